package peers

import (
	"log/slog"
	"sync"
	"time"
)

// rateLog writes at most one warning per interval: a peer refused on
// every reconnect, or a flood of bad connections, cannot flood the log.
// Each line counts the events it stands for (itself and those left out
// since the previous line); Flush writes a summary of the events left out
// once the interval has passed. The counters in metrics.go stay exact.
type rateLog struct {
	log   *slog.Logger
	every time.Duration
	now   func() time.Time

	mu      sync.Mutex
	last    time.Time // the last line written
	pending int       // events since it
}

func newRateLog(log *slog.Logger, every time.Duration, now func() time.Time) *rateLog {
	if now == nil {
		now = time.Now
	}
	return &rateLog{log: log, every: every, now: now}
}

// Warn records an event and logs it unless a line went out within the
// interval.
func (r *rateLog) Warn(msg string, args ...any) {
	r.mu.Lock()
	r.pending++
	now := r.now()
	if !r.last.IsZero() && now.Sub(r.last) < r.every {
		r.mu.Unlock()
		return
	}
	n := r.pending
	r.pending, r.last = 0, now
	r.mu.Unlock()
	r.log.Warn(msg, append(args, "events", n)...)
}

// Flush logs how many events were left out since the last line, once the
// interval has passed.
func (r *rateLog) Flush(msg string) {
	r.mu.Lock()
	now := r.now()
	if r.pending == 0 || now.Sub(r.last) < r.every {
		r.mu.Unlock()
		return
	}
	n := r.pending
	r.pending, r.last = 0, now
	r.mu.Unlock()
	r.log.Warn(msg, "events", n)
}
