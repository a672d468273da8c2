package admission

import "slices"

// Queue orders waiting requests: higher priority first, then arrival
// order. Only the head should re-run the scheduler when capacity may have
// freed up, so that capacity goes to the most important, oldest request.
// Queue holds no lock and no clock; its zero value is an empty queue.
type Queue[T comparable] struct {
	items []queued[T]
	seq   uint64
}

type queued[T comparable] struct {
	v    T
	prio int
	seq  uint64
}

// Push adds v with priority prio behind every waiter of equal or higher
// priority.
func (q *Queue[T]) Push(prio int, v T) {
	q.seq++
	e := queued[T]{v: v, prio: prio, seq: q.seq}
	i, _ := slices.BinarySearchFunc(q.items, e, func(a, b queued[T]) int {
		if a.prio != b.prio {
			if a.prio > b.prio {
				return -1
			}
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
