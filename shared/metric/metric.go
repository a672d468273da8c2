// Package metric declares Prometheus collectors in one line each, so a
// package's metrics read as a table of names, help texts and labels, and
// registers them together. It only shortens the client library's option
// structs: the series it makes are exactly those of prometheus.NewCounterVec
// and its kin with the same name, help, labels and buckets.
package metric

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// Counter returns a counter vector named name with the given help text and
// label names.
func Counter(name, help string, labels ...string) *prometheus.CounterVec {
	return prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, labels)
}

// Gauge returns a gauge vector named name with the given help text and
// label names.
func Gauge(name, help string, labels ...string) *prometheus.GaugeVec {
	return prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: name, Help: help}, labels)
}

// Histogram returns a histogram vector named name with the given help
// text, bucket upper bounds and label names.
func Histogram(name, help string, buckets []float64, labels ...string) *prometheus.HistogramVec {
	return prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: name, Help: help, Buckets: buckets}, labels)
}

// LatencyBuckets returns the seconds buckets of both tiers' request
// latency histograms, from 5 ms to 2 min: the same bounds in both, so
// their quantiles compare. Each call returns a new slice.
func LatencyBuckets() []float64 {
	return []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120}
}

// Register registers cs on reg in order and stops at the first failure,
// which it returns wrapped (errors.As finds a
// prometheus.AlreadyRegisteredError in it). Collectors registered before
// the failure stay registered.
func Register(reg prometheus.Registerer, cs ...prometheus.Collector) error {
	for _, c := range cs {
		if err := reg.Register(c); err != nil {
			return fmt.Errorf("register metrics: %w", err)
		}
	}
	return nil
}
