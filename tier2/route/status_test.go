package route

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/infergate/infergate/shared/cluster"
	"github.com/infergate/infergate/tier2/discovery"
)

// trip opens the breaker of (c, "m") with failed attempts.
func trip(t *testing.T, r *Router, c discovery.Cluster) {
	t.Helper()
	for i := 0; i < 3; i++ {
		a, err := r.Begin(Candidate{Cluster: c}, "m")
		if err != nil {
			return // already open
		}
		a.Done(errors.New("connection refused"))
	}
	if got := r.BreakerState(c.ID, "m"); got != "open" {
		t.Fatalf("breaker of %s = %q, want open", c.Name, got)
	}
}

// TestPlanExclusions: a plan with no candidate says which filter excluded
// the clusters, as a code the gateway answers and a message naming them.
func TestPlanExclusions(t *testing.T) {
	for _, tc := range []struct {
		name     string
		clusters []discovery.Cluster
		drain    []string
		broken   []string
		req      Request
		code     string
		msg      []string // substrings of the message
		retry    bool     // RetryAfter set
	}{
		{name: "pinned to a region without the model", clusters: []discovery.Cluster{cl("e", "east", 1, 10), cl("w", "west", 1, 10)},
			req: Request{Policy: RegionPinned, Region: "eu"}, code: CodeRegionPinned, msg: []string{`region "eu"`, "2 cluster(s) elsewhere"}},
		{name: "every cluster drained", clusters: []discovery.Cluster{cl("a", "east", 1, 10), cl("b", "west", 1, 10)},
			drain: []string{"a", "b"}, code: CodeClusterDrained, msg: []string{"2 drained by an operator"}},
		{name: "pinned region's cluster drained", clusters: []discovery.Cluster{cl("e", "east", 1, 10), cl("w", "west", 1, 10)},
			drain: []string{"w"}, req: Request{Policy: RegionPinned, Region: "west"}, code: CodeClusterDrained,
			msg: []string{"1 drained", `1 outside the pinned region "west"`}},
		{name: "every breaker open", clusters: []discovery.Cluster{cl("a", "east", 1, 10), cl("b", "west", 1, 10)},
			broken: []string{"a", "b"}, code: CodeBreakerOpen, msg: []string{"2 with its circuit breaker open", "next probe in"}, retry: true},
		{name: "drained and broken", clusters: []discovery.Cluster{cl("a", "east", 1, 10), cl("b", "west", 1, 10)},
			drain: []string{"a"}, broken: []string{"b"}, code: CodeNoCapacity, msg: []string{"1 drained", "1 with its circuit breaker open"}, retry: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ov := map[string]Override{}
			r, _ := newTestRouter(t, tc.clusters, func(o *Options) {
				o.Breaker = BreakerOptions{ConsecutiveFailures: 3, OpenTimeout: time.Minute}
				o.Overrides = func() map[string]Override { return ov }
			})
			for _, c := range tc.clusters {
				for _, b := range tc.broken {
					if c.Name == b {
						trip(t, r, c)
					}
				}
			}
			for _, d := range tc.drain {
				ov[d] = Override{Drain: true}
			}
			req := tc.req
			req.Model = "m"
			_, err := r.Plan(req)
			var nc *NoCandidatesError
			if !errors.As(err, &nc) || !errors.Is(err, ErrNoCandidates) {
				t.Fatalf("err = %v, want a *NoCandidatesError", err)
			}
			if nc.Code() != tc.code {
				t.Errorf("code = %s, want %s (%+v)", nc.Code(), tc.code, nc)
			}
			for _, m := range tc.msg {
				if !strings.Contains(err.Error(), m) {
					t.Errorf("message %q lacks %q", err, m)
				}
			}
			if got := nc.RetryAfter > 0; got != tc.retry || nc.RetryAfter > time.Minute {
				t.Errorf("RetryAfter = %v, want set: %v (at most the open timeout)", nc.RetryAfter, tc.retry)
			}
		})
	}
}

