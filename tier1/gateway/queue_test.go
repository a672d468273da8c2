package gateway

import (
	"testing"
	"time"

	"github.com/infergate/infergate/tier1/admission"
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
		w, ok := q.enter(a.prio, admission.Order{}, 0, 10)
		if !ok {
			t.Fatal("enter refused")
		}
		ws[a.name] = w
	}
	want := []string{"crit1", "crit2", "mid", "std1", "std2", "low"}
	for _, name := range want {
		if head, _ := q.isHead(ws[name]); !head {
			t.Fatalf("head is not %s", name)
		}
		q.leave(ws[name])
	}
	if q.len() != 0 {
		t.Errorf("len = %d after all left", q.len())
	}
	// Bounded.
	for i := 0; i < 2; i++ {
		q.enter(0, admission.Order{}, 0, 2)
	}
	if _, ok := q.enter(5, admission.Order{}, 0, 2); ok {
		t.Error("enter beyond max_len accepted")
	}
}

func TestWaitQueueSignal(t *testing.T) {
	q := newWaitQueue()
	w, _ := q.enter(0, admission.Order{}, 0, 10)
	_, ch := q.isHead(w)
	q.signal()
	select {
	case <-ch:
	default:
		t.Fatal("signal did not close the wake channel")
	}
	_, ch2 := q.isHead(w)
	select {
	case <-ch2:
		t.Fatal("new wake channel already closed")
	default:
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
