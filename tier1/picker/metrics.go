package picker

import "strings"

// MetricSet is a set of the pod metrics scraped from model servers that the
// scheduler's plugins read: the data keys of GIE's scheduling framework,
// where each plugin names what it reads in Consumes()
// (gateway-api-inference-extension,
// pkg/epp/scheduling/framework/plugins/scorer/queue.go). A profile's set is
// the union of its plugins' (Scheduler.Consumes); the scraper reports the
// ones a pod's engine does not export (Metrics.Missing), and tier1/scrape's
// dialect table says which engine metric provides each.
type MetricSet uint8

// The metrics, one bit each.
const (
	// MetricWaiting is Metrics.Waiting, requests queued on the server.
	MetricWaiting MetricSet = 1 << iota
	// MetricRunning is Metrics.Running, requests in the running batch.
	MetricRunning
	// MetricKVUsage is Metrics.KVUsage (and HasKV), KV-cache utilization.
	MetricKVUsage
	// MetricLoRA is the adapter state: ActiveAdapters, WaitingAdapters,
	// MaxLoras (and HasLoRA).
	MetricLoRA

	// AllMetrics is every metric.
	AllMetrics = MetricWaiting | MetricRunning | MetricKVUsage | MetricLoRA
)

// metricNames are the metrics' names in Metrics.Missing when an engine has
// no metric of its own for one, in bit order.
var metricNames = [...]string{"waiting", "running", "kv_cache_usage", "lora"}

// Each calls f with each metric of s, in bit order.
func (s MetricSet) Each(f func(MetricSet)) {
	for i := range metricNames {
		if m := MetricSet(1) << i; s&m != 0 {
			f(m)
		}
	}
}

// String names the metrics of s, e.g. "waiting|kv_cache_usage".
func (s MetricSet) String() string {
	var parts []string
	for i, n := range metricNames {
		if s&(1<<i) != 0 {
			parts = append(parts, n)
		}
	}
	return strings.Join(parts, "|")
}

// consumer is implemented by every built-in filter and scorer: it names the
// scraped metrics the plugin reads, so that a profile's needs follow from
// its plugins instead of a list kept elsewhere. Router-side state (InFlight,
// the prefix index, learned speeds) is not scraped and not listed.
type consumer interface {
	Consumes() MetricSet
}

// The metrics of the load helpers plugins share.
const (
	queueDepthMetrics = MetricWaiting | MetricRunning // QueueDepth
	loadMetrics       = MetricWaiting | MetricRunning // Load
	// saturationMetrics are what SaturationDetector.Saturated and
	// PoolSaturation read; every profile has a detector.
	saturationMetrics = queueDepthMetrics | MetricKVUsage
)
