// Package bench is infergate's routing benchmark: it replays one request
// stream against one simulated fleet (sim/engine in virtual time) once per
// routing policy, with the same seed, and measures what each policy did to
// TTFT, latency, throughput and cache hits. Policies built on picker
// profiles run the exact scheduling and admission code Tier 1 runs
// (tier1/picker, tier1/admission): the same queueing by priority, the same
// shedding, the same scheduling input when given request text
// (Options.Inputs).
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
	"github.com/infergate/infergate/tier1/admission"
	"github.com/infergate/infergate/tier1/picker"
)

// Defaults of Options.
const (
	DefaultScrapeInterval = 50 * time.Millisecond // GIE's
	DefaultMaxQueueWait   = 2 * time.Second
	// DefaultCriticalMaxWait is Tier 1's queue.critical_max_wait default.
	DefaultCriticalMaxWait = 10 * time.Second
	loadSamples            = 300
)

// Options tune a run. The zero value is the documented defaults.
type Options struct {
	// ScrapeInterval is how often pod metrics are scraped (50 ms).
	ScrapeInterval time.Duration
	// MaxQueueWait bounds how long a standard request waits in the
	// router's queue when every pod is saturated before it is sent anyway
	// to the best pod (2 s), as Tier 1's queue.max_wait. Sheddable
	// requests never wait: they are shed at once, as in Tier 1.
	MaxQueueWait time.Duration
	// CriticalMaxWait is MaxQueueWait for priority > 0 requests (10 s),
	// as Tier 1's queue.critical_max_wait.
	CriticalMaxWait time.Duration
	// Inputs selects how the router's view of a prompt is built:
	// InputsProduction ("", the default) runs Tier 1's admission.Prompt on
	// the request's text, as the proxy does, and upstream routers hash the
	// text their own way (Prompter); InputsEngine hands every policy the
	// engine's exact token count and all its block hashes (an oracle, kept
	// to measure what production inputs cost).
	Inputs string
	// Text appends a request's prompt text (the raw JSON "messages" value)
	// to dst; nil means workload.AppendText, which turns the stream's token
	// counts and block hashes into text of that many tokens.
	Text func(dst []byte, r *workload.Request) []byte
	// Realism is the run's realism (engine jitter and per-pod variation,
	// staggered and late scrapes); nil means DefaultRealism(), &Realism{}
	// turns it off.
	Realism *Realism
	// RecordLoad samples per-pod load over time for plots.
	RecordLoad bool
	// Replicas splits arrivals over several routers (bench/replicas.go).
	Replicas Replicas
	// HeadOnlyQueue is the router's wait queue as it was before
	// admission.Pass, for comparison: a wake re-runs the scheduler for the
	// head only, and a newcomer behind any waiter of equal or higher
	// priority queues without a cycle.
	HeadOnlyQueue bool
}

// Values of Options.Inputs.
const (
	InputsEngine     = "engine"
	InputsProduction = "production"
)

func (o Options) withDefaults() Options {
	if o.CriticalMaxWait <= 0 {
		o.CriticalMaxWait = DefaultCriticalMaxWait
	}
	if o.ScrapeInterval <= 0 {
		o.ScrapeInterval = DefaultScrapeInterval
	}
	if o.MaxQueueWait <= 0 {
		o.MaxQueueWait = DefaultMaxQueueWait
	}
	if o.Inputs == "" {
		o.Inputs = InputsProduction
	}
	if o.Text == nil {
		o.Text = workload.AppendText
	}
	if o.Realism == nil {
		r := DefaultRealism()
		o.Realism = &r
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
	eng        *engine.Engine
	view       *picker.Pod
	last       picker.Metrics
	lastScrape time.Duration
	tick       int64 // scrapes scheduled so far
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
		Model:            m,
		GPU:              gpu,
		TensorParallel:   g.TensorParallel,
		MaxNumSeqs:       g.MaxNumSeqs,
		MaxLoras:         g.MaxLoras,
		MaxBatchedTokens: g.MaxBatchedTokens,
		Adapters:         f.Adapters,
	}, nil
}

