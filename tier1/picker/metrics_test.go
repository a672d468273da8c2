package picker

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// randomPods returns n pods with random scraped metrics and router state,
// over two hardware classes.
func randomPods(r *rand.Rand, n int) []*Pod {
	pods := make([]*Pod, n)
	for i := range pods {
		p := mkPod(podN(i))
		p.GPU, p.GPUs = []string{"h100", "a10g"}[i%2], 1
		p.InFlight = r.IntN(12)
		p.InFlightPrefill = r.IntN(p.InFlight + 1)
		p.InFlightUncachedTokens = r.IntN(20000)
		if r.IntN(3) > 0 {
			p.PrefillTokensPerSec = 1000 + 10000*r.Float64()
		}
		for _, m := range []MetricSet{MetricWaiting, MetricRunning, MetricKVUsage, MetricLoRA} {
			perturb(r, p, m)
		}
		pods[i] = p
	}
	return pods
}

// perturb draws new values for the fields of p that metric m covers.
func perturb(r *rand.Rand, p *Pod, m MetricSet) {
	mt := &p.Metrics
	switch m {
	case MetricWaiting:
		mt.Waiting = r.IntN(10)
	case MetricRunning:
		mt.Running = r.IntN(10)
	case MetricKVUsage:
		mt.HasKV = r.IntN(4) > 0
		mt.KVUsage = r.Float64()
		if r.IntN(3) == 0 {
			mt.KVUsage = 0.9 + 0.1*r.Float64() // around kv_full and kv_threshold
		}
	case MetricLoRA:
		all := []string{"a", "b", "c", "d"}
		mt.HasLoRA = r.IntN(4) > 0
		mt.MaxLoras = r.IntN(4)
		mt.ActiveAdapters = nil
		mt.WaitingAdapters = nil
		for _, a := range all {
			switch r.IntN(3) {
			case 0:
				mt.ActiveAdapters = append(mt.ActiveAdapters, a)
			case 1:
				mt.WaitingAdapters = append(mt.WaitingAdapters, a)
			}
		}
	}
}

func clonePods(pods []*Pod) []*Pod {
	out := make([]*Pod, len(pods))
	for i, p := range pods {
		c := *p
		c.Metrics.ActiveAdapters = slices.Clone(p.Metrics.ActiveAdapters)
		c.Metrics.WaitingAdapters = slices.Clone(p.Metrics.WaitingAdapters)
		out[i] = &c
	}
	return out
}

// Every plugin's Consumes is complete: changing a scraped metric a plugin
// does not declare never changes what it returns. The scrape needs of a
// profile are computed from these declarations, so an undeclared read
// would be a metric nobody checks the engine exports.
func TestConsumesCoversWhatPluginsRead(t *testing.T) {
	r := seeded(29)
	for trial := range 300 {
		pods := randomPods(r, 2+r.IntN(7))
		tr := NewTracker(TrackerOptions{})
		hashes := []uint64{uint64(trial) + 1, uint64(trial) + 2, uint64(trial) + 3}
		for i, p := range pods {
			if i%3 == 0 {
				past := &Request{BlockHashes: hashes[:1+i%3], Session: fmt.Sprint("s", i)}
				tr.Dispatched(p.Name, past)
				tr.Done(p.Name, past)
			}
		}
		req := &Request{Model: "llama", PromptTokens: 200 + r.IntN(8000), BlockHashes: hashes,
			Session: fmt.Sprint("s", r.IntN(9)), TTFTSLO: []time.Duration{0, 50 * time.Millisecond, 500 * time.Millisecond}[r.IntN(3)]}
		if r.IntN(2) == 0 {
			req.Adapter = []string{"a", "b", "c", "d", "e"}[r.IntN(5)]
		}
		total := make([]float64, len(pods)) // the earlier scorers' sum, for session-balance
		for i := range total {
			total[i] = float64(r.IntN(3))
		}
		cfg := DefaultProfile()
		bc := buildContext{cfg: cfg, tracker: tr, sat: SaturationDetector{}.withDefaults()}

		for name, spec := range scorerSpecs {
			bc.params = spec.withDefaults(nil)
			sc := spec.build(bc)
			score := func(pods []*Pod) []float64 {
				out := make([]float64, len(pods))
				cs := cycleState{total: slices.Clone(total)}
				sc.Score(&cs, req, pods, out)
				return out
			}
			want := score(pods)
			(AllMetrics &^ sc.Consumes()).Each(func(m MetricSet) {
				changed := clonePods(pods)
				for _, p := range changed {
					perturb(r, p, m)
				}
				if got := score(changed); !slices.Equal(got, want) {
					t.Fatalf("trial %d: scorer %s reads %v, which its Consumes (%v) does not list: %v became %v", trial, name, m, sc.Consumes(), want, got)
				}
			})
		}
		for name, build := range filterFactories {
			f := build(bc)
			want := names(f.Filter(&cycleState{}, req, clonePods(pods)))
			(AllMetrics &^ f.Consumes()).Each(func(m MetricSet) {
				changed := clonePods(pods)
				for _, p := range changed {
					perturb(r, p, m)
				}
				if got := names(f.Filter(&cycleState{}, req, changed)); !slices.Equal(got, want) {
					t.Fatalf("trial %d: filter %s reads %v, which its Consumes (%v) does not list: %v became %v", trial, name, m, f.Consumes(), want, got)
				}
			})
		}
		// The saturation detector every profile has.
		sat := bc.sat
		(AllMetrics &^ saturationMetrics).Each(func(m MetricSet) {
			changed := clonePods(pods)
			for _, p := range changed {
				perturb(r, p, m)
			}
			for i := range pods {
				if sat.Saturated(pods[i]) != sat.Saturated(changed[i]) {
					t.Fatalf("trial %d: the saturation detector reads %v", trial, m)
				}
			}
			if sat.PoolSaturation(pods) != sat.PoolSaturation(changed) {
				t.Fatalf("trial %d: PoolSaturation reads %v", trial, m)
			}
		})
	}
}

// A profile consumes what its plugins and its saturation detector read:
// the built-in profiles' sets, and a scorer that is off adds nothing.
func TestSchedulerConsumes(t *testing.T) {
	tests := []struct {
		name string
		cfg  ProfileConfig
		want MetricSet
	}{
		{"default", DefaultProfile(), AllMetrics},
		{"gie", GIEDefaultProfile(), AllMetrics}, // LoRA through the lora filter
		{"round-robin", RoundRobinProfile(), MetricWaiting | MetricRunning | MetricKVUsage},
		{"kv-cache only, no lora filter", ProfileConfig{Base: BaseEmpty, Filters: []string{FilterModel},
			Scorers: []ScorerConfig{{Name: ScorerKVCache, Weight: 1}}}, saturationMetrics},
		{"lora-affinity off", DefaultProfile().WithWeight(ScorerLoRAAffinity, 0), AllMetrics},
		{"no lora plugin at all", ProfileConfig{Base: BaseEmpty, Filters: []string{FilterModel, FilterReady},
			Scorers: []ScorerConfig{{Name: ScorerLoRAAffinity, Weight: 0}, {Name: ScorerPrefix, Weight: 1}}}, saturationMetrics},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := mustScheduler(t, tt.cfg, Options{})
			if got := s.Consumes(); got != tt.want {
				t.Errorf("Consumes() = %v, want %v", got, tt.want)
			}
		})
	}
	if got := (MetricWaiting | MetricLoRA).String(); got != "waiting|lora" {
		t.Errorf("String() = %q", got)
	}
}
