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

// capacitySample is how many requests of the stream measure a pod type's
// throughput.
const capacitySample = 800

// Capacity estimates the fleet's saturated throughput in requests per
// second for this stream's mix: for each pod type it submits a sample of
// the stream's requests at once to one engine (so batches stay full) and
// times how long they take; the fleet's capacity is the sum over pods.
// Offered load divided by it is the utilisation the scenarios state.
// perPod holds each group's per-pod capacity, in f.Pods order.
func Capacity(ctx context.Context, f scenario.Fleet, stream workload.Stream) (total float64, perPod []float64, err error) {
	reqs := stream.Requests
	if len(reqs) > capacitySample {
		// An evenly spaced sample keeps the length mix of the whole run.
		step := float64(len(reqs)) / capacitySample
		s := make([]workload.Request, capacitySample)
		for i := range s {
			s[i] = reqs[int(float64(i)*step)]
		}
		reqs = s
	}
	perPod = make([]float64, len(f.Pods))
	if len(reqs) == 0 {
		return 0, perPod, nil
	}
	for gi, g := range f.Pods {
		if err := ctx.Err(); err != nil {
			return 0, nil, err
		}
		cfg, err := engineConfig(f, g)
		if err != nil {
			return 0, nil, fmt.Errorf("capacity: %w", err)
		}
		e, err := engine.New(cfg)
		if err != nil {
			return 0, nil, fmt.Errorf("capacity: %s: %w", g.GPU, err)
		}
		loop := engine.NewLoop()
		loop.Add(e)
		var last time.Duration
		n := 0
		for i := range reqs {
			w := &reqs[i]
			err := e.Submit(0, &engine.Request{
				ID: uint64(i), Adapter: w.Adapter, PromptTokens: w.PromptTokens,
				BlockHashes: w.BlockHashes, MaxTokens: w.OutputTokens,
				OnDone: func(at time.Duration, res engine.Result) {
					if res.Err == nil {
						n++
						last = max(last, at)
					}
				},
			})
			_ = err // requests this pod type cannot serve do not count
		}
		loop.Run(time.Duration(math.MaxInt64))
		if last > 0 {
			perPod[gi] = float64(n) / last.Seconds()
			total += float64(g.Count) * perPod[gi]
		}
	}
	return total, perPod, nil
}