// podEngine builds pod group g's engine at nominal speed; the error names
// the GPU when the engine refuses the configuration.
func podEngine(f scenario.Fleet, g scenario.PodGroup) (*engine.Engine, error) {
	cfg, err := engineConfig(f, g)
	if err != nil {
		return nil, err
	}
	e, err := engine.New(cfg)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", g.GPU, err)
	}
	return e, nil
}

// reqState is the harness's record of one request.
type reqState struct {
	w        *workload.Request
	preq     *picker.Request
	pod      int
	queuedAt time.Duration
	exact    []uint64 // the engine's block keys, for a Precise policy
}

// Run simulates one policy on one seed's stream and returns what it
// measured. It is deterministic: the same inputs give the same Run.
func Run(ctx context.Context, setup Setup, pol Policy, seed uint64, stream workload.Stream, opts Options) (report.Run, error) {
	s, err := newSim(ctx, setup, pol, seed, stream, opts)
	if err != nil {
		return report.Run{}, err
	}
	return s.run()
}

// sim is one Run: the simulated fleet, the router's state (tracker,
// scheduler, wait queue) and what has been measured so far. Its methods
// are the routing step in virtual time; they run on the engine loop only.
type sim struct {
	ctx     context.Context
	setup   Setup
	pol     Policy
	opts    Options
	stream  workload.Stream
	hasLoRA bool
	slo     time.Duration

	loop    *engine.Loop
	pods    []*podSim
	viewIdx map[*picker.Pod]int
	views   []*picker.Pod
	tracker *picker.Tracker
	sched   *picker.Scheduler
	router  Router // an upstream picker's per-run state, or nil
	rreq    picker.Request
	text    []byte // reused text buffer
	rng     *rand.Rand
	seed    uint64
	result  picker.Result

	states []reqState
	queue  admission.Queue[int] // request indices waiting in the router
	pass   admission.Pass       // the queue's current pass (drainQueue)
	// wakePending: a wake of the wait queues is scheduled (wakeOnFirstToken).
	wakePending bool
	finished    int
	lastDone    time.Duration
	ticks       int
	loadEvery   int
	err         error
	out         report.Run
	rep         *replicaSet // several routers (bench/replicas.go), else nil
	speeds      speedSamples
	// exact is the precise prefix index the engines' KV events feed, for
	// a Precise policy; nil otherwise.
	exact *exactIndex
	// onDispatch, if set (tests), sees every dispatch.
	onDispatch func(i, pod int, now time.Duration)
}

