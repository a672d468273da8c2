package engine

import "time"

// Loop is a deterministic virtual-time discrete-event loop over many
// engines and external events (arrivals, scrape ticks). Events at the same
// time run in the order they were scheduled; an engine's pending step is
// re-keyed whenever Submit or Cancel changes it. Not safe for concurrent use.
type Loop struct {
	now   time.Duration
	heap  []*loopItem
	seq   uint64
	dirty []*Engine
	free  []*loopItem
}

type loopItem struct {
	t   time.Duration
	seq uint64
	fn  func(now time.Duration)
	e   *Engine
	idx int
}

// NewLoop returns an empty loop at time 0.
func NewLoop() *Loop { return &Loop{} }

// Now is the loop's current virtual time.
func (l *Loop) Now() time.Duration { return l.now }

// Add puts e under the loop's control. An engine belongs to one loop.
func (l *Loop) Add(e *Engine) {
	e.notify = l.markDirty
	l.markDirty(e)
}

// At schedules fn at time t (clamped to Now).
func (l *Loop) At(t time.Duration, fn func(now time.Duration)) {
	it := l.item()
	it.t, it.fn = max(t, l.now), fn
	l.push(it)
}

// Run processes every event up to and including until, then sets Now to
// until (if later).
func (l *Loop) Run(until time.Duration) {
	l.flush()
	for len(l.heap) > 0 {
		it := l.heap[0]
		if it.t > until {
			break
		}
		l.pop()
		l.now = it.t
		if fn := it.fn; fn != nil {
			l.recycle(it)
			fn(l.now)
		} else {
			e := it.e
			e.loopIt = nil
			l.recycle(it)
			e.Advance(l.now)
			l.markDirty(e)
		}
		l.flush()
	}
	l.now = max(l.now, until)
}

func (l *Loop) markDirty(e *Engine) {
	if !e.inDirty {
		e.inDirty = true
		l.dirty = append(l.dirty, e)
	}
}

func (l *Loop) flush() {
	for i, e := range l.dirty {
		l.dirty[i] = nil
		e.inDirty = false
		t, ok := e.NextEventTime()
		it := e.loopIt
		if !ok {
			if it != nil {
				l.remove(it)
				e.loopIt = nil
				l.recycle(it)
			}
			continue
		}
		t = max(t, l.now)
		if it != nil {
			if it.t == t {
				continue
			}
			l.remove(it)
		} else {
			it = l.item()
			it.e = e
			e.loopIt = it
		}
		it.t = t
		l.push(it)
	}
	l.dirty = l.dirty[:0]
}

func (l *Loop) item() *loopItem {
	if n := len(l.free); n > 0 {
		it := l.free[n-1]
		l.free = l.free[:n-1]
		return it
	}
	return &loopItem{}
}

func (l *Loop) recycle(it *loopItem) {
	*it = loopItem{}
	l.free = append(l.free, it)
}

func (l *Loop) less(a, b *loopItem) bool {
	if a.t != b.t {
		return a.t < b.t
	}
	return a.seq < b.seq
}

func (l *Loop) push(it *loopItem) {
	l.seq++
	it.seq = l.seq
	it.idx = len(l.heap)
	l.heap = append(l.heap, it)
	l.up(it.idx)
}

func (l *Loop) pop() {
	n := len(l.heap) - 1
	l.swap(0, n)
	l.heap[n] = nil
	l.heap = l.heap[:n]
	if n > 0 {
		l.down(0)
	}
}

func (l *Loop) remove(it *loopItem) {
	i := it.idx
	n := len(l.heap) - 1
	if i != n {
		l.swap(i, n)
	}
	l.heap[n] = nil
	l.heap = l.heap[:n]
	if i != n {
		l.down(i)
		l.up(i)
	}
}

func (l *Loop) swap(i, j int) {
	h := l.heap
	h[i], h[j] = h[j], h[i]
	h[i].idx, h[j].idx = i, j
}

func (l *Loop) up(i int) {
	for i > 0 {
		p := (i - 1) / 2
		if !l.less(l.heap[i], l.heap[p]) {
			return
		}
		l.swap(i, p)
		i = p
	}
}

func (l *Loop) down(i int) {
	n := len(l.heap)
	for {
		c := 2*i + 1
		if c >= n {
			return
		}
		if r := c + 1; r < n && l.less(l.heap[r], l.heap[c]) {
			c = r
		}
		if !l.less(l.heap[c], l.heap[i]) {
			return
		}
		l.swap(i, c)
		i = c
	}
}
