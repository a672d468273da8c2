package admission

import (
	"slices"
	"time"

	"github.com/infergate/infergate/tier1/picker"
)

// Queue orders waiting requests: higher priority first, then by key (see
// Order), then arrival order. Only the head should re-run the scheduler
// when capacity may have freed up, so that capacity goes to the most
// important request that ranks first. Queue holds no lock and no clock;
// its zero value is an empty queue.
type Queue[T comparable] struct {
	items []queued[T]
	seq   uint64
}

type queued[T comparable] struct {
	v    T
	prio int
	key  time.Duration
	seq  uint64
}

// Push adds v with priority prio behind every waiter of equal or higher
// priority (key 0: see PushKey).
func (q *Queue[T]) Push(prio int, v T) { q.PushKey(prio, 0, v) }

// PushKey adds v with priority prio and rank key (Order.Key): ahead of
// waiters of lower priority and of equal priority with a larger key,
// behind the others.
func (q *Queue[T]) PushKey(prio int, key time.Duration, v T) {
	q.seq++
	e := queued[T]{v: v, prio: prio, key: key, seq: q.seq}
	i, _ := slices.BinarySearchFunc(q.items, e, func(a, b queued[T]) int {
		if a.prio != b.prio {
			if a.prio > b.prio {
				return -1
			}
			return 1
		}
		switch {
		case a.key < b.key:
			return -1
		case a.key > b.key:
			return 1
		}
		switch {
		case a.seq < b.seq:
			return -1
		case a.seq > b.seq:
			return 1
		}
		return 0
	})
	q.items = slices.Insert(q.items, i, e)
}

// Ahead reports whether a request of priority prio pushed now would not be
// the head: someone of equal or higher priority already waits.
func (q *Queue[T]) Ahead(prio int) bool {
	return len(q.items) > 0 && q.items[0].prio >= prio
}

// Head returns the first waiter.
func (q *Queue[T]) Head() (T, bool) {
	if len(q.items) == 0 {
		var zero T
		return zero, false
	}
	return q.items[0].v, true
}

// Remove takes v out of the queue, reporting whether it was there.
func (q *Queue[T]) Remove(v T) bool {
	for i := range q.items {
		if q.items[i].v == v {
			q.items = slices.Delete(q.items, i, i+1)
			return true
		}
	}
	return false
}

// Len is the number of waiters.
func (q *Queue[T]) Len() int { return len(q.items) }

// All returns the waiters in queue order (a copy).
func (q *Queue[T]) All() []T {
	out := make([]T, len(q.items))
	for i, e := range q.items {
		out[i] = e.v
	}
	return out
}

// Order ranks waiters within one priority. The zero value is arrival
// order.
type Order struct {
	// ShortestPrefill > 0 ranks a waiter by its arrival plus
	// ShortestPrefill × its estimated prefill time, so shorter prefills
	// are sent first: the engine serves what it was sent in order, and a
	// long prompt sent first delays every prompt behind it by its whole
	// prefill. The extra wait is bounded: a waiter is passed only by
	// requests arriving less than ShortestPrefill × its own prefill time
	// after it.
	ShortestPrefill float64
}

// OrderOf is the order a profile configures.
func OrderOf(c picker.WaitOrderConfig) Order { return Order{ShortestPrefill: c.ShortestPrefill} }

// Key is the rank of a request that starts waiting at now (on any clock
// that does not go back, the same for every waiter) with an estimated
// prefill time of prefill; lower keys go first.
func (o Order) Key(now, prefill time.Duration) time.Duration {
	if o.ShortestPrefill <= 0 {
		return now
	}
	return now + time.Duration(o.ShortestPrefill*float64(prefill))
}

// Ranked reports whether the order needs each waiter's prefill estimate.
func (o Order) Ranked() bool { return o.ShortestPrefill > 0 }
