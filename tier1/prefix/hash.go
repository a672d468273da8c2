// Package prefix computes chained prefix-block hashes of prompts and keeps an
// approximate, bounded-memory index of which pods were sent which blocks, so
// the scheduler can route a request to the pod most likely to hold its
// prefix in KV cache (GIE's prefix-cache plugin, reimplemented).
//
// A block is blockBytes bytes of the request text (64 bytes ≈ 16 tokens).
// Hashes are chained: hash[i] depends on every byte of blocks 0..i, so equal
// hash[i] means an equal prefix of i+1 blocks and the longest common prefix
// of two requests is the longest run of equal leading hashes.
package prefix

import (
	"encoding/binary"
	"math/bits"
	"unsafe"

	"github.com/cespare/xxhash/v2"
)

// A block is 16 tokens × ~4 bytes per token, as in GIE. DefaultPromptBlocks
// covers a 64k-token prompt (GIE stops at 256 blocks, 4k tokens): a
// router that sees only a long prompt's first 8k tokens cannot tell the
// pod that holds the whole conversation from one that holds its start
// (measured on the Mooncake trace, docs/benchmarks.md). Hashing costs
// ~1 µs per 1k tokens; a prompt's blocks beyond its first are recorded
// only when new to the pod.
const (
	DefaultBlockBytes   = 64
	DefaultPromptBlocks = 4096
)

// Hash appends to dst[:0] the chained xxhash64 of each full blockBytes block
// of data, at most maxBlocks of them, and returns it. The first block is
// seeded with seed (the model name, plus any cache salt) so identical text
// sent to different models never matches. A trailing partial block is not
// hashed: a server cannot share a partly filled KV block either.
// blockBytes <= 0 means DefaultBlockBytes; maxBlocks <= 0 means no limit.
// It allocates only if dst is too small.
func Hash(seed string, data []byte, blockBytes, maxBlocks int, dst []uint64) []uint64 {
	if blockBytes <= 0 {
		blockBytes = DefaultBlockBytes
	}
	n := len(data) / blockBytes
	if maxBlocks > 0 && n > maxBlocks {
		n = maxBlocks
	}
	dst = dst[:0]
	if cap(dst) < n {
		dst = make([]uint64, 0, n)
	}
	// Chaining through the seed rather than appending the previous hash to
	// the block keeps each step a single pass over 64 bytes.
	prev := xxhash.Sum64String(seed)
	if blockBytes == 64 {
		for i := 0; i < n; i++ {
			prev = sum64Block64(prev, data[i*64:i*64+64])
			dst = append(dst, prev)
		}
		return dst
	}
	var d xxhash.Digest
	for i := 0; i < n; i++ {
		d.ResetWithSeed(prev)
		_, _ = d.Write(data[i*blockBytes : (i+1)*blockBytes])
		prev = d.Sum64()
		dst = append(dst, prev)
	}
	return dst
}

// XXH64 primes.
const (
	prime1 uint64 = 11400714785074694791
	prime2 uint64 = 14029467366897019727
	prime3 uint64 = 1609587929392839161
	prime4 uint64 = 9650029242287828579
)

// sum64Block64 is xxhash64 with seed of exactly 64 bytes, unrolled: the
// streaming Digest costs ~5× more per block in buffering and finalising.
// TestHashBlock64 checks it against xxhash.Digest.
func sum64Block64(seed uint64, b []byte) uint64 {
	_ = b[63]
	v1 := seed + prime1 + prime2
	v2 := seed + prime2
	v3 := seed
	v4 := seed - prime1
	v1 = round(v1, binary.LittleEndian.Uint64(b[0:]))
	v2 = round(v2, binary.LittleEndian.Uint64(b[8:]))
	v3 = round(v3, binary.LittleEndian.Uint64(b[16:]))
	v4 = round(v4, binary.LittleEndian.Uint64(b[24:]))
	v1 = round(v1, binary.LittleEndian.Uint64(b[32:]))
	v2 = round(v2, binary.LittleEndian.Uint64(b[40:]))
	v3 = round(v3, binary.LittleEndian.Uint64(b[48:]))
	v4 = round(v4, binary.LittleEndian.Uint64(b[56:]))
	h := bits.RotateLeft64(v1, 1) + bits.RotateLeft64(v2, 7) + bits.RotateLeft64(v3, 12) + bits.RotateLeft64(v4, 18)
	h = mergeRound(h, v1)
	h = mergeRound(h, v2)
	h = mergeRound(h, v3)
	h = mergeRound(h, v4)
	h += 64
	h ^= h >> 33
	h *= prime2
	h ^= h >> 29
	h *= prime3
	h ^= h >> 32
	return h
}

func round(acc, input uint64) uint64 {
	acc += input * prime2
	return bits.RotateLeft64(acc, 31) * prime1
}

func mergeRound(acc, val uint64) uint64 {
	return (acc^round(0, val))*prime1 + prime4
}

// HashString is Hash for a string, without copying it.
func HashString(seed, text string, blockBytes, maxBlocks int, dst []uint64) []uint64 {
	// Hash only reads data, so viewing the string's bytes is safe.
	return Hash(seed, unsafe.Slice(unsafe.StringData(text), len(text)), blockBytes, maxBlocks, dst)
}
