package kvevents

import (
	"fmt"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/infergate/infergate/shared/metric"
)

// Metrics are the subscriber's and the index's Prometheus metrics. Every
// label is bounded: pod (only pods the subscriber follows) or a fixed set
// of reasons. A nil *Metrics records nothing.
type Metrics struct {
	messages prometheus.Counter
	events   *prometheus.CounterVec
	errs     *prometheus.CounterVec
	dropped  *prometheus.CounterVec
	gaps     *prometheus.CounterVec
	resets   *prometheus.CounterVec
}

// Error reasons (infergate_tier1_kv_events_errors_total{reason}).
const (
	reasonConnect    = "connect"     // dialling a publisher failed
	reasonRecv       = "recv"        // a connection ended (publisher gone)
	reasonLimit      = "limit"       // a peer was cut off for exceeding a limit
	reasonFrame      = "frame"       // a message not shaped [topic, seq, payload]
	reasonDecode     = "decode"      // a payload that did not decode
	reasonUnknownPod = "unknown_pod" // bind mode: a topic naming no followed pod
	reasonOverflow   = "overflow"    // bind mode: a pod's queue was full
	reasonReplay     = "replay"      // a replay request failed
)

var errorReasons = []string{reasonConnect, reasonRecv, reasonLimit, reasonFrame, reasonDecode, reasonUnknownPod, reasonOverflow, reasonReplay}

// NewMetrics registers the metrics on reg, with a collector reporting
// idx's per-pod state, blocks and memory at scrape time.
func NewMetrics(reg prometheus.Registerer, idx *Index) (*Metrics, error) {
	m := &Metrics{
		messages: prometheus.NewCounter(prometheus.CounterOpts{Name: "infergate_tier1_kv_events_messages_total",
			Help: "KV-event messages received from pods (live and replayed)."}),
		events: metric.Counter("infergate_tier1_kv_events_total", "KV-cache events applied to the index, by type.", "type"),
		errs: metric.Counter("infergate_tier1_kv_events_errors_total",
			"KV-event subscriber errors, by reason (connect, recv, limit, frame, decode, unknown_pod, overflow, replay).", "reason"),
		dropped: metric.Counter("infergate_tier1_kv_index_dropped_blocks_total",
			"Stored blocks not indexed, by reason (cap, orphan, medium, block_size, inconsistent).", "reason"),
		gaps: metric.Counter("infergate_tier1_kv_events_gaps_total",
			"Sequence gaps in a pod's event stream, by outcome (replayed, unrepaired).", "outcome"),
		resets: metric.Counter("infergate_tier1_kv_index_resets_total",
			"Times a pod's entries were dropped, by reason (restart, publisher_gone, gap, joined, decode_error).", "reason"),
	}
	for _, r := range errorReasons {
		m.errs.WithLabelValues(r)
	}
	for _, k := range []EventKind{KindBlockStored, KindBlockRemoved, KindAllBlocksCleared, KindUnknown} {
		m.events.WithLabelValues(k.String())
	}
	if err := metric.Register(reg, m.messages, m.events, m.errs, m.dropped, m.gaps, m.resets, &indexCollector{idx: idx}); err != nil {
		return nil, fmt.Errorf("kv-events: %w", err)
	}
	return m, nil
}

func (m *Metrics) message() {
	if m != nil {
		m.messages.Inc()
	}
}

func (m *Metrics) err(reason string) {
	if m != nil {
		m.errs.WithLabelValues(reason).Inc()
	}
}

func (m *Metrics) gap(outcome string) {
	if m != nil {
		m.gaps.WithLabelValues(outcome).Inc()
	}
}

func (m *Metrics) reset(reason string) {
	if m != nil {
		m.resets.WithLabelValues(reason).Inc()
	}
}

func (m *Metrics) applied(b *Batch, st ApplyStats) {
	if m == nil {
		return
	}
	var counts [4]int
	for i := range b.Events {
		counts[b.Events[i].Kind]++
	}
	for k, n := range counts {
		if n > 0 {
			m.events.WithLabelValues(EventKind(k).String()).Add(float64(n))
		}
	}
	for _, d := range []struct {
		reason string
		n      int
	}{{"cap", st.DroppedCap}, {"orphan", st.DroppedOrphan}, {"medium", st.DroppedMedium},
		{"block_size", st.DroppedBlockSize}, {"inconsistent", st.Inconsistent}} {
		if d.n > 0 {
			m.dropped.WithLabelValues(d.reason).Add(float64(d.n))
		}
	}
}

// indexCollector reports per-pod gauges when scraped, so a pod that left
// leaves no series behind and states age without a timer.
type indexCollector struct{ idx *Index }

var (
	podStateDesc = prometheus.NewDesc("infergate_tier1_kv_events_pod_state",
		"1 for the state the pod's KV-event stream is in (fresh, stale, absent), 0 for the others.", []string{"pod", "state"}, nil)
	podBlocksDesc = prometheus.NewDesc("infergate_tier1_kv_index_blocks",
		"KV blocks the exact index holds for the pod.", []string{"pod"}, nil)
	indexBytesDesc = prometheus.NewDesc("infergate_tier1_kv_index_bytes",
		"Estimated memory of the exact KV index, all pods.", nil, nil)
)

func (c *indexCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- podStateDesc
	ch <- podBlocksDesc
	ch <- indexBytesDesc
}

func (c *indexCollector) Collect(ch chan<- prometheus.Metric) {
	for _, p := range c.idx.Stats() {
		for _, s := range States {
			v := 0.0
			if s == p.State {
				v = 1
			}
			ch <- prometheus.MustNewConstMetric(podStateDesc, prometheus.GaugeValue, v, p.Pod, s.String())
		}
		ch <- prometheus.MustNewConstMetric(podBlocksDesc, prometheus.GaugeValue, float64(p.Blocks), p.Pod)
	}
	ch <- prometheus.MustNewConstMetric(indexBytesDesc, prometheus.GaugeValue, float64(c.idx.Bytes()))
}

// logLimiter lets one log line through per interval and counts the rest,
// so a pod publishing garbage at line rate cannot flood the log.
type logLimiter struct {
	mu         sync.Mutex
	next       time.Time
	suppressed int
}

const logInterval = 30 * time.Second

// allow reports whether to log now, and how many lines were suppressed
// since the last one logged.
func (l *logLimiter) allow(now time.Time) (bool, int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if now.Before(l.next) {
		l.suppressed++
		return false, 0
	}
	l.next = now.Add(logInterval)
	n := l.suppressed
	l.suppressed = 0
	return true, n
}