func newSim(ctx context.Context, setup Setup, pol Policy, seed uint64, stream workload.Stream, opts Options) (*sim, error) {
	opts = opts.withDefaults()
	f := setup.Fleet
	s := &sim{
		ctx: ctx, setup: setup, pol: pol, opts: opts, stream: stream,
		hasLoRA: len(f.Adapters) > 0,
		slo:     f.TTFTSLO,
		loop:    engine.NewLoop(),
		viewIdx: map[*picker.Pod]int{},
		views:   make([]*picker.Pod, 0, f.Size()),
		rng:     rand.New(rand.NewPCG(seed, 0x5eed)),
		seed:    seed,
	}
	if pol.Precise {
		s.exact = newExactIndex()
	}
	s.tracker = picker.NewTracker(s.trackerOptions())
	if pol.NewRouter != nil && pol.Profile == nil {
		s.router = pol.NewRouter()
		if er, ok := s.router.(exactUser); ok && s.exact != nil {
			er.useExact(s.exact)
		}
	}
	for _, g := range f.Pods {
		cfg, err := engineConfig(f, g)
		if err != nil {
			return nil, fmt.Errorf("fleet: %w", err)
		}
		for range g.Count {
			e, err := engine.New(withNoise(opts.Realism.Engine, f.Noise).Apply(cfg, seed, len(s.pods)))
			if err != nil {
				return nil, fmt.Errorf("fleet: pod %d (%s): %w", len(s.pods), g.GPU, err)
			}
			s.loop.Add(e)
			name := fmt.Sprintf("%s-tp%d-%d", g.GPU, max(g.TensorParallel, 1), len(s.pods))
			if s.exact != nil {
				s.exact.attach(e, name)
			}
			v := &picker.Pod{Name: name, Address: name, BaseModel: f.Model, Engine: "vllm", GPU: g.GPU, GPUs: max(g.TensorParallel, 1), Ready: true}
			s.viewIdx[v] = len(s.pods)
			s.views = append(s.views, v)
			s.pods = append(s.pods, &podSim{eng: e, view: v})
		}
	}
	if pol.Profile != nil {
		h := fnv.New64a()
		h.Write([]byte(pol.Name))
		var err error
		s.sched, err = picker.NewScheduler(*pol.Profile, picker.Options{Tracker: s.tracker, Rand: rand.New(rand.NewPCG(seed, h.Sum64()))})
		if err != nil {
			return nil, fmt.Errorf("policy %s: %w", pol.Name, err)
		}
	}
	s.out = report.Run{Policy: pol.Name, Seed: seed, Requests: len(stream.Requests), PodRequests: make([]int, len(s.pods))}
	if opts.RecordLoad {
		s.out.Load = &report.Load{}
		for _, p := range s.pods {
			s.out.Load.Pods = append(s.out.Load.Pods, p.view.Name)
			s.out.Load.GPUs = append(s.out.Load.GPUs, p.view.GPU)
		}
	}
	s.states = make([]reqState, len(stream.Requests))
	var err error
	for i := range stream.Requests {
		w := &stream.Requests[i]
		var pr *picker.Request
		pr, s.text, err = schedInput(w, f.Model, s.slo, opts, s.text)
		if err != nil {
			return nil, err
		}
		s.states[i] = reqState{w: w, preq: pr, pod: -1}
		if s.exact != nil {
			// A precise-prefix router tokenizes the prompt exactly and
			// hashes it as the engine does: its keys are the engine's.
			s.states[i].exact = engine.BlockKeys(nil, w.Adapter, w.BlockHashes, w.PromptTokens)
			pr.ExactHashes, pr.ExactBlockSize = s.states[i].exact, engine.BlockSize
		}
	}
	s.loadEvery = max(1, int(stream.Duration/opts.ScrapeInterval)/loadSamples)
	if err := s.initReplicas(seed); err != nil {
		return nil, err
	}
	return s, nil
}

// schedInput is the picker.Request the router builds for w. By default
// (InputsProduction) the prompt part is what Tier 1's proxy computes from
// the request text, by the same function (admission.Prompt): the estimated
// token count and the prefix hashes of the text. InputsEngine is the
// oracle: the engine's exact token count and all its block hashes. buf is
// a reusable text buffer, returned grown.
func schedInput(w *workload.Request, model string, slo time.Duration, opts Options, buf []byte) (*picker.Request, []byte, error) {
	pr := &picker.Request{
		ID:        strconv.FormatUint(w.ID, 10),
		Model:     model,
		BaseModel: model,
		Adapter:   w.Adapter,
		MaxTokens: w.OutputTokens,
		Priority:  w.Priority,
		Sheddable: w.Sheddable || w.Priority < 0,
		TTFTSLO:   slo,
	}
	if w.Adapter != "" {
		pr.Model = w.Adapter
	}
	if w.Session >= 0 {
		// A chat client knows its conversation and sends its id as
		// x-session-id or prompt_cache_key (Tier 1's sessionKey reads
		// either); only generators that model conversations set Session.
		pr.Session = sessionKey(w.Session)
	}
	if w.Sheddable && pr.Priority >= 0 {
		pr.Priority = -1 // Tier 1's policy: sheddable is below standard
	}
	switch opts.Inputs {
	case InputsEngine:
		pr.PromptTokens, pr.BlockHashes = w.PromptTokens, w.BlockHashes
	case InputsProduction, "":
		if opts.Text == nil {
			return nil, buf, errors.New("inputs production: no request text (Options.Text is nil)")
		}
		buf = opts.Text(buf[:0], w)
		admission.Prompt(pr, "", buf)
	default:
		return nil, buf, fmt.Errorf("unknown inputs %q: want %s or %s", opts.Inputs, InputsEngine, InputsProduction)
	}
	return pr, buf, nil
}

