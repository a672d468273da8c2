package picker

import (
	"bytes"
	"fmt"
	"math"
	"slices"
	"testing"
	"time"

	"github.com/infergate/infergate/tier1/prefix"
)

func approx(a, b []float64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if math.Abs(a[i]-b[i]) > 1e-9 {
			return false
		}
	}
	return true
}

func TestLoadScorers(t *testing.T) {
	noKV := func(p *Pod) { p.Metrics.HasKV = false }
	tests := []struct {
		name   string
		scorer string
		pods   []*Pod
		want   []float64
	}{
		{"queue min-max", ScorerQueue, []*Pod{mkPod("a", waiting(0)), mkPod("b", waiting(5)), mkPod("c", waiting(10))}, []float64{1, 0.5, 0}},
		{"queue all equal", ScorerQueue, []*Pod{mkPod("a", waiting(3)), mkPod("b", waiting(3))}, []float64{1, 1}},
		{"queue counts router in-flight beyond running", ScorerQueue,
			// b's scrape says idle, but the router sent it 6 requests since.
			[]*Pod{mkPod("a", waiting(2), running(4), inflight(6)), mkPod("b", inflight(6))}, []float64{1, 0}},
		{"queue single pod", ScorerQueue, []*Pod{mkPod("a", waiting(9))}, []float64{1}},
		{"kv", ScorerKVCache, []*Pod{mkPod("a", kv(0)), mkPod("b", kv(0.25)), mkPod("c", kv(1))}, []float64{1, 0.75, 0}},
		{"kv out of range clamped", ScorerKVCache, []*Pod{mkPod("a", kv(-0.5)), mkPod("b", kv(1.5))}, []float64{1, 0}},
		{"kv missing is neutral", ScorerKVCache, []*Pod{mkPod("a", kv(0.2)), mkPod("b", kv(0.6)), mkPod("c", noKV)}, []float64{0.8, 0.4, 0.6}},
		{"kv none exported", ScorerKVCache, []*Pod{mkPod("a", noKV), mkPod("b", noKV)}, []float64{0.5, 0.5}},
		{"running", ScorerRunning, []*Pod{mkPod("a", running(10)), mkPod("b", running(30))}, []float64{1, 0}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := scoreOnly(t, tt.scorer, nil, nil, &Request{}, tt.pods)
			if !approx(got, tt.want) {
				t.Fatalf("got %v, want %v", got, tt.want)
			}
		})
	}
}

func TestLoRAAffinityScorer(t *testing.T) {
	lora := func(active, waiting []string, maxLoras int) func(*Pod) {
		return func(p *Pod) {
			p.Metrics.HasLoRA = true
			p.Metrics.ActiveAdapters, p.Metrics.WaitingAdapters, p.Metrics.MaxLoras = active, waiting, maxLoras
		}
	}
	tests := []struct {
		name    string
		adapter string
		pods    []*Pod
		want    []float64
	}{
		{"no adapter: neutral", "", []*Pod{mkPod("a"), mkPod("b", lora([]string{"x"}, nil, 1))}, []float64{1, 1}},
		{"locality order", "x", []*Pod{
			mkPod("active", lora([]string{"x"}, nil, 2)),
			mkPod("waiting", lora(nil, []string{"x"}, 2)),
			mkPod("free", lora([]string{"y"}, nil, 2)),
			mkPod("unknown"),
			mkPod("swap", lora([]string{"y", "z"}, nil, 2)),
		}, []float64{1, 0.8, 0.6, 0.5, 0}},
		{"none has it: most capacity", "x", []*Pod{
			mkPod("busy-free-slot", lora([]string{"y"}, nil, 2), running(20)),
			mkPod("idle-free-slot", lora([]string{"y"}, nil, 2), running(0)),
			mkPod("idle-full", lora([]string{"y", "z"}, nil, 2), running(0)),
		}, []float64{0.5, 1, 0.5}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := scoreOnly(t, ScorerLoRAAffinity, nil, nil, &Request{Adapter: tt.adapter}, tt.pods)
			if !approx(got, tt.want) {
				t.Fatalf("got %v, want %v", got, tt.want)
			}
		})
	}
}

