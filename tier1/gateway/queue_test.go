package gateway

import (
	"testing"
	"time"

	"github.com/infergate/infergate/tier1/picker"
)

func TestWaitQueueOrder(t *testing.T) {
	q := newWaitQueue()
	type in struct {
		name string
		prio int
	}
	arrivals := []in{{"std1", 0}, {"low", -1}, {"crit1", 2}, {"std2", 0}, {"crit2", 2}, {"mid", 1}}
	ws := map[string]*waiter{}
	for _, a := range arrivals {
		w, ok := q.enter(a.prio, picker.HoldKey{}, true, 10)
		if !ok {
			t.Fatal("enter refused")
		}
		ws[a.name] = w
	}
	// A wake gives the head the turn; each that leaves (dispatched) hands
	// it to the next in priority order.
	q.signal()
	want := []string{"crit1", "crit2", "mid", "std1", "std2", "low"}
	for _, name := range want {
		if !q.myTurn(ws[name]) {
			t.Fatalf("turn is not %s's", name)
		}
		q.leave(ws[name])
	}
	if q.len() != 0 {
		t.Errorf("len = %d after all left", q.len())
	}
	// Bounded.
	for i := 0; i < 2; i++ {
		q.enter(0, picker.HoldKey{}, true, 2)
	}
	if _, ok := q.enter(5, picker.HoldKey{}, true, 2); ok {
		t.Error("enter beyond max_len accepted")
	}
}

func TestWaitQueueSignal(t *testing.T) {
	q := newWaitQueue()
	w, _ := q.enter(0, picker.HoldKey{}, true, 10)
	if q.myTurn(w) {
		t.Fatal("turn before any wake")
	}
	q.signal()
	select {
	case <-w.turn:
	default:
		t.Fatal("signal did not hand the head its turn")
	}
	if !q.myTurn(w) {
		t.Fatal("head does not hold the turn")
	}
	q.heldAgain(w)
	if q.myTurn(w) {
		t.Fatal("turn kept after the pass ended")
	}
}

// One pass gives every waiter whose hold key it has not seen held its
// turn, in queue order: a waiter for another adapter is not stuck behind
// a held head. Keyless waiters (admission.Pass) each get a turn.
func TestWaitQueuePass(t *testing.T) {
	a := picker.HoldKey{Model: "lora-a", Adapter: "lora-a"}
	b := picker.HoldKey{Model: "lora-b", Adapter: "lora-b"}
	q := newWaitQueue()
	enter := func(key picker.HoldKey, keyed bool) *waiter {
		w, ok := q.enter(0, key, keyed, 10)
		if !ok {
			t.Fatal("enter refused")
		}
		return w
	}
	a1, a2, b1, c1, c2 := enter(a, true), enter(a, true), enter(b, true), enter(picker.HoldKey{}, false), enter(picker.HoldKey{}, false)
	if q.blocked(&picker.Request{Priority: 0}, a, true) {
		t.Error("a newcomer is blocked before anything was held")
	}
	q.signal()
	for _, step := range []struct {
		name string
		w    *waiter
	}{{"a1", a1}, {"b1", b1}, {"c1", c1}, {"c2", c2}} {
		if !q.myTurn(step.w) {
			t.Fatalf("turn is not %s's", step.name)
		}
		if step.w != a1 && q.myTurn(a2) {
			t.Fatal("a2 got a turn after a1 was held")
		}
		if !q.blocked(&picker.Request{Priority: 0}, picker.HoldKey{Model: "other"}, true) {
			t.Error("a newcomer jumps the queue during a pass")
		}
		q.heldAgain(step.w)
	}
	for _, w := range []*waiter{a1, a2, b1, c1, c2} {
		if q.myTurn(w) {
			t.Fatal("a turn is left after the pass")
		}
	}
	// Until the next wake, a newcomer with a held key queues without a
	// cycle; one with another key, or none, is scheduled.
	if !q.blocked(&picker.Request{Priority: 0}, a, true) || !q.blocked(&picker.Request{Priority: 0}, b, true) {
		t.Error("newcomer with a held key not blocked")
	}
	if q.blocked(&picker.Request{Priority: 0}, picker.HoldKey{Model: "lora-c"}, true) || q.blocked(&picker.Request{Priority: 0}, picker.HoldKey{}, false) {
		t.Error("newcomer with an unheld key blocked")
	}
	if q.blocked(&picker.Request{Priority: 1}, a, true) {
		t.Error("a higher-priority newcomer is blocked by lower-priority waiters")
	}

	// A wake during a pass starts another once it ends; the turn holder
	// leaving hands the turn on.
	q.signal()
	if !q.myTurn(a1) {
		t.Fatal("second pass does not start at the head")
	}
	q.signal()
	q.leave(a1) // dispatched
	if !q.myTurn(a2) {
		t.Fatal("turn not handed to a2 when a1 left")
	}
	q.heldAgain(a2)
	q.heldAgain(b1)
	q.heldAgain(c1)
	q.heldAgain(c2)
	if !q.myTurn(a2) {
		t.Fatal("the wake during the pass did not start another at the head")
	}
}

// A standard request that finds the pool saturated waits, and goes out as
// soon as a pod has room again (well before its 1-minute bound).
func TestQueuedRequestProceedsWhenCapacityFrees(t *testing.T) {
	pod := newFakePod(t, "p0")
	pod.set(func(p *fakePod) { p.waiting = 50 })
	e := newEnv(t, []*fakePod{pod}, "queue: {max_wait: 1m}\n")
	done := make(chan result, 1)
	go func() { done <- e.do(t, "POST", "/v1/chat/completions", chatBody("llama", "hi"), nil) }()
	// Wait until it is queued, then free the pod.
	deadline := time.Now().Add(10 * time.Second)
	for e.gw.state.Load().pools["llama-pool"].queue.len() == 0 {
		if time.Now().After(deadline) {
			t.Fatal("request never queued")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if pod.hits.Load() != 0 {
		t.Fatal("queued request reached the saturated pod")
	}
	pod.set(func(p *fakePod) { p.waiting = 0 })
	res := <-done
	if res.status != 200 {
		t.Fatalf("status %d %s", res.status, res.body)
	}
}
