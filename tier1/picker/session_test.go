package picker

import (
	"fmt"
	"testing"
	"time"
)

func TestSessionStoreBoundAndTTL(t *testing.T) {
	now := time.Unix(1000, 0)
	var st sessionStore
	st.opts = SessionOptions{Max: 3, TTL: time.Minute, Now: func() time.Time { return now }}
	for i := range 5 {
		st.record(fmt.Sprint("s", i), fmt.Sprint("p", i))
	}
	if st.len() != 3 {
		t.Fatalf("len %d, want bound 3", st.len())
	}
	if _, ok := st.lookup("s0"); ok {
		t.Fatal("least recently used s0 not evicted")
	}
	if p, ok := st.lookup("s4"); !ok || p != "p4" {
		t.Fatalf("s4 = %q %v, want p4", p, ok)
	}
	st.record("s4", "p9") // a later turn moves the session
	if p, _ := st.lookup("s4"); p != "p9" {
		t.Fatalf("s4 = %q, want p9", p)
	}
	now = now.Add(2 * time.Minute)
	if _, ok := st.lookup("s4"); ok {
		t.Fatal("expired session still remembered")
	}
	if _, ok := st.lookup(""); ok {
		t.Fatal("empty key found")
	}
}

func TestSessionBalanceScorer(t *testing.T) {
	h100 := func(p *Pod) { p.GPU, p.GPUs = "h100", 1 }
	a10g := func(p *Pod) { p.GPU, p.GPUs = "a10g", 1 }
	tests := []struct {
		name    string
		session string
		live    map[string]int // sessions whose last turn went to each pod
		pods    []*Pod
		total   []float64 // the other scorers' sum; nil = none ran
		want    []float64
	}{
		{"new session: fewest live best", "new", map[string]int{"a": 3, "b": 1, "c": 2},
			[]*Pod{mkPod("a"), mkPod("b"), mkPod("c")}, nil, []float64{0, 1, 0.5}},
		{"equal counts", "new", map[string]int{"a": 2, "b": 2},
			[]*Pod{mkPod("a"), mkPod("b")}, nil, []float64{1, 1}},
		{"known session: no signal", "s-a-0", map[string]int{"a": 1, "b": 0},
			[]*Pod{mkPod("a"), mkPod("b")}, nil, []float64{0, 0}},
		{"no session: no signal", "", map[string]int{"a": 3},
			[]*Pod{mkPod("a"), mkPod("b")}, nil, []float64{0, 0}},
		{"only the leading pod's class", "new", map[string]int{"h1": 5, "h2": 1},
			[]*Pod{mkPod("h1", h100), mkPod("h2", h100), mkPod("s1", a10g), mkPod("s2", a10g)},
			[]float64{3, 2, 1, 1}, []float64{0, 1, 0, 0}},
		{"slower class leads", "new", map[string]int{"s1": 2, "h1": 0},
			[]*Pod{mkPod("h1", h100), mkPod("s1", a10g), mkPod("s2", a10g)},
			[]float64{1, 2, 4}, []float64{0, 0, 1}},
		{"others tied: every class", "new", map[string]int{"h1": 2, "s1": 1},
			[]*Pod{mkPod("h1", h100), mkPod("s1", a10g), mkPod("s2", a10g)},
			[]float64{2, 2, 2}, []float64{0, 0.5, 1}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tr := NewTracker(TrackerOptions{})
			for pod, n := range tt.live {
				for i := range n {
					r := &Request{Session: fmt.Sprintf("s-%s-%d", pod, i)}
					tr.Dispatched(pod, r)
					tr.Done(pod, r)
				}
			}
			sc := sessionBalanceSpec.build(buildContext{tracker: tr})
			cs := cycleState{total: tt.total}
			got := make([]float64, len(tt.pods))
			sc.Score(&cs, &Request{Session: tt.session}, tt.pods, got)
			if !approx(got, tt.want) {
				t.Fatalf("got %v, want %v", got, tt.want)
			}
		})
	}
}

