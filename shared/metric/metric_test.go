package metric

import (
	"errors"
	"slices"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// TestConstructors registers each kind on a real registry and checks what
// a scrape would see: name, help, type, label names and buckets.
func TestConstructors(t *testing.T) {
	buckets := []float64{.1, 1, 10}
	for _, tc := range []struct {
		name    string
		make    func() prometheus.Collector
		touch   func(prometheus.Collector) // creates the one child series
		typ     dto.MetricType
		labels  []string
		buckets []float64
	}{
		{
			name:   "test_counter_total",
			make:   func() prometheus.Collector { return Counter("test_counter_total", "A counter.", "pod", "reason") },
			touch:  func(c prometheus.Collector) { c.(*prometheus.CounterVec).WithLabelValues("a", "b").Add(2) },
			typ:    dto.MetricType_COUNTER,
			labels: []string{"pod", "reason"},
		},
		{
			name:   "test_gauge",
			make:   func() prometheus.Collector { return Gauge("test_gauge", "A gauge.", "pool") },
			touch:  func(c prometheus.Collector) { c.(*prometheus.GaugeVec).WithLabelValues("p").Set(3) },
			typ:    dto.MetricType_GAUGE,
			labels: []string{"pool"},
		},
		{
			name: "test_seconds",
			make: func() prometheus.Collector {
				return Histogram("test_seconds", "A histogram.", buckets, "model", "pool")
			},
			touch:   func(c prometheus.Collector) { c.(*prometheus.HistogramVec).WithLabelValues("m", "p").Observe(.5) },
			typ:     dto.MetricType_HISTOGRAM,
			labels:  []string{"model", "pool"},
			buckets: buckets,
		},
		{
			name:    "test_latency_seconds",
			make:    func() prometheus.Collector { return Histogram("test_latency_seconds", "Latency.", LatencyBuckets()) },
			touch:   func(c prometheus.Collector) { c.(*prometheus.HistogramVec).WithLabelValues().Observe(.5) },
			typ:     dto.MetricType_HISTOGRAM,
			buckets: []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			reg := prometheus.NewRegistry()
			c := tc.make()
			if err := Register(reg, c); err != nil {
				t.Fatal(err)
			}
			tc.touch(c)
			mfs, err := reg.Gather()
			if err != nil {
				t.Fatal(err)
			}
			if len(mfs) != 1 {
				t.Fatalf("gathered %d families, want 1", len(mfs))
			}
			mf := mfs[0]
			if mf.GetName() != tc.name || mf.GetType() != tc.typ || mf.GetHelp() == "" {
				t.Fatalf("family %q type %v help %q, want %q type %v", mf.GetName(), mf.GetType(), mf.GetHelp(), tc.name, tc.typ)
			}
			var got []string
			for _, lp := range mf.GetMetric()[0].GetLabel() {
				got = append(got, lp.GetName())
			}
			if !slices.Equal(got, tc.labels) {
				t.Errorf("labels %v, want %v", got, tc.labels)
			}
			var bounds []float64
			for _, b := range mf.GetMetric()[0].GetHistogram().GetBucket() {
				bounds = append(bounds, b.GetUpperBound())
			}
			if !slices.Equal(bounds, tc.buckets) {
				t.Errorf("buckets %v, want %v", bounds, tc.buckets)
			}
		})
	}
}

// TestLatencyBucketsFresh checks that a caller changing its buckets does
// not change another's.
func TestLatencyBucketsFresh(t *testing.T) {
	a := LatencyBuckets()
	a[0] = 99
	if LatencyBuckets()[0] != .005 {
		t.Fatal("LatencyBuckets returned a shared slice")
	}
}

// TestRegisterStopsAtFirstError registers a name twice: the error wraps
// the client's AlreadyRegisteredError, the collectors before it stay
// registered and the ones after it are not tried.
func TestRegisterStopsAtFirstError(t *testing.T) {
	reg := prometheus.NewRegistry()
	first := Counter("test_first_total", "First.")
	dup := Counter("test_first_total", "First.")
	after := Gauge("test_after", "After.")
	err := Register(reg, first, dup, after)
	var are prometheus.AlreadyRegisteredError
	if !errors.As(err, &are) {
		t.Fatalf("err = %v, want one wrapping prometheus.AlreadyRegisteredError", err)
	}
	if are.ExistingCollector != first {
		t.Error("the existing collector is not the first one registered")
	}
	if !reg.Unregister(first) {
		t.Error("the collector before the failure was not registered")
	}
	if reg.Unregister(after) {
		t.Error("the collector after the failure was registered")
	}
}