// trackerOptions are a router's Tracker options: the session memory's
// clock reads the simulation's virtual time, so a run does not depend on
// how long it takes.
func (s *sim) trackerOptions() picker.TrackerOptions {
	now := func() time.Time { return virtualEpoch.Add(s.loop.Now()) }
	o := picker.TrackerOptions{Sessions: picker.SessionOptions{Now: now}}
	if s.exact != nil {
		o.Exact = s.exact
	}
	return o
}

// virtualEpoch is time zero of a run, as a wall-clock time.
var virtualEpoch = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// sessionKey is the key a chat client sends for conversation s: an opaque
// conversation id, as a client would generate it.
func sessionKey(s int) string { return "conv-" + strconv.Itoa(s) }

// routerInput is what an upstream Router sees of request i: with
// production inputs, the router's own hashing of the request text when it
// has one (Prompter: GIE's 64-character blocks), else Tier 1's input.
func (s *sim) routerInput(i int) *picker.Request {
	st := &s.states[i]
	p, ok := s.router.(Prompter)
	if !ok || s.opts.Inputs == InputsEngine {
		return st.preq
	}
	hashes := s.rreq.BlockHashes
	s.rreq = *st.preq
	s.rreq.BlockHashes = hashes
	s.text = s.opts.Text(s.text[:0], st.w)
	p.Prompt(&s.rreq, s.text)
	return &s.rreq
}

func (s *sim) run() (report.Run, error) {
	for i := range s.states {
		s.loop.At(s.states[i].w.Arrival, func(now time.Duration) { s.arrive(now, i) })
	}
	for k := range s.pods {
		s.scheduleScrape(k)
	}
	s.loop.At(0, s.tick)
	horizon := s.setup.Horizon
	if horizon <= 0 {
		horizon = s.stream.Duration + 10*time.Minute
	}
	s.loop.Run(horizon)
	out := s.out
	if s.err != nil {
		return out, s.err
	}
	// Requests still unfinished at the horizon count as failed: they would
	// have timed out.
	total := len(s.states)
	out.Failed += total - s.finished
	var q, h int64
	for _, p := range s.pods {
		st := p.eng.Stats()
		q += st.PrefixCacheQueries
		h += st.PrefixCacheHits
	}
	if q > 0 {
		out.PrefixHitRate = float64(h) / float64(q)
	}
	first := time.Duration(0)
	if total > 0 {
		first = s.stream.Requests[0].Arrival
	}
	out.Makespan = max(s.lastDone-first, time.Millisecond)
	out.Speeds = s.learnedSpeeds()
	return out, nil
}

// refresh gives the router's pod views their last scrape and the
// tracker's state, as Tier 1's snapshot does.
func (s *sim) refresh(now time.Duration) {
	for _, p := range s.pods {
		p.view.Metrics = p.last
		p.view.MetricsAge = now - p.lastScrape
	}
	s.tracker.Apply(s.views)
}

func (s *sim) finish(now time.Duration) {
	s.finished++
	s.lastDone = max(s.lastDone, now)
}

// schedule runs one scheduling cycle for request i into s.result. A
// policy without the router queue (a plain load balancer) dispatches to
// saturated pods: for it saturation is no error.
func (s *sim) schedule(now time.Duration, i int) error {
	s.refresh(now)
	err := s.sched.ScheduleInto(&s.result, s.states[i].preq, s.views)
	waits := errors.Is(err, picker.ErrSaturated) || errors.Is(err, picker.ErrBusy)
	switch {
	case waits && !s.pol.Queue:
		return nil
	case err != nil && !waits && !errors.Is(err, picker.ErrNoCandidates):
		s.err = fmt.Errorf("schedule request %d: %w", s.states[i].w.ID, err)
	}
	return err
}

