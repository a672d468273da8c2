package gateway

import (
	"slices"
	"sync"
)

// waitQueue orders the requests of one pool that found every pod
// saturated: higher priority first, then arrival. Only the head re-runs
// the scheduler when woken, so capacity that frees up goes to the most
// important, oldest request.
type waitQueue struct {
	mu      sync.Mutex
	waiters []*waiter
	seq     uint64
	wake    chan struct{}
}

type waiter struct {
	prio int
	seq  uint64
}

func newWaitQueue() *waitQueue {
	return &waitQueue{wake: make(chan struct{})}
}

// enter adds a waiter unless the queue already holds maxLen.
func (q *waitQueue) enter(prio, maxLen int) (*waiter, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(q.waiters) >= maxLen {
		return nil, false
	}
	q.seq++
	w := &waiter{prio: prio, seq: q.seq}
	i, _ := slices.BinarySearchFunc(q.waiters, w, func(a, b *waiter) int {
		if a.prio != b.prio {
			return b.prio - a.prio // descending priority
		}
		return int(a.seq - b.seq)
	})
	q.waiters = slices.Insert(q.waiters, i, w)
	return w, true
}

// leave removes w and wakes the others: the next head may now proceed.
func (q *waitQueue) leave(w *waiter) {
	q.mu.Lock()
	if i := slices.Index(q.waiters, w); i >= 0 {
		q.waiters = slices.Delete(q.waiters, i, i+1)
	}
	q.signalLocked()
	q.mu.Unlock()
}

// isHead reports whether w is first in line, and returns the channel that
// is closed at the next signal.
func (q *waitQueue) isHead(w *waiter) (bool, <-chan struct{}) {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.waiters) > 0 && q.waiters[0] == w, q.wake
}

// signal wakes the waiters (pod state changed or a request finished).
func (q *waitQueue) signal() {
	q.mu.Lock()
	q.signalLocked()
	q.mu.Unlock()
}

func (q *waitQueue) signalLocked() {
	if len(q.waiters) == 0 {
		return // nobody listening: skip the channel churn on the hot path
	}
	close(q.wake)
	q.wake = make(chan struct{})
}

func (q *waitQueue) len() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.waiters)
}
