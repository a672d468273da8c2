package picker

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"sync"
	"sync/atomic"
)

// Sentinel errors returned by Schedule.
var (
	// ErrNoCandidates: no pod passed the filters (HTTP 503).
	ErrNoCandidates = errors.New("picker: no candidate pod")
	// ErrSaturated: every candidate is saturated; the caller queues or
	// sheds. The Result is still fully populated, so a caller that must
	// not wait can dispatch to Ranked[0].
	ErrSaturated = errors.New("picker: every candidate pod is saturated")
	// ErrBusy: no candidate is saturated, but every one already has the
	// profile's saturation.prefill_wait of prefill queued; the caller holds
	// the request in its wait queue (see SaturationDetector.Busy). The
	// Result is fully populated, as with ErrSaturated.
	ErrBusy = errors.New("picker: every candidate pod has its prefill wait queued")
)

// Options are a Scheduler's collaborators. The zero value works: no
// router-side state (prefix scorer neutral) and a time-seeded tie-break.
type Options struct {
	// Tracker holds router-side state; the prefix and predicted-latency
	// scorers read its prefix index. Callers still fill pods with
	// Tracker.Apply before Schedule.
	Tracker *Tracker
	// Rand drives tie-breaks; nil means a randomly seeded source. A
	// seeded Rand makes picks reproducible (the benchmark's virtual time).
	// The Scheduler draws one number per Schedule under a lock.
	Rand *rand.Rand
}

// Result is the outcome of one scheduling cycle. Slices are owned by the
// Result: ScheduleInto reuses them, so copy what must outlive the next call.
type Result struct {
	// Ranked holds the best pods first: Ranked[0] is the pick, the rest
	// are retry candidates (at most ProfileConfig.MaxRanked in total).
	Ranked []*Pod
	// Candidates are the pods that passed the filters.
	Candidates []*Pod
	// Total[i] is Σ weight × score for Candidates[i].
	Total []float64
	// Scorers names the enabled scorers; Weights and Scores align with it.
	Scorers []string
	Weights []float64
	// Scores[s][i] is scorer s's score in [0,1] for Candidates[i].
	Scores [][]float64
	// Saturated is set when every candidate is saturated (ErrSaturated).
	Saturated bool
	// Busy is set when every candidate is saturated or busy and at least
	// one is only busy (ErrBusy).
	Busy bool

	flat []float64
}

// Index returns the position of p in Candidates, or -1.
func (r *Result) Index(p *Pod) int {
	for i, c := range r.Candidates {
		if c == p {
			return i
		}
	}
	return -1
}

// Score returns scorer name's score for Candidates[i].
func (r *Result) Score(name string, i int) (float64, bool) {
	for s, n := range r.Scorers {
		if n == name && i >= 0 && i < len(r.Scores[s]) {
			return r.Scores[s][i], true
		}
	}
	return 0, false
}

// Breakdown returns every scorer's score for Candidates[i] (for debug
// headers and logs; it allocates).
func (r *Result) Breakdown(i int) map[string]float64 {
	m := make(map[string]float64, len(r.Scorers))
	for s, n := range r.Scorers {
		if i >= 0 && i < len(r.Scores[s]) {
			m[n] = r.Scores[s][i]
		}
	}
	return m
}

// Scheduler runs one profile. Schedule and Update are safe for concurrent
// use; Update swaps the profile atomically, so in-flight cycles finish with
// the profile they started with.
type Scheduler struct {
	opts Options
	prof atomic.Pointer[profile]

	rngMu sync.Mutex
	rng   *rand.Rand

	cycles sync.Pool // *cycle
}

// profile is a built, immutable ProfileConfig.
type profile struct {
	cfg     ProfileConfig
	filters []filter
	scorers []scorer
	names   []string
	weights []float64
	picker  ranker
	sat     SaturationDetector
	// consumes is what the plugins and the saturation detector read.
	consumes MetricSet
}

// cycle is the reusable per-Schedule scratch.
type cycle struct {
	cs     cycleState
	names  []string
	match  []int
	marker []int // sessionKnown's match, apart from match (cycleState.prefixLen)
	idx    []int32
}

