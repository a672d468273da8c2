package engine

import (
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/infergate/infergate/sim/profile"
)

type closedLoopResult struct {
	ttft, tpot time.Duration // means
	outTokPerS float64
}

// closedLoop runs conc clients, each sending n requests of in/out tokens
// back to back (vllm bench serve --max-concurrency conc, --ignore-eos).
func closedLoop(t testing.TB, cfg Config, conc, in, out, n int) closedLoopResult {
	t.Helper()
	e := mustEngine(t, cfg)
	l := NewLoop()
	l.Add(e)
	var id uint64
	var sumTTFT, sumTPOT time.Duration
	var done, tokens int
	var end time.Duration
	var send func(now time.Duration, left int)
	send = func(now time.Duration, left int) {
		id++
		start := now
		var first time.Duration
		r := &Request{ID: id, PromptTokens: in, MaxTokens: out,
			OnFirstToken: func(at time.Duration) { first = at },
			OnDone: func(at time.Duration, res Result) {
				sumTTFT += first - start
				sumTPOT += (at - first) / time.Duration(max(1, res.CompletionTokens-1))
				done++
				tokens += res.CompletionTokens
				end = at
				if left > 1 {
					l.At(at, func(now time.Duration) { send(now, left-1) })
				}
			}}
		if err := e.Submit(now, r); err != nil {
			t.Fatal(err)
		}
	}
	for range conc {
		l.At(0, func(now time.Duration) { send(now, n) })
	}
	l.Run(time.Hour)
	return closedLoopResult{
		ttft:       sumTTFT / time.Duration(done),
		tpot:       sumTPOT / time.Duration(done),
		outTokPerS: float64(tokens) / end.Seconds(),
	}
}

// a100_40 is the A100 SXM 40GB (1,555 GB/s) used by one public run below.
func a100_40(t testing.TB) profile.GPUSpec {
	g, err := profile.GPU("a100")
	if err != nil {
		t.Fatal(err)
	}
	g.Name, g.MemoryBytes, g.MemBandwidth = "a100-40gb", 40536<<20, 1.555e12
	return g
}

// TestCalibrationAgainstPublishedRuns compares the cost model with public
// vLLM measurements (sources in docs/simulator.md). Tolerances are wide on
// purpose: the runs used other vLLM versions and include HTTP overheads.
func TestCalibrationAgainstPublishedRuns(t *testing.T) {
	h100 := mustConfig(t, "llama-3.1-8b", "h100", 1)
	a100 := mustConfig(t, "llama-3.1-8b", "h100", 1)
	a100.GPU = a100_40(t)
	a100.MaxBatchedTokens = DefaultMaxBatchedTokensSmallGPU

	// Single stream: yobitelcomm InferenceBench, H100 80GB, vLLM 0.21,
	// TPOT p50 6.48 ms at concurrency 1; johnmusgrave.com, A100 40GB,
	// vLLM 0.23, ~75 tok/s (13.3 ms) at concurrency 1, 1024 in / 128 out.
	tests := []struct {
		name     string
		cfg      Config
		wantTPOT time.Duration
	}{
		{"h100 c1", h100, 6480 * time.Microsecond},
		{"a100-40 c1", a100, 13300 * time.Microsecond},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := closedLoop(t, tt.cfg, 1, 1024, 128, 5)
			t.Logf("TTFT %v TPOT %v (published %v) %.0f tok/s", r.ttft, r.tpot, tt.wantTPOT, r.outTokPerS)
			if lo, hi := tt.wantTPOT*8/10, tt.wantTPOT*12/10; r.tpot < lo || r.tpot > hi {
				t.Errorf("TPOT %v outside ±20%% of published %v", r.tpot, tt.wantTPOT)
			}
		})
	}
	// Batching: same A100 run, concurrency 8 gave 6.6× the concurrency-1
	// throughput "with almost no latency cost".
	t.Run("a100-40 c8 scaling", func(t *testing.T) {
		c1 := closedLoop(t, a100, 1, 1024, 128, 5)
		c8 := closedLoop(t, a100, 8, 1024, 128, 5)
		ratio := c8.outTokPerS / c1.outTokPerS
		t.Logf("c1 %.0f tok/s, c8 %.0f tok/s: ×%.2f (published ×6.6); TPOT %v → %v", c1.outTokPerS, c8.outTokPerS, ratio, c1.tpot, c8.tpot)
		if ratio < 5 || ratio > 8 {
			t.Errorf("c8/c1 throughput ×%.2f, published ×6.6", ratio)
		}
	})
}

