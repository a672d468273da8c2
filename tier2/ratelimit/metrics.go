package ratelimit

import "github.com/prometheus/client_golang/prometheus"

// Collector exports Stats as Prometheus metrics; register it with the
// gateway's registry.
func (l *Limiter) Collector() prometheus.Collector { return collector{l} }

type collector struct{ l *Limiter }

var (
	descAdmits   = prometheus.NewDesc("infergate_tier2_ratelimit_admissions_total", "Admit calls.", nil, nil)
	descCalls    = prometheus.NewDesc("infergate_tier2_ratelimit_redis_calls_total", "Redis script calls, by cause (admission, prefetch, background).", []string{"cause"}, nil)
	descDegraded = prometheus.NewDesc("infergate_tier2_ratelimit_degraded_admissions_total", "Admissions decided by local fail-open limits.", nil, nil)
	descErrors   = prometheus.NewDesc("infergate_tier2_ratelimit_redis_errors_total", "Failed or timed-out Redis calls.", nil, nil)
	descDown     = prometheus.NewDesc("infergate_tier2_ratelimit_redis_down", "1 while Redis is considered unreachable.", nil, nil)
)

func (collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descAdmits, descCalls, descDegraded, descErrors, descDown} {
		ch <- d
	}
}

func (c collector) Collect(ch chan<- prometheus.Metric) {
	s := c.l.Stats()
	down := 0.0
	if s.RedisDown {
		down = 1
	}
	ch <- prometheus.MustNewConstMetric(descAdmits, prometheus.CounterValue, float64(s.Admits))
	ch <- prometheus.MustNewConstMetric(descCalls, prometheus.CounterValue, float64(s.AdmitSyncs), "admission")
	ch <- prometheus.MustNewConstMetric(descCalls, prometheus.CounterValue, float64(s.PrefetchSyncs), "prefetch")
	ch <- prometheus.MustNewConstMetric(descCalls, prometheus.CounterValue, float64(s.BackgroundSyncs), "background")
	ch <- prometheus.MustNewConstMetric(descDegraded, prometheus.CounterValue, float64(s.Degraded))
	ch <- prometheus.MustNewConstMetric(descErrors, prometheus.CounterValue, float64(s.RedisErrors))
	ch <- prometheus.MustNewConstMetric(descDown, prometheus.GaugeValue, down)
}
