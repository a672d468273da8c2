package gateway

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/infergate/infergate/shared/metric"
)

// metrics are the router's own Prometheus series (scrape series live in
// tier1/scrape and share the registry).
type metrics struct {
	requests  *prometheus.CounterVec
	ttft      *prometheus.HistogramVec
	e2e       *prometheus.HistogramVec
	scores    *prometheus.HistogramVec
	retries   *prometheus.CounterVec
	queueWait *prometheus.HistogramVec
	queueLen  *prometheus.GaugeVec
	shed      *prometheus.CounterVec
	reloads   *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) *metrics {
	latency := metric.LatencyBuckets()
	m := &metrics{
		requests: metric.Counter("infergate_tier1_requests_total",
			"Requests handled, by model, pool, pod that served (\"\" if none) and HTTP status.", "model", "pool", "pod", "status"),
		ttft: metric.Histogram("infergate_tier1_ttft_seconds",
			"Router-seen time to first response byte (first streamed event), from request arrival.", latency, "model", "pool"),
		e2e: metric.Histogram("infergate_tier1_request_duration_seconds", "Router-seen end-to-end request duration.", latency, "model", "pool"),
		scores: metric.Histogram("infergate_tier1_chosen_pod_score",
			"Per-scorer score, in [0,1], of the pod each request was first sent to.", prometheus.LinearBuckets(0.1, 0.1, 10), "pool", "scorer"),
		retries: metric.Counter("infergate_tier1_retries_total",
			"Attempts retried on the next-best pod, by reason of the failed attempt.", "pool", "reason"),
		queueWait: metric.Histogram("infergate_tier1_queue_wait_seconds",
			"Time requests waited in the router's queue while every pod was saturated.", latency, "pool"),
		queueLen: metric.Gauge("infergate_tier1_queue_length", "Requests waiting in the router's queue.", "pool"),
		shed: metric.Counter("infergate_tier1_shed_total",
			"Sheddable requests rejected with 429 because every pod was saturated.", "model", "pool"),
		reloads: metric.Counter("infergate_tier1_config_reloads_total", "Configuration reloads, by result (ok, error).", "result"),
	}
	reg.MustRegister(m.requests, m.ttft, m.e2e, m.scores, m.retries, m.queueWait, m.queueLen, m.shed, m.reloads)
	return m
}

// retryReasons are every reason label of infergate_tier1_retries_total
// (proxy.go): connect, timeout, reset and client_gone, and
// relay.StatusReason's.
var retryReasons = []string{"connect", "timeout", "reset", "client_gone", "status_5xx", "status_429", "status_404", "status_auth"}

// initPool creates a pool's series at zero, so dashboards and alerts see
// them before the first retry, shed request or queued one (Prometheus
// exports a labelled series only once it exists).
func (m *metrics) initPool(pool, model string, adapters []string) {
	for _, r := range retryReasons {
		m.retries.WithLabelValues(pool, r)
	}
	m.queueLen.WithLabelValues(pool)
	m.queueWait.WithLabelValues(pool)
	for _, name := range append([]string{model}, adapters...) {
		m.shed.WithLabelValues(name, pool)
	}
}
