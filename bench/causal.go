package bench

import (
	"context"
	"fmt"
	"math"
	"sort"
	"time"

	"github.com/infergate/infergate/bench/scenario"
	"github.com/infergate/infergate/bench/workload"
	"github.com/infergate/infergate/sim/engine"
)

// CausalFloors returns each request's causal TTFT floor in milliseconds: a
// lower bound on its TTFT under any placement, tighter than Floors because
// a block is cached only once some request has computed it. Floors lets a
// request find every block of every earlier prompt cached, even when the
// earlier request that brings it arrived a moment before and is still
// prefilling it; no router can place a request on a pod that holds a
// block nobody has finished computing.
//
// The bound replays the stream in arrival order and keeps, for every block
// hash seen, the earliest time any pod could hold it: the arrival of a
// request that contains it, plus the time that request would need alone on
// the fastest pod type to compute its prompt up to that block, from what
// was available to it (sim/engine's cost model, one request at a time, as
// Floors). A request then either starts at once from the prefix already
// available somewhere, or waits for a longer prefix still being computed
// (tried at every 32 blocks and at the longest known prefix) and computes
// the rest; its bound is the cheaper choice, and never below its Floors
// value. Queueing, decode interference and other requests sharing the pod
// are ignored, which only lowers the bound.
func CausalFloors(ctx context.Context, f scenario.Fleet, stream workload.Stream, floors []float64, sp PodSpeeds) ([]float64, error) {
	if len(floors) != len(stream.Requests) {
		return nil, fmt.Errorf("causal floor: %d floors for %d requests", len(floors), len(stream.Requests))
	}
	c, err := newSoloCoster(f, sp)
	if err != nil {
		return nil, err
	}
	cf := causalFloor{reqs: stream.Requests, cost: c, blocks: map[uint64][]int32{}, memo: map[[3]int]float64{}}
	out := make([]float64, len(floors))
	for i := range stream.Requests {
		if i%256 == 0 && ctx.Err() != nil {
			return nil, ctx.Err()
		}
		out[i] = math.Max(cf.add(i), floors[i])
		if math.IsNaN(floors[i]) {
			out[i] = math.NaN()
		}
	}
	return out, nil
}

// causalWaitStep is the spacing, in blocks, of the partial prefixes a
// request may wait for.
const causalWaitStep = 32

type causalOpt struct {
	cached int           // blocks it starts with
	start  time.Duration // when it starts computing the rest
}

type causalFloor struct {
	reqs   []workload.Request
	cost   *soloCoster
	opts   [][]causalOpt      // per request
	blocks map[uint64][]int32 // block hash → requests that may compute it first
	memo   map[[3]int]float64 // (request, blocks, cached) → ms alone
}

// solo is request j's time alone to compute its first m blocks (or its
// whole prompt with m = -1) with its first c blocks cached, in ms.
func (cf *causalFloor) solo(j, m, c int) float64 {
	k := [3]int{j, m, c}
	if v, ok := cf.memo[k]; ok {
		return v
	}
	w := &cf.reqs[j]
	tokens, hashes := w.PromptTokens, w.BlockHashes
	if m >= 0 {
		tokens, hashes = m*workload.BlockSize, w.BlockHashes[:m]
	}
	v := cf.cost.time(hashes, tokens, c, w.Adapter)
	cf.memo[k] = v
	return v
}

// readyAt is the earliest time block number pos (0-based) of request i's
// prompt can be held by any pod.
func (cf *causalFloor) readyAt(i, pos int) time.Duration {
	best := time.Duration(math.MaxInt64)
	for _, j := range cf.blocks[cf.reqs[i].BlockHashes[pos]] {
		for _, o := range cf.opts[j] {
			if o.cached > pos {
				continue // it found that block, it did not compute it
			}
			t := o.start + time.Duration(cf.solo(int(j), pos+1, o.cached)*float64(time.Millisecond))
			best = min(best, t)
		}
	}
	return best
}

