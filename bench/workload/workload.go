// Package workload describes the request streams the routing benchmark
// replays: one immutable slice of Requests per seed, shared read-only by
// every policy so that policies are compared on exactly the same arrivals.
package workload

import (
	"encoding/binary"
	"math"
	"math/rand/v2"
	"time"

	"github.com/cespare/xxhash/v2"
)

// BlockSize is the prefix-cache block size in tokens (vLLM's default, and
// the engine's). Hashes are computed per full block only.
const BlockSize = 16

// Request is one request of a stream.
type Request struct {
	ID           uint64
	Arrival      time.Duration // since the start of the run
	PromptTokens int
	OutputTokens int
	// BlockHashes are chained hashes of the prompt's full 16-token blocks:
	// two prompts share a cached prefix exactly as far as their hashes agree.
	BlockHashes []uint64
	Adapter     string // LoRA adapter, "" for the base model
	Sheddable   bool   // may be shed under saturation
	Priority    int    // Tier 1 priority: > 0 critical, < 0 sheddable
	Session     int    // conversation id, -1 when not part of one
}

// Stream is a request stream sorted by arrival.
type Stream struct {
	Requests []Request
	Duration time.Duration // arrivals span [0, Duration)
}

// Mix folds v into the running hash h with xxhash64 over their 16 bytes; it
// makes block hashes chained: a block's hash depends on every block before
// it. (A cheap arithmetic mix collided on the Azure trace.)
func Mix(h, v uint64) uint64 {
	var b [16]byte
	binary.LittleEndian.PutUint64(b[:8], h)
	binary.LittleEndian.PutUint64(b[8:], v)
	return xxhash.Sum64(b[:])
}

// Chain returns the chained hashes of blocks whose contents are identified by
// content[i]. Equal content sequences give equal hash prefixes.
func Chain(content []uint64) []uint64 {
	out := make([]uint64, len(content))
	var h uint64 = 0x6a09e667f3bcc908 // arbitrary non-zero seed
	for i, c := range content {
		h = Mix(h, c)
		out[i] = h
	}
	return out
}

// Segment is a run of prompt tokens with a content identity: segments with
// the same Key hold the same tokens, so they hash alike when they sit at the
// same position after the same predecessors.
type Segment struct {
	Key    uint64
	Tokens int
}

// HashSegments returns the chained hashes of the full blocks of a prompt made
// of segs in order. A block's content is every (segment, offset) piece it
// covers, so blocks straddling a segment boundary differ when either side
// differs.
func HashSegments(segs []Segment) []uint64 {
	total := 0
	for _, s := range segs {
		total += s.Tokens
	}
	content := make([]uint64, total/BlockSize)
	si, segStart := 0, 0
	for b := range content {
		lo, hi := b*BlockSize, (b+1)*BlockSize
		var c uint64
		for i, start := si, segStart; i < len(segs) && start < hi; i++ {
			end := start + segs[i].Tokens
			if end > lo {
				c = Mix(c, Mix(segs[i].Key, uint64(max(lo, start)-start)))
			}
			start = end
		}
		content[b] = c
		// Advance past segments that end at or before the next block.
		for si < len(segs) && segStart+segs[si].Tokens <= hi {
			segStart += segs[si].Tokens
			si++
		}
	}
	return Chain(content)
}

// LogNormal draws lengths from a lognormal distribution given its median and
// the ratio p90/median, clamped to [Min, Max].
type LogNormal struct {
	Median   float64
	P90Ratio float64 // p90 / median; 1 means constant
	Min, Max int
}

// Draw returns one length.
func (d LogNormal) Draw(r *rand.Rand) int {
	sigma := 0.0
	if d.P90Ratio > 1 {
		sigma = math.Log(d.P90Ratio) / 1.2815515655446004 // z(0.9)
	}
	v := d.Median * math.Exp(sigma*r.NormFloat64())
	n := int(math.Round(v))
	if d.Min > 0 && n < d.Min {
		n = d.Min
	}
	if d.Max > 0 && n > d.Max {
		n = d.Max
	}
	if n < 1 {
		n = 1
	}
	return n
}

// Arrivals generates arrival times in [0, dur).
type Arrivals interface {
	Times(r *rand.Rand, dur time.Duration) []time.Duration
}