// arrive is the routing step for a new request, with Tier 1's admission
// (admission.Arrive, then Decide on the scheduler's answer).
func (s *sim) arrive(now time.Duration, i int) {
	if s.err != nil {
		return
	}
	s.useRouterOf(i)
	if s.router != nil {
		// An upstream picker: its legacy admission sheds a sheddable
		// request when the pool is saturated; anything else is dispatched
		// at once (no router queue).
		s.refresh(now)
		req := s.routerInput(i)
		if er, ok := s.router.(exactUser); ok && s.exact != nil {
			er.exactKeys(s.states[i].exact)
		}
		if a, ok := s.router.(Admitter); ok && !a.Admit(req, s.views) {
			s.out.Shed++
			s.finish(now)
			return
		}
		s.dispatchTo(now, i, s.router.Pick(s.rng, req, s.views))
		return
	}
	if s.sched == nil {
		s.refresh(now)
		s.dispatchTo(now, i, s.pol.pick(s.rng, s.states[i].preq, s.views))
		return
	}
	s.apply(now, i, s.arrival(now, i))
}

// arrival is the decision for request i on arrival, as Tier 1's gateway
// takes it: queue behind waiters of equal or higher priority, or schedule
// now and decide.
func (s *sim) arrival(now time.Duration, i int) admission.Decision {
	req := s.states[i].preq
	key, keyed := s.sched.HoldKey(req)
	d := admission.Arrive(req, s.queue.Ahead(req.Priority) && (s.opts.HeadOnlyQueue || s.pass.Blocks(req, key, keyed)))
	if d.Action == admission.Schedule {
		d = admission.Decide(req, s.schedule(now, i))
		if d.Action == admission.Wait {
			s.pass.Held(key, keyed)
		}
	}
	return d
}

// apply carries out an admission decision for request i.
func (s *sim) apply(now time.Duration, i int, d admission.Decision) {
	if s.err != nil {
		return
	}
	switch d.Action {
	case admission.Dispatch:
		s.dispatchTo(now, i, s.viewIdx[s.result.Ranked[0]])
	case admission.Wait:
		s.states[i].queuedAt = now
		s.queue.Push(s.states[i].preq.Priority, i)
	case admission.Shed:
		s.out.Shed++
		s.finish(now)
	default:
		s.out.Failed++
		s.finish(now)
	}
}

// drainQueue is Tier 1's wait queue at a scrape (Tier 1 wakes its queue on
// every scrape): one admission.Pass in queue order, each waiter scheduled
// unless one with its HoldKey was already held in the pass; then every
// waiter whose bound has passed goes to the best pod anyway.
func (s *sim) drainQueue(now time.Duration) {
	s.pass.Start()
	for _, i := range s.queue.All() {
		if s.err != nil {
			break
		}
		req := s.states[i].preq
		if key, keyed := s.sched.HoldKey(req); !s.pass.Skip(key, keyed) {
			err := s.schedule(now, i)
			d := admission.Decide(req, err)
			if s.expired(now, i) {
				d = admission.Expired(req, err)
			}
			if d.Action == admission.Wait {
				if s.opts.HeadOnlyQueue {
					break
				}
				s.pass.Held(key, keyed)
			} else {
				s.queue.Remove(i)
				s.apply(now, i, d)
			}
		}
	}
	s.pass.End()
	for _, i := range s.queue.All() {
		if s.err != nil || !s.expired(now, i) {
			continue
		}
		d := admission.Expired(s.states[i].preq, s.schedule(now, i))
		s.queue.Remove(i)
		s.apply(now, i, d)
	}
}

