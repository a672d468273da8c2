package picker

import (
	"errors"
	"fmt"
	"reflect"
	"slices"
	"sync"
	"testing"
	"time"
)

func TestScheduleErrors(t *testing.T) {
	s := mustScheduler(t, DefaultProfile(), Options{Rand: seeded(1)})
	req := &Request{Model: "llama", PromptTokens: 100}
	if _, err := s.Schedule(req, nil); !errors.Is(err, ErrNoCandidates) {
		t.Fatalf("no pods: err = %v", err)
	}
	if _, err := s.Schedule(&Request{Model: "qwen"}, []*Pod{mkPod("a")}); !errors.Is(err, ErrNoCandidates) {
		t.Fatalf("wrong model: err = %v", err)
	}
	res, err := s.Schedule(req, []*Pod{mkPod("a", waiting(9)), mkPod("b", kv(0.9))})
	if !errors.Is(err, ErrSaturated) || !res.Saturated || len(res.Ranked) != 2 {
		t.Fatalf("saturated: err = %v, res = %+v", err, res)
	}
	if res.Ranked[0].Name != "b" {
		t.Fatalf("saturated still ranks: got %s first", res.Ranked[0].Name)
	}
}

func TestStaleMetrics(t *testing.T) {
	s := mustScheduler(t, DefaultProfile(), Options{Rand: seeded(1)})
	req := &Request{Model: "llama", PromptTokens: 100}
	stale := func(p *Pod) { p.MetricsAge = 5 * time.Second }
	// The stale pod looks idle (old scrape) but must not be trusted.
	pods := []*Pod{mkPod("stale-idle", stale), mkPod("fresh-busy", waiting(3), running(20), kv(0.7))}
	for range 20 {
		res, err := s.Schedule(req, pods)
		if err != nil {
			t.Fatal(err)
		}
		if len(res.Candidates) != 1 || res.Ranked[0].Name != "fresh-busy" {
			t.Fatalf("picked %v from %v", res.Ranked[0].Name, names(res.Candidates))
		}
	}
	// Only stale pods: still usable, but reported saturated.
	res, err := s.Schedule(req, []*Pod{mkPod("a", stale), mkPod("b", stale)})
	if !errors.Is(err, ErrSaturated) || len(res.Ranked) != 2 {
		t.Fatalf("all stale: err = %v, ranked %v", err, names(res.Ranked))
	}
}

func TestTieBreakSeeded(t *testing.T) {
	pods := []*Pod{mkPod("a"), mkPod("b"), mkPod("c"), mkPod("d")}
	req := &Request{Model: "llama"}
	run := func(seed uint64) []string {
		s := mustScheduler(t, DefaultProfile(), Options{Rand: seeded(seed)})
		var got []string
		for range 40 {
			res, err := s.Schedule(req, pods)
			if err != nil {
				t.Fatal(err)
			}
			got = append(got, res.Ranked[0].Name)
		}
		return got
	}
	a, b, c := run(7), run(7), run(8)
	if !slices.Equal(a, b) {
		t.Fatal("same seed, different picks")
	}
	if slices.Equal(a, c) {
		t.Fatal("different seeds, same 40 picks")
	}
	seen := map[string]int{}
	for _, n := range a {
		seen[n]++
	}
	if len(seen) != 4 {
		t.Fatalf("ties not shuffled: %v", seen)
	}
}

