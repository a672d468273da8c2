package gateway

import "github.com/prometheus/client_golang/prometheus"

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

var latencyBuckets = []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "infergate_tier1_requests_total",
			Help: "Requests handled, by model, pool, pod that served (\"\" if none) and HTTP status.",
		}, []string{"model", "pool", "pod", "status"}),
		ttft: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "infergate_tier1_ttft_seconds",
			Help:    "Router-seen time to first response byte (first streamed event), from request arrival.",
			Buckets: latencyBuckets,
		}, []string{"model", "pool"}),
		e2e: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "infergate_tier1_request_duration_seconds",
			Help:    "Router-seen end-to-end request duration.",
			Buckets: latencyBuckets,
		}, []string{"model", "pool"}),
		scores: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "infergate_tier1_chosen_pod_score",
			Help:    "Per-scorer score, in [0,1], of the pod each request was first sent to.",
			Buckets: prometheus.LinearBuckets(0.1, 0.1, 10),
		}, []string{"pool", "scorer"}),
		retries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "infergate_tier1_retries_total",
			Help: "Attempts retried on the next-best pod, by reason of the failed attempt.",
		}, []string{"pool", "reason"}),
		queueWait: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "infergate_tier1_queue_wait_seconds",
			Help:    "Time requests waited in the router's queue while every pod was saturated.",
			Buckets: latencyBuckets,
		}, []string{"pool"}),
		queueLen: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "infergate_tier1_queue_length",
			Help: "Requests waiting in the router's queue.",
		}, []string{"pool"}),
		shed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "infergate_tier1_shed_total",
			Help: "Sheddable requests rejected with 429 because every pod was saturated.",
		}, []string{"model", "pool"}),
		reloads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "infergate_tier1_config_reloads_total",
			Help: "Configuration reloads, by result (ok, error).",
		}, []string{"result"}),
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