// wakeOnFirstToken is Tier 1's wake of its wait queues at a first token
// (the pod's queued prefill shrank), at the same virtual time. Only holding
// (saturation.prefill_wait) reads the prefill in flight: without it a first
// token changes no admission decision, so the wake is skipped and runs
// without holding draw the same tie-breaks as before it existed.
func (s *sim) wakeOnFirstToken(at time.Duration) {
	if s.sched == nil || s.wakePending || s.sched.Saturation().PrefillWait <= 0 {
		return
	}
	s.wakePending = true
	s.loop.At(at, func(now time.Duration) {
		s.wakePending = false
		if s.err == nil {
			s.drainQueues(now)
		}
	})
}

// expired reports whether request i has waited its bound.
func (s *sim) expired(now time.Duration, i int) bool {
	st := &s.states[i]
	return now-st.queuedAt >= admission.MaxWait(st.preq, s.opts.MaxQueueWait, s.opts.CriticalMaxWait)
}

func (s *sim) dispatchTo(now time.Duration, i, pi int) {
	st := &s.states[i]
	st.pod = pi
	p := s.pods[pi]
	if s.onDispatch != nil {
		s.onDispatch(i, pi, now)
	}
	name := p.view.Name
	tracker := s.tracker // the request's router's, for its callbacks
	tracker.Dispatched(name, st.preq)
	s.out.PodRequests[pi]++
	arrival := st.w.Arrival
	w := st.w
	er := &engine.Request{ID: w.ID, Adapter: w.Adapter, PromptTokens: w.PromptTokens, BlockHashes: w.BlockHashes, MaxTokens: w.OutputTokens}
	er.OnFirstToken = func(at time.Duration) {
		// From dispatch, as Tier 1 measures it: a wait in the router's
		// queue is no time the pod spent.
		tracker.FirstToken(name, st.preq, at-now)
		s.wakeOnFirstToken(at)
	}
	er.OnDone = func(at time.Duration, res engine.Result) {
		tracker.Done(name, st.preq)
		s.finish(at)
		s.record(arrival, at, res)
	}
	if err := p.eng.Submit(now, er); err != nil {
		// The pod rejects what it can never serve (too long for its
		// KV cache or context): a 400 the client sees as a failure.
		tracker.Done(name, st.preq)
		s.out.Failed++
		s.finish(now)
	}
}

// record measures one finished request.
func (s *sim) record(arrival, at time.Duration, res engine.Result) {
	out := &s.out
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
	if ttft <= s.slo {
		out.MetSLO++
	}
}

// scheduleScrape schedules pod k's next scrape, at the time the run's
// Realism gives it (staggered phases, late scrapes), while requests remain.
func (s *sim) scheduleScrape(k int) {
	p := s.pods[k]
	at := s.opts.Realism.ScrapeAt(s.seed, k, p.tick, s.opts.ScrapeInterval)
	p.tick++
	s.loop.At(at, func(now time.Duration) { s.scrape(now, k) })
}

// scrape reads pod k's metrics, then schedules the pod's next scrape.
func (s *sim) scrape(now time.Duration, k int) {
	if s.err != nil {
		return
	}
	if err := s.ctx.Err(); err != nil {
		s.err = err
		return
	}
	p := s.pods[k]
	p.scrape(s.hasLoRA)
	p.lastScrape = now
	if s.finished < len(s.states) {
		s.scheduleScrape(k)
	}
}

// tick is the fleet-wide scrape interval: it retries the router's queue
// (Tier 1 wakes its queue once per scrape round) and samples per-pod load
// as last scraped.
func (s *sim) tick(now time.Duration) {
	if s.err != nil {
		return
	}
	if s.out.Load != nil && s.ticks%s.loadEvery == 0 {
		vals := make([]int, len(s.pods))
		for k, p := range s.pods {
			vals[k] = p.last.Waiting + p.last.Running
		}
		s.out.Load.Times = append(s.out.Load.Times, now)
		s.out.Load.Values = append(s.out.Load.Values, vals)
	}
	s.ticks++
	s.sampleSpeeds(now)
	s.drainQueues(now)
	if s.finished < len(s.states) {
		s.loop.At(now+s.opts.ScrapeInterval, s.tick)
	}
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