// The live counts are kept incrementally; they must equal a recount of
// the store under any mix of turns, moves, evictions and expiry.
func TestSessionStoreLiveCounts(t *testing.T) {
	now := time.Unix(1000, 0)
	var st sessionStore
	st.opts = SessionOptions{Max: 20, TTL: 40 * time.Second, Live: 10 * time.Second, Now: func() time.Time { return now }}
	pods := []*Pod{mkPod("p0"), mkPod("p1"), mkPod("p2"), mkPod("p3")}
	rng := seeded(3)
	got := make([]float64, len(pods))
	for step := range 5000 {
		switch rng.IntN(4) {
		case 0, 1:
			st.record(fmt.Sprint("s", rng.IntN(40)), pods[rng.IntN(len(pods))].Name)
		case 2:
			st.lookup(fmt.Sprint("s", rng.IntN(40))) // may evict an expired session
		case 3:
			now = now.Add(time.Duration(rng.IntN(3000)) * time.Millisecond)
		}
		st.liveOn(pods, got)
		want := make([]float64, len(pods))
		for e := st.lru.Front(); e != nil; e = e.Next() {
			ent := e.Value.(*sessionEntry)
			if now.Sub(ent.seen) <= st.opts.Live {
				want[int(ent.pod[1]-'0')]++
			}
		}
		if !approx(got, want) {
			t.Fatalf("step %d: live %v, recount %v", step, got, want)
		}
	}
}

// New conversations that share a system prompt spread over identical pods
// instead of all following the one pod that holds it; each conversation's
// later turns still go back to its own pod.
func TestNewSessionsSpread(t *testing.T) {
	for _, balance := range []bool{true, false} {
		t.Run(fmt.Sprint("balance=", balance), func(t *testing.T) {
			cfg := DefaultProfile()
			if !balance {
				for i := range cfg.Scorers {
					if cfg.Scorers[i].Name == ScorerSessionBalance {
						cfg.Scorers[i].Weight = 0
					}
				}
			}
			tr := NewTracker(TrackerOptions{})
			s := mustScheduler(t, cfg, Options{Tracker: tr, Rand: seeded(11)})
			a10g := func(p *Pod) { p.GPU, p.GPUs = "a10g", 1 }
			pods := []*Pod{mkPod("a", a10g), mkPod("b", a10g), mkPod("c", a10g), mkPod("d", a10g)}
			sys := &Request{Model: "llama", PromptTokens: 1280, BlockHashes: hashes(20, 0, "")}
			tr.Dispatched("a", sys) // pod a holds the system prompt
			tr.Done("a", sys)
			turn := func(conv, n int) string {
				t.Helper()
				req := &Request{ID: fmt.Sprint(conv, "/", n), Model: "llama", PromptTokens: 1280 + 64*4*n,
					BlockHashes: hashes(20, 4*n, fmt.Sprint("conv", conv)), Session: fmt.Sprint("conv-", conv)}
				tr.Apply(pods)
				res, err := s.Schedule(req, pods)
				if err != nil {
					t.Fatal(err)
				}
				pod := res.Ranked[0].Name
				tr.Dispatched(pod, req)
				tr.Done(pod, req)
				return pod
			}
			home := map[int]string{}
			per := map[string]int{}
			for conv := range 8 {
				home[conv] = turn(conv, 1)
				per[home[conv]]++
			}
			for conv := range 8 {
				if got := turn(conv, 2); got != home[conv] {
					t.Errorf("conversation %d's second turn went to %s, its first to %s", conv, got, home[conv])
				}
			}
			if balance && per["a"] > 2 {
				t.Errorf("sessions per pod %v: want them spread, at most 2 on a", per)
			}
			if !balance && per["a"] != 8 {
				t.Errorf("sessions per pod %v without session-balance: want all 8 on a, the system prompt's holder (the case the scorer exists for)", per)
			}
		})
	}
}
