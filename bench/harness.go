// Package bench is infergate's routing benchmark: it replays one request
// stream against one simulated fleet (sim/engine in virtual time) once per
// routing policy, with the same seed, and measures what each policy did to
// TTFT, latency, throughput and cache hits. Policies built on picker
// profiles run the exact scheduling code Tier 1 runs.
package bench

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"strconv"
	"time"

	"github.com/infergate/infergate/bench/report"
	"github.com/infergate/infergate/bench/scenario"
	"github.com/infergate/infergate/bench/workload"
	"github.com/infergate/infergate/sim/engine"
	"github.com/infergate/infergate/sim/profile"
	"github.com/infergate/infergate/tier1/picker"
)

// Defaults of Options.
const (
	DefaultScrapeInterval = 50 * time.Millisecond // GIE's
	DefaultMaxQueueWait   = 2 * time.Second
	// promptBlocks caps the hashes the router sees, as Tier 1 hashes at
	// most prefix.DefaultPromptBlocks blocks of a prompt.
	promptBlocks = 512
	loadSamples  = 300
)

// Options tune a run. The zero value is the documented defaults.
type Options struct {
	// ScrapeInterval is how often pod metrics are scraped (50 ms).
	ScrapeInterval time.Duration
	// MaxQueueWait bounds how long a request waits in the router's queue
	// when every pod is saturated before it is shed (sheddable) or sent
	// anyway to the best pod (2 s).
	MaxQueueWait time.Duration
	// RecordLoad samples per-pod load over time for plots.
	RecordLoad bool
}

func (o Options) withDefaults() Options {
	if o.ScrapeInterval <= 0 {
		o.ScrapeInterval = DefaultScrapeInterval
	}
	if o.MaxQueueWait <= 0 {
		o.MaxQueueWait = DefaultMaxQueueWait
	}
	return o
}

// Setup is what a run simulates besides the policy and the stream.
type Setup struct {
	Name    string
	Fleet   scenario.Fleet
	Horizon time.Duration // stop simulating at this virtual time even if requests remain
}

// podSim is one simulated pod and what the router last scraped from it.
type podSim struct {
	eng  *engine.Engine
	view *picker.Pod
	last picker.Metrics
}

func (p *podSim) scrape(hasLoRA bool) {
	s := p.eng.Stats()
	p.last = picker.Metrics{
		Waiting:         s.Waiting,
		Running:         s.Running,
		KVUsage:         s.KVUsage,
		HasKV:           true,
		ActiveAdapters:  s.RunningAdapters,
		WaitingAdapters: s.WaitingAdapters,
		MaxLoras:        s.MaxLoras,
		HasLoRA:         hasLoRA,
		BlockSize:       s.BlockSize,
		NumBlocks:       s.NumBlocks,
	}
}

// engineConfig resolves a pod group into an engine configuration.
func engineConfig(f scenario.Fleet, g scenario.PodGroup) (engine.Config, error) {
	m, err := profile.Model(f.Model)
	if err != nil {
		return engine.Config{}, err
	}
	gpu, err := profile.GPU(g.GPU)
	if err != nil {
		return engine.Config{}, err
	}
	return engine.Config{
		Model:          m,
		GPU:            gpu,
		TensorParallel: g.TensorParallel,
		MaxNumSeqs:     g.MaxNumSeqs,
		MaxLoras:       g.MaxLoras,
		Adapters:       f.Adapters,
	}, nil
}

// reqState is the harness's record of one request.
type reqState struct {
	w        *workload.Request
	preq     *picker.Request
	pod      int
	queuedAt time.Duration
}

