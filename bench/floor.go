package bench

import (
	"context"
	"fmt"
	"math"
	"time"

	"github.com/infergate/infergate/bench/scenario"
	"github.com/infergate/infergate/bench/workload"
	"github.com/infergate/infergate/sim/engine"
)

// PodSpeeds is how fast a run's pods are against nominal: the realism
// knobs give pod number k of a run seeded with Seed the time factor
// engine.PodSpeedFactor(Seed, k, Spread), uniform in [1−Spread, 1+Spread]
// (pods numbered in fleet order, as the benchmark builds them). The zero
// value is nominal speed.
type PodSpeeds struct {
	Seed   uint64
	Spread float64
}

// RunSpeeds is the PodSpeeds of a benchmark run with realism r (nil: the
// default) and seed.
func RunSpeeds(r *Realism, seed uint64) PodSpeeds {
	if r == nil {
		d := DefaultRealism()
		r = &d
	}
	return PodSpeeds{Seed: seed, Spread: r.Engine.PodSpread}
}

// fastest is the smallest time factor among f's pods of g's type (podTypes'
// key), 1 at nominal speed. Step jitter is left at its mean of one.
func (s PodSpeeds) fastest(f scenario.Fleet, g scenario.PodGroup) float64 {
	best, pod := math.Inf(1), 0
	for _, h := range f.Pods {
		for range h.Count {
			if podTypeKey(h) == podTypeKey(g) {
				best = math.Min(best, engine.PodSpeedFactor(s.Seed, pod, s.Spread))
			}
			pod++
		}
	}
	if math.IsInf(best, 1) {
		return 1
	}
	return best
}

// Floors returns each request's no-queue TTFT floor in milliseconds: its
// prefill alone on the fastest pod that can serve it, with the best cache
// it could have had. For each distinct pod type it replays the whole
// stream one request at a time (each alone on the engine, one output
// token) through the engine's own cost model, at the speed of the type's
// fastest pod (sp; step jitter at its mean), on an engine whose KV cache
// never evicts, so a request finds cached every block of every earlier
// prompt. NaN marks a request no pod type can serve.
func Floors(ctx context.Context, f scenario.Fleet, stream workload.Stream, sp PodSpeeds) ([]float64, error) {
	floors := make([]float64, len(stream.Requests))
	for i := range floors {
		floors[i] = math.Inf(1)
	}
	// Enough KV for every distinct prompt block plus the working set: the
	// engine sizes its block index by capacity, so no larger.
	distinct := map[uint64]struct{}{}
	for i := range stream.Requests {
		for _, h := range stream.Requests[i].BlockHashes {
			distinct[h] = struct{}{}
		}
	}
	for _, g := range podTypes(f) {
		cfg, err := engineConfig(f, g)
		if err != nil {
			return nil, fmt.Errorf("floor: %w", err)
		}
		real, err := engine.New(cfg)
		if err != nil {
			return nil, fmt.Errorf("floor: %s: %w", g.GPU, err)
		}
		// Every adapter resident, so the floor never pays an adapter swap
		// beyond its first load, and a KV cache too large to evict, so each
		// request finds every block any earlier prompt computed; the real
		// pod's context limit still applies.
		cfg.MaxLoras = max(len(f.Adapters), 1)
		cfg.NumBlocks = real.Stats().NumBlocks + len(distinct)
		cfg.MaxModelLen = real.MaxModelLen()
		cfg.SpeedFactor = sp.fastest(f, g)
		e, err := engine.New(cfg)
		if err != nil {
			return nil, fmt.Errorf("floor: %s: %w", g.GPU, err)
		}
		loop := engine.NewLoop()
		loop.Add(e)
		reqs := stream.Requests
		var next func(now time.Duration, i int)
		next = func(now time.Duration, i int) {
			for ; i < len(reqs); i++ {
				if i%1024 == 0 && ctx.Err() != nil {
					return
				}
				w := &reqs[i]
				start := now
				k := i
				err := e.Submit(now, &engine.Request{
					ID:           w.ID,
					Adapter:      w.Adapter,
					PromptTokens: w.PromptTokens,
					BlockHashes:  w.BlockHashes,
					MaxTokens:    1,
					OnDone: func(at time.Duration, res engine.Result) {
						if res.Err == nil {
							floors[k] = math.Min(floors[k], ms(res.FirstTokenAt-start))
						}
						loop.At(at+time.Millisecond, func(now time.Duration) { next(now, k+1) })
					},
				})
				if err == nil {
					return // continue from OnDone
				}
			}
		}
		loop.At(0, func(now time.Duration) { next(now, 0) })
		loop.Run(time.Duration(math.MaxInt64))
		if err := ctx.Err(); err != nil {
			return nil, err
		}
	}
	for i, v := range floors {
		if math.IsInf(v, 1) {
			floors[i] = math.NaN()
		}
	}
	return floors, nil
}

// podTypes returns one pod group per distinct pod type of f (GPU, tensor
// parallelism, batch size): what a per-type replay needs to run once.
func podTypes(f scenario.Fleet) []scenario.PodGroup {
	var out []scenario.PodGroup
	seen := map[string]bool{}
	for _, g := range f.Pods {
		key := podTypeKey(g)
		if !seen[key] {
			seen[key] = true
			out = append(out, g)
		}
	}
	return out
}

func podTypeKey(g scenario.PodGroup) string {
	return fmt.Sprintf("%s/%d/%d", g.GPU, g.TensorParallel, g.MaxNumSeqs)
}

// MaxModelLen is the longest prompt plus output every pod of the fleet
// accepts (its smallest max model length), used to clamp traces whose
// requests exceed what the fleet can serve.
func MaxModelLen(f scenario.Fleet) (int, error) {
	f.SetDefaults()
	best := 0
	for _, g := range f.Pods {
		e, err := podEngine(f, g)
		if err != nil {
			return 0, fmt.Errorf("fleet: %w", err)
		}
		if n := e.MaxModelLen(); best == 0 || n < best {
			best = n
		}
	}
	return best, nil
}
