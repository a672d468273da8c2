// Package clock holds the one ticker loop that the gateways' background
// workers share, so that each of them states only what it does per tick.
package clock

import (
	"context"
	"iter"
	"time"
)

// Ticks yields the time of each tick of a ticker that fires every interval,
// until ctx ends or the loop over it stops; either way the ticker is
// stopped. A tick that is not taken while the loop body runs is dropped, as
// with time.Ticker. Like time.NewTicker, it panics when every is not
// positive, on the first iteration.
func Ticks(ctx context.Context, every time.Duration) iter.Seq[time.Time] {
	return func(yield func(time.Time) bool) {
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case now := <-t.C:
				if !yield(now) {
					return
				}
			}
		}
	}
}
