// Package route decides which Tier 1 clusters a Tier 2 request goes to, in
// which order to fail over, and keeps what those decisions need: each
// cluster's live load (polled from its load summary), a circuit breaker per
// (cluster, model), recent error rates and first-token latencies.
//
// Ordering, per request:
//
//  1. Filter: the cluster serves the model, is not drained, its breaker is
//     not open, and (region-pinned tenants) it is in the tenant's region.
//  2. Group: 0 = has headroom (utilisation below the spill threshold), meets
//     the latency objective, low error rate; 1 = degraded (over the spill
//     threshold, slow, erroring, stale load); 2 = last resort (saturated, no
//     ready pods, load polls failing, weight 0).
//  3. Within a group, by policy: cost-first and region-pinned sort by
//     effective cost, then locality, then utilisation; latency-first sorts
//     by locality, then utilisation and error rate, then cost.
//
// The first candidate is the pick. The rest are the failover order: other
// clusters of the pick's region, then other regions (in the configured
// region order), last-resort clusters at the end. Cost shaping falls out of
// the groups: the cheapest cluster takes traffic until its utilisation
// crosses the spill threshold, then the next cheapest with headroom does.
package route

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math"
	"net"
	"net/http"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/sony/gobreaker/v2"

	"github.com/infergate/infergate/shared/cluster"
	"github.com/infergate/infergate/shared/config"
	"github.com/infergate/infergate/shared/getjson"
	"github.com/infergate/infergate/shared/metric"
	"github.com/infergate/infergate/tier2/discovery"
)

// Policy is a tenant's routing policy.
type Policy string

// Policies.
const (
	CostFirst    Policy = "cost-first"    // cheapest cluster with headroom that meets the latency objective
	LatencyFirst Policy = "latency-first" // own region first, least loaded
	RegionPinned Policy = "region-pinned" // cost-first, never outside the tenant's region
)

// ParsePolicy parses a policy name; "" is the default policy def.
func ParsePolicy(s string, def Policy) (Policy, error) {
	switch p := Policy(s); p {
	case "":
		return def, nil
	case CostFirst, LatencyFirst, RegionPinned:
		return p, nil
	}
	return "", fmt.Errorf("unknown routing policy %q (want cost-first, latency-first or region-pinned)", s)
}

// Decision reasons (the reason label of infergate_tier2_route_decisions_total).
const (
	ReasonCheapest   = "cheapest"    // cost-first pick: no cheaper cluster is eligible
	ReasonSpill      = "spill"       // cost-first pick: cheaper clusters lack headroom or are slow
	ReasonLocal      = "local"       // latency-first pick in the router's own region
	ReasonRemote     = "remote"      // latency-first pick outside the router's region
	ReasonPinned     = "pinned"      // region-pinned pick
	ReasonDegraded   = "degraded"    // no cluster has headroom; best of the degraded ones
	ReasonLastResort = "last_resort" // only saturated / unreachable clusters left
	ReasonFailover   = "failover"    // a later attempt after a failed one
)

// Errors from Plan and Begin.
var (
	// ErrUnknownModel: no known cluster serves the model.
	ErrUnknownModel = errors.New("no cluster serves this model")
	// ErrNoCandidates: clusters serve the model but none may take the
	// request now (drained, breakers open, or outside a pinned region).
	// Plan returns it as a *NoCandidatesError, which says why.
	ErrNoCandidates = errors.New("no cluster available for this model")
	// ErrBreakerOpen: Begin refused the cluster (its breaker is open, or
	// half-open with its probe already in flight).
	ErrBreakerOpen = errors.New("circuit breaker open")
	// ErrClientCanceled marks an attempt that ended because the client went
	// away; it does not count against the cluster.
	ErrClientCanceled = errors.New("client canceled")
)

// StatusError is an attempt that got an HTTP error status from Tier 1.
// 4xx (429 included) do not count against the cluster's breaker: they say
// something about the request or the tenant, or ask to back off.
type StatusError struct {
	Code   int
	Reason string // Tier 1's OpenAI error code, when it gave one (a 429's or 503's)
}

func (e *StatusError) Error() string { return fmt.Sprintf("tier1 answered HTTP %d", e.Code) }

// excluded says whether an attempt's error is neither success nor failure
// for the breaker.
func excluded(err error) bool {
	if errors.Is(err, ErrClientCanceled) {
		return true
	}
	var se *StatusError
	return errors.As(err, &se) && se.Code >= 400 && se.Code < 500
}