// NewScheduler builds a scheduler for cfg. A zero ProfileConfig means
// DefaultProfile(); other zero fields take their defaults.
func NewScheduler(cfg ProfileConfig, opts Options) (*Scheduler, error) {
	s := &Scheduler{opts: opts, rng: opts.Rand}
	if s.rng == nil {
		s.rng = rand.New(rand.NewPCG(rand.Uint64(), rand.Uint64()))
	}
	if err := s.Update(cfg); err != nil {
		return nil, err
	}
	return s, nil
}

// Update validates cfg, builds its plugins and swaps them in. On error the
// previous profile stays in force.
func (s *Scheduler) Update(cfg ProfileConfig) error {
	p, err := buildProfile(cfg, s.opts)
	if err != nil {
		return err
	}
	s.prof.Store(p)
	return nil
}

// Profile returns the configuration in force (a copy).
func (s *Scheduler) Profile() ProfileConfig { return s.prof.Load().cfg.Clone() }

// Saturation returns the profile's saturation detector.
func (s *Scheduler) Saturation() SaturationDetector { return s.prof.Load().sat }

// Consumes returns the scraped pod metrics the profile in force reads: the
// union of its filters' and enabled scorers' Consumes and the saturation
// detector's. A scraper needs only these; one a pod's engine lacks is
// worth a warning (Metrics.Missing).
func (s *Scheduler) Consumes() MetricSet { return s.prof.Load().consumes }

func isZeroProfile(c ProfileConfig) bool {
	return c.Base == "" && c.Filters == nil && c.Scorers == nil && c.Picker == ""
}

func buildProfile(cfg ProfileConfig, opts Options) (*profile, error) {
	if isZeroProfile(cfg) {
		cfg = DefaultProfile()
	}
	cfg = cfg.Clone()
	cfg.SetDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("picker: invalid profile: %w", err)
	}
	p := &profile{
		cfg: cfg,
		sat: SaturationDetector{
			QueueThreshold: cfg.Saturation.QueueThreshold,
			KVThreshold:    cfg.Saturation.KVThreshold,
			StaleAfter:     cfg.StaleAfter,
			PrefillWait:    cfg.Saturation.PrefillWait,
			SheddableWait:  cfg.Saturation.SheddableWait,
		}.withDefaults(),
		consumes: saturationMetrics,
	}
	bc := buildContext{cfg: cfg, tracker: opts.Tracker, sat: p.sat}
	for _, name := range cfg.Filters {
		f := filterFactories[name](bc)
		p.filters = append(p.filters, f)
		p.consumes |= f.Consumes()
	}
	// Scorers that read the others' weighted sum run after them, in
	// profile order within each group.
	var late []ScorerConfig
	var lateBuilt []scorer
	for _, sc := range cfg.Scorers {
		if !sc.On() {
			continue
		}
		bc.params = scorerSpecs[sc.Name].withDefaults(sc.Params)
		built := scorerSpecs[sc.Name].build(bc)
		if _, ok := built.(afterOthers); ok {
			late, lateBuilt = append(late, sc), append(lateBuilt, built)
			continue
		}
		p.addScorer(sc, built)
	}
	for i, sc := range late {
		p.addScorer(sc, lateBuilt[i])
	}
	p.picker = pickerFactories[cfg.Picker](bc)
	return p, nil
}

func (p *profile) addScorer(sc ScorerConfig, built scorer) {
	p.consumes |= built.Consumes()
	p.scorers = append(p.scorers, built)
	p.names = append(p.names, sc.Name)
	p.weights = append(p.weights, sc.Weight)
}

// Schedule picks pods for req among pods, which it does not modify. See
// ScheduleInto to reuse a Result's memory.
func (s *Scheduler) Schedule(req *Request, pods []*Pod) (Result, error) {
	var r Result
	err := s.ScheduleInto(&r, req, pods)
	return r, err
}