func TestRankedAndScores(t *testing.T) {
	pods := []*Pod{mkPod("a", waiting(4)), mkPod("b"), mkPod("c", waiting(2)), mkPod("d", waiting(1)), mkPod("e", waiting(3)), mkPod("f", waiting(4))}
	cfg := ProfileConfig{Base: BaseEmpty, Filters: []string{FilterReady}, Scorers: []ScorerConfig{{Name: ScorerQueue, Weight: 2}}, MaxRanked: 3}
	s := mustScheduler(t, cfg, Options{Rand: seeded(1)})
	res, err := s.Schedule(&Request{}, pods)
	if err != nil {
		t.Fatal(err)
	}
	if got := names(res.Ranked); !slices.Equal(got, []string{"b", "d", "c"}) {
		t.Fatalf("Ranked = %v", got)
	}
	i := res.Index(pods[2])
	if v, ok := res.Score(ScorerQueue, i); !ok || v != 0.5 || res.Total[i] != 1 {
		t.Fatalf("score %v %v total %v", v, ok, res.Total[i])
	}
	if m := res.Breakdown(i); m[ScorerQueue] != 0.5 {
		t.Fatalf("Breakdown %v", m)
	}
	if err := s.Update(cfg.WithParam("x", "y", 1)); err == nil {
		t.Fatal("bad update accepted")
	}
	cfg.MaxRanked = -1
	if err := s.Update(cfg); err != nil {
		t.Fatal(err)
	}
	res, _ = s.Schedule(&Request{}, pods)
	if len(res.Ranked) != 6 || res.Ranked[5].Name != "a" && res.Ranked[5].Name != "f" {
		t.Fatalf("Ranked = %v", names(res.Ranked))
	}
}

func TestRoundRobin(t *testing.T) {
	s := mustScheduler(t, RoundRobinProfile(), Options{})
	pods := []*Pod{mkPod("a"), mkPod("b"), mkPod("c")}
	var got []string
	for range 6 {
		res, err := s.Schedule(&Request{Model: "llama"}, pods)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, res.Ranked[0].Name)
	}
	if !slices.Equal(got, []string{"a", "b", "c", "a", "b", "c"}) {
		t.Fatalf("got %v", got)
	}
}

// simulate routes n requests with the given prefix through s and tr,
// keeping each in flight (no Done), and returns the pick counts.
func simulate(t *testing.T, s *Scheduler, tr *Tracker, pods []*Pod, reqs func(i int) *Request, n int) map[string]int {
	t.Helper()
	got := map[string]int{}
	for i := range n {
		req := reqs(i)
		tr.Apply(pods)
		res, err := s.Schedule(req, pods)
		if err != nil && !errors.Is(err, ErrSaturated) {
			t.Fatal(err)
		}
		pick := res.Ranked[0].Name
		tr.Dispatched(pick, req)
		got[pick]++
	}
	return got
}

func TestPrefixAffinitySticks(t *testing.T) {
	tr := NewTracker(TrackerOptions{})
	s := mustScheduler(t, DefaultProfile(), Options{Tracker: tr, Rand: seeded(3)})
	pods := []*Pod{mkPod("a"), mkPod("b"), mkPod("c"), mkPod("d")}
	h := hashes(32, 8, "conv")
	// Requests complete between arrivals: load stays equal, so only the
	// prefix decides, and after the first pick it always holds.
	got := map[string]int{}
	for range 20 {
		req := &Request{Model: "llama", PromptTokens: 640, BlockHashes: h}
		tr.Apply(pods)
		res, err := s.Schedule(req, pods)
		if err != nil {
			t.Fatal(err)
		}
		p := res.Ranked[0].Name
		tr.Dispatched(p, req)
		tr.FirstToken(p, req, 50*time.Millisecond)
		tr.Done(p, req)
		got[p]++
	}
	if len(got) != 1 {
		t.Fatalf("repeated prefix spread over %v", got)
	}
}

func TestHotPrefixGuardSpreads(t *testing.T) {
	h := hashes(64, 0, "")
	reqs := func(i int) *Request {
		return &Request{ID: fmt.Sprint(i), Model: "llama", PromptTokens: 1024, BlockHashes: h}
	}
	pods := func() []*Pod { return []*Pod{mkPod("a"), mkPod("b"), mkPod("c"), mkPod("d")} }
	// Prefix-only profile, so nothing but the guard resists herding.
	cfg := ProfileConfig{Base: BaseEmpty, Filters: []string{FilterReady}, Scorers: []ScorerConfig{
		{Name: ScorerPrefix, Weight: 3}, {Name: ScorerQueue, Weight: 0.1},
	}}

	tr := NewTracker(TrackerOptions{})
	s := mustScheduler(t, cfg.WithParam(ScorerPrefix, ParamGuardDiscount, 1), Options{Tracker: tr, Rand: seeded(1)})
	if got := simulate(t, s, tr, pods(), reqs, 60); len(got) != 1 {
		t.Fatalf("without guard expected herding onto one pod, got %v", got)
	}

	tr = NewTracker(TrackerOptions{})
	s = mustScheduler(t, cfg, Options{Tracker: tr, Rand: seeded(1)})
	got := simulate(t, s, tr, pods(), reqs, 60)
	if len(got) != 4 {
		t.Fatalf("guard did not spread: %v", got)
	}
	for p, n := range got {
		if n > 30 {
			t.Errorf("pod %s took %d of 60", p, n)
		}
	}
}

