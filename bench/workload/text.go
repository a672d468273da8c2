package workload

import (
	"github.com/infergate/infergate/sim/tokenize"
)

// Chat-completions messages the text sits in: what Tier 1's proxy hashes
// for a /v1/chat/completions request is the raw "messages" value.
const (
	textOpen  = `[{"role":"user","content":"`
	textClose = `"}]`
)

// AppendText appends request r's prompt as the raw JSON "messages" value
// of a chat completion, so the router can compute from it what Tier 1's
// proxy computes (token estimate, prefix hashes). The content holds exactly
// r.PromptTokens tokens by sim/tokenize: each 16-token block is words drawn
// from that block's chained hash, so prompts share text exactly as far as
// their block hashes agree (a shared system prompt or conversation is a
// shared text prefix), and the tail after the last full block is the
// request's own. Words are lowercase ASCII of 2–7 letters after one space,
// about 4 bytes per token as English BPE, so a bytes/4 estimate is close
// but not exact.
func AppendText(dst []byte, r *Request) []byte {
	dst = append(dst, textOpen...)
	full := r.PromptTokens / BlockSize
	var h uint64
	for b := range full {
		if b < len(r.BlockHashes) {
			h = r.BlockHashes[b]
		} else {
			h = Mix(h, r.ID<<20|uint64(b)) // a block the stream left unhashed
		}
		dst = appendWords(dst, h, BlockSize)
	}
	if tail := r.PromptTokens - full*BlockSize; tail > 0 || r.PromptTokens <= 0 {
		dst = appendWords(dst, Mix(h^0x7a11, r.ID), max(tail, 1))
	}
	return append(dst, textClose...)
}

// wordLens are the word lengths drawn from: mean 5 bytes with the space,
// 1.25 tokens, so 4 bytes per token.
var wordLens = [8]int{2, 3, 3, 4, 4, 4, 5, 7}

// appendWords appends words worth exactly tokens tokens, drawn from seed.
func appendWords(dst []byte, seed uint64, tokens int) []byte {
	s := seed
	var w [8]byte
	for tokens > 0 {
		s = splitmix(s)
		n := wordLens[s&7]
		w[0] = ' '
		x := s >> 3
		for i := 1; i <= n; i++ {
			w[i] = 'a' + byte(x%26)
			x /= 26
		}
		word := w[:n+1]
		c := tokenize.Count(string(word))
		if c > tokens {
			word, c = w[:5], 1 // " " + 4 letters is one token
		}
		dst = append(dst, word...)
		tokens -= c
	}
	return dst
}

func splitmix(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}
