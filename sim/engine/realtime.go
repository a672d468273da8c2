package engine

import (
	"context"
	"sync"
	"time"
)

// DefaultRealtimeCoalesce caps how much simulated time one coalesced run of
// decode steps may cover under Realtime, so tokens still stream in small
// groups.
const DefaultRealtimeCoalesce = 25 * time.Millisecond

// Realtime drives an Engine against the wall clock. Safe for concurrent use;
// the engine's callbacks run on Run's goroutine with the lock held.
type Realtime struct {
	mu    sync.Mutex
	e     *Engine
	scale float64 // real seconds per simulated second
	epoch time.Time
	wake  chan struct{}
}

// NewRealtime wraps e. timeScale is real seconds per simulated second: 1 is
// real time, 0.05 runs 20× faster; non-positive means 1. The engine's epoch
// (time 0) is now.
func NewRealtime(e *Engine, timeScale float64) *Realtime {
	if timeScale <= 0 {
		timeScale = 1
	}
	if e.maxCoalesce == 0 {
		e.maxCoalesce = DefaultRealtimeCoalesce
	}
	return &Realtime{e: e, scale: timeScale, epoch: time.Now(), wake: make(chan struct{}, 1)}
}

// now is the simulated time; call with mu held (time only moves forward
// for the engine anyway).
func (rt *Realtime) now() time.Duration {
	return time.Duration(float64(time.Since(rt.epoch)) / rt.scale)
}

func (rt *Realtime) kick() {
	select {
	case rt.wake <- struct{}{}:
	default:
	}
}

// Run advances the engine until ctx is done.
func (rt *Realtime) Run(ctx context.Context) {
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		rt.mu.Lock()
		now := rt.now()
		rt.e.Advance(now)
		next, ok := rt.e.NextEventTime()
		rt.mu.Unlock()
		wait := time.Hour
		if ok {
			wait = max(0, time.Duration(float64(next-now)*rt.scale))
		}
		timer.Reset(wait)
		select {
		case <-ctx.Done():
			return
		case <-rt.wake:
			if !timer.Stop() {
				select {
				case <-timer.C:
				default:
				}
			}
		case <-timer.C:
		}
	}
}

// Submit enqueues r now. See Engine.Submit for the errors.
func (rt *Realtime) Submit(r *Request) error {
	rt.mu.Lock()
	err := rt.e.Submit(rt.now(), r)
	rt.mu.Unlock()
	if err == nil {
		rt.kick()
	}
	return err
}

// Cancel aborts request id now.
func (rt *Realtime) Cancel(id uint64) {
	rt.mu.Lock()
	rt.e.Cancel(rt.now(), id)
	rt.mu.Unlock()
	rt.kick()
}

// Do runs fn with the engine locked, at simulated time now (stats, adapter
// management). fn must not call the Realtime's methods.
func (rt *Realtime) Do(fn func(e *Engine, now time.Duration)) {
	rt.mu.Lock()
	fn(rt.e, rt.now())
	rt.mu.Unlock()
	rt.kick()
}