// Poisson is a constant-rate Poisson process.
type Poisson struct{ Rate float64 } // requests per second

// Times implements Arrivals.
func (p Poisson) Times(r *rand.Rand, dur time.Duration) []time.Duration {
	return poissonBetween(r, nil, p.Rate, 0, dur)
}

func poissonBetween(r *rand.Rand, out []time.Duration, rate float64, from, to time.Duration) []time.Duration {
	if rate <= 0 {
		return out
	}
	t := from.Seconds()
	for {
		t += r.ExpFloat64() / rate
		d := time.Duration(t * float64(time.Second))
		if d >= to {
			return out
		}
		out = append(out, d)
	}
}

// OnOff is a bursty process: Poisson at OnRate for On, then at OffRate for
// Off, repeating. The first burst starts after a random phase so seeds
// differ in where bursts fall.
type OnOff struct {
	OnRate, OffRate float64
	On, Off         time.Duration
}

// Times implements Arrivals.
func (p OnOff) Times(r *rand.Rand, dur time.Duration) []time.Duration {
	period := p.On + p.Off
	if period <= 0 {
		return Poisson{Rate: p.OnRate}.Times(r, dur)
	}
	var out []time.Duration
	start := -time.Duration(r.Float64() * float64(period))
	for t := start; t < dur; t += period {
		onEnd := t + p.On
		out = poissonBetween(r, out, p.OnRate, max(t, 0), min(onEnd, dur))
		if onEnd < dur {
			out = poissonBetween(r, out, p.OffRate, max(onEnd, 0), min(t+period, dur))
		}
	}
	return out
}

// MeanRate is the long-run mean arrival rate.
func (p OnOff) MeanRate() float64 {
	period := (p.On + p.Off).Seconds()
	if period <= 0 {
		return p.OnRate
	}
	return (p.OnRate*p.On.Seconds() + p.OffRate*p.Off.Seconds()) / period
}

// Zipf draws indices in [0,n) with P(i) ∝ 1/(i+1)^s. It precomputes the CDF,
// so drawing is a binary search.
type Zipf struct{ cdf []float64 }

// NewZipf returns a Zipf sampler over n items with exponent s.
func NewZipf(n int, s float64) *Zipf {
	cdf := make([]float64, n)
	sum := 0.0
	for i := range n {
		sum += 1 / math.Pow(float64(i+1), s)
		cdf[i] = sum
	}
	for i := range cdf {
		cdf[i] /= sum
	}
	return &Zipf{cdf: cdf}
}

// Draw returns an index.
func (z *Zipf) Draw(r *rand.Rand) int {
	u := r.Float64()
	lo, hi := 0, len(z.cdf)-1
	for lo < hi {
		m := (lo + hi) / 2
		if z.cdf[m] < u {
			lo = m + 1
		} else {
			hi = m
		}
	}
	return lo
}

// Stats summarises a stream, for documentation and sanity checks.
type Stats struct {
	Requests               int
	Rate                   float64 // requests per second
	MeanPrompt, MeanOutput float64
	PromptTokensPerSec     float64
	OutputTokensPerSec     float64
	RepeatedBlockFraction  float64 // blocks whose hash was seen in an earlier request
}

// Summarize computes Stats for s.
func Summarize(s Stream) Stats {
	var st Stats
	st.Requests = len(s.Requests)
	if st.Requests == 0 {
		return st
	}
	seen := make(map[uint64]struct{})
	var p, o, blocks, rep int
	for _, r := range s.Requests {
		p += r.PromptTokens
		o += r.OutputTokens
		for _, h := range r.BlockHashes {
			blocks++
			if _, ok := seen[h]; ok {
				rep++
			}
		}
		for _, h := range r.BlockHashes {
			seen[h] = struct{}{}
		}
	}
	sec := s.Duration.Seconds()
	if sec > 0 {
		st.Rate = float64(st.Requests) / sec
		st.PromptTokensPerSec = float64(p) / sec
		st.OutputTokensPerSec = float64(o) / sec
	}
	st.MeanPrompt = float64(p) / float64(st.Requests)
	st.MeanOutput = float64(o) / float64(st.Requests)
	if blocks > 0 {
		st.RepeatedBlockFraction = float64(rep) / float64(blocks)
	}
	return st
}