// Override is an operator's per-cluster setting (from the tenant store).
type Override struct {
	Drain  bool     // take no new requests
	Weight *float64 // preference multiplier, default 1; divides the effective cost; 0 = last resort
	Cost   *float64 // replaces the advertised cost
}

// Source lists the clusters (discovery.Discovery implements it).
type Source interface {
	Clusters() []discovery.Cluster
}

// BreakerOptions configures the per-(cluster, model) circuit breakers.
type BreakerOptions struct {
	ConsecutiveFailures uint32        // trip after this many failures in a row; default 5
	FailureRatio        float64       // or this share of failures ...; default 0.5
	MinRequests         uint32        // ... over at least this many requests in Interval; default 20
	Interval            time.Duration // counting window while closed; default 30s
	OpenTimeout         time.Duration // open → half-open after this; default 10s
	HalfOpenRequests    uint32        // probes allowed while half-open; default 1
}

// Options configures a Router. Zero values take the defaults noted.
type Options struct {
	Region      string   // this Tier 2's region ("own region")
	RegionOrder []string // failover preference after the own region; unlisted regions follow, by name

	Token        string       // bearer token for Tier 1 (load summaries)
	HTTPClient   *http.Client // for load polls; default: 1s-timeout client
	PollInterval time.Duration
	PollTimeout  time.Duration // default: PollInterval, at most 2s
	StaleAfter   time.Duration // load older than this is stale; default 3 × PollInterval
	// DialTLSContext, when set, makes the default HTTPClient's
	// connections to https clusters (Tier 2's tier1.tls: CA bundle,
	// client certificate); nil: the system roots, no client certificate.
	DialTLSContext func(ctx context.Context, network, addr string) (net.Conn, error)

	DefaultPolicy      Policy        // default cost-first
	SpillThreshold     float64       // utilisation where a cluster stops counting as having headroom; default 0.8
	QueuePerPod        float64       // queued requests per ready pod that count as full when capacity is unknown; default 4
	LatencyObjective   time.Duration // first-token objective; 0 = none
	ErrorRateThreshold float64       // recent error rate that marks a cluster degraded; default 0.2
	// TokensPerGPUSecond converts per-GPU-hour costs to per-million-token
	// costs so clusters priced either way compare; 0 compares raw numbers.
	TokensPerGPUSecond float64

	Breaker   BreakerOptions
	Overrides func() map[string]Override // keyed by cluster name; nil = none
	// Adapters maps LoRA adapter names to their base model, for clusters
	// whose load summaries do not say (summaries name the base of each
	// adapter they serve). Entries here win.
	Adapters map[string]string

	Registry prometheus.Registerer
	Logger   *slog.Logger
}

