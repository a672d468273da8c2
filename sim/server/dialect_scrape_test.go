package server

import (
	"context"
	"slices"
	"testing"
	"time"

	tier1scrape "github.com/infergate/infergate/tier1/scrape"
)

// TestTier1ScrapesEveryFlavor points Tier 1's real scraper at a simulated
// pod of each flavor over HTTP, the engine configured as an operator
// would, and checks what it reads: each dialect end to end, including
// trtllm-serve's /prometheus/metrics path and vLLM's
// vllm:lora_adapter_loaded (an adapter idle in its GPU slot reads as
// active). The simulator stands in for the engines, which need GPUs.
func TestTier1ScrapesEveryFlavor(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pods := map[Flavor]*Pod{}
	var targets []tier1scrape.Target
	for _, f := range Flavors() {
		p := startPod(t, Config{ServedModelName: "m", Flavor: f, LoRAModules: []LoRAModule{{Name: "a"}}})
		if status, body := postJSON(t, p.URL+"/v1/chat/completions", chatBody("a", "hello there", 2, false)); status != 200 {
			t.Fatalf("%s: status %d: %s", f, status, body)
		}
		pods[f] = p
		targets = append(targets, tier1scrape.Target{Name: string(f), Address: p.Addr, Engine: string(f)})
	}
	// trtllm-serve's /metrics is JSON: left to detection (which asks
	// /metrics), the scrape fails rather than reading nonsense.
	targets = append(targets, tier1scrape.Target{Name: "trtllm-detected", Address: pods[FlavorTRTLLM].Addr})
	s := tier1scrape.New(ctx, tier1scrape.Options{Logger: quietLogger()})
	defer s.Close()
	s.SetTargets(targets)

	state := func(name string) *tier1scrape.PodState {
		deadline := time.Now().Add(10 * time.Second)
		for {
			if st, ok := s.Get(name); ok && st.Scrapes+st.Errors > 0 {
				return st
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: never scraped", name)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	for f, p := range pods {
		t.Run(string(f), func(t *testing.T) {
			st := state(string(f))
			if st.LastError != "" || st.Engine != string(f) {
				t.Fatalf("scrape: engine %q, error %q", st.Engine, st.LastError)
			}
			eng := p.Stats()
			m := st.Metrics
			if m.Waiting != 0 || m.Running != 0 {
				t.Errorf("idle pod read as waiting %d running %d", m.Waiting, m.Running)
			}
			wantKV := f != FlavorTGI && f != FlavorDynamo
			if m.HasKV != wantKV {
				t.Errorf("HasKV %v, want %v", m.HasKV, wantKV)
			}
			if f != FlavorTGI && (m.BlockSize != eng.BlockSize || m.NumBlocks != eng.NumBlocks) {
				t.Errorf("blocks %d × %d, engine has %d × %d", m.NumBlocks, m.BlockSize, eng.NumBlocks, eng.BlockSize)
			}
			switch f {
			case FlavorVLLM:
				// Nothing runs on a, but it holds a GPU slot.
				if !m.HasLoRA || !slices.Equal(m.ActiveAdapters, []string{"a"}) || !slices.Equal(eng.LoadedAdapters, []string{"a"}) {
					t.Errorf("LoRA %v active %q (engine loaded %q)", m.HasLoRA, m.ActiveAdapters, eng.LoadedAdapters)
				}
			case FlavorVLLMLegacy:
				if !m.HasLoRA || len(m.ActiveAdapters) != 0 {
					t.Errorf("legacy vLLM: LoRA %v active %q, want state without residency", m.HasLoRA, m.ActiveAdapters)
				}
			}
		})
	}
	if st := state("trtllm-detected"); st.LastError == "" || !st.LastSuccess.IsZero() {
		t.Errorf("trtllm-serve scraped on /metrics without error: %+v", st)
	}
}
