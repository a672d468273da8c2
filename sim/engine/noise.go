package engine

import (
	"fmt"
	"math"
	"time"
)

// Engine noise beyond StepJitter (Config.StallProb, StallMean,
// PrefillNoise): what a router's estimates must survive on real engines,
// where step times have heavy tails (GC pauses, host preemption, a slow
// collective) and prompts of one length do not cost the same. Every draw
// is a pure function of JitterSeed and a step index or request ID, so a
// run stays deterministic and a coalesced run of decode steps costs what
// the same steps one by one would. All of it is off unless set.

// DefaultStallMean is Config.StallMean's default.
const DefaultStallMean = 20 * time.Millisecond

// stallShape is the Pareto shape of stall lengths: heavy-tailed (a stall
// of ten times the minimum has probability 10^-1.5 ≈ 3%) but with a
// finite mean.
const stallShape = 1.5

// withNoiseDefaults fills StallMean and checks the noise knobs.
func withNoiseDefaults(cfg Config) (Config, error) {
	if cfg.StallProb < 0 || cfg.StallProb > 1 || cfg.StallMean < 0 || cfg.PrefillNoise < 0 || cfg.PrefillNoise > 2 {
		return cfg, fmt.Errorf("%w: StallProb %.3f must be in [0,1], StallMean %v not negative and PrefillNoise %.3f in [0,2]",
			ErrInvalidConfig, cfg.StallProb, cfg.StallMean, cfg.PrefillNoise)
	}
	if cfg.StallProb > 0 && cfg.StallMean == 0 {
		cfg.StallMean = DefaultStallMean
	}
	return cfg, nil
}

// stall is the extra time step number i stalls for: with probability
// prob a Pareto(stallShape) length of mean mean, else 0.
func stall(prob float64, mean time.Duration, seed uint64, i int64) time.Duration {
	if prob <= 0 {
		return 0
	}
	h := mix64(seed ^ mix64(uint64(i)^0x5a11_5a11_5a11_5a11))
	if unit(h) >= prob {
		return 0
	}
	u := 1 - unit(mix64(h)) // (0, 1]
	xm := float64(mean) * (stallShape - 1) / stallShape
	// Inverse CDF; capped at 1,000× the minimum so a single draw cannot
	// stop a pod for the rest of a run.
	return time.Duration(xm * math.Min(math.Pow(u, -1/stallShape), 1000))
}

// prefillFactor is request id's prefill cost multiplier: a mean-one
// lognormal exp(σZ − σ²/2), Z from (seed, id) alone.
func prefillFactor(sigma float64, seed, id uint64) float64 {
	if sigma <= 0 {
		return 1
	}
	h := mix64(seed ^ mix64(id^0x9f3a_c0ff_ee00_1234))
	u1 := 1 - unit(h)
	u2 := unit(mix64(h))
	z := math.Sqrt(-2*math.Log(u1)) * math.Cos(2*math.Pi*u2)
	return math.Exp(sigma*z - sigma*sigma/2)
}

// noisyPrefill is the extra tokens' worth of compute that s's prompt
// tokens among the n scheduled this step cost under PrefillNoise (negative
// for a request cheaper than nominal); 0 when the noise is off.
func (e *Engine) noisyPrefill(s *seq, n int) float64 {
	if e.cfg.PrefillNoise <= 0 {
		return 0
	}
	p := min(n, s.prompt-s.computed)
	if p <= 0 {
		return 0
	}
	return (prefillFactor(e.cfg.PrefillNoise, e.cfg.JitterSeed, s.id) - 1) * float64(p)
}

// noisyTokens is tokens plus the step's prefill noise, at least 1.
func noisyTokens(tokens int, extra float64) int {
	if extra == 0 {
		return tokens
	}
	return max(1, tokens+int(math.Round(extra)))
}