func (o *Options) setDefaults() {
	config.Default(&o.PollInterval, time.Second)
	config.Default(&o.PollTimeout, min(o.PollInterval, 2*time.Second))
	config.Default(&o.StaleAfter, 3*o.PollInterval)
	if o.HTTPClient == nil {
		o.HTTPClient = &http.Client{Timeout: o.PollTimeout}
		if o.DialTLSContext != nil {
			tr := http.DefaultTransport.(*http.Transport).Clone()
			tr.DialTLSContext = o.DialTLSContext
			o.HTTPClient.Transport = tr
		}
	}
	config.Default(&o.DefaultPolicy, CostFirst)
	config.Default(&o.SpillThreshold, 0.8)
	config.Default(&o.QueuePerPod, 4)
	config.Default(&o.ErrorRateThreshold, 0.2)
	b := &o.Breaker
	if b.ConsecutiveFailures == 0 {
		b.ConsecutiveFailures = 5
	}
	config.Default(&b.FailureRatio, 0.5)
	if b.MinRequests == 0 {
		b.MinRequests = 20
	}
	config.Default(&b.Interval, 30*time.Second)
	config.Default(&b.OpenTimeout, 10*time.Second)
	if b.HalfOpenRequests == 0 {
		b.HalfOpenRequests = 1
	}
	if o.Registry == nil {
		o.Registry = prometheus.NewRegistry()
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
}

// errorHalfLife is how fast a cluster's recent error rate fades without
// new outcomes.
const errorHalfLife = 30 * time.Second

// Router plans and tracks routing to Tier 1 clusters. Safe for concurrent
// use.
type Router struct {
	src  Source
	opts Options
	log  *slog.Logger

	mu     sync.Mutex
	states map[string]*clusterState // by cluster ID

	mDecisions   *prometheus.CounterVec
	mBreaker     *prometheus.GaugeVec
	mTransitions *prometheus.CounterVec
	mPolls       *prometheus.CounterVec
	mUtil        *prometheus.GaugeVec
	mAttempts    *prometheus.CounterVec
}

type clusterState struct {
	name      string
	summary   *cluster.LoadSummary
	summaryAt time.Time // when we received it
	pollFails int       // consecutive
	models    map[string]*modelState

	// For the admin API (ClusterInfo): the last poll, the last failed
	// poll, and the last failure of any kind (poll or request attempt).
	polledAt              time.Time
	pollErr               string
	pollErrAt             time.Time
	lastErr, lastErrModel string
	lastErrAt             time.Time

	// unserved is the cluster's listed models its Tier 1's last summary
	// lacks, joined, so the warning is logged when the set changes, not
	// on every poll.
	unserved string
}

type modelState struct {
	breaker   *gobreaker.TwoStepCircuitBreaker[struct{}]
	inflight  int     // our requests in flight
	sincePoll int     // of those, the ones dispatched since the last summary (which does not count them yet)
	gen       uint64  // summaries received, to match attempts with sincePoll
	errRate   float64 // EWMA of failures, decaying with errorHalfLife
	errAt     time.Time
	ttft      float64      // EWMA of first-token latency, seconds; 0 = unknown
	since     atomic.Int64 // unix nanoseconds of the breaker's last state change
}

// New builds a Router over src. Call Run to poll load summaries.
func New(src Source, opts Options) (*Router, error) {
	opts.setDefaults()
	if opts.SpillThreshold > 1 {
		return nil, fmt.Errorf("route: spill threshold %v must be in (0,1]", opts.SpillThreshold)
	}
	if _, err := ParsePolicy(string(opts.DefaultPolicy), CostFirst); err != nil {
		return nil, fmt.Errorf("route: %w", err)
	}
	r := &Router{
		src:    src,
		opts:   opts,
		log:    opts.Logger.With("component", "route"),
		states: map[string]*clusterState{},
		mDecisions: metric.Counter("infergate_tier2_route_decisions_total",
			"Requests dispatched to a Tier 1 cluster, by why it was chosen.", "cluster", "region", "reason"),
		mBreaker: metric.Gauge("infergate_tier2_breaker_state",
			"Circuit breaker state per cluster and model: 0 closed, 1 half-open, 2 open.", "cluster", "model"),
		mTransitions: metric.Counter("infergate_tier2_breaker_transitions_total",
			"Circuit breaker state changes, by the state entered.", "cluster", "model", "to"),
		mPolls: metric.Counter("infergate_tier2_load_polls_total",
			"Load-summary polls of Tier 1 clusters, by result (ok, error).", "cluster", "result"),
		mUtil: metric.Gauge("infergate_tier2_cluster_utilization",
			"Estimated utilisation of a cluster from its last load summary (1 = full).", "cluster"),
		mAttempts: metric.Counter("infergate_tier2_attempts_total",
			"Attempts to Tier 1 clusters, by outcome (ok, failure, excluded).", "cluster", "outcome"),
	}
	if err := metric.Register(opts.Registry, r.mDecisions, r.mBreaker, r.mTransitions, r.mPolls, r.mUtil, r.mAttempts); err != nil {
		return nil, fmt.Errorf("route: %w", err)
	}
	return r, nil
}

// Run polls every cluster's load summary each PollInterval until ctx ends.
// When the source can signal changes (discovery.Discovery), new clusters
// are polled as soon as they appear.
func (r *Router) Run(ctx context.Context) error {
	type changer interface{ Changed() <-chan struct{} }
	ch, _ := r.src.(changer)
	t := time.NewTicker(r.opts.PollInterval)
	defer t.Stop()
	for {
		var changed <-chan struct{}
		if ch != nil {
			changed = ch.Changed()
		}
		r.pollAll(ctx)
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		case <-changed:
		}
	}
}

func (r *Router) pollAll(ctx context.Context) {
	clusters := r.src.Clusters()
	live := make(map[string]bool, len(clusters))
	var wg sync.WaitGroup
	for _, c := range clusters {
		live[c.ID] = true
		wg.Add(1)
		go func() {
			defer wg.Done()
			r.poll(ctx, c)
		}()
	}
	wg.Wait()
	// Forget clusters that left, so a returning one starts fresh.
	r.mu.Lock()
	for id, st := range r.states {
		if !live[id] {
			delete(r.states, id)
			r.mUtil.DeleteLabelValues(st.name)
		}
	}
	r.mu.Unlock()
}