// Run simulates one policy on one seed's stream and returns what it
// measured. It is deterministic: the same inputs give the same Run.
func Run(ctx context.Context, setup Setup, pol Policy, seed uint64, stream workload.Stream, opts Options) (report.Run, error) {
	opts = opts.withDefaults()
	f := setup.Fleet
	hasLoRA := len(f.Adapters) > 0
	loop := engine.NewLoop()
	var pods []*podSim
	viewIdx := map[*picker.Pod]int{}
	views := make([]*picker.Pod, 0, f.Size())
	for _, g := range f.Pods {
		cfg, err := engineConfig(f, g)
		if err != nil {
			return report.Run{}, fmt.Errorf("fleet: %w", err)
		}
		for range g.Count {
			e, err := engine.New(cfg)
			if err != nil {
				return report.Run{}, fmt.Errorf("fleet: pod %d (%s): %w", len(pods), g.GPU, err)
			}
			loop.Add(e)
			name := fmt.Sprintf("%s-tp%d-%d", g.GPU, max(g.TensorParallel, 1), len(pods))
			v := &picker.Pod{Name: name, Address: name, BaseModel: f.Model, Engine: "vllm", GPU: g.GPU, Ready: true}
			viewIdx[v] = len(pods)
			views = append(views, v)
			pods = append(pods, &podSim{eng: e, view: v})
		}
	}

	tracker := picker.NewTracker(picker.TrackerOptions{})
	var sched *picker.Scheduler
	if pol.Profile != nil {
		h := fnv.New64a()
		h.Write([]byte(pol.Name))
		var err error
		sched, err = picker.NewScheduler(*pol.Profile, picker.Options{Tracker: tracker, Rand: rand.New(rand.NewPCG(seed, h.Sum64()))})
		if err != nil {
			return report.Run{}, fmt.Errorf("policy %s: %w", pol.Name, err)
		}
	}
	rng := rand.New(rand.NewPCG(seed, 0x5eed))

	out := report.Run{Policy: pol.Name, Seed: seed, Requests: len(stream.Requests), PodRequests: make([]int, len(pods))}
	if opts.RecordLoad {
		out.Load = &report.Load{}
		for _, p := range pods {
			out.Load.Pods = append(out.Load.Pods, p.view.Name)
			out.Load.GPUs = append(out.Load.GPUs, p.view.GPU)
		}
	}
	states := make([]reqState, len(stream.Requests))
	var (
		lastScrape time.Duration
		queue      []int // request indices waiting in the router
		finished   int
		lastDone   time.Duration
		simErr     error
		result     picker.Result
	)
	slo := f.TTFTSLO

	refresh := func(now time.Duration) {
		for _, p := range pods {
			p.view.Metrics = p.last
			p.view.MetricsAge = now - lastScrape
		}
		tracker.Apply(views)
	}
	finish := func(now time.Duration) {
		finished++
		lastDone = max(lastDone, now)
	}

	dispatchTo := func(now time.Duration, i, pi int) {
		st := &states[i]
		st.pod = pi
		p := pods[pi]
		name := p.view.Name
		tracker.Dispatched(name, st.preq)
		out.PodRequests[pi]++
		arrival := st.w.Arrival
		er := &engine.Request{
			ID:           st.w.ID,
			Adapter:      st.w.Adapter,
			PromptTokens: st.w.PromptTokens,
			BlockHashes:  st.w.BlockHashes,
			MaxTokens:    st.w.OutputTokens,
			OnFirstToken: func(at time.Duration) {
				tracker.FirstToken(name, st.preq, at-arrival)
			},
			OnDone: func(at time.Duration, res engine.Result) {
				tracker.Done(name, st.preq)
				finish(at)
				if res.Err != nil {
					out.Failed++
					return
				}
				ttft := res.FirstTokenAt - arrival
				out.Completed++
				out.TTFT = append(out.TTFT, ms(ttft))
				out.E2E = append(out.E2E, ms(at-arrival))
				out.OutputTokens += res.CompletionTokens
				if res.CompletionTokens > 1 {
					out.ITL = append(out.ITL, ms(at-res.FirstTokenAt)/float64(res.CompletionTokens-1))
				}
				if ttft <= slo {
					out.MetSLO++
				}
			},
		}
		if err := p.eng.Submit(now, er); err != nil {
			// The pod rejects what it can never serve (too long for its
			// KV cache or context): a 400 the client sees as a failure.
			tracker.Done(name, st.preq)
			out.Failed++
			finish(now)
		}
	}

	// try routes request i; it reports false when the request must keep
	// waiting in the router's queue.
	try := func(now time.Duration, i int, final bool) bool {
		st := &states[i]
		refresh(now)
		pi := -1
		if sched == nil {
			pi = pol.pick(rng, st.preq, views)
		} else {
			err := sched.ScheduleInto(&result, st.preq, views)
			switch {
			case errors.Is(err, picker.ErrNoCandidates):
				out.Failed++
				finish(now)
				return true
			case errors.Is(err, picker.ErrSaturated) && pol.Queue && !final:
				return false
			case errors.Is(err, picker.ErrSaturated) && pol.Queue && st.w.Sheddable:
				out.Shed++
				finish(now)
				return true
			case err != nil && !errors.Is(err, picker.ErrSaturated):
				simErr = fmt.Errorf("schedule request %d: %w", st.w.ID, err)
				return true
			}
			pi = viewIdx[result.Ranked[0]]
		}
		dispatchTo(now, i, pi)
		return true
	}

	for i := range stream.Requests {
		w := &stream.Requests[i]
		bh := w.BlockHashes
		if len(bh) > promptBlocks {
			bh = bh[:promptBlocks]
		}
		pr := &picker.Request{
			ID:           strconv.FormatUint(w.ID, 10),
			Model:        f.Model,
			BaseModel:    f.Model,
			Adapter:      w.Adapter,
			PromptTokens: w.PromptTokens,
			MaxTokens:    w.OutputTokens,
			BlockHashes:  bh,
			Sheddable:    w.Sheddable,
			TTFTSLO:      slo,
		}
		if w.Adapter != "" {
			pr.Model = w.Adapter
		}
		if w.Sheddable {
			pr.Priority = -1
		}
		states[i] = reqState{w: w, preq: pr, pod: -1}
		loop.At(w.Arrival, func(now time.Duration) {
			if simErr != nil {
				return
			}
			if len(queue) > 0 || !try(now, i, false) {
				// FIFO: behind earlier waiters, retried at scrape ticks.
				states[i].queuedAt = now
				queue = append(queue, i)
			}
		})
	}

	total := len(stream.Requests)
	loadEvery := max(1, int(stream.Duration/opts.ScrapeInterval)/loadSamples)
	tick := 0
	var scrapeTick func(now time.Duration)
	scrapeTick = func(now time.Duration) {
		if simErr != nil {
			return
		}
		if err := ctx.Err(); err != nil {
			simErr = err
			return
		}
		for _, p := range pods {
			p.scrape(hasLoRA)
		}
		lastScrape = now
		if out.Load != nil && tick%loadEvery == 0 {
			vals := make([]int, len(pods))
			for k, p := range pods {
				vals[k] = p.last.Waiting + p.last.Running
			}
			out.Load.Times = append(out.Load.Times, now)
			out.Load.Values = append(out.Load.Values, vals)
		}
		tick++
		// Retry the router's queue in FIFO order; stop at the first that
		// must still wait, unless its bounded wait has run out.
		k := 0
		for ; k < len(queue); k++ {
			i := queue[k]
			final := now-states[i].queuedAt >= opts.MaxQueueWait
			if !try(now, i, final) {
				break
			}
		}
		queue = queue[k:]
		if finished < total {
			loop.At(now+opts.ScrapeInterval, scrapeTick)
		}
	}
	loop.At(0, scrapeTick)
	horizon := setup.Horizon
	if horizon <= 0 {
		horizon = stream.Duration + 10*time.Minute
	}
	loop.Run(horizon)
	if simErr != nil {
		return out, simErr
	}
	// Requests still unfinished at the horizon count as failed: they would
	// have timed out.
	out.Failed += total - finished
	var q, h int64
	for _, p := range pods {
		s := p.eng.Stats()
		q += s.PrefixCacheQueries
		h += s.PrefixCacheHits
	}
	if q > 0 {
		out.PrefixHitRate = float64(h) / float64(q)
	}
	first := time.Duration(0)
	if total > 0 {
		first = stream.Requests[0].Arrival
	}
	out.Makespan = max(lastDone-first, time.Millisecond)
	return out, nil
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
