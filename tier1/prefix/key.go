package prefix

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/hkdf"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"sync"
)

// MinKeyBytes is the shortest secret NewKey accepts.
const MinKeyBytes = 16

// Key keys block hashes with a per-deployment secret. Hash's chained
// xxhash values are fast but not secret: anyone holding a few of them can
// confirm a guessed prompt by hashing it. An Index with a Key (SetKey)
// stores and compares PRF_key(hash) instead, AES-128 of the hash truncated
// to 64 bits, so the values it records and that replicas stream to each
// other (tier1/peers) say nothing about the prompt without the key. Prefix
// matching is unchanged: equal chained hashes give equal keyed ones.
// A nil *Key keys nothing. Safe for concurrent use.
type Key struct {
	block cipher.Block
	id    []byte
	bufs  sync.Pool // *[32]byte: AES's input and output, kept off the heap per call
}

// NewKey derives a key from secret (at least MinKeyBytes bytes; the same
// on every replica of a deployment).
func NewKey(secret []byte) (*Key, error) {
	if len(secret) < MinKeyBytes {
		return nil, errors.New("prefix: hash key shorter than 16 bytes")
	}
	k, err := hkdf.Key(sha256.New, secret, nil, "infergate prefix block hash key", 16)
	if err != nil {
		return nil, err
	}
	id, err := hkdf.Key(sha256.New, secret, nil, "infergate prefix block hash key id", 8)
	if err != nil {
		return nil, err
	}
	b, err := aes.NewCipher(k)
	if err != nil {
		return nil, err
	}
	return &Key{block: b, id: id}, nil
}

// ID is a fingerprint of the key (8 bytes derived apart from it, so it
// reveals nothing of it; nil for a nil Key): replicas compare it to find a
// peer configured with another key.
func (k *Key) ID() []byte {
	if k == nil {
		return nil
	}
	return k.id
}

func (k *Key) sum(h uint64, buf *[32]byte) uint64 {
	binary.LittleEndian.PutUint64(buf[:8], h)
	k.block.Encrypt(buf[16:], buf[:16])
	return binary.LittleEndian.Uint64(buf[16:])
}

func (k *Key) buf() *[32]byte {
	if b, _ := k.bufs.Get().(*[32]byte); b != nil {
		return b
	}
	return new([32]byte)
}

// Sum returns h keyed (h itself for a nil Key).
func (k *Key) Sum(h uint64) uint64 {
	if k == nil {
		return h
	}
	b := k.buf()
	defer k.bufs.Put(b)
	return k.sum(h, b)
}

// Apply keys every hash of hashes in place (nothing for a nil Key).
func (k *Key) Apply(hashes []uint64) {
	if k == nil || len(hashes) == 0 {
		return
	}
	b := k.buf()
	defer k.bufs.Put(b)
	for i, h := range hashes {
		hashes[i] = k.sum(h, b)
	}
}