// hashes returns n distinct chained blocks whose first `shared` equal
// those of every other call with the same shared count.
func hashes(shared, n int, salt string) []uint64 {
	text := bytes.Repeat([]byte("S"), 64*shared)
	text = append(text, bytes.Repeat([]byte(salt+"-"), 64*n)...)
	return prefix.Hash("llama", text, 64, shared+n, nil)
}

func TestPrefixScorer(t *testing.T) {
	h := hashes(20, 20, "a") // 40 blocks
	tests := []struct {
		name   string
		params map[string]float64
		req    []uint64
		record map[string][]uint64
		pods   []*Pod
		want   []float64
	}{
		{"ratio", nil, h, map[string][]uint64{"a": h, "b": h[:10]},
			[]*Pod{mkPod("a"), mkPod("b"), mkPod("c")}, []float64{1, 0.25, 0}},
		{"no hashes: no signal", nil, nil, map[string][]uint64{"a": h},
			[]*Pod{mkPod("a"), mkPod("b")}, []float64{0, 0}},
		{"short prompt scaled", nil, h[:4], map[string][]uint64{"a": h},
			[]*Pod{mkPod("a"), mkPod("b")}, []float64{0.25, 0}},
		{"short prompt scaling off (GIE)", map[string]float64{ParamShortPromptBlocks: 0}, h[:4], map[string][]uint64{"a": h},
			[]*Pod{mkPod("a"), mkPod("b")}, []float64{1, 0}},
		{"guard: overloaded favourite discounted", nil, h, map[string][]uint64{"a": h, "b": h[:20]},
			[]*Pod{mkPod("a", waiting(20), running(10)), mkPod("b", running(2))}, []float64{0, 0.5}},
		{"guard: mild imbalance tolerated", nil, h, map[string][]uint64{"a": h, "b": h[:20]},
			[]*Pod{mkPod("a", running(8)), mkPod("b", running(4))}, []float64{1, 0.5}},
		{"guard off (GIE)", map[string]float64{ParamGuardDiscount: 1}, h, map[string][]uint64{"a": h},
			[]*Pod{mkPod("a", waiting(50)), mkPod("b")}, []float64{1, 0}},
		{"guard counts router in-flight", nil, h, map[string][]uint64{"a": h},
			[]*Pod{mkPod("a", inflight(30)), mkPod("b", inflight(2))}, []float64{0, 0}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tr := NewTracker(TrackerOptions{Index: exactIndex})
			for pod, hs := range tt.record {
				tr.Index().Record(pod, hs)
			}
			got := scoreOnly(t, ScorerPrefix, tt.params, tr, &Request{BlockHashes: tt.req}, tt.pods)
			if !approx(got, tt.want) {
				t.Fatalf("got %v, want %v", got, tt.want)
			}
		})
	}
	// Only the first 40 of the prompt's 100 blocks were hashed: holding
	// all 40 is holding 40% of the prompt, not all of it.
	t.Run("long prompt: share of the whole prompt", func(t *testing.T) {
		tr := NewTracker(TrackerOptions{Index: exactIndex})
		tr.Index().Record("a", h)
		tr.Index().Record("b", h[:10])
		got := scoreOnly(t, ScorerPrefix, nil, tr, &Request{BlockHashes: h, PromptBlocks: 100}, []*Pod{mkPod("a"), mkPod("b"), mkPod("c")})
		if want := []float64{0.4, 0.1, 0}; !approx(got, want) {
			t.Fatalf("got %v, want %v", got, want)
		}
	})
	t.Run("no tracker", func(t *testing.T) {
		got := scoreOnly(t, ScorerPrefix, nil, nil, &Request{BlockHashes: h}, []*Pod{mkPod("a")})
		if got[0] != 0 {
			t.Fatalf("got %v", got)
		}
	})
}

