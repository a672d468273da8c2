package scenario

import (
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"testing"
	"time"
)

func TestCatalog(t *testing.T) {
	want := []string{"mixed-gpu-8b", "mixed-gpu-32b", "bursty-70b", "bursty-235b", "shared-prefix-8b", "uniform-235b", "multi-turn-chat", "many-lora", "scale-1000", "priority-mix-8b", "multi-turn-chat-heavy", "identical-pods-noisy"}
	if got := Names(); !reflect.DeepEqual(got, want) {
		t.Fatalf("Names() = %v, want %v", got, want)
	}
	for _, s := range All() {
		f := s.Fleet
		f.SetDefaults()
		if err := f.Validate(); err != nil {
			t.Errorf("%s: %v", s.Name, err)
		}
		if s.Duration <= 0 || s.Summary == "" {
			t.Errorf("%s: duration %v, summary %q", s.Name, s.Duration, s.Summary)
		}
	}
	if _, err := Get("nope"); err == nil {
		t.Error("Get(nope): no error")
	}
	// Held-out scenarios run by name but stay out of the published list.
	for _, s := range Heldout() {
		f := s.Fleet
		f.SetDefaults()
		if err := f.Validate(); err != nil {
			t.Errorf("%s: %v", s.Name, err)
		}
		if slices.Contains(Names(), s.Name) {
			t.Errorf("held-out %s is in the published catalogue", s.Name)
		}
		if got, err := Get(s.Name); err != nil || got.Name != s.Name {
			t.Errorf("Get(%s) = %s, %v", s.Name, got.Name, err)
		}
	}
}

func TestStreamsAreSeeded(t *testing.T) {
	for _, name := range []string{"mixed-gpu-8b", "shared-prefix-8b", "multi-turn-chat", "many-lora"} {
		s, err := Get(name)
		if err != nil {
			t.Fatal(err)
		}
		s.Duration = 20 * time.Second
		a, b, c := s.Stream(1), s.Stream(1), s.Stream(2)
		if !reflect.DeepEqual(a, b) {
			t.Errorf("%s: same seed gave different streams", name)
		}
		if reflect.DeepEqual(a, c) {
			t.Errorf("%s: different seeds gave the same stream", name)
		}
		if len(a.Requests) == 0 {
			t.Fatalf("%s: empty stream", name)
		}
		for i, r := range a.Requests {
			if r.ID != uint64(i) || (i > 0 && r.Arrival < a.Requests[i-1].Arrival) || r.PromptTokens < 1 || r.OutputTokens < 1 {
				t.Fatalf("%s: bad request %d: %+v", name, i, r)
			}
			if len(r.BlockHashes) != r.PromptTokens/16 {
				t.Fatalf("%s: request %d has %d blocks for %d tokens", name, i, len(r.BlockHashes), r.PromptTokens)
			}
		}
	}
}

// firstBlocks counts distinct first-block hashes: how many distinct prefixes
// the requests start with.
func TestSharedPrefixShape(t *testing.T) {
	s, _ := Get("shared-prefix-8b")
	st := s.Stream(1)
	first := map[uint64]int{}
	for _, r := range st.Requests {
		if len(r.BlockHashes) > 0 {
			first[r.BlockHashes[0]]++
		}
	}
	// 16 system prompts plus the ~10% of requests without one.
	shared := 0
	for _, n := range first {
		if n > 1 {
			shared++
		}
	}
	if shared < 10 || shared > 16 {
		t.Errorf("%d shared first blocks, want ≤ 16 and most of them used", shared)
	}
}

func TestChatPromptsGrow(t *testing.T) {
	s, _ := Get("multi-turn-chat")
	st := s.Stream(1)
	last := map[int][]uint64{}
	turns := 0
	for _, r := range st.Requests {
		prev, ok := last[r.Session]
		if ok {
			turns++
			if len(r.BlockHashes) < len(prev) {
				t.Fatalf("session %d prompt shrank", r.Session)
			}
			for i := range prev {
				if prev[i] != r.BlockHashes[i] {
					t.Fatalf("session %d: turn does not extend the previous prompt at block %d", r.Session, i)
				}
			}
		}
		last[r.Session] = r.BlockHashes
	}
	if turns == 0 {
		t.Error("no session has a second turn")
	}
}

func TestManyLoRAUsesAdapters(t *testing.T) {
	s, _ := Get("many-lora")
	used := map[string]int{}
	for _, r := range s.Stream(1).Requests {
		used[r.Adapter]++
	}
	if len(used) < 30 {
		t.Errorf("only %d distinct adapters used", len(used))
	}
}

func TestLoadFleet(t *testing.T) {
	dir := t.TempDir()
	tests := []struct {
		name, yaml string
		ok         bool
	}{
		{"valid", "model: llama-3.1-8b\npods:\n  - gpu: h100\n    count: 2\nttft_slo: 1500ms\n", true},
		{"unknown field", "model: x\npods:\n  - gpu: h100\n    count: 1\n    colour: red\n", false},
		{"no pods", "model: x\n", false},
		{"zero count", "model: x\npods:\n  - gpu: h100\n", false},
		{"step budget", "model: llama-3.1-8b\npods:\n  - gpu: h100\n    count: 2\n    max_num_batched_tokens: 2048\nttft_slo: 1500ms\n", true},
		{"negative step budget", "model: x\npods:\n  - gpu: h100\n    count: 1\n    max_num_batched_tokens: -1\n", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := filepath.Join(dir, tt.name+".yaml")
			if err := os.WriteFile(p, []byte(tt.yaml), 0o644); err != nil {
				t.Fatal(err)
			}
			f, err := LoadFleet(p)
			if (err == nil) != tt.ok {
				t.Fatalf("LoadFleet: err = %v, want ok = %v", err, tt.ok)
			}
			if tt.ok && (f.TTFTSLO != 1500*time.Millisecond || f.Pods[0].TensorParallel != 1 || f.Size() != 2) {
				t.Errorf("fleet = %+v", f)
			}
		})
	}
}
