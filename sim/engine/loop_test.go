package engine

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"
)

func TestLoopOrdering(t *testing.T) {
	l := NewLoop()
	var got []string
	rec := func(s string) func(time.Duration) {
		return func(now time.Duration) { got = append(got, s) }
	}
	l.At(30, rec("c"))
	l.At(10, rec("a1"))
	l.At(10, rec("a2"))
	l.At(20, func(now time.Duration) {
		got = append(got, "b")
		l.At(now, rec("b-same-time"))
		l.At(now-5, rec("b-past-clamped"))
		l.At(25, rec("b-later"))
	})
	l.At(10, rec("a3"))
	l.Run(25)
	if l.Now() != 25 {
		t.Errorf("Now = %d after Run(25)", l.Now())
	}
	l.Run(100)
	want := []string{"a1", "a2", "a3", "b", "b-same-time", "b-past-clamped", "b-later", "c"}
	if !slices.Equal(got, want) {
		t.Fatalf("order %v, want %v", got, want)
	}
	if l.Now() != 100 {
		t.Errorf("Now = %d", l.Now())
	}
}

func TestLoopDrivesEngines(t *testing.T) {
	// Two pods, one fast one slow; events from both and external ticks must
	// come out in time order and every request must finish.
	l := NewLoop()
	fast := mustEngine(t, mustConfig(t, "llama-3.1-8b", "h100", 1))
	slow := mustEngine(t, mustConfig(t, "llama-3.1-8b", "l4", 1))
	l.Add(fast)
	l.Add(slow)
	var times []time.Duration
	done := 0
	for i := range 20 {
		e := fast
		if i%2 == 1 {
			e = slow
		}
		r := &Request{ID: uint64(i), PromptTokens: 500 + 100*i, MaxTokens: 50,
			OnFirstToken: func(at time.Duration) { times = append(times, at) },
			OnDone: func(at time.Duration, _ Result) {
				times = append(times, at)
				done++
			}}
		l.At(time.Duration(i)*10*time.Millisecond, func(now time.Duration) {
			if err := e.Submit(now, r); err != nil {
				t.Error(err)
			}
		})
	}
	for tick := time.Duration(0); tick < 5*time.Second; tick += 50 * time.Millisecond {
		l.At(tick, func(now time.Duration) { times = append(times, now) })
	}
	l.Run(time.Minute)
	if done != 20 {
		t.Fatalf("%d of 20 finished", done)
	}
	if !slices.IsSorted(times) {
		t.Fatal("events not in time order")
	}
	if _, ok := fast.NextEventTime(); ok {
		t.Error("fast pod still busy")
	}
}

func TestRealtime(t *testing.T) {
	e := mustEngine(t, mustConfig(t, "llama-3.1-8b", "h100", 1))
	rt := NewRealtime(e, 0.05)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); rt.Run(ctx) }()
	defer func() { cancel(); wg.Wait() }()

	results := make(chan Result, 4)
	var mu sync.Mutex
	var tokens, calls int
	for i := range 3 {
		err := rt.Submit(&Request{ID: uint64(i), PromptTokens: 300, MaxTokens: 100,
			OnTokens: func(_ time.Duration, n int) { mu.Lock(); tokens += n; calls++; mu.Unlock() },
			OnDone:   func(_ time.Duration, r Result) { results <- r }})
		if err != nil {
			t.Fatal(err)
		}
	}
	if err := rt.Submit(&Request{ID: 9, PromptTokens: 300, MaxTokens: 1_000_000}); err == nil {
		t.Fatal("oversized request accepted")
	}
	// A long request to cancel.
	if err := rt.Submit(&Request{ID: 10, PromptTokens: 300, MaxTokens: 5000}); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		select {
		case r := <-results:
			if r.CompletionTokens != 100 {
				t.Errorf("result %+v", r)
			}
		case <-time.After(20 * time.Second):
			t.Fatal("no result from the realtime engine")
		}
	}
	rt.Cancel(10)
	var st Stats
	rt.Do(func(e *Engine, now time.Duration) {
		st = e.Stats()
		if now <= 0 {
			t.Errorf("simulated now %v", now)
		}
	})
	if st.Running != 0 || st.UsedBlocks != 0 || st.FinishedRequests != 3 {
		t.Errorf("stats %+v", st)
	}
	mu.Lock()
	defer mu.Unlock()
	// Streaming: tokens arrive in several groups, not one lump per request.
	if tokens != 300 || calls < 3*4 {
		t.Errorf("%d tokens in %d callbacks", tokens, calls)
	}
}
