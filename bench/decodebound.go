package bench

import (
	"container/heap"
	"context"
	"fmt"
	"math"
	"sort"

	"github.com/infergate/infergate/bench/scenario"
	"github.com/infergate/infergate/bench/workload"
	"github.com/infergate/infergate/sim/engine"
)

// DecodeBoundP99 is QueueBoundP99 with decode counted: a request that
// reaches its first token keeps a seat in every step of its pod until its
// last output token, and each such seat takes prefill capacity away. The
// result is never below QueueBoundP99's and, like it, holds for every
// placement and every order of service, under the engine's step model:
//
// Per step (sim/engine: schedule and costModel.step, in the pod's nominal
// seconds; wall time is that times the pod's speed factor, jitter at its
// mean of one as QueueBoundP99 takes it), with p prefill tokens of prefill
// work W (QueueBoundP99's per-request work, summed over the step's
// chunks), d decoding requests and budget B ≥ p + d, the duration is at
// least over + perSeq·(seqs) + comm·(p+d) + perFlop·FLOPs(all tokens), and
// W is perFlop·FLOPs(prefill) + (comm + over/B)·p. So the step lasts at
// least W + δ·d, δ = over/B + perSeq + comm + perFlop·linear: each decode
// token holds a budget slot (its share over/B of the overhead), its own
// per-sequence cost, all-reduce and linear FLOPs (its attention is dropped,
// the safe side). No step lasts more than τmax (a full budget at the
// longest context the stream can reach, MaxNumSeqs such contexts of KV
// read, every LoRA slot loaded), so a step of wall length τ does at most
// τ·(1 − δ·d/τmax)/speed of prefill work: a decoding request costs its pod
// σ = δ/(speed·τmax) of prefill rate (reference units: times the pod
// type's ratio) for as long as it decodes. The fleet's σ is the smallest
// pod's, so wherever decoding requests sit the fleet loses at least σ per
// request. Steps that straddle the window's edges hold no prefill of the
// window's fast requests (an arrival waits for the step in flight; a first
// token comes at a step's end) and lose rate σ·d ≤ their whole rate
// (δ·d ≤ δ·MaxNumSeqs ≤ τmax since MaxNumSeqs ≤ B), so leaving them out
// of the loss only lowers the bound.
//
// Which requests surely decode inside a window [s, e+x]: a request of the
// window that is fast (TTFT < x) has its first token before a+x and, from
// then until its last token, is in every step of its pod: the engine
// schedules running requests first, one decode token each, and they come
// before the one request whose prefill is chunked (it took the rest of the
// budget when admitted, so nobody is admitted after it until it finishes
// its prefill) and there are at most MaxNumSeqs ≤ B of them. Its O−1 decode
// steps each last at least τmin (weights read once, overhead, one
// sequence), so it is still decoding until a + floor + (O−1)·τmin: it
// decodes throughout [a+x, min(e+x, a+floor+(O−1)·τmin)]. So the fast
// requests' work plus σ times those times fits in rate·(e−s+x); c slow
// requests take back at most the c largest works and the c largest
// times, which gives the fewest slow requests as in QueueBoundP99, never
// fewer than it finds. Earlier arrivals' decoding is left out (they may be
// slow). The argument assumes no preemption: a preempted request leaves
// the running set early. The engine preempts only when a pod's KV blocks
// run out; the runs checked (TestDecodeBoundCheck) report how often that
// happened.
//
// Why it adds little: a full step of B tokens holding d decoding requests
// loses about d/B of its prefill, and a schedule that keeps steps full
// (the engine does, under load) pays no more for decode than that; the
// weight read a decode step costs is hidden under a full step's compute.
func DecodeBoundP99(ctx context.Context, f scenario.Fleet, stream workload.Stream, causal []float64, seed uint64) (float64, error) {
	b, err := newFleetBound(ctx, "decode bound", f, stream, causal, seed)
	if err != nil {
		return 0, err
	}
	if b.dec, err = fleetDecodeCharge(f, stream, seed, engine.DefaultVariation().PodSpread, b.cap); err != nil {
		return 0, err
	}
	return b.p99(), nil
}

// decodeCharge is what a decoding request costs the window argument:
// sigma reference seconds of prefill work per second it decodes, and
// stepMin, the shortest wall time of any step on any pod.
type decodeCharge struct {
	sigma, stepMin float64
}

// running is how long past a+x a request with this floor (seconds) and
// output surely still decodes if its TTFT is below x.
func (d decodeCharge) running(floor float64, out int, x float64) float64 {
	if d.sigma == 0 || out <= 1 {
		return 0
	}
	return max(0, floor+float64(out-1)*d.stepMin-x)
}

