package picker

import (
	"fmt"
	"math/rand/v2"
	"testing"
)

// mkPod returns a ready, fresh pod serving "llama" with KV usage exported.
func mkPod(name string, mods ...func(*Pod)) *Pod {
	p := &Pod{
		Name: name, Address: name + ":8000", Pool: "pool", BaseModel: "llama",
		Engine: "vllm", Ready: true, MetricsAge: 10 * 1e6,
		Metrics: Metrics{HasKV: true},
	}
	for _, m := range mods {
		m(p)
	}
	return p
}

func waiting(n int) func(*Pod)     { return func(p *Pod) { p.Metrics.Waiting = n } }
func running(n int) func(*Pod)     { return func(p *Pod) { p.Metrics.Running = n } }
func kv(u float64) func(*Pod)      { return func(p *Pod) { p.Metrics.KVUsage = u } }
func inflight(n int) func(*Pod)    { return func(p *Pod) { p.InFlight = n } }
func prefill(v float64) func(*Pod) { return func(p *Pod) { p.PrefillTokensPerSec = v } }

// queued gives the pod one router-sent request with tokens of uncached
// prefill still in flight.
func queued(tokens int) func(*Pod) {
	return func(p *Pod) { p.InFlightUncachedTokens, p.InFlightPrefill, p.InFlight = tokens, 1, 1 }
}

func names(pods []*Pod) []string {
	out := make([]string, len(pods))
	for i, p := range pods {
		out[i] = p.Name
	}
	return out
}

func seeded(seed uint64) *rand.Rand { return rand.New(rand.NewPCG(seed, seed)) }

func mustScheduler(t testing.TB, cfg ProfileConfig, opts Options) *Scheduler {
	t.Helper()
	s, err := NewScheduler(cfg, opts)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// scoreOnly runs one scorer from a profile on pods and returns its scores.
func scoreOnly(t *testing.T, name string, params map[string]float64, tr *Tracker, req *Request, pods []*Pod) []float64 {
	t.Helper()
	spec, ok := scorerSpecs[name]
	if !ok {
		t.Fatalf("no scorer %q", name)
	}
	bc := buildContext{tracker: tr, params: spec.withDefaults(params)}
	out := make([]float64, len(pods))
	var cs cycleState
	spec.build(bc).Score(&cs, req, pods, out)
	for i, v := range out {
		if !(v >= 0 && v <= 1) {
			t.Fatalf("%s: score[%d] = %v outside [0,1]", name, i, v)
		}
	}
	return out
}

func podN(i int) string { return fmt.Sprintf("pod-%03d", i) }