// add computes request i's bound and records it as a possible first
// computer of the blocks not yet available at its arrival.
func (cf *causalFloor) add(i int) float64 {
	w := &cf.reqs[i]
	n := len(w.BlockHashes)
	known := 0
	for known < n {
		if _, ok := cf.blocks[w.BlockHashes[known]]; !ok {
			break
		}
		known++
	}
	// avail: the longest prefix some pod could hold at arrival. Readiness
	// grows along the chain, so binary search.
	avail := sort.Search(known, func(m int) bool { return cf.readyAt(i, m) > w.Arrival })
	best := cf.solo(i, -1, avail)
	opts := []causalOpt{{cached: avail, start: w.Arrival}}
	try := func(c int) {
		start := max(cf.readyAt(i, c-1), w.Arrival)
		t := float64(start-w.Arrival)/float64(time.Millisecond) + cf.solo(i, -1, c)
		best = math.Min(best, t)
		opts = append(opts, causalOpt{cached: c, start: start})
	}
	for c := (avail/causalWaitStep + 1) * causalWaitStep; c < known; c += causalWaitStep {
		try(c)
	}
	if known > avail {
		try(known)
	}
	cf.opts = append(cf.opts, opts)
	for pos := avail; pos < n; pos++ {
		h := w.BlockHashes[pos]
		cf.blocks[h] = append(cf.blocks[h], int32(i))
	}
	return best
}

// soloCoster times one prompt alone on a fresh-looking engine of each pod
// type: every call salts its block hashes, so nothing cached by an earlier
// call is found.
type soloCoster struct {
	loops  []*engine.Loop
	engs   []*engine.Engine
	salt   uint64
	id     uint64
	hashes []uint64
}

func newSoloCoster(f scenario.Fleet, sp PodSpeeds) (*soloCoster, error) {
	s := &soloCoster{}
	for _, g := range podTypes(f) {
		cfg, err := engineConfig(f, g)
		if err != nil {
			return nil, fmt.Errorf("causal floor: %w", err)
		}
		cfg.MaxLoras = max(len(f.Adapters), 1)
		cfg.SpeedFactor = sp.fastest(f, g)
		e, err := engine.New(cfg)
		if err != nil {
			return nil, fmt.Errorf("causal floor: %s: %w", g.GPU, err)
		}
		l := engine.NewLoop()
		l.Add(e)
		s.loops, s.engs = append(s.loops, l), append(s.engs, e)
	}
	return s, nil
}

// time is the TTFT in ms of a prompt of tokens tokens with block hashes
// hashes, alone on the fastest pod type, its first cached blocks already
// in the cache (computed by an earlier request); +Inf if no type serves it.
func (s *soloCoster) time(hashes []uint64, tokens, cached int, adapter string) float64 {
	best := math.Inf(1)
	s.salt++
	salt := mixSalt(s.salt)
	s.hashes = s.hashes[:0]
	for _, h := range hashes {
		s.hashes = append(s.hashes, h^salt)
	}
	for k, e := range s.engs {
		l := s.loops[k]
		run := func(tokens int, hashes []uint64) (time.Duration, bool) {
			s.id++
			var ttft time.Duration
			ok := false
			start := l.Now() + time.Second
			l.At(start, func(now time.Duration) {
				err := e.Submit(now, &engine.Request{ID: s.id, Adapter: adapter, PromptTokens: tokens, BlockHashes: hashes, MaxTokens: 1,
					OnDone: func(_ time.Duration, res engine.Result) {
						ttft, ok = res.FirstTokenAt-start, res.Err == nil
					}})
				if err != nil {
					ok = false
				}
			})
			l.Run(start + time.Hour)
			return ttft, ok
		}
		if cached > 0 {
			if _, ok := run(cached*workload.BlockSize, s.hashes[:cached]); !ok {
				continue
			}
		}
		if d, ok := run(tokens, s.hashes); ok {
			best = math.Min(best, ms(d))
		}
	}
	return best
}

func mixSalt(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}
