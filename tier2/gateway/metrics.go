package gateway

import (
	"fmt"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/infergate/infergate/shared/metric"
)

// metrics are the gateway's own series (tier2/route has the routing's);
// docs/metrics.md lists them all. They name tenants, so tier2/server
// serves them on their own listener. Label values are bounded: tenants
// and models beyond the first MaxTenantLabels / MaxModelLabels seen read
// "other", a model no cluster serves reads "other", and a request that
// got no answer from a cluster has cluster and region "".
type metrics struct {
	mRequests  *prometheus.CounterVec
	mDuration  *prometheus.HistogramVec
	mTTFT      *prometheus.HistogramVec
	mFailovers prometheus.Counter
	mLimited   *prometheus.CounterVec
	mTokens    *prometheus.CounterVec
	mCost      *prometheus.CounterVec

	tenantLabels, modelLabels *labelSet
}

// OtherLabel stands for the tenants and models past the label bounds.
const OtherLabel = "other"

// newMetrics registers the gateway's series on reg.
func newMetrics(reg prometheus.Registerer, maxTenants, maxModels int) (metrics, error) {
	latency := metric.LatencyBuckets()
	m := metrics{
		mRequests: metric.Counter("infergate_tier2_requests_total",
			"Requests answered by Tier 2, by endpoint, HTTP status, tenant, model, and the cluster and region that answered (\"\" if none).",
			"endpoint", "status", "tenant", "model", "cluster", "region"),
		mDuration: metric.Histogram("infergate_tier2_request_duration_seconds",
			"Time from request to the end of the response, by endpoint, model and the cluster that answered.", latency, "endpoint", "model", "cluster"),
		mTTFT: metric.Histogram("infergate_tier2_ttft_seconds",
			"Time from request to a stream's first event relayed to the client, by model and cluster.", latency, "model", "cluster"),
		mFailovers: prometheus.NewCounter(prometheus.CounterOpts{Name: "infergate_tier2_failovers_total",
			Help: "Attempts that failed before any byte reached the client and moved on to another cluster."}),
		mLimited: metric.Counter("infergate_tier2_ratelimited_total",
			"Requests refused with 429 by the tenant's limits, by the limit that tripped (rpm, tpm, concurrency, budget).", "tenant", "limit"),
		mTokens: metric.Counter("infergate_tier2_tokens_total",
			"Tokens served, from the responses' usage, by tenant, model, cluster and type (prompt, completion).", "tenant", "model", "cluster", "type"),
		mCost: metric.Counter("infergate_tier2_cost_total",
			"Estimated spend, in the clusters' currency: tokens × the cluster's cost per million tokens (per-GPU-hour costs converted with routing.tokens_per_gpu_second).",
			"tenant", "model", "cluster"),
		tenantLabels: newLabelSet(maxTenants),
		modelLabels:  newLabelSet(maxModels),
	}
	if err := metric.Register(reg, m.mRequests, m.mDuration, m.mTTFT, m.mFailovers, m.mLimited, m.mTokens, m.mCost); err != nil {
		return metrics{}, fmt.Errorf("gateway: %w", err)
	}
	return m, nil
}

// labelSet bounds one label's values: the first max distinct values keep
// their own, later ones read OtherLabel. Safe for concurrent use.
type labelSet struct {
	max  int
	mu   sync.RWMutex
	seen map[string]struct{}
}

func newLabelSet(max int) *labelSet { return &labelSet{max: max, seen: map[string]struct{}{}} }

// value is v's label value ("" stays "").
func (l *labelSet) value(v string) string {
	if v == "" {
		return ""
	}
	l.mu.RLock()
	_, ok := l.seen[v]
	full := len(l.seen) >= l.max
	l.mu.RUnlock()
	switch {
	case ok:
		return v
	case full:
		return OtherLabel
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, ok := l.seen[v]; !ok {
		if len(l.seen) >= l.max {
			return OtherLabel
		}
		l.seen[v] = struct{}{}
	}
	return v
}

// labels are one request's metric labels, filled as it goes: the tenant
// once authenticated, the model once planned (OtherLabel for one no
// cluster serves), the cluster and region once one answered.
type labels struct {
	tenant, model, cluster, region string
}
