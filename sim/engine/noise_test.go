package engine

import (
	"errors"
	"math"
	"testing"
	"time"
)

// Stalls: about StallProb of steps stall, the mean stall is StallMean
// (Pareto 1.5, so the sample mean converges slowly: a loose bound), some
// stalls are several times the mean (the heavy tail), none exceed the
// cap, and the draws are a pure function of seed and step.
func TestStallDistribution(t *testing.T) {
	const n, prob, mean = 2_000_000, 0.01, 20 * time.Millisecond
	var k int
	var sum, longest time.Duration
	for i := range int64(n) {
		d := stall(prob, mean, 42, i)
		if d != stall(prob, mean, 42, i) {
			t.Fatal("stall is not deterministic")
		}
		if d > 0 {
			k++
			sum += d
			longest = max(longest, d)
		}
	}
	if f := float64(k) / n; math.Abs(f-prob) > 0.1*prob {
		t.Errorf("stalled %.4f of steps, want %.4f", f, prob)
	}
	m := sum / time.Duration(k)
	if m < mean*7/10 || m > mean*13/10 {
		t.Errorf("mean stall %v, want about %v", m, mean)
	}
	xm := float64(mean) / 3 // minimum: mean × (shape−1)/shape
	if longest < 5*mean || float64(longest) > 1000*xm*1.0001 {
		t.Errorf("longest stall %v, want a heavy tail beyond 5× the mean and within the cap %v", longest, time.Duration(1000*xm))
	}
	if stall(0, mean, 42, 1) != 0 {
		t.Error("StallProb 0 stalls")
	}
}

// The prefill factor is mean one, lognormal with the given σ, and fixed
// per (seed, request).
func TestPrefillFactor(t *testing.T) {
	const n, sigma = 200_000, 0.25
	var sum, sumLog, sumLog2 float64
	for id := range uint64(n) {
		f := prefillFactor(sigma, 7, id)
		if f != prefillFactor(sigma, 7, id) || !(f > 0) {
			t.Fatalf("factor %v for request %d: not positive or not deterministic", f, id)
		}
		sum += f
		l := math.Log(f)
		sumLog += l
		sumLog2 += l * l
	}
	if m := sum / n; math.Abs(m-1) > 0.01 {
		t.Errorf("mean factor %.4f, want 1", m)
	}
	ml := sumLog / n
	if sd := math.Sqrt(sumLog2/n - ml*ml); math.Abs(sd-sigma) > 0.01 {
		t.Errorf("σ of log factor %.4f, want %.2f", sd, sigma)
	}
	if prefillFactor(0, 7, 1) != 1 {
		t.Error("PrefillNoise 0 changes the cost")
	}
}

// Stalls in an engine: with a stall in 5% of steps of mean 20 ms, the
// mean time per output token rises by about 1 ms (a loose band: the
// Pareto sample mean converges slowly); runs stay deterministic; bad
// knobs are refused.
func TestNoiseInEngine(t *testing.T) {
	base := mustConfig(t, "llama-3.1-8b", "h100", 1)
	quiet := DefaultVariation().Apply(base, 3, 0)
	v := DefaultVariation()
	v.StallProb, v.StallMean = 0.05, 20*time.Millisecond
	noisy := v.Apply(base, 3, 0)
	q := closedLoop(t, quiet, 8, 1000, 100, 200)
	a := closedLoop(t, noisy, 8, 1000, 100, 200)
	b := closedLoop(t, noisy, 8, 1000, 100, 200)
	if a != b {
		t.Errorf("noisy runs differ: %+v vs %+v", a, b)
	}
	if d := a.tpot - q.tpot; d < 500*time.Microsecond || d > 2*time.Millisecond {
		t.Errorf("stalls moved TPOT %v → %v (%+v), want about +1 ms", q.tpot, a.tpot, d)
	}
	for _, bad := range []Config{{StallProb: -0.1}, {StallProb: 1.5}, {StallMean: -time.Millisecond}, {PrefillNoise: 3}} {
		cfg := base
		cfg.StallProb, cfg.StallMean, cfg.PrefillNoise = bad.StallProb, bad.StallMean, bad.PrefillNoise
		if _, err := New(cfg); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("New with %+v: %v, want ErrInvalidConfig", bad, err)
		}
	}
}
