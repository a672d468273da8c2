package trace

import (
	"bytes"
	"testing"
	"time"

	"github.com/infergate/infergate/bench/workload"
)

// checkStream asserts what the benchmark relies on in a loaded trace.
func checkStream(t *testing.T, s workload.Stream, opts Options) {
	t.Helper()
	if len(s.Requests) == 0 {
		t.Fatal("accepted trace with no requests")
	}
	var prev time.Duration
	for i, r := range s.Requests {
		if r.ID != uint64(i) {
			t.Fatalf("request %d has ID %d", i, r.ID)
		}
		if r.Arrival < prev || r.Arrival < 0 {
			t.Fatalf("request %d arrives at %v after %v", i, r.Arrival, prev)
		}
		prev = r.Arrival
		if r.Arrival >= s.Duration {
			t.Fatalf("request %d arrives at %v, stream lasts %v", i, r.Arrival, s.Duration)
		}
		if r.PromptTokens < 1 || r.OutputTokens < 1 {
			t.Fatalf("request %d: %d prompt, %d output tokens", i, r.PromptTokens, r.OutputTokens)
		}
		if r.PromptTokens > MaxTokens || r.OutputTokens > MaxTokens {
			t.Fatalf("request %d: %d prompt, %d output tokens over %d", i, r.PromptTokens, r.OutputTokens, MaxTokens)
		}
		if m := opts.MaxOutputTokens; m > 0 && r.OutputTokens > m {
			t.Fatalf("request %d: output %d over %d", i, r.OutputTokens, m)
		}
		if m := opts.MaxTotalTokens; m > 1 && r.PromptTokens+r.OutputTokens > m {
			t.Fatalf("request %d: %d tokens over %d", i, r.PromptTokens+r.OutputTokens, m)
		}
		if len(r.BlockHashes) > r.PromptTokens/workload.BlockSize {
			t.Fatalf("request %d: %d block hashes for %d prompt tokens", i, len(r.BlockHashes), r.PromptTokens)
		}
	}
}

func fuzzOpts(scale uint8, maxTotal, maxOut uint16) Options {
	return Options{RateScale: float64(scale) / 16, MaxTotalTokens: int(maxTotal), MaxOutputTokens: int(maxOut)}
}

// FuzzReadMooncake: a trace file is outside input; it must load into a
// sound stream or fail with an error.
func FuzzReadMooncake(f *testing.F) {
	for _, s := range []string{
		`{"timestamp": 0, "input_length": 6955, "output_length": 52, "hash_ids": [46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 2353, 2354]}` + "\n" +
			`{"timestamp": 1020, "input_length": 6472, "output_length": 26, "hash_ids": [46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 2366]}`,
		`{"timestamp": 5, "input_length": -3, "output_length": 0, "hash_ids": []}`,
		`{"timestamp": 1e300, "input_length": 1, "output_length": 1}` + "\n" + `{"timestamp": -1e300, "input_length": 1, "output_length": 1}`,
		`{"timestamp": 0, "input_length": 9223372036854775807, "output_length": 9223372036854775807, "hash_ids": [18446744073709551615]}`,
		`{"timestamp": 0.5}`,
		"\n\n",
	} {
		f.Add([]byte(s), uint8(16), uint16(0), uint16(0))
		f.Add([]byte(s), uint8(3), uint16(8192), uint16(256))
	}
	f.Fuzz(func(t *testing.T, data []byte, scale uint8, maxTotal, maxOut uint16) {
		opts := fuzzOpts(scale, maxTotal, maxOut)
		s, err := ReadMooncake(bytes.NewReader(data), opts)
		if err != nil {
			return
		}
		checkStream(t, s, opts)
	})
}

// FuzzReadAzure: the same for the Azure CSV.
func FuzzReadAzure(f *testing.F) {
	for _, s := range []string{
		"TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,374,44\n2023-11-16 18:15:50.9951690,396,109\n",
		"\ufeffTIMESTAMP,ContextTokens,GeneratedTokens\n1700000000.5,10,10\n1700000001,-5,0\n",
		"TIMESTAMP,ContextTokens,GeneratedTokens\nNaN,1,1\n",
		"TIMESTAMP,ContextTokens,GeneratedTokens\n1e300,1,1\n-1e300,1,1\n",
		"TIMESTAMP,ContextTokens,GeneratedTokens\n0,-32,1\n",
		"TIMESTAMP,ContextTokens,GeneratedTokens\n0,2000000000,1\n",
		"GeneratedTokens,TIMESTAMP,ContextTokens\n7,2023-11-16T18:15:46Z,9\n",
	} {
		f.Add([]byte(s), uint8(16), uint16(0), uint16(0))
		f.Add([]byte(s), uint8(40), uint16(100), uint16(7))
	}
	f.Fuzz(func(t *testing.T, data []byte, scale uint8, maxTotal, maxOut uint16) {
		opts := fuzzOpts(scale, maxTotal, maxOut)
		s, err := ReadAzure(bytes.NewReader(data), opts)
		if err != nil {
			return
		}
		checkStream(t, s, opts)
	})
}
