package route

import (
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/sony/gobreaker/v2"

	"github.com/infergate/infergate/shared/cluster"
	"github.com/infergate/infergate/tier2/discovery"
)

// Codes of a request no cluster may take (NoCandidatesError.Code), as the
// gateway answers them in the OpenAI error's code.
const (
	CodeRegionPinned   = "region_pinned"   // the tenant is pinned to a region where no cluster serves the model
	CodeClusterDrained = "cluster_drained" // every cluster that could take it is drained by an operator
	CodeBreakerOpen    = "breaker_open"    // every cluster that could take it has its circuit breaker open
	CodeNoCapacity     = "no_capacity"     // several of the above at once
)

// NoCandidatesError is Plan's answer when clusters serve the model but
// none may take the request now; it wraps ErrNoCandidates and says which
// filter excluded how many.
type NoCandidatesError struct {
	Model         string
	Region        string // the pinned region; "" unless the policy is region-pinned
	Serving       int    // clusters serving the model
	OutsideRegion int    // ... outside the pinned region
	Drained       int    // ... drained by an admin override
	BreakerOpen   int    // ... with the model's circuit breaker open
	// RetryAfter is how long until the first open breaker half-opens (and
	// may take a probe); 0 when no breaker excluded a cluster.
	RetryAfter time.Duration
}

func (e *NoCandidatesError) Unwrap() error { return ErrNoCandidates }

// Code names the cause: one filter excluded every cluster, or several did
// (CodeNoCapacity).
func (e *NoCandidatesError) Code() string {
	switch {
	case e.OutsideRegion == e.Serving:
		return CodeRegionPinned
	case e.BreakerOpen == 0:
		return CodeClusterDrained
	case e.Drained == 0:
		return CodeBreakerOpen
	}
	return CodeNoCapacity
}

// Error is the message a client gets: what excluded the clusters, in
// words a person can act on.
func (e *NoCandidatesError) Error() string {
	if e.Code() == CodeRegionPinned {
		return fmt.Sprintf("no cluster in region %q serves %q (the tenant is pinned to its region; %d cluster(s) elsewhere serve it)",
			e.Region, e.Model, e.Serving)
	}
	var why []string
	if e.Drained > 0 {
		why = append(why, fmt.Sprintf("%d drained by an operator", e.Drained))
	}
	if e.BreakerOpen > 0 {
		why = append(why, fmt.Sprintf("%d with its circuit breaker open after repeated failures (next probe in %s)",
			e.BreakerOpen, e.RetryAfter.Round(time.Second)))
	}
	if e.OutsideRegion > 0 {
		why = append(why, fmt.Sprintf("%d outside the pinned region %q", e.OutsideRegion, e.Region))
	}
	return fmt.Sprintf("no cluster can take %q requests right now: of %d serving it, %s", e.Model, e.Serving, strings.Join(why, ", "))
}

// Cluster states (ClusterInfo.State).
const (
	StateOK          = "ok"
	StateDegraded    = "degraded"    // stale load, a breaker not closed, a model without ready pods or saturated, over the spill threshold
	StateUnreachable = "unreachable" // load polls failing (two or more in a row)
	StateDrained     = "drained"     // an admin override drains it
	StateUnknown     = "unknown"     // not polled yet
)

// ClusterInfo is what the router knows of one cluster, for the admin API.
type ClusterInfo struct {
	Cluster discovery.Cluster
	State   string   // State* constants
	Models  []string // advertised and in the last summary, sorted

	Summary   *cluster.LoadSummary // the last one received, fresh or not; nil before the first
	SummaryAt time.Time
	Fresh     bool // Summary is recent enough to route on

	PolledAt      time.Time // the last poll's end
	PollFailures  int       // in a row
	PollError     string    // the last failed poll's error
	PollErrorAt   time.Time
	LastError     string // the last failure, poll or request attempt
	LastErrorAt   time.Time
	LastErrorFrom string // the model of a failed attempt; "" for a poll

	Utilization float64 // the whole cluster's estimate
	InFlight    int     // this replica's requests in flight there

	Override    Override
	HasOverride bool
	// Cost: the advertised one or the override's, in the cluster's unit,
	// converted both ways when routing.tokens_per_gpu_second is set.
	Cost              float64
	PerMTok, PerGPUHr float64
	HasMTok, HasGPUHr bool
	Weight            float64 // the override's, 1 without one
	Effective         float64 // what cost-first orders by

	Breakers []BreakerInfo
}

// Region is this router's region.
func (r *Router) Region() string { return r.opts.Region }

// RegionOrder is the configured failover order after the own region.
func (r *Router) RegionOrder() []string { return slices.Clone(r.opts.RegionOrder) }

// TokensPerGPUSecond is the configured cost conversion (0: none).
func (r *Router) TokensPerGPUSecond() float64 { return r.opts.TokensPerGPUSecond }

// RegionRank orders regions for display and failover: the own region 0,
// then the configured order, then the rest (compare names for those).
func (r *Router) RegionRank(region string) int { return r.regionRank(region) }

