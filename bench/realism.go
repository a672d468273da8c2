package bench

import (
	"fmt"
	"hash/fnv"
	"strings"
	"time"

	"github.com/infergate/infergate/bench/scenario"
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

// Realism knob names for ParseRealism.
const (
	KnobJitter  = "jitter"  // engine step jitter
	KnobSpread  = "spread"  // per-pod speed variation
	KnobStagger = "stagger" // staggered scrape phases
	KnobLate    = "late"    // late scrapes
	// KnobNoise is heavy-tailed engine noise (engine.NoisyVariation's
	// step jitter, stalls and prefill noise).
	KnobNoise = "noise"
)

// ParseRealism reads a realism setting: "default" (or ""), "off", or a
// comma-separated list of the knobs to turn on at their default strength
// (jitter, spread, stagger, late).
func ParseRealism(s string) (Realism, error) {
	switch strings.TrimSpace(s) {
	case "", "default", "on":
		return DefaultRealism(), nil
	case "off", "none":
		return Realism{}, nil
	}
	d, r := DefaultRealism(), Realism{}
	for _, k := range strings.Split(s, ",") {
		switch strings.TrimSpace(k) {
		case KnobJitter:
			r.Engine.StepJitter = max(r.Engine.StepJitter, d.Engine.StepJitter)
		case KnobSpread:
			r.Engine.PodSpread = d.Engine.PodSpread
		case KnobStagger:
			r.ScrapeStagger = true
		case KnobLate:
			r.LateScrape = d.LateScrape
		case KnobNoise:
			n := engine.NoisyVariation()
			r.Engine.StepJitter = max(r.Engine.StepJitter, n.StepJitter)
			r.Engine.StallProb, r.Engine.StallMean, r.Engine.PrefillNoise = n.StallProb, n.StallMean, n.PrefillNoise
		default:
			return Realism{}, fmt.Errorf("unknown realism knob %q: want default, off or a list of %s, %s, %s, %s, %s", k, KnobJitter, KnobSpread, KnobStagger, KnobLate, KnobNoise)
		}
	}
	return r, nil
}

// String describes r for reports.
func (r Realism) String() string {
	var on []string
	if r.Engine.StepJitter > 0 {
		on = append(on, fmt.Sprintf("step jitter σ %g%%", 100*r.Engine.StepJitter))
	}
	if r.Engine.PodSpread > 0 {
		on = append(on, fmt.Sprintf("pods ±%g%%", 100*r.Engine.PodSpread))
	}
	if r.ScrapeStagger {
		on = append(on, "staggered scrapes")
	}
	if r.LateScrape > 0 {
		on = append(on, fmt.Sprintf("%g%% late scrapes", 100*r.LateScrape))
	}
	if r.Engine.StallProb > 0 {
		on = append(on, fmt.Sprintf("stalls in %g%% of steps (mean %v)", 100*r.Engine.StallProb, r.Engine.StallMean))
	}
	if r.Engine.PrefillNoise > 0 {
		on = append(on, fmt.Sprintf("prefill noise σ %g%%", 100*r.Engine.PrefillNoise))
	}
	if len(on) == 0 {
		return "realism off"
	}
	return "realism: " + strings.Join(on, ", ")
}

// Conditions describes what a run with o is measured under: realism and
// scheduling inputs.
func (o Options) Conditions() string {
	o = o.withDefaults()
	in := "production inputs (admission.Prompt on generated text)"
	if o.Inputs == InputsEngine {
		in = "engine inputs (oracle token counts and block hashes)"
	}
	return o.Realism.String() + "; " + in
}

// withNoise is v with a fleet's own engine noise added: the larger step
// jitter of the two, the fleet's stalls and prefill noise.
func withNoise(v engine.Variation, n scenario.Noise) engine.Variation {
	v.StepJitter = max(v.StepJitter, n.StepJitter)
	if n.StallProb > 0 {
		v.StallProb, v.StallMean = n.StallProb, n.StallMean
	}
	if n.PrefillNoise > 0 {
		v.PrefillNoise = n.PrefillNoise
	}
	return v
}
