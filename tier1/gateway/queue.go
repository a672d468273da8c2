package gateway

import (
	"sync"
	"time"

	"github.com/infergate/infergate/tier1/admission"
)

// waitQueue is one pool's admission.Queue of requests that found every pod
// saturated, made safe for concurrent use and able to wake its waiters.
// Only the head re-runs the scheduler when woken (see waitForCapacity).
type waitQueue struct {
	mu    sync.Mutex
	q     admission.Queue[*waiter]
	wake  chan struct{}
	epoch time.Time // zero of the queue's keys (monotonic clock)
}

// waiter is one queued request; its address is its identity.
type waiter struct{ prio int }

func newWaitQueue() *waitQueue {
	return &waitQueue{wake: make(chan struct{}), epoch: time.Now()}
}

// enter adds a waiter of priority prio that ranks by prefill (its
// estimated prefill time, admission.Order) unless the queue already holds
// maxLen.
func (q *waitQueue) enter(prio int, order admission.Order, prefill time.Duration, maxLen int) (*waiter, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.q.Len() >= maxLen {
		return nil, false
	}
	w := &waiter{prio: prio}
	// Read under the lock, so keys of arrival order never go back.
	q.q.PushKey(prio, order.Key(time.Since(q.epoch), prefill), w)
	return w, true
}

// ahead reports whether a request of priority prio would queue behind
// someone already waiting (see admission.Arrive).
func (q *waitQueue) ahead(prio int) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.q.Ahead(prio)
}

// leave removes w and wakes the others: the next head may now proceed.
func (q *waitQueue) leave(w *waiter) {
	q.mu.Lock()
	q.q.Remove(w)
	q.signalLocked()
	q.mu.Unlock()
}

// isHead reports whether w is first in line, and returns the channel that
// is closed at the next signal.
func (q *waitQueue) isHead(w *waiter) (bool, <-chan struct{}) {
	q.mu.Lock()
	defer q.mu.Unlock()
	h, ok := q.q.Head()
	return ok && h == w, q.wake
}

// signal wakes the waiters (pod state changed or a request finished).
func (q *waitQueue) signal() {
	q.mu.Lock()
	q.signalLocked()
	q.mu.Unlock()
}

func (q *waitQueue) signalLocked() {
	if q.q.Len() == 0 {
		return // nobody listening: skip the channel churn on the hot path
	}
	close(q.wake)
	q.wake = make(chan struct{})
}

func (q *waitQueue) len() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.q.Len()
}
