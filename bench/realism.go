package bench

import (
	"hash/fnv"
	"time"

	"github.com/infergate/infergate/sim/engine"
)

// Realism is what makes a simulated fleet less tidy than a spreadsheet:
// engine steps jitter, pods of one GPU type differ slightly, and pods are
// scraped at staggered moments, sometimes late. Everything is a pure
// function of (seed, pod[, tick]), so runs stay deterministic. The zero
// value is off.
//
// The harness applies it (see the hook described in docs/benchmarks.md):
// Engine.Apply to each pod's engine.Config, and ScrapeAt to schedule each
// pod's scrapes instead of one fleet-wide tick.
type Realism struct {
	Engine engine.Variation
	// ScrapeStagger spreads the pods' scrape phases uniformly over one
	// scrape interval instead of scraping every pod at the same instant.
	ScrapeStagger bool
	// LateScrape is the probability that one scrape of one pod arrives a
	// whole interval late (a slow /metrics response), so the router keeps
	// the older view for twice as long.
	LateScrape float64
}

// DefaultRealism is the benchmark's: 3% step jitter, pods within ±3%,
// staggered scrapes, 2% of scrapes late.
func DefaultRealism() Realism {
	return Realism{Engine: engine.DefaultVariation(), ScrapeStagger: true, LateScrape: 0.02}
}

// ScrapeAt is when pod's scrape number tick (0, 1, ...) lands, for a
// scrape interval of every: its phase within the interval, plus one
// interval when that scrape is late.
func (r Realism) ScrapeAt(seed uint64, pod int, tick int64, every time.Duration) time.Duration {
	at := time.Duration(tick) * every
	if r.ScrapeStagger {
		at += time.Duration(unitHash(seed, uint64(pod), 1<<62) * float64(every))
	}
	if r.LateScrape > 0 && unitHash(seed, uint64(pod), uint64(tick)) < r.LateScrape {
		at += every
	}
	return at
}

// unitHash maps (seed, a, b) to [0, 1) deterministically.
func unitHash(seed, a, b uint64) float64 {
	h := fnv.New64a()
	var buf [24]byte
	for i, v := range [3]uint64{seed, a, b} {
		for j := range 8 {
			buf[i*8+j] = byte(v >> (8 * j))
		}
	}
	h.Write(buf[:])
	return float64(h.Sum64()>>11) / (1 << 53)
}
