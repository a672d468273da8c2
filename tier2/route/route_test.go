package route

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/infergate/infergate/shared/cluster"
	"github.com/infergate/infergate/tier2/discovery"
)

type staticSource []discovery.Cluster

func (s staticSource) Clusters() []discovery.Cluster { return s }

func newTestRouter(t testing.TB, cs []discovery.Cluster, mod func(*Options)) (*Router, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	o := Options{Region: "east", RegionOrder: []string{"west", "eu"}, Registry: reg,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), PollInterval: time.Hour}
	if mod != nil {
		mod(&o)
	}
	r, err := New(staticSource(cs), o)
	if err != nil {
		t.Fatal(err)
	}
	return r, reg
}

func cl(name, region string, cost float64, capacity int) discovery.Cluster {
	return discovery.Cluster{ID: name, Name: name, Region: region, Address: "http://127.0.0.1:1", Models: []string{"m"},
		Cost: cost, CostUnit: "gpu-hour", Capacity: capacity}
}

func load(running, queue, ready int, kv float64) *cluster.LoadSummary {
	return &cluster.LoadSummary{Models: map[string]cluster.ModelLoad{"m": {ReadyPods: ready, Pods: ready, Running: running, Queue: queue, KVHeadroom: kv}}}
}

func names(cs []Candidate) string {
	var out []string
	for _, c := range cs {
		out = append(out, c.Cluster.Name)
	}
	return strings.Join(out, ",")
}