// podDecodeCharge is one pod type's δ, τmax and τmin (nominal seconds) for
// requests of at most maxCtx tokens (prompt plus output).
func podDecodeCharge(cfg engine.Config, maxCtx int, adapters bool) (delta, tauMax, tauMin float64) {
	m, gpu, tp := cfg.Model, cfg.GPU, float64(max(cfg.TensorParallel, 1))
	t := stepTerms(cfg)
	bud := float64(cfg.MaxBatchedTokens)
	linear := 2 * m.ActiveParams
	attn := 4 * float64(m.Layers) * float64(m.Heads) * float64(m.HeadDim)
	perSeq := cfg.PerSeqOverhead.Seconds()
	delta = t.over/bud + perSeq + t.comm + t.perFlop*linear

	ctx := float64(min(maxCtx, cfg.MaxModelLen))
	bw := gpu.MemBandwidth * cfg.BandwidthEfficiency
	kvPerToken := 2 * float64(m.Layers) * float64(max(1, m.KVHeads/max(cfg.TensorParallel, 1))) * float64(m.HeadDim) * 2
	// A step's chunks attend to at most ctx keys per query token, and it
	// reads at most ctx tokens of KV per running request (not the pool's
	// size: requests sharing cached blocks each read them).
	compute := t.perFlop * (linear*bud + attn*bud*ctx)
	memory := (m.WeightBytes()/tp + kvPerToken*float64(cfg.MaxNumSeqs)*ctx) / bw
	tauMax = t.over + perSeq*float64(cfg.MaxNumSeqs) + t.comm*bud + math.Max(compute, memory)
	if adapters {
		tauMax += float64(cfg.MaxLoras) * cfg.LoRALoadTime.Seconds()
	}
	dense := (m.Params - m.ExpertParams) * m.BytesPerParam / tp / bw
	tauMin = t.over + perSeq + math.Max(t.perFlop*linear, dense)
	return delta, tauMax, tauMin
}

func fleetDecodeCharge(f scenario.Fleet, stream workload.Stream, seed uint64, spread float64, fc fleetCapacity) (decodeCharge, error) {
	f.SetDefaults()
	maxCtx := 0
	for i := range stream.Requests {
		w := &stream.Requests[i]
		maxCtx = max(maxCtx, w.PromptTokens+w.OutputTokens)
	}
	d := decodeCharge{sigma: math.Inf(1), stepMin: math.Inf(1)}
	pod := 0
	for _, g := range f.Pods {
		e, err := podEngine(f, g)
		if err != nil {
			return d, fmt.Errorf("decode bound: %w", err)
		}
		cfg := e.Config()
		delta, tauMax, tauMin := podDecodeCharge(cfg, maxCtx, len(f.Adapters) > 0)
		c := podPrefillCost(cfg)
		ratio := math.Max(fc.ref.perFlop/c.perFlop, fc.ref.perToken/c.perToken)
		for range g.Count {
			speed := engine.PodSpeedFactor(seed, pod, spread)
			d.sigma = math.Min(d.sigma, ratio*delta/(speed*tauMax))
			d.stepMin = math.Min(d.stepMin, speed*tauMin)
			pod++
		}
	}
	if pod == 0 {
		return d, fmt.Errorf("decode bound: empty fleet")
	}
	return d, nil
}

// decodeRun sums, over a window's requests so far, min(e − a, run): the
// time each decodes inside the window ending at the latest arrival e. It
// keeps those times sorted enough to give the c largest.
type decodeRun struct {
	last  float64
	open  endHeap   // the requests still decoding at last, by end
	arr   []float64 // their arrivals, ascending (their times are last − a)
	ended []float64 // times of the requests no longer decoding, ascending
	total float64
}

func (r *decodeRun) add(a, run float64) {
	r.total += float64(len(r.open)) * (a - r.last)
	for len(r.open) > 0 && r.open[0].end <= a {
		d := heap.Pop(&r.open).(decoding)
		r.total -= a - d.end
		// Requests that arrived together have the same time while open,
		// so any one of them may leave the list.
		k := sort.SearchFloat64s(r.arr, d.at)
		r.arr = append(r.arr[:k], r.arr[k+1:]...)
		ran := d.end - d.at
		p := sort.SearchFloat64s(r.ended, ran)
		r.ended = append(r.ended, 0)
		copy(r.ended[p+1:], r.ended[p:])
		r.ended[p] = ran
	}
	r.last = a
	if run > 0 {
		heap.Push(&r.open, decoding{at: a, end: a + run})
		r.arr = append(r.arr, a)
	}
}

// top returns an iterator over the decoding times, largest first, then
// zeros.
func (r *decodeRun) top() func() float64 {
	io, ie := 0, len(r.ended)-1
	return func() float64 {
		switch {
		case io < len(r.arr) && (ie < 0 || r.last-r.arr[io] >= r.ended[ie]):
			io++
			return r.last - r.arr[io-1]
		case ie >= 0:
			ie--
			return r.ended[ie+1]
		}
		return 0
	}
}

type decoding struct{ at, end float64 }

type endHeap []decoding

func (h endHeap) Len() int           { return len(h) }
func (h endHeap) Less(i, j int) bool { return h[i].end < h[j].end }
func (h endHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *endHeap) Push(x any)        { *h = append(*h, x.(decoding)) }
func (h *endHeap) Pop() any {
	old := *h
	v := old[len(old)-1]
	*h = old[:len(old)-1]
	return v
}
