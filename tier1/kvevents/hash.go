package kvevents

import (
	"encoding/binary"
	"strconv"

	"github.com/cespare/xxhash/v2"
)

// chainDomain separates this chain from every other xxhash use in the
// project; bump the version if the construction ever changes (a router and
// its index must agree, and both live in one process).
const chainDomain = "infergate/kv-chain/v1\x00"

// ChainSeed is the hash a chain starts from: it carries the LoRA adapter
// ("" for the base model), so the same tokens under another adapter, whose
// KV differs, never match.
func ChainSeed(lora string) uint64 {
	var d xxhash.Digest
	d.Reset()
	_, _ = d.WriteString(chainDomain)
	_, _ = d.WriteString(lora)
	return d.Sum64()
}

// loraIDSeed is the seed for events that name their adapter only by
// vLLM's integer lora_id (no lora_name): a request knows the adapter's
// name, never that id, so such blocks get a seed no request can produce
// and are never credited to the wrong prefix.
func loraIDSeed(id int64) uint64 {
	return ChainSeed("\x00lora_id:" + strconv.FormatInt(id, 10))
}

// chainStep hashes one block: the parent's hash, then the block's token
// ids (4 bytes little-endian each), then, for blocks whose engine hash
// mixed in more than tokens and adapter (multimodal inputs, cache_salt),
// a salt, so such a block can only match itself. buf is scratch.
func chainStep(parent uint64, tokens []uint32, salt uint64, buf []byte) (uint64, []byte) {
	buf = binary.LittleEndian.AppendUint64(buf[:0], parent)
	for _, t := range tokens {
		buf = binary.LittleEndian.AppendUint32(buf, t)
	}
	if salt != 0 {
		buf = binary.LittleEndian.AppendUint64(buf, salt)
	}
	return xxhash.Sum64(buf), buf
}

// HashTokens returns the chained hashes of tokens' full blocks of
// blockSize tokens under adapter lora ("" for the base model): the keys
// Index.Match takes. It hashes exactly as the index hashes the token ids
// that BlockStored events carry, so a request's prompt tokens find the
// blocks a pod reported. A trailing partial block is not hashed (engines
// cache only full blocks); blockSize ≤ 0 gives nil.
func HashTokens(tokens []uint32, blockSize int, lora string) []uint64 {
	return AppendHashTokens(nil, tokens, blockSize, lora)
}

// AppendHashTokens is HashTokens appending to dst.
func AppendHashTokens(dst []uint64, tokens []uint32, blockSize int, lora string) []uint64 {
	if blockSize <= 0 {
		return dst
	}
	n := len(tokens) / blockSize
	if n == 0 {
		return dst
	}
	h := ChainSeed(lora)
	buf := make([]byte, 0, 8+4*blockSize)
	for i := range n {
		h, buf = chainStep(h, tokens[i*blockSize:(i+1)*blockSize], 0, buf)
		dst = append(dst, h)
	}
	return dst
}