func (r *Router) poll(ctx context.Context, c discovery.Cluster) {
	sum, err := r.fetch(ctx, c)
	if ctx.Err() != nil {
		return
	}
	r.store(c, sum, err)
}

// store records a poll's result.
func (r *Router) store(c discovery.Cluster, sum *cluster.LoadSummary, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	st := r.stateLocked(c)
	now := time.Now()
	st.polledAt = now
	if err != nil {
		r.mPolls.WithLabelValues(c.Name, "error").Inc()
		st.pollFails++
		st.pollErr, st.pollErrAt = err.Error(), now
		st.lastErr, st.lastErrModel, st.lastErrAt = "load poll: "+err.Error(), "", now
		if st.pollFails == 2 {
			r.log.Warn("tier1 load polls failing", "cluster", c.Name, "err", err)
		}
		// An unreachable cluster fails every model: the poll counts as a
		// failed request on each breaker, so a dead cluster trips them even
		// when no request goes there, and while half-open the poll is the
		// probe that fails. (A good poll proves nothing about inference, so
		// only real requests close a breaker.)
		for _, ms := range st.models {
			if ms.breaker.State() == gobreaker.StateOpen {
				continue
			}
			if done, err2 := ms.breaker.Allow(); err2 == nil {
				done(fmt.Errorf("load poll: %w", err))
			}
		}
		return
	}
	r.mPolls.WithLabelValues(c.Name, "ok").Inc()
	st.pollFails = 0
	r.checkServedLocked(c, st, sum)
	st.summary = sum
	st.summaryAt = now
	for _, ms := range st.models {
		ms.sincePoll = 0
		ms.gen++
	}
	r.mUtil.WithLabelValues(c.Name).Set(r.utilLocked(c, st, ""))
}

// checkServedLocked warns when the cluster's entry (Tier 2's clusters:
// list or its Consul metadata) names models its Tier 1 does not serve:
// requests for them sent there fail with model_not_found until the two
// agree. The warning repeats only when the set of such models changes.
func (r *Router) checkServedLocked(c discovery.Cluster, st *clusterState, sum *cluster.LoadSummary) {
	var missing []string
	for _, m := range c.Models {
		if _, ok := sum.Models[m]; !ok {
			missing = append(missing, m)
		}
	}
	joined := strings.Join(missing, ",")
	if joined == st.unserved {
		return
	}
	st.unserved = joined
	if len(missing) > 0 {
		served := slices.Sorted(maps.Keys(sum.Models))
		r.log.Warn("cluster lists models its tier1 does not serve", "cluster", c.Name, "models", missing, "tier1_serves", served)
	}
}

func (r *Router) fetch(ctx context.Context, c discovery.Cluster) (*cluster.LoadSummary, error) {
	ctx, cancel := context.WithTimeout(ctx, r.opts.PollTimeout)
	defer cancel()
	var s cluster.LoadSummary
	if err := getjson.Get(ctx, r.opts.HTTPClient, getjson.Request{URL: c.Address + cluster.LoadPath, Token: r.opts.Token}, &s); err != nil {
		return nil, fmt.Errorf("load summary: %w", err)
	}
	return &s, nil
}

func (r *Router) stateLocked(c discovery.Cluster) *clusterState {
	st := r.states[c.ID]
	if st == nil {
		st = &clusterState{name: c.Name, models: map[string]*modelState{}}
		r.states[c.ID] = st
	}
	return st
}

func (r *Router) modelLocked(c discovery.Cluster, st *clusterState, model string) *modelState {
	ms := st.models[model]
	if ms != nil {
		return ms
	}
	b := r.opts.Breaker
	name, clusterName := c.Name, c.Name
	ms = &modelState{}
	ms.since.Store(time.Now().UnixNano())
	ms.breaker = gobreaker.NewTwoStepCircuitBreaker[struct{}](gobreaker.Settings{
		Name:        name + "/" + model,
		MaxRequests: b.HalfOpenRequests,
		Interval:    b.Interval,
		Timeout:     b.OpenTimeout,
		ReadyToTrip: func(n gobreaker.Counts) bool {
			return n.ConsecutiveFailures >= b.ConsecutiveFailures ||
				(n.Requests >= b.MinRequests && float64(n.TotalFailures) >= b.FailureRatio*float64(n.Requests))
		},
		IsExcluded: excluded,
		// Runs under the breaker's lock: metrics and a log line only.
		OnStateChange: func(_ string, from, to gobreaker.State) {
			ms.since.Store(time.Now().UnixNano())
			r.mBreaker.WithLabelValues(clusterName, model).Set(float64(to))
			r.mTransitions.WithLabelValues(clusterName, model, to.String()).Inc()
			r.log.Info("circuit breaker", "cluster", clusterName, "model", model, "from", from.String(), "to", to.String())
		},
	})
	r.mBreaker.WithLabelValues(clusterName, model).Set(0)
	st.models[model] = ms
	return ms
}