func TestPredictedLatencyScorer(t *testing.T) {
	h := hashes(0, 64, "x")
	tests := []struct {
		name   string
		req    Request
		record map[string][]uint64
		pods   []*Pod
		want   []float64 // nil: check order only
		best   string
	}{
		{"fast prefill wins", Request{PromptTokens: 4000},
			nil, []*Pod{mkPod("slow", prefill(4000)), mkPod("fast", prefill(20000))}, nil, "fast"},
		{"queued prefill counts", Request{PromptTokens: 1000},
			nil, []*Pod{
				mkPod("fast-busy", prefill(20000), func(p *Pod) { p.InFlightUncachedTokens = 200000 }),
				mkPod("slow-idle", prefill(5000)),
			}, nil, "slow-idle"},
		{"unseen waiting requests count", Request{PromptTokens: 1000},
			nil, []*Pod{mkPod("a", prefill(10000), waiting(10)), mkPod("b", prefill(10000))}, nil, "b"},
		{"cached prefix counts", Request{PromptTokens: 8000, BlockHashes: h},
			map[string][]uint64{"cached": h}, []*Pod{mkPod("cold", prefill(10000)), mkPod("cached", prefill(8000))}, nil, "cached"},
		// 64 of 256 blocks hashed and cached: 6,000 tokens still to compute
		// at 7,000/s against 8,000 at 10,000/s on the cold pod. Taking the
		// hashed window for the whole prompt would pick the cached pod.
		{"long prompt: unhashed rest is uncached", Request{PromptTokens: 8000, BlockHashes: h, PromptBlocks: 256},
			map[string][]uint64{"cached": h}, []*Pod{mkPod("cold", prefill(10000)), mkPod("cached", prefill(7000))}, nil, "cold"},
		{"unknown speed uses candidates' mean", Request{PromptTokens: 1000},
			nil, []*Pod{mkPod("a", prefill(10000)), mkPod("b"), mkPod("c", prefill(30000))}, nil, "c"},
		{"SLO misses score 0", Request{PromptTokens: 10000, TTFTSLO: 600 * time.Millisecond},
			nil, []*Pod{mkPod("a", prefill(20000)), mkPod("b", prefill(10000))}, []float64{1, 0}, "a"},
		{"SLO missed everywhere: relative", Request{PromptTokens: 10000, TTFTSLO: 10 * time.Millisecond},
			nil, []*Pod{mkPod("a", prefill(20000)), mkPod("b", prefill(10000))}, nil, "a"},
		{"equal pods", Request{PromptTokens: 100},
			nil, []*Pod{mkPod("a"), mkPod("b")}, []float64{1, 1}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tr := NewTracker(TrackerOptions{})
			for pod, hs := range tt.record {
				tr.Index().Record(pod, hs)
			}
			got := scoreOnly(t, ScorerPredictedLatency, nil, tr, &tt.req, tt.pods)
			if tt.want != nil && !approx(got, tt.want) {
				t.Fatalf("got %v, want %v", got, tt.want)
			}
			if tt.best != "" {
				bi := slices.Index(got, slices.Max(got))
				if tt.pods[bi].Name != tt.best || slices.Max(got) != 1 {
					t.Fatalf("scores %v: best %s, want %s scoring 1", got, tt.pods[bi].Name, tt.best)
				}
				if slices.Min(got) >= 1 {
					t.Fatalf("scores %v: no preference", got)
				}
			}
		})
	}
}

// TestPredictedLatencyMemoryBound: a pod whose KV cache is at least
// kv_full full loses a request it holds cached to a cold pod with room,
// since vLLM would make the request wait for running ones to finish; below
// the threshold, with the check off, or without KV metrics the cache wins.
func TestPredictedLatencyMemoryBound(t *testing.T) {
	h := hashes(0, 64, "x")
	req := Request{PromptTokens: 1024, BlockHashes: h}
	tests := []struct {
		name     string
		params   map[string]float64
		cachedKV float64
		hasKV    bool
		best     string
	}{
		{"full pod loses its cache", nil, 0.97, true, "cold"},
		{"at the threshold", nil, 0.95, true, "cold"},
		{"below the threshold", nil, 0.94, true, "cached"},
		{"check off", map[string]float64{ParamKVFull: 0}, 0.99, true, "cached"},
		{"lower threshold", map[string]float64{ParamKVFull: 0.9}, 0.92, true, "cold"},
		{"wait too short to matter", map[string]float64{ParamKVFullWaitMs: 10}, 0.99, true, "cached"},
		{"no KV metrics", nil, 0.99, false, "cached"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tr := NewTracker(TrackerOptions{})
			tr.Index().Record("cached", h)
			// 1,024 tokens at 10,000/s cold: 102 ms plus overhead.
			pods := []*Pod{
				mkPod("cold", prefill(10000), kv(0.5)),
				mkPod("cached", prefill(10000), kv(tt.cachedKV), func(p *Pod) { p.Metrics.HasKV = tt.hasKV }),
			}
			got := scoreOnly(t, ScorerPredictedLatency, tt.params, tr, &req, pods)
			bi := slices.Index(got, slices.Max(got))
			if pods[bi].Name != tt.best || got[0] == got[1] {
				t.Fatalf("scores %v: best %s, want %s", got, pods[bi].Name, tt.best)
			}
		})
	}
}