func TestLoRAFallbackMostCapacity(t *testing.T) {
	lora := func(active ...string) func(*Pod) {
		return func(p *Pod) {
			p.Metrics.HasLoRA, p.Metrics.MaxLoras, p.Metrics.ActiveAdapters = true, 2, active
		}
	}
	s := mustScheduler(t, DefaultProfile(), Options{Rand: seeded(1)})
	req := &Request{Model: "sql-lora", BaseModel: "llama", Adapter: "sql-lora", PromptTokens: 200}
	pods := []*Pod{
		mkPod("full", lora("x", "y")),
		mkPod("busy", lora("x"), running(30), waiting(3), kv(0.6)),
		mkPod("idle", lora("x"), running(2), kv(0.1)),
	}
	res, err := s.Schedule(req, pods)
	if err != nil {
		t.Fatal(err)
	}
	if res.Ranked[0].Name != "idle" || res.Index(pods[0]) != -1 {
		t.Fatalf("ranked %v, candidates %v", names(res.Ranked), names(res.Candidates))
	}
	// Once a pod has it loaded, affinity wins over mild load differences.
	pods[1].Metrics.ActiveAdapters = []string{"x", "sql-lora"}
	pods[1].Metrics.Running, pods[1].Metrics.Waiting, pods[1].Metrics.KVUsage = 6, 0, 0.2
	res, _ = s.Schedule(req, pods)
	if res.Ranked[0].Name != "busy" {
		t.Fatalf("ranked %v", names(res.Ranked))
	}
}

func TestPredictedLatencyLearnsFastPod(t *testing.T) {
	tr := NewTracker(TrackerOptions{})
	s := mustScheduler(t, DefaultProfile(), Options{Tracker: tr, Rand: seeded(1)})
	pods := []*Pod{mkPod("a10g"), mkPod("h100")}
	speed := map[string]float64{"a10g": 3000, "h100": 15000}
	// Teach the tracker from observed TTFTs: one request at a time per pod.
	for i := range 20 {
		for _, p := range pods {
			req := &Request{Model: "llama", PromptTokens: 1000 + 300*i}
			tr.Dispatched(p.Name, req)
			ttft := time.Duration((0.01 + float64(req.PromptTokens)/speed[p.Name]) * float64(time.Second))
			tr.FirstToken(p.Name, req, ttft)
			tr.Done(p.Name, req)
		}
	}
	tr.Apply(pods)
	if v := pods[1].PrefillTokensPerSec; v < 12000 || v > 18000 {
		t.Fatalf("learned h100 speed %v, want ≈15000", v)
	}
	// Both look equally idle by scraped metrics.
	for range 10 {
		res, err := s.Schedule(&Request{Model: "llama", PromptTokens: 4000}, pods)
		if err != nil {
			t.Fatal(err)
		}
		if res.Ranked[0].Name != "h100" {
			t.Fatalf("picked %s", res.Ranked[0].Name)
		}
	}
	// Enough queued prefill on the fast pod makes the slow one better.
	req := &Request{Model: "llama", PromptTokens: 30000}
	tr.Dispatched("h100", req)
	tr.Apply(pods)
	res, _ := s.Schedule(&Request{Model: "llama", PromptTokens: 4000}, pods)
	if res.Ranked[0].Name != "a10g" {
		t.Fatalf("picked %s with 30k tokens queued on h100", res.Ranked[0].Name)
	}
}

var raceEnabled bool

func TestScheduleIntoNoAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts are not meaningful under -race")
	}
	tr := NewTracker(TrackerOptions{})
	s := mustScheduler(t, DefaultProfile(), Options{Tracker: tr, Rand: seeded(1)})
	h := hashes(40, 40, "z")
	var pods []*Pod
	for i := range 50 {
		pods = append(pods, mkPod(podN(i), waiting(i%3), prefill(float64(1000*(i+1)))))
		tr.Index().Record(podN(i), h[:i])
	}
	req := &Request{Model: "llama", PromptTokens: 5000, BlockHashes: h}
	var res Result
	_ = s.ScheduleInto(&res, req, pods)
	if n := testing.AllocsPerRun(50, func() { _ = s.ScheduleInto(&res, req, pods) }); n != 0 {
		t.Fatalf("ScheduleInto allocs = %v, want 0", n)
	}
}

func TestConcurrent(t *testing.T) {
	tr := NewTracker(TrackerOptions{})
	s := mustScheduler(t, DefaultProfile(), Options{Tracker: tr, Rand: seeded(1)})
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 200 {
				pods := []*Pod{mkPod("a"), mkPod("b"), mkPod("c")}
				tr.Apply(pods)
				req := &Request{Model: "llama", PromptTokens: 500, BlockHashes: hashes(8, 2, fmt.Sprint(g, i%5))}
				res, err := s.Schedule(req, pods)
				if err != nil && !errors.Is(err, ErrSaturated) {
					t.Error(err)
					return
				}
				p := res.Ranked[0].Name
				tr.Dispatched(p, req)
				tr.FirstToken(p, req, time.Millisecond*time.Duration(10+i%7))
				tr.Done(p, req)
				if i%50 == 0 {
					if err := s.Update(DefaultProfile().WithWeight(ScorerPrefix, float64(1+i%3))); err != nil {
						t.Error(err)
					}
				}
			}
		}()
	}
	wg.Wait()
	for _, p := range []string{"a", "b", "c"} {
		if n := tr.InFlight(p); n != 0 {
			t.Errorf("%s in flight = %d after all Done", p, n)
		}
	}
}

// TestBurstDoesNotHerd: between two scrapes every pod's scraped metrics
// stay identical; the router's own in-flight count must spread a burst.
func TestBurstDoesNotHerd(t *testing.T) {
	tr := NewTracker(TrackerOptions{})
	s := mustScheduler(t, DefaultProfile(), Options{Tracker: tr, Rand: seeded(9)})
	var pods []*Pod
	for i := range 10 {
		pods = append(pods, mkPod(podN(i), running(4), kv(0.3)))
	}
	got := simulate(t, s, tr, pods, func(i int) *Request {
		return &Request{Model: "llama", PromptTokens: 500, BlockHashes: hashes(0, 8, fmt.Sprint(i))}
	}, 30)
	for p, n := range got {
		if n != 3 {
			t.Fatalf("pod %s got %d of 30 (want 3 each): %v", p, n, got)
		}
	}
}

// Schedule leaves the caller's pods and slice as they were, whatever the
// profile does with its own copy (filters compact it in place).
func TestScheduleLeavesPodsAlone(t *testing.T) {
	r := seeded(3)
	tr := NewTracker(TrackerOptions{})
	for _, cfg := range []ProfileConfig{DefaultProfile(), GIEDefaultProfile(), RoundRobinProfile()} {
		s := mustScheduler(t, cfg, Options{Tracker: tr, Rand: seeded(1)})
		for range 50 {
			pods := randomPods(r, 1+r.IntN(8))
			before := clonePods(pods)
			order := names(pods)
			req := &Request{Model: "llama", Adapter: []string{"", "a", "e"}[r.IntN(3)], PromptTokens: 1 + r.IntN(9000),
				BlockHashes: hashes(0, 4, "x"), Session: fmt.Sprint("s", r.IntN(3))}
			res, err := s.Schedule(req, pods)
			if err != nil && !errors.Is(err, ErrSaturated) && !errors.Is(err, ErrBusy) {
				t.Fatal(err)
			}
			if len(res.Ranked) > 0 {
				tr.Dispatched(res.Ranked[0].Name, req)
			}
			if !slices.Equal(names(pods), order) {
				t.Fatalf("%s: pods reordered: %v, was %v", cfg.Base, names(pods), order)
			}
			for i := range pods {
				if !reflect.DeepEqual(pods[i], before[i]) {
					t.Fatalf("%s: pod %s changed: %+v, was %+v", cfg.Base, pods[i].Name, *pods[i], *before[i])
				}
			}
		}
	}
}
