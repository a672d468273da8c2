package jsonkeys

import (
	"encoding/json"
	"strings"
	"testing"
)

// body32K is a chat request of about 32 KiB, mostly message text.
func body32K() []byte {
	var b strings.Builder
	b.WriteString(`{"model":"llama","stream":true,"stream_options":{"include_usage":true},"max_tokens":256,"messages":[`)
	para := strings.Repeat(`The quick brown fox jumps over the lazy dog, \"twice\" — déjà vu.\n `, 16)
	for i := 0; b.Len() < 32<<10; i++ {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(`{"role":"user","content":"` + para + `"}`)
	}
	b.WriteString(`],"temperature":0.7}`)
	return []byte(b.String())
}

// go test -run '^$' -bench . ./shared/jsonkeys
func BenchmarkScan32K(b *testing.B) {
	data := body32K()
	vals := make([][]byte, 4)
	b.SetBytes(int64(len(data)))
	b.ReportAllocs()
	for b.Loop() {
		if err := testSet.Scan(data, vals); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkEncodingJSONValid32K is the baseline: encoding/json's own
// validity check of the same body, which json.Unmarshal runs first.
func BenchmarkEncodingJSONValid32K(b *testing.B) {
	data := body32K()
	b.SetBytes(int64(len(data)))
	for b.Loop() {
		if !json.Valid(data) {
			b.Fatal("invalid")
		}
	}
}

// bodyASCII32K is a chat request of 32 KiB whose text is plain ASCII
// without escapes, like the load benchmark's (bench/load).
func bodyASCII32K() []byte {
	words := strings.Repeat("which model request token cache prefix router latency throughput batch ", 500)
	head := `{"model":"llama","stream":true,"max_tokens":16,"messages":[{"role":"system","content":"` + words[:8<<10] + `"},{"role":"user","content":"`
	tail := `"}]}`
	return []byte(head + words[:32<<10-len(head)-len(tail)] + tail)
}

// BenchmarkScanASCII32K is BenchmarkScan32K on plain ASCII text, where
// strings are skipped eight bytes at a time throughout.
func BenchmarkScanASCII32K(b *testing.B) {
	data := bodyASCII32K()
	vals := make([][]byte, 4)
	b.SetBytes(int64(len(data)))
	b.ReportAllocs()
	for b.Loop() {
		if err := testSet.Scan(data, vals); err != nil {
			b.Fatal(err)
		}
	}
}