// fresh returns the summary if it is recent enough to route on.
func (r *Router) freshLocked(st *clusterState) *cluster.LoadSummary {
	return r.freshAtLocked(st, time.Now())
}

func (r *Router) freshAtLocked(st *clusterState, now time.Time) *cluster.LoadSummary {
	if st.summary == nil || now.Sub(st.summaryAt) > r.opts.StaleAfter {
		return nil
	}
	return st.summary
}

// utilLocked estimates a cluster's utilisation in [0, ∞): what its last
// summary said plus what we sent since. model "" means the whole cluster.
func (r *Router) utilLocked(c discovery.Cluster, st *clusterState, model string) float64 {
	return r.utilAtLocked(c, st, model, r.freshLocked(st))
}

// utilAtLocked is utilLocked with the fresh summary (or nil) given.
func (r *Router) utilAtLocked(c discovery.Cluster, st *clusterState, model string, sum *cluster.LoadSummary) float64 {
	var outstanding, queue, ready, sincePoll int
	var kv, u float64 = 1, 0
	for _, ms := range st.models {
		if sum == nil {
			outstanding += ms.inflight
		} else {
			sincePoll += ms.sincePoll
		}
	}
	if sum != nil {
		kvn := 0
		for name, ml := range sum.Models {
			outstanding += max(ml.InFlight, ml.Running+ml.Queue)
			if model == "" || name == model {
				queue += ml.Queue
				ready += ml.ReadyPods
				kv = min(kv, ml.KVHeadroom)
				kvn++
				if ml.Saturated {
					u = 1
				}
			}
		}
		if kvn == 0 {
			kv = 1
		}
	}
	outstanding += sincePoll
	switch {
	case c.Capacity > 0:
		u = max(u, float64(outstanding)/float64(c.Capacity))
	case ready > 0:
		u = max(u, float64(queue+sincePoll)/(float64(ready)*r.opts.QueuePerPod))
	}
	return max(u, 1-kv)
}

// Candidate is one cluster in a Plan.
type Candidate struct {
	Cluster     discovery.Cluster
	Reason      string  // why it is where it is (Reason* constants)
	Group       int     // 0 headroom, 1 degraded, 2 last resort
	Cost        float64 // effective cost used for ordering
	Utilization float64 // estimated utilisation
	ErrorRate   float64
	rank        int // region rank, for sorting
}

// Request is what Plan needs to know about a request.
type Request struct {
	Model  string
	Policy Policy // "" = the default policy
	Region string // tenant's home region (region-pinned); "" = the router's region
}

// Plan returns the clusters to try for req, best first, then the failover
// order. It does not reserve anything; call Begin for each attempt.
func (r *Router) Plan(req Request) ([]Candidate, error) {
	if req.Policy == "" {
		req.Policy = r.opts.DefaultPolicy
	}
	if req.Region == "" {
		req.Region = r.opts.Region
	}
	cands, err := r.candidates(req)
	if err != nil {
		return nil, err
	}
	// Sort pointers: candidates are large, and Plan runs per request.
	ptrs := make([]*Candidate, len(cands))
	for i := range cands {
		cands[i].rank = r.regionRank(cands[i].Cluster.Region)
		ptrs[i] = &cands[i]
	}
	slices.SortStableFunc(ptrs, byPolicy(req.Policy))
	ptrs[0].Reason = r.pickReason(ptrs, req.Policy)
	failoverOrder(ptrs[0].Cluster.Region, ptrs[1:])
	out := make([]Candidate, len(ptrs))
	for i, c := range ptrs {
		out[i] = *c
		if i > 0 {
			out[i].Reason = ReasonFailover
		}
	}
	return out, nil
}

