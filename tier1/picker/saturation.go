package picker

import (
	"time"

	"github.com/infergate/infergate/shared/config"
)

// SaturationDetector decides whether a pod (or the pool) can take more
// work right now, as GIE's saturation detector does. A pod is saturated
// when its metrics are stale, its effective queue reaches QueueThreshold or
// its KV-cache usage reaches KVThreshold. The zero value uses the defaults.
type SaturationDetector struct {
	QueueThreshold int           // default DefaultQueueThreshold
	KVThreshold    float64       // default DefaultKVThreshold
	StaleAfter     time.Duration // default DefaultStaleAfter
	// PrefillWait, when > 0, marks a pod busy (see Busy) once the prefill
	// the router has queued on it would take this long. 0 = off.
	PrefillWait time.Duration
	// SheddableWait is PrefillWait for sheddable requests (see
	// SaturationConfig.SheddableWait); 0 = PrefillWait.
	SheddableWait time.Duration
}

func (d SaturationDetector) withDefaults() SaturationDetector {
	config.Default(&d.QueueThreshold, DefaultQueueThreshold)
	config.Default(&d.KVThreshold, DefaultKVThreshold)
	config.Default(&d.StaleAfter, DefaultStaleAfter)
	return d
}

// Stale reports whether the pod's metrics are too old to trust.
func (d SaturationDetector) Stale(p *Pod) bool {
	d = d.withDefaults()
	return p.MetricsAge > d.StaleAfter
}

// Saturated reports whether p should not receive more work: stale metrics
// count as saturated, because an unseen queue may be arbitrarily long.
func (d SaturationDetector) Saturated(p *Pod) bool {
	d = d.withDefaults()
	if p.MetricsAge > d.StaleAfter {
		return true
	}
	if QueueDepth(p) >= d.QueueThreshold {
		return true
	}
	return p.Metrics.HasKV && p.Metrics.KVUsage >= d.KVThreshold
}

// Busy reports whether the prefill queued on p reaches PrefillWait: the
// router's in-flight uncached prompt tokens (its own and its peers') at
// speed tokens per second (the scheduler's estimate for p: its learned
// speed pooled with its class, or the prior's guess), else at p's learned
// PrefillTokensPerSec. A busy pod still takes work; when every candidate is busy the
// scheduler says so (ErrBusy) and the caller holds the request, so that it
// chooses the order in which held requests reach the pods (the engine
// serves what it was sent first come, first served). Off (false) when
// PrefillWait is 0 or no speed is known.
func (d SaturationDetector) Busy(p *Pod, speed float64) bool {
	return busyAt(p, speed, d.PrefillWait)
}

// BusyFor is Busy with req's wait: SheddableWait for a sheddable request
// when set, else PrefillWait.
func (d SaturationDetector) BusyFor(req *Request, p *Pod, speed float64) bool {
	return busyAt(p, speed, d.waitFor(req))
}

func (d SaturationDetector) waitFor(req *Request) time.Duration {
	if req.Sheddable && d.SheddableWait > 0 {
		return d.SheddableWait
	}
	return d.PrefillWait
}

func busyAt(p *Pod, speed float64, wait time.Duration) bool {
	if wait <= 0 {
		return false
	}
	if !(speed > 0) {
		speed = p.PrefillTokensPerSec
	}
	if !(speed > 0) {
		return false
	}
	return float64(p.InFlightUncachedTokens) >= speed*wait.Seconds()
}

// PoolSaturation is GIE's pool-level signal: the mean over pods of
// max(queue/QueueThreshold, kv/KVThreshold), with stale pods counting as
// 1 (fully saturated) or more. ≥ 1 means the pool is saturated.
func (d SaturationDetector) PoolSaturation(pods []*Pod) float64 {
	d = d.withDefaults()
	if len(pods) == 0 {
		return 1
	}
	var sum float64
	for _, p := range pods {
		s := float64(QueueDepth(p)) / float64(d.QueueThreshold)
		if p.Metrics.HasKV {
			s = max(s, p.Metrics.KVUsage/d.KVThreshold)
		}
		if p.MetricsAge > d.StaleAfter {
			s = max(s, 1)
		}
		sum += s
	}
	return sum / float64(len(pods))
}

// Saturated reports whether p is saturated under the default thresholds.
func Saturated(p *Pod) bool { return SaturationDetector{}.Saturated(p) }

// QueueDepth is the pod's effective queue: the scraped Waiting, or the
// router's in-flight requests beyond the scraped Running if larger. The
// latter counts requests dispatched since the last scrape, so a burst
// between scrapes does not see every pod as idle and herd onto one.
func QueueDepth(p *Pod) int {
	return max(p.Metrics.Waiting, p.InFlight-p.Metrics.Running, 0)
}

// Load is the pod's effective number of requests (queued plus running),
// the quantity the hot-prefix guard compares.
func Load(p *Pod) int {
	return max(p.Metrics.Waiting+p.Metrics.Running, p.InFlight)
}
