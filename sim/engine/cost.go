package engine

import (
	"cmp"
	"fmt"
	"math"
	"time"
)

const gib = 1 << 30

// resolve fills defaults and derives KV capacity; it returns the resolved
// config, the number of KV blocks and the max model length.
func resolve(cfg Config) (Config, int, int, error) {
	m, g := cfg.Model, cfg.GPU
	if m.Name == "" || m.Layers <= 0 || m.Params <= 0 {
		return cfg, 0, 0, fmt.Errorf("%w: Model not set (use profile.Model)", ErrInvalidConfig)
	}
	if g.Name == "" || g.MemoryBytes <= 0 || g.BF16FLOPS <= 0 || g.MemBandwidth <= 0 {
		return cfg, 0, 0, fmt.Errorf("%w: GPU not set (use profile.GPU)", ErrInvalidConfig)
	}
	if cfg.TensorParallel == 0 {
		cfg.TensorParallel = 1
	}
	tp := cfg.TensorParallel
	if tp < 0 || m.Heads%tp != 0 {
		return cfg, 0, 0, fmt.Errorf("%w: tensor parallel size %d must divide %s's %d attention heads", ErrInvalidConfig, tp, m.Name, m.Heads)
	}
	if cfg.MaxNumSeqs == 0 {
		cfg.MaxNumSeqs = DefaultMaxNumSeqs
	}
	if cfg.MaxBatchedTokens == 0 {
		cfg.MaxBatchedTokens = DefaultMaxBatchedTokens
		// vLLM's EngineArgs.get_batch_defaults: ≥70 GiB and not an A100
		// (PR #17885 found the larger budget slower there).
		if g.MemoryBytes < 70*gib || g.Name == "a100" {
			cfg.MaxBatchedTokens = DefaultMaxBatchedTokensSmallGPU
		}
	}
	if cfg.MaxNumSeqs < 1 || cfg.MaxBatchedTokens < cfg.MaxNumSeqs {
		return cfg, 0, 0, fmt.Errorf("%w: MaxBatchedTokens (%d) must be ≥ MaxNumSeqs (%d) ≥ 1", ErrInvalidConfig, cfg.MaxBatchedTokens, cfg.MaxNumSeqs)
	}
	if cfg.MaxLoras == 0 {
		cfg.MaxLoras = DefaultMaxLoras
	}
	if cfg.MaxLoras < 0 {
		return cfg, 0, 0, fmt.Errorf("%w: MaxLoras %d < 0", ErrInvalidConfig, cfg.MaxLoras)
	}
	if cfg.LoRALoadTime == 0 {
		cfg.LoRALoadTime = DefaultLoRALoadTime
	}
	if cfg.GPUMemoryUtilization == 0 {
		cfg.GPUMemoryUtilization = DefaultGPUMemoryUtilization
	}
	if cfg.GPUMemoryUtilization <= 0 || cfg.GPUMemoryUtilization > 1 {
		return cfg, 0, 0, fmt.Errorf("%w: GPUMemoryUtilization %.2f not in (0,1]", ErrInvalidConfig, cfg.GPUMemoryUtilization)
	}
	if cfg.ActivationReserveBytes == 0 {
		cfg.ActivationReserveBytes = gib + 16<<10*int64(cfg.MaxBatchedTokens)
	}
	// A calibrated GPU brings its own efficiencies; an explicit Config
	// value still wins.
	if cfg.MFU == 0 {
		cfg.MFU = cmp.Or(g.PrefillMFU, DefaultMFU)
	}
	if cfg.BandwidthEfficiency == 0 {
		cfg.BandwidthEfficiency = cmp.Or(g.DecodeBWEfficiency, DefaultBandwidthEfficiency)
	}
	if cfg.MFUHalfTokens == 0 {
		cfg.MFUHalfTokens = g.PrefillHalfTokens
	}
	if cfg.MFU < 0 || cfg.MFU > 1 || cfg.BandwidthEfficiency < 0 || cfg.BandwidthEfficiency > 1 {
		return cfg, 0, 0, fmt.Errorf("%w: MFU %.2f and BandwidthEfficiency %.2f must be in (0,1]", ErrInvalidConfig, cfg.MFU, cfg.BandwidthEfficiency)
	}
	if cfg.StepOverhead == 0 {
		cfg.StepOverhead = DefaultStepOverhead
	}
	if cfg.PerSeqOverhead == 0 {
		cfg.PerSeqOverhead = DefaultPerSeqOverhead
	}
	if cfg.SpeedFactor == 0 {
		cfg.SpeedFactor = 1
	}
	if cfg.SpeedFactor < 0 || cfg.StepJitter < 0 || cfg.StepJitter > 1 {
		return cfg, 0, 0, fmt.Errorf("%w: SpeedFactor %.3f must be > 0 and StepJitter %.3f in [0,1]", ErrInvalidConfig, cfg.SpeedFactor, cfg.StepJitter)
	}

	perGPUWeights := m.WeightBytes() / float64(tp)
	budget := float64(g.MemoryBytes)*cfg.GPUMemoryUtilization - float64(cfg.ActivationReserveBytes)
	kvBytes := budget - perGPUWeights
	numBlocks := cfg.NumBlocks
	if numBlocks == 0 {
		if kvBytes <= 0 {
			return cfg, 0, 0, fmt.Errorf("%w: %s needs %.1f GB of weights, %.1f GB per GPU at TP=%d, but each %s offers %.1f GB (%.2f × %.1f GB minus %.1f GB reserve)",
				ErrInvalidConfig, m.Name, m.WeightBytes()/1e9, perGPUWeights/1e9, tp, g.Name, budget/1e9,
				cfg.GPUMemoryUtilization, float64(g.MemoryBytes)/1e9, float64(cfg.ActivationReserveBytes)/1e9)
		}
		numBlocks = int(kvBytes / float64(kvBytesPerTokenPerGPU(cfg)*BlockSize))
	}
	if numBlocks < 1 {
		return cfg, 0, 0, fmt.Errorf("%w: %s on %d×%s leaves no KV-cache blocks", ErrInvalidConfig, m.Name, tp, g.Name)
	}
	capTokens := numBlocks * BlockSize
	maxLen := cfg.MaxModelLen
	switch {
	case maxLen == 0:
		maxLen = min(m.MaxContext, capTokens)
	case maxLen < 0 || maxLen > m.MaxContext:
		return cfg, 0, 0, fmt.Errorf("%w: MaxModelLen %d not in [1, %d] for %s", ErrInvalidConfig, maxLen, m.MaxContext, m.Name)
	case maxLen > capTokens:
		// vLLM refuses to start in this case too.
		return cfg, 0, 0, fmt.Errorf("%w: MaxModelLen %d exceeds the KV cache's %d tokens (%d blocks)", ErrInvalidConfig, maxLen, capTokens, numBlocks)
	}
	cfg.MaxModelLen = maxLen
	cfg.NumBlocks = numBlocks
	return cfg, numBlocks, maxLen, nil
}