// TestSLOMissKeepsOrder: whatever slo_miss_score is, a pod predicted to
// meet the TTFT SLO outranks every pod predicted to miss it, even a slow
// one that only just meets it against a fast leader (the case a constant
// miss score of 0.5 got wrong), and misses keep their relative order.
func TestSLOMissKeepsOrder(t *testing.T) {
	req := Request{PromptTokens: 10000, TTFTSLO: 600 * time.Millisecond}
	pods := []*Pod{
		mkPod("fast", prefill(50000)),  // 0.205 s: meets
		mkPod("slow", prefill(17000)),  // 0.593 s: just meets
		mkPod("miss", prefill(16000)),  // 0.630 s: just misses
		mkPod("worse", prefill(10000)), // 1.005 s: misses by more
	}
	for _, ms := range []float64{0, 0.1, 0.25, 0.5, 0.9, 1, 3} {
		t.Run(fmt.Sprint(ms), func(t *testing.T) {
			got := scoreOnly(t, ScorerPredictedLatency, map[string]float64{ParamSLOMissScore: ms}, nil, &req, pods)
			if !(got[0] > got[1] && got[1] > got[2]) {
				t.Fatalf("scores %v: want fast > slow (meets) > miss", got)
			}
			if ms > 0 && !(got[2] > got[3]) {
				t.Fatalf("scores %v: misses lost their order", got)
			}
			// Through the scheduler at any weight, alone or beside an equal
			// kv-cache scorer, the pick is never a pod that misses.
			for _, w := range []float64{0.5, 1, 5, 20} {
				c := ProfileConfig{Base: BaseEmpty, Filters: []string{}, Picker: PickerMaxScore, MaxRanked: -1,
					Scorers: []ScorerConfig{{Name: ScorerPredictedLatency, Weight: w, Params: map[string]float64{ParamSLOMissScore: ms}}, {Name: ScorerKVCache, Weight: 1}}}
				s, err := NewScheduler(c, Options{})
				if err != nil {
					t.Fatal(err)
				}
				var res Result
				if err := s.ScheduleInto(&res, &req, pods); err != nil {
					t.Fatal(err)
				}
				for i, p := range res.Ranked[:2] {
					if p.Name == "miss" || p.Name == "worse" {
						t.Fatalf("weight %v: rank %d is %s, which misses the SLO", w, i, p.Name)
					}
				}
			}
		})
	}
}

// TestScoresInRange feeds every scorer adversarial pods and checks [0,1].
func TestScoresInRange(t *testing.T) {
	h := hashes(8, 8, "r")
	tr := NewTracker(TrackerOptions{})
	tr.Index().Record("p0", h)
	var pods []*Pod
	for i := range 12 {
		pods = append(pods, mkPod(fmt.Sprintf("p%d", i), waiting(i*7%5), running(-i), kv(float64(i)/5-0.5),
			inflight(i*3), prefill(float64(i-3)*1000), func(p *Pod) {
				p.Metrics.HasKV = i%3 != 0
				p.InFlightUncachedTokens = i * 1000
			}))
	}
	reqs := []*Request{
		{}, {PromptTokens: -5}, {PromptTokens: 5000, BlockHashes: h, Adapter: "x", TTFTSLO: time.Millisecond},
	}
	for name := range scorerSpecs {
		for _, req := range reqs {
			scoreOnly(t, name, nil, tr, req, pods) // checks the range
		}
	}
}