// TestCalibrationTable logs the model's figures for docs/simulator.md
// (go test -run CalibrationTable -v ./sim/engine/).
func TestCalibrationTable(t *testing.T) {
	cases := []struct {
		model, gpu string
		tp         int
	}{
		{"llama-3.1-8b", "h100", 1},
		{"llama-3.1-8b", "a100", 1},
		{"llama-3.1-8b", "l40s", 1},
		{"llama-3.1-8b", "a10g", 1},
		{"llama-3.1-8b", "l4", 1},
		{"qwen3-32b", "h100", 1},
		{"qwen3-32b", "a10g", 4},
		{"llama-3.1-70b", "h100", 4},
		{"llama-3.1-70b", "a100", 4},
		{"qwen3-235b-a22b", "h100", 8},
		{"qwen3-235b-a22b", "h200", 4},
	}
	for _, c := range cases {
		cfg := mustConfig(t, c.model, c.gpu, c.tp)
		e := mustEngine(t, cfg)
		rc := e.Config()
		one := closedLoop(t, cfg, 1, 1024, 128, 3)
		long := closedLoop(t, cfg, 1, 8000, 2, 1)
		sat := closedLoop(t, cfg, 256, 1024, 128, 4)
		t.Logf("%-16s %d×%-5s blocks %7d maxlen %6d batched %5d | c1 TTFT(1k) %7.1fms TPOT %6.2fms | TTFT(8k) %7.1fms | c256 %6.0f out tok/s TPOT %6.1fms",
			c.model, c.tp, c.gpu, rc.NumBlocks, rc.MaxModelLen, rc.MaxBatchedTokens,
			ms(one.ttft), ms(one.tpot), ms(long.ttft), sat.outTokPerS, ms(sat.tpot))
	}
}

func ms(d time.Duration) float64 { return float64(d) / 1e6 }

// TestGPUCalibration pins each GPU profile's speed to a published figure
// (sources and how each was read in docs/simulator.md). Tolerances are
// stated per row; published runs include HTTP and tokenisation time the
// engine does not model.
func TestGPUCalibration(t *testing.T) {
	ttft := func(gpu string, in int) time.Duration {
		return closedLoop(t, mustConfig(t, "llama-3.1-8b", gpu, 1), 1, in, 2, 3).ttft
	}
	sat := func(gpu string) float64 {
		return closedLoop(t, mustConfig(t, "llama-3.1-8b", gpu, 1), 256, 1024, 128, 4).outTokPerS
	}
	t.Run("a100 prefill 500 tokens", func(t *testing.T) {
		// NVIDIA NIM (Llama-3.1 architecture 8B, A100 80GB SXM, BF16):
		// 48.3 ms TTFT at concurrency 1 for 500 input tokens.
		got, want := ttft("a100", 500), 48300*time.Microsecond
		t.Logf("TTFT %v, published %v (%.0f prompt tok/s)", got, want, 500/got.Seconds())
		if got < want*85/100 || got > want*115/100 {
			t.Errorf("TTFT %v outside ±15%% of %v", got, want)
		}
	})
	ratio := func(name, a, b string, want, tol float64) {
		t.Run(name, func(t *testing.T) {
			ra, rb := sat(a), sat(b)
			r := ra / rb
			t.Logf("%s %.0f, %s %.0f output tok/s: ×%.2f (published ×%.2f)", a, ra, b, rb, r, want)
			if math.Abs(r/want-1) > tol {
				t.Errorf("%s/%s throughput ×%.2f, published ×%.2f ± %.0f%%", a, b, r, want, tol*100)
			}
		})
	}
	// MLPerf Inference v5.1, Red Hat, vLLM 0.10, Llama-3.1-8B offline:
	// 5777 tok/s on one H100, 1642 on one L40S. The L40S's MFU is derived
	// from this ratio against the H100's (itself measured on an H200).
	ratio("h100 vs l40s (MLPerf v5.1)", "h100", "l40s", 5777.0/1642, 0.10)
	// Lambda's vLLM benchmark says an H100 gives "~2x" an A100's
	// throughput, a rounded headline over models from 7B to 405B on vLLM
	// 0.6. Both GPUs are now pinned by direct measurements (the A100 by
	// NIM's TTFT above, the H100 by the H200 run), which put the ratio
	// near 2.9 for this workload; docs/simulator.md states the
	// disagreement. What must hold is physics: the ratio lies between the
	// two GPUs' bandwidth ratio (all decode) and their peak ratio (all
	// prefill).
	t.Run("h100 vs a100 within the bandwidth and peak ratios", func(t *testing.T) {
		h, a := sat("h100"), sat("a100")
		hg, _ := profile.GPU("h100")
		ag, _ := profile.GPU("a100")
		lo, hi := hg.MemBandwidth/ag.MemBandwidth, hg.BF16FLOPS/ag.BF16FLOPS
		t.Logf("h100 %.0f, a100 %.0f output tok/s: ×%.2f (bounds ×%.2f–×%.2f; Lambda says ~×2)", h, a, h/a, lo, hi)
		if r := h / a; r < lo || r > hi {
			t.Errorf("h100/a100 throughput ×%.2f outside [×%.2f, ×%.2f]", r, lo, hi)
		}
	})
}

