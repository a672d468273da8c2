package gateway

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the gateway's own series (tier2/route has the routing's).
// They name tenants, so tier2/server serves them on their own listener.
type metrics struct {
	mRequests  *prometheus.CounterVec
	mDuration  *prometheus.HistogramVec
	mFailovers prometheus.Counter
	mLimited   *prometheus.CounterVec
	mTokens    *prometheus.CounterVec
	mCost      *prometheus.CounterVec
}

// newMetrics registers the gateway's series on reg.
func newMetrics(reg prometheus.Registerer) (metrics, error) {
	counter := func(name, help string, labels ...string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, labels)
	}
	m := metrics{
		mRequests: counter("infergate_tier2_requests_total", "Requests answered by Tier 2, by endpoint and HTTP status.", "endpoint", "code"),
		mDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "infergate_tier2_request_duration_seconds",
			Help: "Time from request to the end of the response, by endpoint.", Buckets: prometheus.ExponentialBuckets(0.001, 2.5, 14)},
			[]string{"endpoint"}),
		mFailovers: prometheus.NewCounter(prometheus.CounterOpts{Name: "infergate_tier2_failovers_total",
			Help: "Attempts that failed before any byte reached the client and moved on to another cluster."}),
		mLimited: counter("infergate_tier2_ratelimited_total",
			"Requests refused with 429 by the tenant's limits, by the limit that tripped (rpm, tpm, concurrency, budget).", "tenant", "limit"),
		mTokens: counter("infergate_tier2_tokens_total",
			"Tokens served, from the responses' usage, by tenant, cluster and type (prompt, completion).", "tenant", "cluster", "type"),
		mCost: counter("infergate_tier2_cost_total",
			"Estimated spend from each cluster's advertised per-million-token cost (clusters priced per GPU-hour are not counted).", "tenant", "cluster"),
	}
	for _, c := range []prometheus.Collector{m.mRequests, m.mDuration, m.mFailovers, m.mLimited, m.mTokens, m.mCost} {
		if err := reg.Register(c); err != nil {
			return metrics{}, fmt.Errorf("gateway: register metrics: %w", err)
		}
	}
	return m, nil
}
