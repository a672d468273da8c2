package bench

import (
	"context"
	"fmt"
	"io"
	"math"
	"runtime"
	"sync"
	"time"

	"github.com/infergate/infergate/bench/report"
	"github.com/infergate/infergate/bench/workload"
)

// Comparison is a side-by-side run of policies over seeds.
type Comparison struct {
	Setup    Setup
	Policies []Policy
	Seeds    []uint64
	// Stream returns the request stream of a seed; it is called once per
	// seed and the stream is shared read-only by every policy.
	Stream  func(seed uint64) (workload.Stream, error)
	Options Options
	// Parallel is how many simulations run at once; 0 means GOMAXPROCS.
	// Each simulation is single-threaded and deterministic, so results do
	// not depend on it.
	Parallel int
	// Progress, if set, receives progress once the run has taken more than
	// two seconds: a line rewritten in place (\r) when ProgressInPlace is
	// set (a terminal), else a line at most every 10 s.
	Progress        io.Writer
	ProgressInPlace bool
}

// Outcome is what a Comparison measured.
type Outcome struct {
	Runs []report.Run // in (seed, policy) order
	// OfferedRPS is the first seed's mean arrival rate; CapacityRPS the
	// fleet's saturated throughput on that stream's mix (see Capacity).
	OfferedRPS, CapacityRPS float64
	// EvenSplitUtilisation is the busiest pod type's utilisation if
	// requests were split evenly over pods (what round-robin does): above
	// 1 the slowest pods cannot keep up under round-robin.
	EvenSplitUtilisation float64
}

// Run runs every (policy, seed) simulation plus each seed's floor
// computation and the capacity estimate.
func (c Comparison) Run(ctx context.Context) (Outcome, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	streams := make([]workload.Stream, len(c.Seeds))
	for i, s := range c.Seeds {
		st, err := c.Stream(s)
		if err != nil {
			return Outcome{}, fmt.Errorf("seed %d: %w", s, err)
		}
		streams[i] = st
	}
	np := len(c.Policies)
	runs := make([]report.Run, len(c.Seeds)*np)
	floors := make([][]float64, len(c.Seeds))
	causal := make([][]float64, len(c.Seeds))
	var (
		capacity float64
		perPod   []float64
	)
	type job struct{ seed, pol int } // pol == -1: floor, -2: capacity
	jobs := make(chan job)
	var (
		mu       sync.Mutex
		firstErr error
		done     int
		start    = time.Now()
		shown    bool
		lastLine time.Time
	)
	total := len(c.Seeds)*(np+1) + 1
	report1 := func(err error) {
		mu.Lock()
		defer mu.Unlock()
		if err != nil && firstErr == nil {
			firstErr = err
			cancel()
		}
		done++
		if c.Progress == nil {
			return
		}
		el := time.Since(start)
		if el < 2*time.Second && !(shown && done == total) {
			return
		}
		line := fmt.Sprintf("bench %s: %d/%d simulations done (%s)", c.Setup.Name, done, total, el.Round(100*time.Millisecond))
		// Progress only: a failed write to it must not stop the run.
		switch {
		case c.ProgressInPlace:
			_, _ = fmt.Fprint(c.Progress, "\r"+line)
			if done == total {
				_, _ = fmt.Fprintln(c.Progress)
			}
		case done == total || time.Since(lastLine) >= 10*time.Second:
			_, _ = fmt.Fprintln(c.Progress, line)
			lastLine = time.Now()
		}
		shown = true
	}
	par := c.Parallel
	if par <= 0 {
		par = runtime.GOMAXPROCS(0)
	}
	var wg sync.WaitGroup
	for range par {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range jobs {
				if ctx.Err() != nil {
					report1(nil)
					continue
				}
				if j.pol == -2 {
					v, pp, err := Capacity(ctx, c.Setup.Fleet, streams[0])
					capacity, perPod = v, pp
					report1(err)
					continue
				}
				if j.pol < 0 {
					sp := RunSpeeds(c.Options.Realism, c.Seeds[j.seed])
					f, err := Floors(ctx, c.Setup.Fleet, streams[j.seed], sp)
					floors[j.seed] = f
					if err == nil {
						causal[j.seed], err = CausalFloors(ctx, c.Setup.Fleet, streams[j.seed], f, sp)
					}
					report1(err)
					continue
				}
				opts := c.Options
				opts.RecordLoad = opts.RecordLoad && j.seed == 0
				r, err := Run(ctx, c.Setup, c.Policies[j.pol], c.Seeds[j.seed], streams[j.seed], opts)
				if err != nil {
					err = fmt.Errorf("%s seed %d: %w", c.Policies[j.pol].Name, c.Seeds[j.seed], err)
				}
				runs[j.seed*np+j.pol] = r
				report1(err)
			}
		}()
	}
	// Floors first: they are the longest single jobs on big traces.
	jobs <- job{0, -2}
	for s := range c.Seeds {
		jobs <- job{s, -1}
	}
	for s := range c.Seeds {
		for p := range c.Policies {
			jobs <- job{s, p}
		}
	}
	close(jobs)
	wg.Wait()
	if firstErr != nil {
		return Outcome{}, firstErr
	}
	if err := ctx.Err(); err != nil {
		return Outcome{}, err
	}
	for s := range c.Seeds {
		var fl []float64
		for _, v := range floors[s] {
			if !math.IsNaN(v) {
				fl = append(fl, v)
			}
		}
		var cf []float64
		for _, v := range causal[s] {
			if !math.IsNaN(v) {
				cf = append(cf, v)
			}
		}
		for p := range c.Policies {
			runs[s*np+p].Floor = fl
			runs[s*np+p].CausalFloor = cf
		}
	}
	out := Outcome{Runs: runs, CapacityRPS: capacity}
	if d := streams[0].Duration.Seconds(); d > 0 {
		out.OfferedRPS = float64(len(streams[0].Requests)) / d
	}
	share := out.OfferedRPS / float64(max(c.Setup.Fleet.Size(), 1))
	for _, pc := range perPod {
		if pc > 0 {
			out.EvenSplitUtilisation = max(out.EvenSplitUtilisation, share/pc)
		}
	}
	return out, nil
}
