package trace

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"
)

const mooncakeSample = `{"timestamp": 0, "input_length": 1100, "output_length": 50, "hash_ids": [0, 1, 2]}
{"timestamp": 0, "input_length": 600, "output_length": 10, "hash_ids": [0, 3]}

{"timestamp": 1500, "input_length": 20, "output_length": 0, "hash_ids": [4]}
`

func TestReadMooncake(t *testing.T) {
	s, err := ReadMooncake(strings.NewReader(mooncakeSample), Options{})
	if err != nil {
		t.Fatal(err)
	}
	if len(s.Requests) != 3 {
		t.Fatalf("got %d requests, want 3", len(s.Requests))
	}
	r0, r1, r2 := s.Requests[0], s.Requests[1], s.Requests[2]
	// 1100 tokens = 68 full blocks; hash ids would give 96, so truncated.
	if len(r0.BlockHashes) != 1100/16 || len(r1.BlockHashes) != 600/16 || len(r2.BlockHashes) != 1 {
		t.Errorf("block counts %d %d %d", len(r0.BlockHashes), len(r1.BlockHashes), len(r2.BlockHashes))
	}
	// Shared hash id 0 → first 32 blocks equal, block 32 differs.
	for i := range 32 {
		if r0.BlockHashes[i] != r1.BlockHashes[i] {
			t.Fatalf("block %d differs though hash id 0 is shared", i)
		}
	}
	if r0.BlockHashes[32] == r1.BlockHashes[32] {
		t.Error("block 32 equal though hash ids 1 and 3 differ")
	}
	if r2.Arrival != 1500*time.Millisecond || r2.OutputTokens != 1 {
		t.Errorf("r2 = %+v, want arrival 1.5s and output clamped to 1", r2)
	}
	if r0.ID != 0 || r2.ID != 2 {
		t.Errorf("ids %d %d", r0.ID, r2.ID)
	}
}

func TestReadMooncakeErrors(t *testing.T) {
	for _, in := range []string{`{"timestamp": 0}`, `not json`, ``} {
		if _, err := ReadMooncake(strings.NewReader(in), Options{}); err == nil {
			t.Errorf("ReadMooncake(%q): no error", in)
		}
	}
}

const azureSample = `TIMESTAMP,ContextTokens,GeneratedTokens
2023-11-16 18:17:03.9799600,4808,10
2023-11-16 18:17:04.0319600,3180,8
2023-11-16 18:17:05.9799600,110,27
`

func TestReadAzure(t *testing.T) {
	s, err := ReadAzure(strings.NewReader(azureSample), Options{})
	if err != nil {
		t.Fatal(err)
	}
	if len(s.Requests) != 3 {
		t.Fatalf("got %d requests", len(s.Requests))
	}
	if s.Requests[0].Arrival != 0 || s.Requests[1].Arrival != 52*time.Millisecond || s.Requests[2].Arrival != 2*time.Second {
		t.Errorf("arrivals %v %v %v", s.Requests[0].Arrival, s.Requests[1].Arrival, s.Requests[2].Arrival)
	}
	if s.Requests[0].PromptTokens != 4808 || s.Requests[0].OutputTokens != 10 {
		t.Errorf("r0 = %+v", s.Requests[0])
	}
	if len(s.Requests[0].BlockHashes) != 4808/16 {
		t.Errorf("r0 has %d blocks", len(s.Requests[0].BlockHashes))
	}
	if s.Requests[0].BlockHashes[0] == s.Requests[1].BlockHashes[0] {
		t.Error("azure requests share a block though the trace has no prefix info")
	}
}

func TestOptions(t *testing.T) {
	s, err := ReadAzure(strings.NewReader(azureSample), Options{RateScale: 2, Duration: time.Second, MaxTotalTokens: 1000})
	if err != nil {
		t.Fatal(err)
	}
	// Scaled arrivals 0, 26ms, 1s: the last is cut by Duration.
	if len(s.Requests) != 2 || s.Requests[1].Arrival != 26*time.Millisecond {
		t.Fatalf("got %+v", s.Requests)
	}
	// 4808+10 > 1000: output kept (≤ 250), prompt cut to 990.
	if s.Requests[0].PromptTokens != 990 || s.Requests[0].OutputTokens != 10 || len(s.Requests[0].BlockHashes) != 990/16 {
		t.Errorf("clamp: %d tokens, %d blocks", s.Requests[0].PromptTokens, len(s.Requests[0].BlockHashes))
	}
	if s.Duration != time.Second {
		t.Errorf("duration %v", s.Duration)
	}
}

func TestReadAzureErrors(t *testing.T) {
	for _, in := range []string{"a,b,c\n1,2,3\n", "TIMESTAMP,ContextTokens,GeneratedTokens\nyesterday,1,2\n", "TIMESTAMP,ContextTokens,GeneratedTokens\n"} {
		if _, err := ReadAzure(strings.NewReader(in), Options{}); err == nil {
			t.Errorf("ReadAzure(%q): no error", in)
		}
	}
}

// tracesDir finds the shared traces: $INFERGATE_TRACES or ../shared/traces
// relative to the repository root.
func tracesDir() string {
	if d := os.Getenv("INFERGATE_TRACES"); d != "" {
		return d
	}
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..", "..", "shared", "traces")
}

func TestRealTraces(t *testing.T) {
	if testing.Short() {
		t.Skip("parses two public traces (seconds); skipped with -short")
	}
	tests := []struct {
		file    string
		minReqs int
		shared  bool
	}{
		{"mooncake_conversation.jsonl", 10000, true},
		{"azure_llm_code_2023.csv", 8000, false},
	}
	for _, tt := range tests {
		t.Run(tt.file, func(t *testing.T) {
			path := filepath.Join(tracesDir(), tt.file)
			if _, err := os.Stat(path); err != nil {
				t.Skipf("trace not present: %v", err)
			}
			s, err := Load(path, Options{})
			if err != nil {
				t.Fatal(err)
			}
			if len(s.Requests) < tt.minReqs {
				t.Errorf("%d requests, want ≥ %d", len(s.Requests), tt.minReqs)
			}
			seen := map[uint64]bool{}
			shared := false
			for _, r := range s.Requests {
				if len(r.BlockHashes) > 0 && seen[r.BlockHashes[0]] {
					shared = true
					break
				}
				if len(r.BlockHashes) > 0 {
					seen[r.BlockHashes[0]] = true
				}
			}
			if shared != tt.shared {
				t.Errorf("shared first block = %v, want %v", shared, tt.shared)
			}
		})
	}
}

func TestLoadWindow(t *testing.T) {
	p := filepath.Join(t.TempDir(), "w.csv")
	csv := "TIMESTAMP,ContextTokens,GeneratedTokens\n"
	for i := range 10 {
		csv += fmt.Sprintf("2023-11-16 18:15:%02d.000000,100,10\n", i)
	}
	if err := os.WriteFile(p, []byte(csv), 0o644); err != nil {
		t.Fatal(err)
	}
	st, err := Load(p, Options{Start: 3 * time.Second, Duration: 4 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Requests) != 4 || st.Requests[0].Arrival != 0 || st.Requests[3].Arrival != 3*time.Second {
		t.Fatalf("window [3s, 7s): %d requests, first at %v", len(st.Requests), st.Requests[0].Arrival)
	}
	if _, err := Load(p, Options{Start: time.Minute}); err == nil {
		t.Error("an empty window loaded")
	}
}
