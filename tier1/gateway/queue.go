package gateway

import (
	"sync"
	"time"

	"github.com/infergate/infergate/tier1/admission"
	"github.com/infergate/infergate/tier1/picker"
)

// waitQueue is one pool's admission.Queue of requests that found every pod
// saturated or busy, made safe for concurrent use. A wake (a scrape, a
// first token, a completion) starts an admission.Pass: the turn goes to
// the head and, each time the waiter holding it is held again, on to the
// next waiter whose HoldKey the pass has not seen held, so a waiter that
// wants other pods than the head (another adapter's) is not stuck behind
// it. Each waiter's goroutine runs its own scheduling cycle on its turn
// (see waitForCapacity).
type waitQueue struct {
	mu    sync.Mutex
	q     admission.Queue[*waiter]
	pass  admission.Pass
	turn  *waiter // whose turn it is in the open pass
	again bool    // woken during the open pass: start another when it ends
}

// waiter is one queued request; its address is its identity.
type waiter struct {
	key   picker.HoldKey
	keyed bool
	turn  chan struct{} // receives when the turn reaches this waiter
	prio  int           // for the status page (status.go)
	since time.Time     // when it entered
}

func newWaitQueue() *waitQueue { return &waitQueue{} }

// enter adds a waiter of priority prio and hold key (key, keyed) unless
// the queue already holds maxLen.
func (q *waitQueue) enter(prio int, key picker.HoldKey, keyed bool, maxLen int) (*waiter, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.q.Len() >= maxLen {
		return nil, false
	}
	w := &waiter{key: key, keyed: keyed, turn: make(chan struct{}, 1), prio: prio, since: time.Now()}
	q.q.Push(prio, w)
	if q.pass.Open() {
		// It may rank ahead of the turn: the next pass sees it.
		q.again = true
	}
	return w, true
}

// blocked reports whether req, with hold key (key, keyed), queues (or is
// shed) without a scheduling cycle (admission.Arrive): someone of equal or
// higher priority waits and the queue's pass says so
// (admission.Pass.Blocks).
func (q *waitQueue) blocked(req *picker.Request, key picker.HoldKey, keyed bool) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.q.Ahead(req.Priority) && q.pass.Blocks(req, key, keyed)
}

// held records that a newcomer was scheduled and held, so that later ones
// with its key queue without a cycle until the next wake.
func (q *waitQueue) held(key picker.HoldKey, keyed bool) {
	q.mu.Lock()
	q.pass.Held(key, keyed)
	q.mu.Unlock()
}

// myTurn reports whether the open pass has reached w.
func (q *waitQueue) myTurn(w *waiter) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.turn == w
}

// heldAgain passes w's turn on: it was scheduled and held.
func (q *waitQueue) heldAgain(w *waiter) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.turn != w {
		return
	}
	q.pass.Held(w.key, w.keyed)
	q.advanceLocked(w)
}

// leave removes w, passing its turn on if it had it (it was dispatched, or
// its wait ended).
func (q *waitQueue) leave(w *waiter) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.turn != w {
		q.q.Remove(w)
		return
	}
	next, ok := q.after(w)
	q.q.Remove(w) // before the pass may end and start another at w
	if ok {
		q.giveLocked(next)
	} else {
		q.endLocked()
	}
}

// signal wakes the queue (pod state changed or a request finished): a new
// pass starts at the head, or, if one is under way, right after it.
func (q *waitQueue) signal() {
	q.mu.Lock()
	q.signalLocked()
	q.mu.Unlock()
}

// poll is a waiter's periodic check, in case a pod stops reporting: it
// starts a pass if none is under way.
func (q *waitQueue) poll() {
	q.mu.Lock()
	if !q.pass.Open() {
		q.signalLocked()
	}
	q.mu.Unlock()
}

func (q *waitQueue) signalLocked() {
	if q.q.Len() == 0 {
		return // nobody waiting: nothing to do on the hot path
	}
	if q.pass.Open() {
		q.again = true
		return
	}
	q.pass.Start()
	q.again = false
	h, _ := q.q.Head()
	q.giveLocked(h)
}

// advanceLocked gives the turn to the first waiter behind from that the
// pass does not skip, or ends the pass.
func (q *waitQueue) advanceLocked(from *waiter) {
	next, ok := q.after(from)
	if !ok {
		q.endLocked()
		return
	}
	q.giveLocked(next)
}

// after is the first waiter behind from that the pass does not skip.
func (q *waitQueue) after(from *waiter) (*waiter, bool) {
	return q.q.After(from, func(w *waiter) bool { return q.pass.Skip(w.key, w.keyed) })
}

func (q *waitQueue) endLocked() {
	q.turn = nil
	q.pass.End()
	if q.again {
		q.signalLocked()
	}
}

func (q *waitQueue) giveLocked(w *waiter) {
	q.turn = w
	select {
	case w.turn <- struct{}{}:
	default: // an earlier turn's token is still unread; one suffices
	}
}

func (q *waitQueue) len() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.q.Len()
}
