package workload

import (
	"bytes"
	"encoding/json"
	"testing"

	"github.com/infergate/infergate/sim/tokenize"
)

func TestAppendTextTokensAndSharedPrefixes(t *testing.T) {
	sys := Segment{Key: 1, Tokens: 1000}
	a := Request{ID: 1, PromptTokens: 1150, BlockHashes: HashSegments([]Segment{sys, {Key: 2, Tokens: 150}})}
	b := Request{ID: 2, PromptTokens: 1203, BlockHashes: HashSegments([]Segment{sys, {Key: 3, Tokens: 203}})}
	c := Request{ID: 3, PromptTokens: 1150, BlockHashes: HashSegments([]Segment{{Key: 9, Tokens: 1150}})}
	for _, r := range []Request{a, b, c, {ID: 4, PromptTokens: 5}, {ID: 5, PromptTokens: 40}} {
		text := AppendText(nil, &r)
		var msgs []struct{ Role, Content string }
		if err := json.Unmarshal(text, &msgs); err != nil || len(msgs) != 1 {
			t.Fatalf("request %d: not a messages array: %v", r.ID, err)
		}
		if n := tokenize.Count(msgs[0].Content); n != r.PromptTokens {
			t.Errorf("request %d: %d tokens of text, want %d", r.ID, n, r.PromptTokens)
		}
		if n := len(msgs[0].Content); n < 3*r.PromptTokens || n > 6*r.PromptTokens {
			t.Errorf("request %d: %d bytes for %d tokens", r.ID, n, r.PromptTokens)
		}
	}
	ta, tb, tc := AppendText(nil, &a), AppendText(nil, &b), AppendText(nil, &c)
	common := func(x, y []byte) int {
		n := 0
		for n < min(len(x), len(y)) && x[n] == y[n] {
			n++
		}
		return n
	}
	// 1000 shared tokens = 62 shared blocks, about 4 bytes a token.
	if n := common(ta, tb); n < 3*992 || n > 6*1000 {
		t.Errorf("a and b share %d bytes, want the 62 blocks of the system prompt", n)
	}
	if n := common(ta, tc); n > len(textOpen)+8 {
		t.Errorf("a and c share %d bytes, want none beyond the JSON", n)
	}
	if !bytes.Equal(ta, AppendText(nil, &a)) {
		t.Error("not deterministic")
	}
}
