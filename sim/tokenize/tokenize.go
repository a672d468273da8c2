// Package tokenize is a deterministic, approximate tokenizer. It stands in
// for a model's BPE tokenizer wherever infergate needs token counts or
// token-level prefix hashes (the simulator, the router's prefix index, the
// benchmark) without shipping vocabularies.
//
// The rules, loosely modelled on GPT-style BPE, are:
//
//   - A word is a maximal run of ASCII letters, digits and '_' plus any
//     non-ASCII byte (so multi-byte UTF-8 text counts as word text). A word
//     is split into pieces of at most 4 bytes: English averages about 4
//     characters per token.
//   - A single space directly before a word is folded into the word's first
//     piece (" hello" is one token, as in GPT tokenizers).
//   - Any other run of whitespace is one token.
//   - Every other byte (ASCII punctuation and symbols) is one token.
//
// A token's ID is the 32-bit FNV-1a hash of its bytes, so equal text gives
// equal IDs in every process. Counting and tokenizing never allocate per
// token; any input, including invalid UTF-8, is accepted.
package tokenize

import (
	"encoding/binary"

	"github.com/cespare/xxhash/v2"
)

// maxPiece is the most word bytes one token covers.
const maxPiece = 4

const (
	fnvOffset32 = 2166136261
	fnvPrime32  = 16777619
)

// class of a byte for splitting.
const (
	clsWord = iota
	clsSpace
	clsPunct
)

var classes = func() (t [256]uint8) {
	for i := range t {
		c := byte(i)
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == '_', c >= 0x80:
			t[i] = clsWord
		case c == ' ', c == '\t', c == '\n', c == '\r', c == '\v', c == '\f':
			t[i] = clsSpace
		default:
			t[i] = clsPunct
		}
	}
	return t
}()

// scan calls emit with the [start,end) byte range of each token of s, in
// order. It is the single definition of the splitting rules.
func scan(s string, emit func(start, end int)) {
	i := 0
	for i < len(s) {
		switch classes[s[i]] {
		case clsPunct:
			emit(i, i+1)
			i++
		case clsSpace:
			j := i + 1
			for j < len(s) && classes[s[j]] == clsSpace {
				j++
			}
			if j-i == 1 && s[i] == ' ' && j < len(s) && classes[s[j]] == clsWord {
				// A lone space joins the following word's first piece.
				i = emitWord(s, i, j, emit)
				continue
			}
			emit(i, j)
			i = j
		default:
			i = emitWord(s, i, i, emit)
		}
	}
}

// emitWord emits the word starting at byte w (with an optional folded space
// at start < w) and returns the index after it.
func emitWord(s string, start, w int, emit func(start, end int)) int {
	end := w
	for end < len(s) && classes[s[end]] == clsWord {
		end++
	}
	for w < end {
		n := min(end-w, maxPiece)
		emit(start, w+n)
		w += n
		start = w
	}
	return end
}

// Count returns the number of tokens in s.
func Count(s string) int {
	n := 0
	scan(s, func(int, int) { n++ })
	return n
}

// Tokens returns the token IDs of s.
func Tokens(s string) []uint32 {
	return AppendTokens(make([]uint32, 0, len(s)/3+1), s)
}

// AppendTokens appends the token IDs of s to dst and returns the extended
// slice, so callers can reuse a buffer.
func AppendTokens(dst []uint32, s string) []uint32 {
	scan(s, func(start, end int) {
		dst = append(dst, hash32(s[start:end]))
	})
	return dst
}

func hash32(s string) uint32 {
	h := uint32(fnvOffset32)
	for i := 0; i < len(s); i++ {
		h ^= uint32(s[i])
		h *= fnvPrime32
	}
	return h
}

// BlockHashes returns one hash per full block of blockSize tokens: block i's
// hash covers the previous block's hash and block i's token IDs, so equal
// hashes mean equal prefixes, as in vLLM's prefix cache. The chain starts
// from the hash of seed (the model or adapter name, so different adapters
// never share cache blocks). A trailing partial block is not hashed.
// blockSize <= 0 returns nil.
func BlockHashes(seed string, tokens []uint32, blockSize int) []uint64 {
	if blockSize <= 0 || len(tokens) < blockSize {
		return nil
	}
	out := make([]uint64, 0, len(tokens)/blockSize)
	prev := xxhash.Sum64String(seed)
	var d xxhash.Digest
	var buf [8 + 4*64]byte
	for b := 0; b+blockSize <= len(tokens); b += blockSize {
		d.Reset()
		binary.LittleEndian.PutUint64(buf[:8], prev)
		n := 8
		for _, t := range tokens[b : b+blockSize] {
			if n+4 > len(buf) {
				_, _ = d.Write(buf[:n])
				n = 0
			}
			binary.LittleEndian.PutUint32(buf[n:], t)
			n += 4
		}
		_, _ = d.Write(buf[:n])
		prev = d.Sum64()
		out = append(out, prev)
	}
	return out
}