// candidates filters the clusters that may take req (step 1 of the package
// doc) and puts each in its group (step 2). Policy and Region are set.
func (r *Router) candidates(req Request) ([]Candidate, error) {
	var overrides map[string]Override
	if r.opts.Overrides != nil {
		overrides = r.opts.Overrides()
	}
	clusters := r.src.Clusters()
	now := time.Now()

	r.mu.Lock()
	defer r.mu.Unlock()
	var ex *NoCandidatesError // what was excluded, made on the first exclusion
	exclude := func() *NoCandidatesError {
		if ex == nil {
			ex = &NoCandidatesError{Model: req.Model}
			if req.Policy == RegionPinned {
				ex.Region = req.Region
			}
		}
		return ex
	}
	serving := 0
	cands := make([]Candidate, 0, len(clusters))
	for _, c := range clusters {
		st := r.stateLocked(c)
		sum := r.freshAtLocked(st, now)
		if !serves(c, sum, req.Model) {
			continue
		}
		serving++
		if req.Policy == RegionPinned && c.Region != req.Region {
			exclude().OutsideRegion++
			continue
		}
		ov := overrides[c.Name]
		if ov.Drain {
			exclude().Drained++
			continue
		}
		ms := r.modelLocked(c, st, req.Model)
		if ms.breaker.State() == gobreaker.StateOpen {
			e := exclude()
			e.BreakerOpen++
			// Open → half-open after OpenTimeout from the trip.
			wait := max(time.Unix(0, ms.since.Load()).Add(r.opts.Breaker.OpenTimeout).Sub(now), 0)
			if e.BreakerOpen == 1 || wait < e.RetryAfter {
				e.RetryAfter = wait
			}
			continue
		}
		cand := Candidate{Cluster: c, Cost: r.effectiveCost(c, ov), Utilization: r.utilAtLocked(c, st, req.Model, sum), ErrorRate: ms.errorRate(now)}
		cand.Group = r.groupLocked(cand, clusterView{st: st, sum: sum, ms: ms, ov: ov}, req.Model)
		cands = append(cands, cand)
	}
	if serving == 0 {
		return nil, ErrUnknownModel
	}
	if len(cands) == 0 {
		ex.Serving = serving
		return nil, ex
	}
	return cands, nil
}

// clusterView is what the router knows of one cluster for one model while
// planning: its state, fresh load summary (nil if none or stale), the
// model's breaker and history, and the operator's override.
type clusterView struct {
	st  *clusterState
	sum *cluster.LoadSummary
	ms  *modelState
	ov  Override
}

// groupLocked puts a candidate in group 0 (headroom), 1 (degraded) or 2
// (last resort).
func (r *Router) groupLocked(cand Candidate, v clusterView, model string) int {
	var ml cluster.ModelLoad
	var hasModelLoad bool
	if v.sum != nil {
		ml, hasModelLoad = v.sum.Models[model]
	}
	weight := 1.0
	if v.ov.Weight != nil {
		weight = *v.ov.Weight
	}
	switch {
	case weight <= 0, v.st.pollFails >= 2, cand.Utilization >= 1,
		v.sum != nil && (!hasModelLoad || ml.ReadyPods == 0 || ml.Saturated):
		return 2
	case cand.Utilization >= r.opts.SpillThreshold,
		// Half-open keeps its place so the next request probes it (one at
		// a time; a failed probe fails over); its error history is what
		// the probe is about, so it does not demote it.
		v.ms.breaker.State() != gobreaker.StateHalfOpen && cand.ErrorRate > r.opts.ErrorRateThreshold,
		v.st.summary != nil && v.sum == nil, // had load, now stale
		r.opts.LatencyObjective > 0 && v.ms.ttft > r.opts.LatencyObjective.Seconds():
		return 1
	}
	return 0
}

// byPolicy orders candidates within and across groups (step 3).
func byPolicy(policy Policy) func(a, b *Candidate) int {
	if policy == LatencyFirst {
		return func(a, b *Candidate) int {
			return cmp.Or(
				cmp.Compare(a.Group, b.Group),
				cmp.Compare(a.rank, b.rank),
				cmp.Compare(a.Utilization+a.ErrorRate, b.Utilization+b.ErrorRate),
				cmp.Compare(a.Cost, b.Cost),
				cmp.Compare(a.Cluster.ID, b.Cluster.ID))
		}
	}
	return func(a, b *Candidate) int {
		return cmp.Or(
			cmp.Compare(a.Group, b.Group),
			cmp.Compare(a.Cost, b.Cost),
			cmp.Compare(a.rank, b.rank),
			cmp.Compare(a.Utilization, b.Utilization),
			cmp.Compare(a.Cluster.ID, b.Cluster.ID))
	}
}

