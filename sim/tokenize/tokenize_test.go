package tokenize

import (
	"slices"
	"strings"
	"testing"
)

// pieces returns the text of each token, for readable expectations.
func pieces(s string) []string {
	var out []string
	scan(s, func(a, b int) { out = append(out, s[a:b]) })
	return out
}

func TestSplit(t *testing.T) {
	tests := []struct {
		in   string
		want []string
	}{
		{"", nil},
		{"hello", []string{"hell", "o"}},
		{"hi there", []string{"hi", " ther", "e"}},
		{"a, b.", []string{"a", ",", " b", "."}},
		{"x  y", []string{"x", "  ", "y"}},
		{"line\nnext", []string{"line", "\n", "next"}},
		{" ", []string{" "}},
		{"trailing ", []string{"trai", "ling", " "}},
		{"héllo", []string{"h\xc3\xa9l", "lo"}},
		{"a+b", []string{"a", "+", "b"}},
		{"\xff\xfe", []string{"\xff\xfe"}},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got := pieces(tt.in)
			if !slices.Equal(got, tt.want) {
				t.Fatalf("pieces(%q) = %q, want %q", tt.in, got, tt.want)
			}
			if c := Count(tt.in); c != len(tt.want) {
				t.Fatalf("Count(%q) = %d, want %d", tt.in, c, len(tt.want))
			}
			if toks := Tokens(tt.in); len(toks) != len(tt.want) {
				t.Fatalf("len(Tokens(%q)) = %d, want %d", tt.in, len(toks), len(tt.want))
			}
		})
	}
}

func TestTokensDeterministicAndDistinct(t *testing.T) {
	a := Tokens("the quick brown fox")
	b := Tokens("the quick brown fox")
	if !slices.Equal(a, b) {
		t.Fatal("same text gave different tokens")
	}
	c := Tokens("the quick brown cat")
	if slices.Equal(a, c) {
		t.Fatal("different text gave equal tokens")
	}
	if !slices.Equal(a[:len(a)-1], c[:len(c)-1]) {
		t.Fatal("shared prefix should give shared token prefix")
	}
}

func TestCountRoughlyFourCharsPerToken(t *testing.T) {
	s := strings.Repeat("The simulator approximates tokenization deterministically. ", 50)
	n := Count(s)
	ratio := float64(len(s)) / float64(n)
	if ratio < 3 || ratio > 6 {
		t.Fatalf("chars per token = %.2f, want roughly 4", ratio)
	}
}

func TestBlockHashes(t *testing.T) {
	toks := make([]uint32, 40)
	for i := range toks {
		toks[i] = uint32(i)
	}
	tests := []struct {
		name      string
		seed      string
		tokens    []uint32
		blockSize int
		wantLen   int
	}{
		{"two full blocks", "m", toks, 16, 2},
		{"exact", "m", toks[:32], 16, 2},
		{"short", "m", toks[:15], 16, 0},
		{"zero size", "m", toks, 0, 0},
		{"negative size", "m", toks, -1, 0},
		{"large block", "m", toks, 100, 0},
		{"block of 1", "m", toks, 1, 40},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := BlockHashes(tt.seed, tt.tokens, tt.blockSize)
			if len(got) != tt.wantLen {
				t.Fatalf("len = %d, want %d", len(got), tt.wantLen)
			}
		})
	}

	base := BlockHashes("m", toks, 16)
	if !slices.Equal(base, BlockHashes("m", toks, 16)) {
		t.Fatal("not deterministic")
	}
	if other := BlockHashes("adapter", toks, 16); other[0] == base[0] || other[1] == base[1] {
		t.Fatal("seed must change every hash")
	}
	// Changing a token in block 0 changes block 1's hash too (chaining).
	mod := slices.Clone(toks)
	mod[3]++
	if h := BlockHashes("m", mod, 16); h[0] == base[0] || h[1] == base[1] {
		t.Fatal("block hashes are not chained")
	}
	// Changing a token in block 1 leaves block 0 alone.
	mod = slices.Clone(toks)
	mod[20]++
	if h := BlockHashes("m", mod, 16); h[0] != base[0] || h[1] == base[1] {
		t.Fatal("block 0 should be unaffected by block 1")
	}
	// Large blocks exercise the internal buffer flush.
	big := make([]uint32, 300)
	h1 := BlockHashes("m", big, 150)
	big[149] = 1
	h2 := BlockHashes("m", big, 150)
	if len(h1) != 2 || h1[0] == h2[0] {
		t.Fatal("last token of a large block must be hashed")
	}
}

func TestNoAllocsPerToken(t *testing.T) {
	s := strings.Repeat("hello, world! ", 100)
	if n := testing.AllocsPerRun(10, func() { Count(s) }); n != 0 {
		t.Fatalf("Count allocs = %v, want 0", n)
	}
	buf := make([]uint32, 0, 1000)
	if n := testing.AllocsPerRun(10, func() { buf = AppendTokens(buf[:0], s) }); n != 0 {
		t.Fatalf("AppendTokens allocs = %v, want 0", n)
	}
	toks := Tokens(s)
	if n := testing.AllocsPerRun(10, func() { BlockHashes("m", toks, 16) }); n > 1 {
		t.Fatalf("BlockHashes allocs = %v, want <= 1", n)
	}
}

func FuzzTokenize(f *testing.F) {
	for _, s := range []string{"", " ", "hello world", "a,b", "\xff", "  x\n\ny ", "héllo wörld"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		var total int
		prevEnd := 0
		scan(s, func(a, b int) {
			if a != prevEnd || b <= a || b > len(s) {
				t.Fatalf("bad token range [%d,%d) after %d in %q", a, b, prevEnd, s)
			}
			prevEnd = b
			total++
		})
		if prevEnd != len(s) {
			t.Fatalf("tokens cover %d of %d bytes", prevEnd, len(s))
		}
		if Count(s) != total || len(Tokens(s)) != total {
			t.Fatal("Count/Tokens disagree with scan")
		}
		_ = BlockHashes(s, Tokens(s), 4)
	})
}

func BenchmarkCount(b *testing.B) {
	s := strings.Repeat("The quick brown fox jumps over the lazy dog. ", 100)
	b.SetBytes(int64(len(s)))
	for b.Loop() {
		Count(s)
	}
}

func BenchmarkAppendTokens(b *testing.B) {
	s := strings.Repeat("The quick brown fox jumps over the lazy dog. ", 100)
	buf := make([]uint32, 0, len(s))
	b.SetBytes(int64(len(s)))
	for b.Loop() {
		buf = AppendTokens(buf[:0], s)
	}
}

func BenchmarkBlockHashes(b *testing.B) {
	toks := Tokens(strings.Repeat("The quick brown fox jumps over the lazy dog. ", 100))
	b.SetBytes(int64(4 * len(toks)))
	for b.Loop() {
		BlockHashes("meta-llama/Llama-3.1-8B-Instruct", toks, 16)
	}
}