// TestClusterInfo: the admin view of clusters — state, health, load,
// cost in both units, breakers and the last error.
func TestClusterInfo(t *testing.T) {
	weight, cost := 0.5, 3.0
	cs := []discovery.Cluster{
		cl("w-ok", "west", 2, 10),
		{ID: "e-mtok", Name: "e-mtok", Region: "east", Address: "http://127.0.0.1:1", Models: []string{"m"}, Cost: 0.9, CostUnit: cluster.CostPerMTok},
		cl("e-dead", "east", 1, 10),
		cl("eu-drained", "eu", 1, 10),
		cl("x-new", "asia", 1, 10),
	}
	r, _ := newTestRouter(t, cs, func(o *Options) {
		o.TokensPerGPUSecond = 1000 // 3.6 Mtok per GPU-hour
		o.Breaker = BreakerOptions{ConsecutiveFailures: 3, OpenTimeout: time.Minute}
		o.Overrides = func() map[string]Override {
			return map[string]Override{"eu-drained": {Drain: true}, "w-ok": {Weight: &weight, Cost: &cost}}
		}
	})
	r.store(cs[0], load(1, 0, 2, 0.9), nil)
	r.store(cs[1], &cluster.LoadSummary{Models: map[string]cluster.ModelLoad{"m": {ReadyPods: 0, Pods: 1, KVHeadroom: 1}, "lora": {ReadyPods: 0, Base: "m"}}}, nil)
	r.store(cs[2], nil, errors.New("dial tcp 127.0.0.1:1: connection refused"))
	r.store(cs[2], nil, errors.New("dial tcp 127.0.0.1:1: connection refused"))
	r.store(cs[3], load(0, 0, 1, 1), nil)
	a, err := r.Begin(Candidate{Cluster: cs[0]}, "m")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := r.Begin(Candidate{Cluster: cs[0]}, "m")
	b.Done(errors.New("tier1 answered HTTP 502"))

	info := r.ClusterInfo()
	var order []string
	byName := map[string]ClusterInfo{}
	for _, ci := range info {
		order = append(order, ci.Cluster.Name)
		byName[ci.Cluster.Name] = ci
	}
	// Own region (east) first, then region_order (west, eu), then the rest.
	if got := strings.Join(order, ","); got != "e-dead,e-mtok,w-ok,eu-drained,x-new" {
		t.Errorf("order = %s", got)
	}
	for name, want := range map[string]string{"w-ok": StateOK, "e-mtok": StateDegraded, "e-dead": StateUnreachable,
		"eu-drained": StateDrained, "x-new": StateUnknown} {
		if got := byName[name].State; got != want {
			t.Errorf("%s state = %s, want %s", name, got, want)
		}
	}
	w := byName["w-ok"]
	// gpu-hour 3 (override) at 3.6 Mtok/GPU-hour: 0.833/Mtok; weight 0.5 doubles it.
	if !w.HasMTok || !approx(w.PerMTok, 3/3.6) || w.PerGPUHr != 3 || !approx(w.Effective, 3/3.6/0.5) || w.Weight != 0.5 {
		t.Errorf("w-ok cost = %+v", w)
	}
	if w.InFlight != 1 || w.LastError != "tier1 answered HTTP 502" || w.LastErrorFrom != "m" || !w.Fresh || w.Summary == nil {
		t.Errorf("w-ok = %+v", w)
	}
	if len(w.Breakers) != 1 || w.Breakers[0].Model != "m" || w.Breakers[0].ConsecutiveFailures != 1 {
		t.Errorf("w-ok breakers = %+v", w.Breakers)
	}
	a.Done(nil)
	m := byName["e-mtok"]
	if !approx(m.PerGPUHr, 0.9*3.6) || m.PerMTok != 0.9 || strings.Join(m.Models, ",") != "lora,m" {
		t.Errorf("e-mtok = %+v", m)
	}
	d := byName["e-dead"]
	if d.PollFailures != 2 || !strings.Contains(d.PollError, "connection refused") || !strings.HasPrefix(d.LastError, "load poll: ") || d.PolledAt.IsZero() {
		t.Errorf("e-dead = %+v", d)
	}
	if got, ok := r.SpendPerMTok(cs[0]); !ok || !approx(got, 3/3.6) {
		t.Errorf("SpendPerMTok(w-ok) = %v, %v (the override's cost, not weighted)", got, ok)
	}

	// Without tokens_per_gpu_second gpu-hour costs do not convert.
	r2, _ := newTestRouter(t, cs[:1], nil)
	if _, ok := r2.SpendPerMTok(cs[0]); ok {
		t.Error("SpendPerMTok converted gpu-hour without tokens_per_gpu_second")
	}
	if ci := r2.ClusterInfo()[0]; ci.HasMTok || !ci.HasGPUHr || ci.PerGPUHr != 2 {
		t.Errorf("unconverted = %+v", ci)
	}
}

func approx(a, b float64) bool { return a-b < 1e-9 && b-a < 1e-9 }
