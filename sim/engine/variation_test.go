package engine

import (
	"math"
	"slices"
	"testing"
	"time"
)

// With jitter and a speed factor on, coalescing stays exact (a truncated
// run recomputes the durations it planned) and runs stay deterministic.
func TestVariationCoalescingExactAndDeterministic(t *testing.T) {
	cfg := mustConfig(t, "llama-3.1-8b", "h100", 1)
	plain, _ := workload(t, cfg, 200, 9, 0)
	cfg = DefaultVariation().Apply(cfg, 5, 3)
	coalesced, ec := workload(t, cfg, 200, 9, 0)
	stepwise, _ := workload(t, cfg, 200, 9, time.Nanosecond)
	again, _ := workload(t, cfg, 200, 9, 0)
	if ec.coalesced == 0 {
		t.Fatal("no coalesced runs")
	}
	if !slices.Equal(coalesced, stepwise) {
		t.Fatal("coalesced and stepwise transcripts differ under jitter")
	}
	if !slices.Equal(coalesced, again) {
		t.Fatal("same seed gave different transcripts")
	}
	if slices.Equal(coalesced, plain) {
		t.Fatal("variation changed nothing")
	}
}

func TestStepFactorDistribution(t *testing.T) {
	const n = 200000
	var sum, sumSq float64
	for i := range int64(n) {
		f := stepFactor(1, 0.03, 11, i)
		sum += f
		sumSq += f * f
	}
	mean := sum / n
	sd := math.Sqrt(sumSq/n - mean*mean)
	if math.Abs(mean-1) > 0.002 || math.Abs(sd-0.03) > 0.003 {
		t.Errorf("jitter mean %.4f sd %.4f, want 1 and ≈0.03", mean, sd)
	}
	if stepFactor(1.02, 0, 11, 5) != 1.02 {
		t.Error("no jitter must leave the speed factor alone")
	}
}

func TestPodSpeedFactor(t *testing.T) {
	seen := map[float64]bool{}
	for pod := range 50 {
		f := PodSpeedFactor(7, pod, 0.03)
		if f < 0.97 || f > 1.03 {
			t.Fatalf("pod %d factor %v outside ±3%%", pod, f)
		}
		if f != PodSpeedFactor(7, pod, 0.03) {
			t.Fatal("not deterministic")
		}
		seen[f] = true
	}
	if len(seen) < 45 {
		t.Errorf("only %d distinct factors over 50 pods", len(seen))
	}
	if PodSpeedFactor(7, 1, 0) != 1 {
		t.Error("zero spread must give 1")
	}
	// Two runs (seeds) give a pod different factors.
	if PodSpeedFactor(7, 1, 0.03) == PodSpeedFactor(8, 1, 0.03) {
		t.Error("seed ignored")
	}
	// A slower pod takes longer for the same step.
	cfg := mustConfig(t, "llama-3.1-8b", "a10g", 1)
	fast, slow := cfg, cfg
	fast.SpeedFactor, slow.SpeedFactor = 0.97, 1.03
	a, b := closedLoop(t, fast, 1, 2000, 10, 1), closedLoop(t, slow, 1, 2000, 10, 1)
	if !(a.ttft < b.ttft) {
		t.Errorf("TTFT %v at 0.97 not below %v at 1.03", a.ttft, b.ttft)
	}
	bad := cfg
	bad.StepJitter = -1
	if _, err := New(bad); err == nil {
		t.Error("negative jitter accepted")
	}
}