// pickReason says why ptrs[0], the pick, is first.
func (r *Router) pickReason(ptrs []*Candidate, policy Policy) string {
	first := ptrs[0]
	switch {
	case first.Group == 2:
		return ReasonLastResort
	case first.Group == 1:
		return ReasonDegraded
	case policy == RegionPinned:
		return ReasonPinned
	case policy == LatencyFirst && first.Cluster.Region == r.opts.Region:
		return ReasonLocal
	case policy == LatencyFirst:
		return ReasonRemote
	}
	for _, c := range ptrs[1:] {
		if c.Cost < first.Cost {
			return ReasonSpill
		}
	}
	return ReasonCheapest
}

// failoverOrder sorts the candidates after the pick: the pick's region
// first, then the others in region order; last-resort clusters at the very
// end.
func failoverOrder(pickRegion string, rest []*Candidate) {
	slices.SortStableFunc(rest, func(a, b *Candidate) int {
		if la, lb := a.Group == 2, b.Group == 2; la != lb {
			if lb {
				return -1
			}
			return 1
		}
		sa, sb := a.Cluster.Region == pickRegion, b.Cluster.Region == pickRegion
		if sa != sb {
			if sa {
				return -1
			}
			return 1
		}
		return cmp.Compare(a.rank, b.rank)
	})
}

// serves: the cluster advertises the model, or (no advertised list) its
// fresh load summary has it, or we know nothing yet.
func serves(c discovery.Cluster, sum *cluster.LoadSummary, model string) bool {
	if len(c.Models) > 0 {
		return c.Serves(model)
	}
	if sum != nil {
		_, ok := sum.Models[model]
		return ok
	}
	return true
}

func (r *Router) effectiveCost(c discovery.Cluster, ov Override) float64 {
	cost := c.Cost
	if ov.Cost != nil {
		cost = *ov.Cost
	}
	if c.CostUnit == cluster.CostPerGPUHour && r.opts.TokensPerGPUSecond > 0 {
		cost /= r.opts.TokensPerGPUSecond * 3600 / 1e6
	}
	if ov.Weight != nil && *ov.Weight > 0 {
		cost /= *ov.Weight
	}
	return cost
}

// regionRank: own region 0, then RegionOrder, then the rest.
func (r *Router) regionRank(region string) int {
	if region == r.opts.Region {
		return 0
	}
	if i := slices.Index(r.opts.RegionOrder, region); i >= 0 {
		return 1 + i
	}
	return 1 + len(r.opts.RegionOrder)
}

func (ms *modelState) errorRate(now time.Time) float64 {
	if ms.errRate == 0 {
		return 0
	}
	return ms.errRate * math.Exp2(-now.Sub(ms.errAt).Seconds()/errorHalfLife.Seconds())
}

// Attempt is one dispatch to a cluster, from Begin to Done.
type Attempt struct {
	r     *Router
	c     discovery.Cluster
	model string
	done  func(error)
	gen   uint64
	probe bool // began while the breaker was half-open
	once  sync.Once
}

// Begin starts an attempt on c for model: it asks the cluster's breaker,
// counts the request in flight and records the routing decision with
// c.Reason. It returns ErrBreakerOpen when the breaker refuses; call Done on
// the returned attempt exactly once otherwise.
func (r *Router) Begin(c Candidate, model string) (*Attempt, error) {
	r.mu.Lock()
	st := r.stateLocked(c.Cluster)
	ms := r.modelLocked(c.Cluster, st, model)
	r.mu.Unlock()
	probe := ms.breaker.State() == gobreaker.StateHalfOpen
	done, err := ms.breaker.Allow()
	if err != nil {
		return nil, fmt.Errorf("%s: %w", c.Cluster.Name, ErrBreakerOpen)
	}
	r.mu.Lock()
	ms.inflight++
	ms.sincePoll++
	gen := ms.gen
	r.mu.Unlock()
	r.mDecisions.WithLabelValues(c.Cluster.Name, c.Cluster.Region, c.Reason).Inc()
	return &Attempt{r: r, c: c.Cluster, model: model, done: done, gen: gen, probe: probe}, nil
}

