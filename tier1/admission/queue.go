package admission

import (
	"slices"

	"github.com/infergate/infergate/tier1/picker"
)

// Queue orders waiting requests: higher priority first, then arrival
// order. When capacity may have freed up, waiters
// re-run the scheduler in queue order, one Pass at a time, so that
// capacity goes to the most important request that ranks first and can
// use it. Queue holds no lock and no clock; its zero value is an empty
// queue.
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

// After returns the first waiter behind v for which skip is false, if v
// waits and there is one.
func (q *Queue[T]) After(v T, skip func(T) bool) (T, bool) {
	for i := range q.items {
		if q.items[i].v != v {
			continue
		}
		for _, e := range q.items[i+1:] {
			if !skip(e.v) {
				return e.v, true
			}
		}
		break
	}
	var zero T
	return zero, false
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

// PassScan bounds the scheduling cycles one Pass runs for waiters whose
// answer no earlier waiter's stands for (keyless waiters: see
// picker.Scheduler.HoldKey), so a wake costs at most this many cycles
// beyond the dispatches it makes.
const PassScan = 32

// Pass is one pass over the wait queue after a wake (a scrape, a first
// token, a completion: anything that may have freed a pod), in queue
// order. Every waiter gets its turn, not only the head: a waiter is held
// only if no pod will take it, and the head being held says nothing about
// a waiter that wants other pods (another LoRA adapter, whose pods are
// idle). Without the pass such a waiter queued behind the head
// until the head left (head-of-line blocking).
//
// Order is kept: a waiter is scheduled only after every waiter ahead of it
// was held in this pass, and within one state of the pods a dispatch only
// adds load, so a pod that takes a later waiter is one no earlier waiter
// could use. A waiter whose HoldKey was already held in this pass is held
// without a cycle (Skip), and so is a newcomer (Blocks) until the next
// wake; keyless waiters are scheduled, at most PassScan of them per pass.
// The zero value is a Pass that has seen nothing held.
type Pass struct {
	held    map[picker.HoldKey]bool
	open    bool
	scanned int
}

// Start begins a pass: the pods' state changed, so nothing held before
// still stands.
func (p *Pass) Start() {
	clear(p.held)
	p.open, p.scanned = true, 0
}

// End closes the pass: until the next Start, what it held stands.
func (p *Pass) End() { p.open = false }

// Open reports whether a pass has started and not ended.
func (p *Pass) Open() bool { return p.open }

// Held records that a waiter (or a newcomer) with this key was held.
func (p *Pass) Held(key picker.HoldKey, keyed bool) {
	if !keyed {
		p.scanned++
		return
	}
	if p.held == nil {
		p.held = make(map[picker.HoldKey]bool)
	}
	p.held[key] = true
}

// Skip reports whether a waiter with this key is held without a
// scheduling cycle in this pass: one with its key was held already, or
// the pass has run PassScan cycles for keyless waiters.
func (p *Pass) Skip(key picker.HoldKey, keyed bool) bool {
	if !keyed {
		return p.scanned >= PassScan
	}
	return p.held[key]
}

// Blocks reports whether newcomer req, with hold key (key, keyed),
// arriving behind waiters of equal or higher priority, must queue without
// a scheduling cycle (Arrive): it is sheddable (judged at its own wait, it
// could take a pod the waiters ahead are held from), a pass is under way
// (the waiters ahead have not had their turn on the new state), or a
// request with its key was held since the last wake. Otherwise it is
// scheduled, and held only if no pod takes it.
func (p *Pass) Blocks(req *picker.Request, key picker.HoldKey, keyed bool) bool {
	return req.Sheddable || p.open || keyed && p.held[key]
}