// mix64 is SplitMix64's finaliser: a bijective scramble of x.
func mix64(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}

// unit maps x to [0, 1) using its top 53 bits.
func unit(x uint64) float64 { return float64(x>>11) / (1 << 53) }

// stepFactor is the duration multiplier of step number i: the pod's speed
// factor times a mean-one lognormal jitter exp(σZ − σ²/2), Z drawn by
// Box–Muller from (seed, i) alone.
func stepFactor(speed, sigma float64, seed uint64, i int64) float64 {
	if sigma <= 0 {
		return speed
	}
	h := mix64(seed ^ mix64(uint64(i)))
	u1 := 1 - unit(h) // (0, 1]
	u2 := unit(mix64(h))
	z := math.Sqrt(-2*math.Log(u1)) * math.Cos(2*math.Pi*u2)
	return speed * math.Exp(sigma*z-sigma*sigma/2)
}

// kvBytesPerTokenPerGPU splits the KV heads over TP; with fewer KV heads
// than GPUs each GPU keeps a replica of one head, as vLLM.
func kvBytesPerTokenPerGPU(cfg Config) int64 {
	m := cfg.Model
	heads := max(1, m.KVHeads/cfg.TensorParallel)
	return int64(2 * m.Layers * heads * m.HeadDim * 2)
}