func TestPlanOrder(t *testing.T) {
	f := func(v float64) *float64 { return &v }
	for _, tc := range []struct {
		name       string
		clusters   []discovery.Cluster
		loads      map[string]*cluster.LoadSummary
		req        Request
		overrides  map[string]Override
		want       string
		wantReason string
		wantErr    error
	}{
		{
			name:     "cost-first picks the cheapest, fails over in its region first",
			clusters: []discovery.Cluster{cl("e-dear", "east", 3, 10), cl("w-cheap", "west", 1, 10), cl("w-mid", "west", 2, 10), cl("e-mid", "east", 2, 10)},
			want:     "w-cheap,w-mid,e-mid,e-dear", wantReason: ReasonCheapest,
		},
		{
			name:     "cost ties go to the own region",
			clusters: []discovery.Cluster{cl("w", "west", 1, 10), cl("e", "east", 1, 10)},
			want:     "e,w", wantReason: ReasonCheapest,
		},
		{
			name:     "over the spill threshold the next cheapest takes over",
			clusters: []discovery.Cluster{cl("cheap", "east", 1, 10), cl("dear", "east", 2, 10)},
			loads:    map[string]*cluster.LoadSummary{"cheap": load(8, 1, 2, 0.5), "dear": load(0, 0, 2, 1)},
			want:     "dear,cheap", wantReason: ReasonSpill,
		},
		{
			name:     "KV pressure counts as load",
			clusters: []discovery.Cluster{cl("cheap", "east", 1, 0), cl("dear", "east", 2, 0)},
			loads:    map[string]*cluster.LoadSummary{"cheap": load(1, 0, 2, 0.1), "dear": load(0, 0, 2, 1)},
			want:     "dear,cheap", wantReason: ReasonSpill,
		},
		{
			name:     "saturated and pod-less clusters are last resort",
			clusters: []discovery.Cluster{cl("a", "east", 1, 10), cl("b", "east", 2, 10), cl("c", "west", 3, 10)},
			loads:    map[string]*cluster.LoadSummary{"a": load(0, 0, 0, 1), "b": {Models: map[string]cluster.ModelLoad{"m": {ReadyPods: 1, KVHeadroom: 1, Saturated: true}}}, "c": load(0, 0, 1, 1)},
			want:     "c,a,b", wantReason: ReasonSpill,
		},
		{
			name:     "everything full: degraded pick",
			clusters: []discovery.Cluster{cl("a", "east", 1, 10), cl("b", "east", 2, 10)},
			loads:    map[string]*cluster.LoadSummary{"a": load(9, 0, 1, 1), "b": load(9, 0, 1, 1)},
			want:     "a,b", wantReason: ReasonDegraded,
		},
		{
			name:     "latency-first prefers the own region, then the least loaded",
			clusters: []discovery.Cluster{cl("w", "west", 1, 10), cl("e1", "east", 5, 10), cl("e2", "east", 4, 10)},
			loads:    map[string]*cluster.LoadSummary{"e1": load(1, 0, 1, 1), "e2": load(5, 0, 1, 1), "w": load(0, 0, 1, 1)},
			req:      Request{Policy: LatencyFirst},
			want:     "e1,e2,w", wantReason: ReasonLocal,
		},
		{
			name:     "latency-first leaves the region when it is full",
			clusters: []discovery.Cluster{cl("w", "west", 1, 10), cl("e", "east", 5, 10)},
			loads:    map[string]*cluster.LoadSummary{"e": load(9, 0, 1, 1), "w": load(0, 0, 1, 1)},
			req:      Request{Policy: LatencyFirst},
			want:     "w,e", wantReason: ReasonRemote,
		},
		{
			name:     "region-pinned never leaves its region",
			clusters: []discovery.Cluster{cl("e", "east", 1, 10), cl("w1", "west", 3, 10), cl("w2", "west", 2, 10)},
			req:      Request{Policy: RegionPinned, Region: "west"},
			want:     "w2,w1", wantReason: ReasonPinned,
		},
		{
			name:     "region-pinned with its region gone has no candidates",
			clusters: []discovery.Cluster{cl("e", "east", 1, 10)},
			req:      Request{Policy: RegionPinned, Region: "west"},
			wantErr:  ErrNoCandidates,
		},
		{
			name:      "drained clusters get nothing; cost override reorders",
			clusters:  []discovery.Cluster{cl("a", "east", 1, 10), cl("b", "east", 2, 10), cl("c", "east", 3, 10)},
			overrides: map[string]Override{"a": {Drain: true}, "c": {Cost: f(0.5)}},
			want:      "c,b", wantReason: ReasonCheapest,
		},
		{
			name:      "weight 0 is last resort",
			clusters:  []discovery.Cluster{cl("a", "east", 1, 10), cl("b", "east", 2, 10)},
			overrides: map[string]Override{"a": {Weight: f(0)}},
			want:      "b,a", wantReason: ReasonSpill,
		},
		{
			name:     "all drained",
			clusters: []discovery.Cluster{cl("a", "east", 1, 10)}, overrides: map[string]Override{"a": {Drain: true}},
			wantErr: ErrNoCandidates,
		},
		{
			name:     "unknown model",
			clusters: []discovery.Cluster{cl("a", "east", 1, 10)}, req: Request{Model: "other"},
			wantErr: ErrUnknownModel,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, _ := newTestRouter(t, tc.clusters, func(o *Options) {
				o.Overrides = func() map[string]Override { return tc.overrides }
			})
			for _, c := range tc.clusters {
				if s := tc.loads[c.Name]; s != nil {
					r.store(c, s, nil)
				}
			}
			req := tc.req
			if req.Model == "" {
				req.Model = "m"
			}
			got, err := r.Plan(req)
			if tc.wantErr != nil {
				if !errors.Is(err, tc.wantErr) {
					t.Fatalf("err = %v, want %v", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if names(got) != tc.want {
				t.Errorf("order = %s, want %s", names(got), tc.want)
			}
			if got[0].Reason != tc.wantReason {
				t.Errorf("reason = %s, want %s", got[0].Reason, tc.wantReason)
			}
			for _, c := range got[1:] {
				if c.Reason != ReasonFailover {
					t.Errorf("%s reason = %s, want failover", c.Cluster.Name, c.Reason)
				}
			}
		})
	}
}

// Requests dispatched since the last summary count towards utilisation, so
// a burst spills before the next poll.
func TestSpillBetweenPolls(t *testing.T) {
	cs := []discovery.Cluster{cl("cheap", "east", 1, 5), cl("dear", "east", 2, 100)}
	r, _ := newTestRouter(t, cs, nil)
	r.store(cs[0], load(0, 0, 1, 1), nil)
	r.store(cs[1], load(0, 0, 1, 1), nil)
	got := map[string]int{}
	for range 10 {
		plan, err := r.Plan(Request{Model: "m"})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := r.Begin(plan[0], "m"); err != nil {
			t.Fatal(err)
		}
		got[plan[0].Cluster.Name]++
	}
	// 4 of 5 slots is the 0.8 spill threshold.
	if got["cheap"] != 4 || got["dear"] != 6 {
		t.Fatalf("dispatches = %v, want cheap 4, dear 6", got)
	}
	// A new summary resets the estimate.
	r.store(cs[0], load(0, 0, 1, 1), nil)
	plan, _ := r.Plan(Request{Model: "m"})
	if plan[0].Cluster.Name != "cheap" {
		t.Fatalf("after a fresh summary, pick = %s", plan[0].Cluster.Name)
	}
}

func TestBreaker(t *testing.T) {
	cs := []discovery.Cluster{cl("a", "east", 1, 100), cl("b", "east", 2, 100)}
	r, _ := newTestRouter(t, cs, func(o *Options) {
		// The breaker turns half-open when it is read past OpenTimeout,
		// so every check of the open breaker must run within it: a
		// second, not tens of milliseconds that a stall under the race
		// detector on a loaded machine can outlast.
		o.Breaker = BreakerOptions{ConsecutiveFailures: 3, OpenTimeout: time.Second}
	})
	cand := func() Candidate {
		plan, err := r.Plan(Request{Model: "m"})
		if err != nil {
			t.Fatal(err)
		}
		return plan[0]
	}
	// Client cancellations and 4xx do not trip it.
	for _, err := range []error{ErrClientCanceled, &StatusError{Code: 400}, &StatusError{Code: 429}, ErrClientCanceled} {
		a, err2 := r.Begin(cand(), "m")
		if err2 != nil {
			t.Fatal(err2)
		}
		a.Done(err)
	}
	if s := r.BreakerState("a", "m"); s != "closed" {
		t.Fatalf("after excluded errors, breaker = %s", s)
	}
	for range 3 {
		a, err := r.Begin(Candidate{Cluster: cs[0], Reason: ReasonCheapest}, "m")
		if err != nil {
			t.Fatal(err)
		}
		a.Done(&StatusError{Code: 503})
	}
	if s := r.BreakerState("a", "m"); s != "open" {
		t.Fatalf("after 3 failures, breaker = %s", s)
	}
	if c := cand(); c.Cluster.Name != "b" {
		t.Fatalf("open breaker: pick = %s, want b", c.Cluster.Name)
	}
	if _, err := r.Begin(Candidate{Cluster: cs[0]}, "m"); !errors.Is(err, ErrBreakerOpen) {
		t.Fatalf("Begin on open breaker: %v", err)
	}
	// Wait for the open timeout (to a deadline) rather than sleep a
	// fixed time past it.
	for deadline := time.Now().Add(10 * time.Second); r.BreakerState("a", "m") == "open" && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
	}
	if s := r.BreakerState("a", "m"); s != "half-open" {
		t.Fatalf("after the open timeout, breaker = %s", s)
	}
	// Half-open keeps its place: the next request is the probe, and only
	// one probe runs at a time.
	plan, _ := r.Plan(Request{Model: "m"})
	if names(plan) != "a,b" {
		t.Fatalf("half-open plan = %s", names(plan))
	}
	probe, err := r.Begin(plan[0], "m")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.Begin(plan[0], "m"); !errors.Is(err, ErrBreakerOpen) {
		t.Fatalf("second concurrent probe: %v, want ErrBreakerOpen", err)
	}
	probe.Done(nil)
	if s := r.BreakerState("a", "m"); s != "closed" {
		t.Fatalf("after a good probe, breaker = %s", s)
	}
	if c := cand(); c.Cluster.Name != "a" {
		t.Fatalf("recovered: pick = %s, want a", c.Cluster.Name)
	}
	if bs := r.Breakers(); len(bs) != 2 || bs[0].Cluster != "a" || bs[0].State != "closed" {
		t.Fatalf("Breakers() = %+v", bs)
	}

	// Failed load polls count too: an unreachable cluster trips its
	// breakers without any request going there.
	for range 3 {
		r.store(cs[0], nil, errors.New("connection refused"))
	}
	if s := r.BreakerState("a", "m"); s != "open" {
		t.Fatalf("after 3 failed polls, breaker = %s", s)
	}
}

func TestLatencyObjective(t *testing.T) {
	cs := []discovery.Cluster{cl("cheap", "east", 1, 100), cl("dear", "east", 2, 100)}
	r, _ := newTestRouter(t, cs, func(o *Options) { o.LatencyObjective = 500 * time.Millisecond })
	a, _ := r.Begin(Candidate{Cluster: cs[0]}, "m")
	a.FirstToken(2 * time.Second)
	a.Done(nil)
	plan, _ := r.Plan(Request{Model: "m"})
	if names(plan) != "dear,cheap" || plan[0].Reason != ReasonSpill {
		t.Fatalf("slow cheap cluster: plan = %s (%s)", names(plan), plan[0].Reason)
	}
}

func TestCostUnits(t *testing.T) {
	gpu := cl("gpu", "east", 4, 10) // $4/GPU-hour at 1000 tok/s = $1.11/Mtok
	tok := cl("tok", "east", 1.5, 10)
	tok.CostUnit = "mtok"
	r, _ := newTestRouter(t, []discovery.Cluster{tok, gpu}, func(o *Options) { o.TokensPerGPUSecond = 1000 })
	plan, _ := r.Plan(Request{Model: "m"})
	if names(plan) != "gpu,tok" {
		t.Fatalf("plan = %s, want gpu first", names(plan))
	}
}

func TestParsePolicy(t *testing.T) {
	for in, want := range map[string]Policy{"": CostFirst, "cost-first": CostFirst, "latency-first": LatencyFirst, "region-pinned": RegionPinned} {
		got, err := ParsePolicy(in, CostFirst)
		if err != nil || got != want {
			t.Errorf("ParsePolicy(%q) = %v, %v", in, got, err)
		}
	}
	if _, err := ParsePolicy("cheapest", CostFirst); err == nil {
		t.Error("want an error for an unknown policy")
	}
}

// BenchmarkPlan: planning one request over N clusters in 4 regions with
// fresh load summaries.
//
//	go test -run '^$' -bench Plan -benchmem ./tier2/route
func BenchmarkPlan(b *testing.B) {
	for _, n := range []int{4, 40} {
		b.Run(fmt.Sprintf("clusters=%d", n), func(b *testing.B) {
			var cs []discovery.Cluster
			regions := []string{"east", "west", "eu", "ap"}
			for i := range n {
				cs = append(cs, cl(fmt.Sprintf("c%02d", i), regions[i%4], float64(1+i%7), 100))
			}
			r, _ := newTestRouter(b, cs, nil)
			for i, c := range cs {
				r.store(c, load(i%50, i%5, 4, 0.5), nil)
			}
			b.ReportAllocs()
			b.ResetTimer()
			cpu0 := cpuTime()
			for range b.N {
				if _, err := r.Plan(Request{Model: "m"}); err != nil {
					b.Fatal(err)
				}
			}
			// CPU time per op: on a shared, overloaded machine wall time
			// mostly measures waiting for a core.
			b.ReportMetric(float64((cpuTime()-cpu0).Nanoseconds())/float64(b.N), "cpu-ns/op")
		})
	}
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BaseModel learns adapters from load summaries; configured ones win.
func TestBaseModel(t *testing.T) {
	cs := []discovery.Cluster{cl("a", "east", 1, 10)}
	r, _ := newTestRouter(t, cs, func(o *Options) { o.Adapters = map[string]string{"cfg-lora": "cfg-base"} })
	if got := r.BaseModel("m-sql"); got != "" {
		t.Fatalf("before any summary: %q", got)
	}
	r.store(cs[0], &cluster.LoadSummary{Models: map[string]cluster.ModelLoad{
		"m": {ReadyPods: 1}, "m-sql": {ReadyPods: 1, Base: "m"}}}, nil)
	for model, want := range map[string]string{"m-sql": "m", "m": "", "cfg-lora": "cfg-base", "unknown": ""} {
		if got := r.BaseModel(model); got != want {
			t.Errorf("BaseModel(%q) = %q, want %q", model, got, want)
		}
	}
}

// TestWarnUnservedModels: a cluster entry that names a model its Tier 1's
// summary lacks is logged once per change of that set, naming the models
// on both sides; a summary that serves them all is quiet.
func TestWarnUnservedModels(t *testing.T) {
	var logs strings.Builder
	c := cl("east-a", "east", 1, 10)
	c.Models = []string{"m", "llama-3.1-8b"}
	r, _ := newTestRouter(t, []discovery.Cluster{c}, func(o *Options) {
		o.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	})
	const warn = "cluster lists models its tier1 does not serve"
	for _, tc := range []struct {
		served []string
		warns  int // total warnings after this summary
		names  string
	}{
		{served: []string{"m", "llama-3.1-8b"}, warns: 0},
		{served: []string{"m", "meta-llama/Llama-3.1-8B-Instruct"}, warns: 1, names: "models=[llama-3.1-8b]"},
		{served: []string{"m", "meta-llama/Llama-3.1-8B-Instruct"}, warns: 1}, // same set: no repeat
		{served: []string{"qwen"}, warns: 2, names: "models=\"[m llama-3.1-8b]\""},
		{served: []string{"m", "llama-3.1-8b"}, warns: 2}, // agreement again: quiet
		{served: []string{"m"}, warns: 3, names: "tier1_serves=[m]"},
	} {
		sum := &cluster.LoadSummary{Models: map[string]cluster.ModelLoad{}}
		for _, m := range tc.served {
			sum.Models[m] = cluster.ModelLoad{ReadyPods: 1, Pods: 1}
		}
		r.store(c, sum, nil)
		if got := strings.Count(logs.String(), warn); got != tc.warns {
			t.Fatalf("after a summary serving %v: %d warnings, want %d:\n%s", tc.served, got, tc.warns, logs.String())
		}
		if tc.names != "" {
			lines := strings.Split(strings.TrimSpace(logs.String()), "\n")
			if last := lines[len(lines)-1]; !strings.Contains(last, tc.names) {
				t.Fatalf("warning %q lacks %s", last, tc.names)
			}
		}
	}
}
