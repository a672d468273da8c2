package picker

import (
	"fmt"
	"testing"
	"time"
)

func TestSessionAffinityScorer(t *testing.T) {
	load := func(n int) func(*Pod) { return func(p *Pod) { p.Metrics.Running = n } }
	tests := []struct {
		name    string
		session string
		last    string // pod the session's last turn went to, "" = none
		pods    []*Pod
		want    []float64
	}{
		{"sticky pod scores 1", "s1", "b", []*Pod{mkPod("a"), mkPod("b"), mkPod("c")}, []float64{0, 1, 0}},
		{"sticky under moderate load keeps it", "s1", "b", []*Pod{mkPod("a", load(4)), mkPod("b", load(10)), mkPod("c", load(6))}, []float64{0, 1, 0}},
		{"much more loaded loses it", "s1", "b", []*Pod{mkPod("a", load(4)), mkPod("b", load(30)), mkPod("c", load(6))}, []float64{0, 0, 0}},
		{"no session key", "", "b", []*Pod{mkPod("a"), mkPod("b")}, []float64{0, 0}},
		{"unknown session", "s2", "", []*Pod{mkPod("a"), mkPod("b")}, []float64{0, 0}},
		{"sticky pod no longer a candidate", "s1", "gone", []*Pod{mkPod("a"), mkPod("b")}, []float64{0, 0}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tr := NewTracker(TrackerOptions{})
			if tt.last != "" {
				r := &Request{Session: "s1"}
				tr.Dispatched(tt.last, r)
				tr.Done(tt.last, r)
			}
			got := scoreOnly(t, ScorerSessionAffinity, nil, tr, &Request{Session: tt.session}, tt.pods)
			if !approx(got, tt.want) {
				t.Fatalf("got %v, want %v", got, tt.want)
			}
		})
	}
}

// A conversation's turns stay on one pod under balanced load, and leave it
// when it becomes much more loaded: the key is a score, not a route.
func TestSessionSticksUnlessMuchMoreLoaded(t *testing.T) {
	cfg := ProfileConfig{Base: BaseEmpty, Filters: []string{FilterModel}, Picker: PickerMaxScore,
		Scorers: []ScorerConfig{{Name: ScorerQueue, Weight: 1}, {Name: ScorerSessionAffinity, Weight: 2}}}
	tr := NewTracker(TrackerOptions{})
	s := mustScheduler(t, cfg, Options{Tracker: tr, Rand: seeded(7)})
	pods := []*Pod{mkPod("a"), mkPod("b"), mkPod("c")}
	first := ""
	for turn := range 5 {
		req := &Request{ID: fmt.Sprint(turn), Session: "conv-1"}
		pods[1].Metrics.Waiting = turn % 2 // some load noise
		tr.Apply(pods)
		res, err := s.Schedule(req, pods)
		if err != nil {
			t.Fatal(err)
		}
		got := res.Ranked[0].Name
		if first == "" {
			first = got
		} else if got != first {
			t.Fatalf("turn %d went to %s, want %s", turn, got, first)
		}
		tr.Dispatched(got, req)
		tr.Done(got, req)
	}
	// The sticky pod becomes much more loaded: the next turn moves.
	for _, p := range pods {
		p.Metrics.Running = 2
		if p.Name == first {
			p.Metrics.Waiting, p.Metrics.Running = 10, 20
		}
	}
	tr.Apply(pods)
	res, err := s.Schedule(&Request{ID: "late", Session: "conv-1"}, pods)
	if err != nil {
		t.Fatal(err)
	}
	if res.Ranked[0].Name == first {
		t.Fatalf("session stayed on overloaded %s", first)
	}
}

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