// unitCosts converts cost in unit both ways: per million tokens and per
// GPU-hour, each with ok false when it needs tokens_per_gpu_second and
// that is not set.
func (r *Router) unitCosts(cost float64, unit string) (mtok float64, okM bool, gpuHr float64, okG bool) {
	mtokPerGPUHr := r.opts.TokensPerGPUSecond * 3600 / 1e6 // million tokens one GPU-hour makes
	if unit == cluster.CostPerMTok {
		return cost, true, cost * mtokPerGPUHr, mtokPerGPUHr > 0
	}
	if mtokPerGPUHr > 0 {
		return cost / mtokPerGPUHr, true, cost, true
	}
	return 0, false, cost, true
}

// SpendPerMTok is what a million tokens served by c cost (the override's
// cost if an operator set one), or false when c is priced per GPU-hour
// and routing.tokens_per_gpu_second is not set. The gateway's cost metric
// uses it.
func (r *Router) SpendPerMTok(c discovery.Cluster) (float64, bool) {
	cost := c.Cost
	if r.opts.Overrides != nil {
		if ov, ok := r.opts.Overrides()[c.Name]; ok && ov.Cost != nil {
			cost = *ov.Cost
		}
	}
	m, ok, _, _ := r.unitCosts(cost, c.CostUnit)
	return m, ok
}

// ClusterInfo reports every cluster discovery knows, sorted by region
// rank, region and name.
func (r *Router) ClusterInfo() []ClusterInfo {
	var overrides map[string]Override
	if r.opts.Overrides != nil {
		overrides = r.opts.Overrides()
	}
	clusters := r.src.Clusters()
	now := time.Now()
	out := make([]ClusterInfo, 0, len(clusters))
	r.mu.Lock()
	for _, c := range clusters {
		ov, hasOv := overrides[c.Name]
		ci := ClusterInfo{Cluster: c, Override: ov, HasOverride: hasOv, Weight: 1}
		ci.Cost = c.Cost
		if ov.Cost != nil {
			ci.Cost = *ov.Cost
		}
		if ov.Weight != nil {
			ci.Weight = *ov.Weight
		}
		ci.PerMTok, ci.HasMTok, ci.PerGPUHr, ci.HasGPUHr = r.unitCosts(ci.Cost, c.CostUnit)
		ci.Effective = r.effectiveCost(c, ov)
		models := map[string]bool{}
		for _, m := range c.Models {
			models[m] = true
		}
		if st := r.states[c.ID]; st != nil {
			sum := r.freshAtLocked(st, now)
			ci.Summary, ci.SummaryAt, ci.Fresh = st.summary, st.summaryAt, sum != nil
			if st.summary != nil {
				for m := range st.summary.Models {
					models[m] = true
				}
			}
			ci.PolledAt, ci.PollFailures, ci.PollError, ci.PollErrorAt = st.polledAt, st.pollFails, st.pollErr, st.pollErrAt
			ci.LastError, ci.LastErrorAt, ci.LastErrorFrom = st.lastErr, st.lastErrAt, st.lastErrModel
			ci.Utilization = r.utilAtLocked(c, st, "", sum)
			for model, ms := range st.models {
				ci.InFlight += ms.inflight
				ci.Breakers = append(ci.Breakers, BreakerInfo{ClusterID: c.ID, Cluster: c.Name, Model: model,
					State: ms.breaker.State().String(), ConsecutiveFailures: ms.breaker.Counts().ConsecutiveFailures,
					Since: time.Unix(0, ms.since.Load())})
			}
			ci.State = r.stateOf(st, sum, ci.Utilization)
		} else {
			ci.State = StateUnknown
		}
		if ov.Drain {
			ci.State = StateDrained
		}
		ci.Models = slices.Sorted(maps.Keys(models))
		sort.Slice(ci.Breakers, func(i, j int) bool { return ci.Breakers[i].Model < ci.Breakers[j].Model })
		out = append(out, ci)
	}
	r.mu.Unlock()
	slices.SortStableFunc(out, func(a, b ClusterInfo) int {
		ra, rb := r.regionRank(a.Cluster.Region), r.regionRank(b.Cluster.Region)
		if ra != rb {
			return ra - rb
		}
		return strings.Compare(a.Cluster.Region+"\x00"+a.Cluster.Name, b.Cluster.Region+"\x00"+b.Cluster.Name)
	})
	return out
}

// stateOf classifies a cluster that has state (drain is the caller's).
func (r *Router) stateOf(st *clusterState, fresh *cluster.LoadSummary, util float64) string {
	switch {
	case st.pollFails >= 2:
		return StateUnreachable
	case st.summary == nil && st.polledAt.IsZero():
		return StateUnknown
	case fresh == nil, util >= r.opts.SpillThreshold:
		return StateDegraded
	}
	for _, ms := range st.models {
		if ms.breaker.State() != gobreaker.StateClosed {
			return StateDegraded
		}
	}
	for _, ml := range fresh.Models {
		if ml.ReadyPods == 0 || ml.Saturated {
			return StateDegraded
		}
	}
	return StateOK
}