// The H200 measurements (../shared/reference.md, "Prefill speed measured
// on a real H200"; docs/simulator.md#h200-calibration): PyTorch 2.11 SDPA
// through Hugging Face transformers, eager, random bf16 weights, batch 1,
// median of 5. Prefill is one forward pass over n tokens; decode is one
// hand-written step captured in a CUDA graph, batch b at context c.
var (
	h200Prefill = []struct {
		model  string
		tokens int
		ms     float64
	}{
		{"llama-3.1-8b", 512, 32.4}, {"llama-3.1-8b", 1024, 39.6}, {"llama-3.1-8b", 2048, 60.7},
		{"llama-3.1-8b", 4096, 121}, {"llama-3.1-8b", 8192, 254},
		{"qwen3-32b", 512, 76.0}, {"qwen3-32b", 2048, 244}, {"qwen3-32b", 8192, 1053},
	}
	h200Decode = []struct {
		model        string
		batch, ctx   int
		ms, fraction float64 // fraction: of 4.8 TB/s, as measured
	}{
		{"llama-3.1-8b", 1, 1024, 4.71, 0.67}, {"llama-3.1-8b", 1, 8192, 4.96, 0.68},
		{"llama-3.1-8b", 16, 2048, 5.85, 0.69}, {"llama-3.1-8b", 64, 2048, 8.87, 0.76},
		{"llama-3.1-8b", 128, 2048, 14.2, 0.72}, {"llama-3.1-8b", 256, 1024, 15.8, 0.65},
		{"qwen3-32b", 1, 1024, 17.9, 0.75}, {"qwen3-32b", 32, 2048, 22.1, 0.77},
		{"qwen3-32b", 64, 2048, 29.0, 0.71},
	}
)

// eagerLaunchFloor is what the measured eager forward pass pays and vLLM
// does not: Python launching ~40 kernels per decoder layer, about 1 ms
// per layer, overlapping with the GPU's work (a soft maximum of the two,
// exponent 4). Fitted with the profile; it explains why the measured MFU
// climbs from 0.24 at 512 tokens to 0.56 at 8,192 for the 8B shape while
// the 32B shape is already at 0.44 at 512 tokens: at the same n, the 32B
// model gives the GPU four times the work per launch.
func eagerLaunchFloor(gpu time.Duration, layers int) time.Duration {
	const perLayerMs, k = 1.04, 4.0
	g, c := ms(gpu), perLayerMs*float64(layers)
	return time.Duration(math.Pow(math.Pow(g, k)+math.Pow(c, k), 1/k) * 1e6)
}

// gpuOnly is an H200 pod without vLLM's CPU costs per step, to compare
// with GPU timings (a zero overhead would mean the default).
func gpuOnly(t testing.TB, model string) Config {
	cfg := mustConfig(t, model, "h200", 1)
	cfg.StepOverhead, cfg.PerSeqOverhead = time.Nanosecond, time.Nanosecond
	return cfg
}

// TestH200Calibration holds the H100/H200 profile to every measured
// point. Prefill: the simulated TTFT of a lone prompt on an idle pod (one
// engine step), plus the eager runtime's launch floor, within ±10% of the
// measured forward pass; without the floor it is never slower than the
// measurement (eager PyTorch bounds vLLM's speed from below) and within
// ±10% where the GPU, not the launches, sets the time (2,048 tokens and
// more). Decode: the cost model's step for the measured batch and
// context within ±10%.
func TestH200Calibration(t *testing.T) {
	for _, p := range h200Prefill {
		t.Run(fmt.Sprintf("prefill %s %d", p.model, p.tokens), func(t *testing.T) {
			cfg := gpuOnly(t, p.model)
			got := closedLoop(t, cfg, 1, p.tokens, 1, 1).ttft
			want := time.Duration(p.ms * 1e6)
			eager := eagerLaunchFloor(got, cfg.Model.Layers)
			t.Logf("simulated %v, + launch floor %v, measured %v (%+.1f%%)", got, eager, want, (float64(eager)/float64(want)-1)*100)
			if r := float64(eager) / float64(want); r < 0.9 || r > 1.1 {
				t.Errorf("simulated + launch floor %v outside ±10%% of measured %v", eager, want)
			}
			if got > want*105/100 {
				t.Errorf("simulated %v slower than the eager measurement %v", got, want)
			}
			if r := float64(got) / float64(want); p.tokens >= 2048 && (r < 0.9 || r > 1.1) {
				t.Errorf("simulated %v outside ±10%% of measured %v at a GPU-bound size", got, want)
			}
		})
	}
	for _, d := range h200Decode {
		t.Run(fmt.Sprintf("decode %s %d×%d", d.model, d.batch, d.ctx), func(t *testing.T) {
			cfg, _, _, err := resolve(gpuOnly(t, d.model))
			if err != nil {
				t.Fatal(err)
			}
			c := newCostModel(cfg)
			ctx := float64(d.batch) * float64(d.ctx)
			got := c.step(d.batch, d.batch, ctx, ctx)
			want := time.Duration(d.ms * 1e6)
			t.Logf("simulated %v, measured %v (%+.1f%%; measured %.2f of bandwidth)", got, want, (float64(got)/float64(want)-1)*100, d.fraction)
			if r := float64(got) / float64(want); r < 0.9 || r > 1.1 {
				t.Errorf("simulated step %v outside ±10%% of measured %v", got, want)
			}
		})
	}
}
