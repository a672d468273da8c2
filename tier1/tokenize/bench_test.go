package tokenize

import (
	"math/rand/v2"
	"runtime"
	"strings"
	"testing"
)

// benchPrompt is a 32 KB prompt: mostly English prose and code, some
// numbers, CJK and emoji, as a long RAG or coding request looks.
func benchPrompt() string {
	c := newCorpus(rand.New(rand.NewPCG(7, 32)))
	var b strings.Builder
	for b.Len() < 32<<10 {
		switch c.r.IntN(10) {
		case 0, 1, 2, 3, 4:
			b.WriteString(c.pick(fragments["english"]))
			b.WriteString(" ")
		case 5, 6:
			b.WriteString(c.pick(fragments["code"]))
		case 7:
			b.WriteString(c.pick(fragments["numbers"]))
			b.WriteString(" ")
		case 8:
			b.WriteString(c.pick(fragments["cjk"]))
		case 9:
			b.WriteString(c.pick(fragments["punct"]) + c.pick(fragments["emoji"]) + "\n")
		}
	}
	return b.String()[:32<<10]
}

// BenchmarkEncode encodes a 32 KB prompt (go test -bench Encode -run '^$'
// ./tier1/tokenize/; needs scripts/tokenizer-oracle.sh's vocabularies).
func BenchmarkEncode(b *testing.B) {
	prompt := strings.ToValidUTF8(benchPrompt(), "")
	for _, pkg := range []string{"tokenizer-llama3_1", "tokenizer-qwen3"} {
		b.Run(strings.TrimPrefix(pkg, "tokenizer-"), func(b *testing.B) {
			tok, _, _ := loadVocab(b, pkg)
			b.SetBytes(int64(len(prompt)))
			b.ReportAllocs()
			var ids []uint32
			for b.Loop() {
				ids = tok.AppendEncode(ids[:0], prompt, false)
			}
			b.ReportMetric(float64(len(ids)), "tokens/op")
		})
		// Cold: the piece cache emptied before each encoding, as for a
		// prompt unlike any seen before.
		b.Run(strings.TrimPrefix(pkg, "tokenizer-")+"/cold", func(b *testing.B) {
			tok, _, _ := loadVocab(b, pkg)
			b.SetBytes(int64(len(prompt)))
			var ids []uint32
			for b.Loop() {
				b.StopTimer()
				tok.model.cache = newPieceCache()
				b.StartTimer()
				ids = tok.AppendEncode(ids[:0], prompt, false)
			}
		})
	}
}

// BenchmarkPreTokenize compares the hand-written scanner with regexp2 on
// the Llama-3 pattern: the reason the scanner exists.
func BenchmarkPreTokenize(b *testing.B) {
	prompt := strings.ToValidUTF8(benchPrompt(), "")
	re, err := newRegexSplit(llama3Pattern+"|(?!)", true) // defeats the fast-path switch
	if err != nil {
		b.Fatal(err)
	}
	for name, sp := range map[string]splitter{"scanner": patternScanner{maxDigits: 3}, "regexp2": re} {
		b.Run(name, func(b *testing.B) {
			b.SetBytes(int64(len(prompt)))
			n := 0
			for b.Loop() {
				sp.split(prompt, func(string) { n++ })
			}
		})
	}
}

// BenchmarkLoad loads a tokenizer.json and reports the heap it keeps.
func BenchmarkLoad(b *testing.B) {
	for _, pkg := range []string{"tokenizer-llama3_1", "tokenizer-qwen3"} {
		b.Run(strings.TrimPrefix(pkg, "tokenizer-"), func(b *testing.B) {
			tj, cj := vocabFiles(b, pkg)
			var kept uint64
			for b.Loop() {
				var before, after runtime.MemStats
				runtime.GC()
				runtime.ReadMemStats(&before)
				tok, err := Load(Config{File: tj, ConfigFile: cj})
				if err != nil {
					b.Fatal(err)
				}
				runtime.GC()
				runtime.ReadMemStats(&after)
				kept = after.HeapAlloc - before.HeapAlloc
				runtime.KeepAlive(tok)
			}
			b.ReportMetric(float64(kept)/(1<<20), "MiB-kept")
		})
	}
}
