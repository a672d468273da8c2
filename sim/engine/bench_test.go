package engine

import (
	"math/rand/v2"
	"syscall"
	"testing"
	"time"
)

// fleetSaturated runs pods pods of model on gpu for dur simulated time with
// clients closed-loop clients each (more than MaxNumSeqs, so queues never
// empty) and a 50 ms scrape tick per pod; it returns finished requests.
func fleetSaturated(b testing.TB, model, gpu string, tp, pods, clients int, dur time.Duration) (finished int64, steps int64) {
	cfg := mustConfig(b, model, gpu, tp)
	l := NewLoop()
	engines := make([]*Engine, pods)
	for i := range engines {
		engines[i] = mustEngine(b, cfg)
		l.Add(engines[i])
	}
	rng := rand.New(rand.NewPCG(1, 2))
	prefixes := make([][]uint64, 8)
	for i := range prefixes {
		prefixes[i] = hashes(uint64(i), 2048/BlockSize)
	}
	var nextID uint64
	var submit func(now time.Duration)
	submit = func(now time.Duration) {
		e := engines[rng.IntN(pods)]
		prompt := 200 + rng.IntN(1800)
		// Every prompt carries its block hashes, as the server computes them;
		// a quarter start with one of 8 shared system prompts of up to 1024
		// tokens.
		nextID++
		h := make([]uint64, prompt/BlockSize)
		shared := 0
		if rng.IntN(4) == 0 {
			p := prefixes[rng.IntN(len(prefixes))]
			shared = copy(h, p[:min(len(h), 64)])
		}
		for i := shared; i < len(h); i++ {
			h[i] = nextID<<20 | uint64(i)
		}
		r := &Request{ID: nextID, PromptTokens: prompt, MaxTokens: 50 + rng.IntN(350), BlockHashes: h,
			OnDone: func(at time.Duration, _ Result) {
				l.At(at+time.Duration(rng.ExpFloat64()*float64(50*time.Millisecond)), submit)
			}}
		if err := e.Submit(now, r); err != nil {
			b.Fatal(err)
		}
	}
	for range pods * clients {
		l.At(time.Duration(rng.IntN(1000))*time.Millisecond, submit)
	}
	var scrape func(now time.Duration)
	scrape = func(now time.Duration) {
		for _, e := range engines {
			_ = e.Stats()
		}
		l.At(now+50*time.Millisecond, scrape)
	}
	l.At(0, scrape)
	l.Run(dur)
	for _, e := range engines {
		st := e.Stats()
		finished += st.FinishedRequests
		steps += st.Steps
	}
	return finished, steps
}

// BenchmarkFleet16Saturated: 10 simulated minutes of 16 Llama-3.1-8B/H100
// pods at saturation. Run with -cpu 1 -benchtime 1x; see
// docs/performance-engine.md.
func BenchmarkFleet16Saturated(b *testing.B) {
	const sim = 10 * time.Minute
	var finished, steps int64
	cpu0 := cpuTime()
	start := time.Now()
	for b.Loop() {
		finished, steps = fleetSaturated(b, "llama-3.1-8b", "h100", 1, 16, 320, sim)
	}
	wall := time.Since(start) / time.Duration(b.N)
	cpu := (cpuTime() - cpu0) / time.Duration(b.N)
	b.ReportMetric(float64(sim)/float64(wall), "sim/wall")
	// CPU time is the figure to trust on a shared machine, where wall time
	// includes waiting for a core.
	b.ReportMetric(cpu.Seconds(), "cpu-s/op")
	b.ReportMetric(float64(finished), "requests")
	b.ReportMetric(float64(steps), "steps")
}

// cpuTime is the process's user+system CPU time.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkFleet16LightLoad: 16 pods at light load (Poisson arrivals, 0.5
// requests/s per pod, 500-token prompts, 1000 output tokens), where
// decode-only stretches dominate; "stepwise" disables coalescing to show
// what it saves.
func BenchmarkFleet16LightLoad(b *testing.B) {
	for _, mode := range []struct {
		name string
		cap  time.Duration
	}{{"coalesced", 0}, {"stepwise", time.Nanosecond}} {
		b.Run(mode.name, func(b *testing.B) {
			const sim = 10 * time.Minute
			var steps, events int64
			cpu0 := cpuTime()
			for b.Loop() {
				cfg := mustConfig(b, "llama-3.1-8b", "h100", 1)
				l := NewLoop()
				rng := rand.New(rand.NewPCG(3, 4))
				engines := make([]*Engine, 16)
				for i := range engines {
					engines[i] = mustEngine(b, cfg)
					engines[i].maxCoalesce = mode.cap
					l.Add(engines[i])
				}
				var id uint64
				for i, e := range engines {
					var at time.Duration
					for {
						at += time.Duration(rng.ExpFloat64() * 2 * float64(time.Second))
						if at >= sim {
							break
						}
						id++
						r := &Request{ID: id, PromptTokens: 500, MaxTokens: 1000, OnDone: func(time.Duration, Result) {}}
						l.At(at, func(now time.Duration) {
							if err := e.Submit(now, r); err != nil {
								b.Fatal(err)
							}
						})
					}
					_ = i
				}
				l.Run(sim)
				steps, events = 0, 0
				for _, e := range engines {
					steps += e.Stats().Steps
					events += e.coalesced
				}
			}
			b.ReportMetric((cpuTime()-cpu0).Seconds()/float64(b.N), "cpu-s/op")
			b.ReportMetric(float64(steps), "steps")
			b.ReportMetric(float64(events), "coalesced-runs")
		})
	}
}