// FirstToken records the attempt's time to first token (streams), which
// the latency objective is checked against.
func (a *Attempt) FirstToken(d time.Duration) {
	a.r.mu.Lock()
	defer a.r.mu.Unlock()
	if st := a.r.states[a.c.ID]; st != nil {
		if ms := st.models[a.model]; ms != nil {
			s := d.Seconds()
			if ms.ttft == 0 {
				ms.ttft = s
			} else {
				ms.ttft = 0.8*ms.ttft + 0.2*s
			}
		}
	}
}

// Done ends the attempt: nil for success, a *StatusError, ErrClientCanceled
// or any other error (a failure). Only the first call counts.
func (a *Attempt) Done(err error) {
	a.once.Do(func() {
		a.done(err)
		outcome := "ok"
		switch {
		case err == nil:
		case excluded(err):
			outcome = "excluded"
		default:
			outcome = "failure"
		}
		a.r.mAttempts.WithLabelValues(a.c.Name, outcome).Inc()
		a.r.mu.Lock()
		defer a.r.mu.Unlock()
		st := a.r.states[a.c.ID]
		if st == nil {
			return
		}
		if outcome == "failure" {
			st.lastErr, st.lastErrModel, st.lastErrAt = err.Error(), a.model, time.Now()
		}
		ms := st.models[a.model]
		if ms == nil {
			return
		}
		ms.inflight--
		if ms.gen == a.gen && ms.sincePoll > 0 {
			ms.sincePoll--
		}
		if outcome == "excluded" {
			return
		}
		now := time.Now()
		rate := ms.errorRate(now)
		switch {
		case outcome == "failure":
			rate = 0.8*rate + 0.2
		case a.probe:
			rate = 0 // a good probe closed the breaker: start clean
		default:
			rate *= 0.8
		}
		ms.errRate, ms.errAt = rate, now
	})
}

// BreakerState reports the breaker of (cluster ID, model): "closed",
// "half-open", "open", or "" if it does not exist yet.
func (r *Router) BreakerState(clusterID, model string) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	st := r.states[clusterID]
	if st == nil || st.models[model] == nil {
		return ""
	}
	return st.models[model].breaker.State().String()
}

// Models returns every model some cluster serves: advertised ones and
// those in fresh load summaries.
func (r *Router) Models() []string {
	set := map[string]bool{}
	clusters := r.src.Clusters()
	r.mu.Lock()
	for _, c := range clusters {
		for _, m := range c.Models {
			set[m] = true
		}
		if st := r.states[c.ID]; st != nil {
			if sum := r.freshLocked(st); sum != nil {
				for m := range sum.Models {
					set[m] = true
				}
			}
		}
	}
	r.mu.Unlock()
	out := make([]string, 0, len(set))
	for m := range set {
		out = append(out, m)
	}
	sort.Strings(out)
	return out
}

// BaseModel returns the base model a LoRA adapter runs on, or "" when
// model is not a known adapter: from Options.Adapters, else from the
// fresh load summaries (the first cluster that names a base).
func (r *Router) BaseModel(model string) string {
	if b, ok := r.opts.Adapters[model]; ok {
		return b
	}
	clusters := r.src.Clusters()
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, c := range clusters {
		if st := r.states[c.ID]; st != nil {
			if sum := r.freshLocked(st); sum != nil && sum.Models[model].Base != "" {
				return sum.Models[model].Base
			}
		}
	}
	return ""
}

// BreakerInfo describes one circuit breaker (for the admin API).
type BreakerInfo struct {
	ClusterID           string
	Cluster             string
	Model               string
	State               string // closed, half-open, open
	ConsecutiveFailures uint32
	Since               time.Time // last state change (or creation)
}

// Breakers lists every breaker, sorted by cluster and model.
func (r *Router) Breakers() []BreakerInfo {
	r.mu.Lock()
	var out []BreakerInfo
	for id, st := range r.states {
		for model, ms := range st.models {
			out = append(out, BreakerInfo{
				ClusterID: id, Cluster: st.name, Model: model,
				State:               ms.breaker.State().String(),
				ConsecutiveFailures: ms.breaker.Counts().ConsecutiveFailures,
				Since:               time.Unix(0, ms.since.Load()),
			})
		}
	}
	r.mu.Unlock()
	sort.Slice(out, func(i, j int) bool {
		if out[i].Cluster != out[j].Cluster {
			return out[i].Cluster < out[j].Cluster
		}
		return out[i].Model < out[j].Model
	})
	return out
}