// ScheduleInto is Schedule writing into res, reusing its slices. With a
// reused Result a cycle performs no allocations that grow with len(pods).
func (s *Scheduler) ScheduleInto(res *Result, req *Request, pods []*Pod) error {
	p := s.prof.Load()
	c, _ := s.cycles.Get().(*cycle)
	if c == nil {
		c = &cycle{}
	}
	defer s.cycles.Put(c)
	c.cs.reset()
	c.cs.cyc = c
	c.cs.seed = s.seed()

	res.Ranked = res.Ranked[:0]
	res.Total = res.Total[:0]
	res.Scores = res.Scores[:0]
	res.Scorers = p.names
	res.Weights = p.weights
	res.Saturated, res.Busy = false, false
	cands := append(res.Candidates[:0], pods...)
	for _, f := range p.filters {
		if cands = f.Filter(&c.cs, req, cands); len(cands) == 0 {
			break
		}
	}
	res.Candidates = cands
	n := len(cands)
	if n == 0 {
		return ErrNoCandidates
	}

	res.flat = grow(res.flat, n*(len(p.scorers)+1))
	res.Total = res.flat[:n]
	clear(res.Total)
	c.cs.total = res.Total // the running sum, for afterOthers scorers
	for k, sc := range p.scorers {
		out := res.flat[(k+1)*n : (k+2)*n]
		clear(out)
		sc.Score(&c.cs, req, cands, out)
		w := p.weights[k]
		for i, v := range out {
			if !(v >= 0) { // also catches NaN
				v = 0
			} else if v > 1 {
				v = 1
			}
			out[i] = v
			res.Total[i] += w * v
		}
		res.Scores = append(res.Scores, out)
	}

	c.cs.maxRanked = p.cfg.MaxRanked
	c.cs.out = res.Ranked[:0]
	res.Ranked = p.picker.Pick(&c.cs, req, cands, res.Total)
	c.cs.out = nil

	// Busy pods still take work: only when every candidate is saturated
	// or busy is the request held (ErrBusy). The pick itself stays the
	// scorers'; a busy filter on the candidates, measured, hurt
	// multi-turn chat (turns sent away from their cached history).
	var prior speedPrior // for pods without a learned speed; none known: not busy
	wait := p.sat.waitFor(req)
	if wait > 0 {
		prior = newSpeedPrior(cands, 0, p.cfg.SpeedPooling)
	}
	busy := false
	for _, pod := range cands {
		if p.sat.Saturated(pod) {
			continue
		}
		if p.sat.BusyFor(req, pod, prior.of(pod)) {
			busy = true
			continue
		}
		return nil
	}
	if busy {
		res.Busy = true
		return ErrBusy
	}
	res.Saturated = true
	return ErrSaturated
}

// PrefillSpeeds appends to out, for each of pods (as Tracker.Apply filled
// them), the prefill speed in tokens/s the scheduler's scorers and busy
// check use for it: its learned speed pooled with its hardware class
// (ProfileConfig.SpeedPooling), else the GPU prior from the default speed.
// For operators (Tier 1's /debug/pods); it is not on the request path.
func (s *Scheduler) PrefillSpeeds(pods []*Pod, out []float64) []float64 {
	prior := newSpeedPrior(pods, defaultPrefillSpeed, s.prof.Load().cfg.SpeedPooling)
	for _, p := range pods {
		out = append(out, prior.of(p))
	}
	return out
}

func (s *Scheduler) seed() uint64 {
	s.rngMu.Lock()
	v := s.rng.Uint64()
	s.rngMu.Unlock()
	return v
}

func grow[T any](b []T, n int) []T {
	if cap(b) < n {
		return make([]T, n)
	}
	return b[:n]
}

// clamp01 maps v into [0,1]; NaN becomes 0.
func clamp01(v float64) float64 {
	if !(v >= 0) {
		return 0
	}
	return math.Min(v, 1)
}

// HoldKey is what the scheduler's answer to "is every candidate saturated
// or busy?" reads from a non-sheddable request: the filters' inputs
// (model, base model, pool, adapter). Two such requests with equal keys,
// scheduled against the same pods, are both held or both not, so a caller
// that saw one held can hold the other without a scheduling cycle, until
// the pods' state changes (see admission.Pass).
type HoldKey struct {
	Model, BaseModel, Pool, Adapter string
}

// HoldKey returns req's HoldKey, and whether other requests' answers can
// stand for req's: always true now that no rule reads a request's own
// prompt; callers (admission.Pass) keep the flag for such a rule.
func (s *Scheduler) HoldKey(req *Request) (HoldKey, bool) {
	return HoldKey{Model: req.Model, BaseModel: req.BaseModel, Pool: req.Pool, Adapter: req.Adapter}, true
}
