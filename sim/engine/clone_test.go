package engine

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestCloneReplaysExactly clones a busy engine (small KV, LoRA slots,
// shared prefixes, cancellations, preemptions, step jitter) at several
// points and drives original and copy with the same remaining calls: every
// request submitted after the copy must see the same first-token and done
// times on both, the final statistics must match, and cloning must not
// change the original's own transcript.
func TestCloneReplaysExactly(t *testing.T) {
	cfg := churnConfig(t)
	cfg.StepJitter, cfg.JitterSeed, cfg.SpeedFactor = 0.03, 7, 1.02

	type call struct {
		at     time.Duration
		cancel bool
		r      Request
	}
	rng := rand.New(rand.NewPCG(11, 12))
	adapters := []string{"", "", "a", "b", "c"}
	var calls []call
	var at time.Duration
	for i := range 400 {
		at += time.Duration(rng.ExpFloat64() * float64(40*time.Millisecond))
		prompt := 20 + rng.IntN(1500)
		calls = append(calls, call{at: at, r: Request{ID: uint64(i), PromptTokens: prompt, MaxTokens: 1 + rng.IntN(300),
			Adapter: adapters[rng.IntN(len(adapters))], BlockHashes: hashes(uint64(rng.IntN(5)), prompt/BlockSize)}})
		if rng.IntN(10) == 0 {
			calls = append(calls, call{at: at + time.Duration(rng.IntN(3000))*time.Millisecond, cancel: true, r: Request{ID: uint64(i)}})
		}
	}
	slices.SortStableFunc(calls, func(a, b call) int { return int(a.at - b.at) })

	// run drives e through calls[from:], logging the callbacks of the
	// requests it submits, and drains it.
	run := func(e *Engine, from int, onCall func(k int, e *Engine)) []string {
		var log []string
		for k := from; k < len(calls); k++ {
			c := calls[k]
			e.Advance(c.at)
			if onCall != nil {
				onCall(k, e)
			}
			if c.cancel {
				e.Cancel(c.at, c.r.ID)
				continue
			}
			r := c.r
			id := r.ID
			r.OnFirstToken = func(at time.Duration) { log = append(log, fmt.Sprintf("%d first %d", id, at)) }
			r.OnDone = func(at time.Duration, res Result) { log = append(log, fmt.Sprintf("%d done %d %+v", id, at, res)) }
			if err := e.Submit(c.at, &r); err != nil {
				t.Fatal(err)
			}
		}
		for {
			next, ok := e.NextEventTime()
			if !ok {
				break
			}
			e.Advance(next)
		}
		return append(log, fmt.Sprintf("stats %+v", e.Stats()))
	}

	plain := run(mustEngine(t, cfg), 0, nil)
	points := map[int]bool{50: true, 151: true, 230: true, 333: true}
	clones := map[int]*Engine{}
	cloned := run(mustEngine(t, cfg), 0, func(k int, e *Engine) {
		if points[k] {
			clones[k] = e.Clone()
			if err := checkInvariants(clones[k]); err != nil {
				t.Fatalf("clone at call %d: %v", k, err)
			}
		}
	})
	if !slices.Equal(plain, cloned) {
		t.Fatal("cloning changed the original's transcript")
	}
	if len(clones) != len(points) {
		t.Fatalf("cloned at %d points, want %d", len(clones), len(points))
	}
	for k, c := range clones {
		if st := c.Stats(); st.Running+st.Waiting == 0 {
			t.Fatalf("clone at call %d is idle: nothing in flight to copy", k)
		}
		// The clone logs only the requests it is given (calls k on), and
		// ends with the same cumulative statistics as the original.
		later := map[string]bool{}
		for _, c := range calls[k:] {
			if !c.cancel {
				later[fmt.Sprint(c.r.ID)] = true
			}
		}
		var want []string
		for _, line := range plain {
			id, _, _ := strings.Cut(line, " ")
			if later[id] || id == "stats" {
				want = append(want, line)
			}
		}
		got := run(c, k, nil)
		if !slices.Equal(got, want) {
			for i := range min(len(got), len(want)) {
				if got[i] != want[i] {
					t.Fatalf("clone at call %d diverged at line %d:\n got %s\nwant %s", k, i, got[i], want[i])
				}
			}
			t.Fatalf("clone at call %d: %d lines, want %d", k, len(got), len(want))
		}
	}
	st := clones[333].Stats()
	if st.Preemptions == 0 || st.LoraLoads == 0 || st.PrefixCacheHits == 0 {
		t.Errorf("workload did not exercise preemption/LoRA/prefix cache: %+v", st)
	}
}