// costModel turns a step's batch aggregates into a duration. All figures
// are per GPU; see docs/simulator.md.
type costModel struct {
	flopsPerToken  float64 // 2 × active params / TP
	attnFlopsCoef  float64 // per (query, key) pair per GPU: 4 × layers × heads/TP × head_dim
	flops          float64 // effective FLOP/s per GPU of a large step
	halfTokens     float64 // step size at which efficiency is half of flops's (0: flat)
	bw             float64 // effective bytes/s per GPU
	denseBytes     float64 // non-expert weights per GPU
	expertBytes    float64 // expert weights per GPU
	expertMissProb float64 // 1 - k/E: chance one token leaves an expert untouched
	kvPerToken     float64 // KV bytes per token per GPU
	commPerToken   float64 // all-reduce seconds per token per step (TP > 1)
	commFixed      float64 // all-reduce latency per step
	overhead       float64
	perSeq         float64
}

func newCostModel(cfg Config) costModel {
	m, g, tp := cfg.Model, cfg.GPU, float64(cfg.TensorParallel)
	c := costModel{
		flopsPerToken: 2 * m.ActiveParams / tp,
		attnFlopsCoef: 4 * float64(m.Layers) * float64(m.Heads) / tp * float64(m.HeadDim),
		flops:         g.BF16FLOPS * cfg.MFU,
		halfTokens:    max(cfg.MFUHalfTokens, 0),
		bw:            g.MemBandwidth * cfg.BandwidthEfficiency,
		denseBytes:    (m.Params - m.ExpertParams) * m.BytesPerParam / tp,
		expertBytes:   m.ExpertParams * m.BytesPerParam / tp,
		kvPerToken:    float64(kvBytesPerTokenPerGPU(cfg)),
		overhead:      cfg.StepOverhead.Seconds(),
		perSeq:        cfg.PerSeqOverhead.Seconds(),
	}
	if m.NumExperts > 0 {
		c.expertMissProb = 1 - float64(m.ExpertsPerToken)/float64(m.NumExperts)
	}
	if cfg.TensorParallel > 1 && g.LinkBandwidth > 0 {
		// Two all-reduces per layer (after attention and after the MLP) of
		// hidden × 2 bytes per token; a ring moves 2(TP-1)/TP of it.
		perLayer := 2 * (tp - 1) / tp * float64(m.Hidden) * 2 / g.LinkBandwidth
		c.commPerToken = 2 * float64(m.Layers) * perLayer
		c.commFixed = 2 * float64(m.Layers) * g.LinkLatencySeconds
	}
	return c
}

// step returns the duration of a step computing tokens new tokens for seqs
// requests, reading ctx tokens of KV (Σ computed+new over the batch) with
// attnPairs (query, key) pairs of attention.
func (c *costModel) step(tokens, seqs int, ctx, attnPairs float64) time.Duration {
	t := float64(tokens)
	compute := (c.flopsPerToken*t + c.attnFlopsCoef*attnPairs) / c.flops
	if c.halfTokens > 0 && t > 0 {
		// Efficiency MFU × t/(t + half): small steps fill the GPU's
		// tensor cores less (fitted on an H200, docs/simulator.md).
		compute *= 1 + c.halfTokens/t
	}
	weights := c.denseBytes
	if c.expertBytes > 0 {
		// Fraction of experts touched by t tokens with top-k routing.
		weights += c.expertBytes * (1 - math.Pow(c.expertMissProb, t))
	}
	memory := (weights + c.kvPerToken*ctx) / c.bw
	sec := max(compute, memory) + c.overhead + c.perSeq*float64(seqs)
	if c.commPerToken > 0 {
		sec += c.commFixed + c.commPerToken*t
	}
	d := time.Duration(sec * 1e9)
	if d < time.Microsecond {
		d = time.Microsecond
	}
	return d
}
