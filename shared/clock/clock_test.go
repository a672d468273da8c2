package clock

import (
	"context"
	"testing"
	"time"
)

func TestTicks(t *testing.T) {
	tests := []struct {
		name string
		// stopAfter is the tick on which the loop breaks; 0: never, the
		// context ends it.
		stopAfter int
		// cancelAfter cancels the context on that tick and keeps looping.
		cancelAfter int
		want        int
	}{
		{name: "break ends the loop", stopAfter: 3, want: 3},
		{name: "context end ends the loop", cancelAfter: 2, want: 2},
		{name: "break on the first tick", stopAfter: 1, want: 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			done := make(chan int)
			go func() {
				n := 0
				var last time.Time
				for now := range Ticks(ctx, time.Millisecond) {
					n++
					if now.Before(last) {
						t.Errorf("tick %d at %v, before the previous %v", n, now, last)
					}
					last = now
					if n == tc.stopAfter {
						break
					}
					if n == tc.cancelAfter {
						cancel()
						// Let the next tick fall due, so that the select
						// has both to choose from; the context must win
						// within a few ticks.
						time.Sleep(2 * time.Millisecond)
					}
					if n > tc.cancelAfter+100 && tc.cancelAfter > 0 {
						t.Errorf("still ticking %d ticks after the context ended", n-tc.cancelAfter)
						break
					}
				}
				done <- n
			}()
			select {
			case n := <-done:
				if tc.stopAfter > 0 && n != tc.want {
					t.Errorf("loop ran %d times, want %d", n, tc.want)
				}
				if tc.cancelAfter > 0 && n < tc.want {
					t.Errorf("loop ran %d times, want at least %d", n, tc.want)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("loop did not end")
			}
		})
	}
}

func TestTicksAlreadyEnded(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	for range Ticks(ctx, time.Hour) {
		t.Fatal("a context that has already ended yielded a tick")
	}
}

func TestTicksPanicsOnNonPositive(t *testing.T) {
	for _, every := range []time.Duration{0, -time.Second} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("Ticks(%v) did not panic", every)
				}
			}()
			for range Ticks(context.Background(), every) {
				break
			}
		}()
	}
}
