package bench

import (
	"context"
	"fmt"
	"math"
	"sort"

	"github.com/infergate/infergate/bench/scenario"
	"github.com/infergate/infergate/bench/workload"
)

// KVBoundP99 returns, in milliseconds, a lower bound on the P99 TTFT
// under every placement and order that comes from the fleet's KV cache
// size: a conversation turn finds its history cached only if the blocks
// its previous turn computed stayed resident until it arrived, and the
// fleet cannot keep more blocks than it has.
//
// For a turn i with previous turn p of the same session (and no later
// turn arriving within x of it), take an instant t in [a_p + x, a_i]. If
// p is fast (TTFT < x) its prompt, which holds i's history, was in some
// pod's cache by a_p + x ≤ t. If i is fast it needs at least m_i(x) of
// its history blocks (the fewest with which its prefill alone on the
// fastest pod type takes less than x; blocks shared with other sessions
// are taken as free) in a cache when its prefill runs, after t. Only the
// session's own turns hold those blocks, so if they were not resident at
// t, some turn of the session up to i recomputed them after t, which
// makes it slow (t ≥ its arrival + x). So at t, either the m_i(x) blocks
// of every active turn are resident, or one turn of its session is slow:
// with Σ m_i(x) over the active turns above the fleet's blocks, at least
// the fewest (largest) turns covering the excess have a slow request in
// their session. Different instants count only sessions not yet used, so
// the slow requests are distinct; sessions with a turn whose floor is
// already ≥ x are left to that floor's count. The residency ignores the
// KV of running requests, shared prompts and copies on several pods,
// which only lowers the bound.
func KVBoundP99(ctx context.Context, f scenario.Fleet, stream workload.Stream, causal []float64, sp PodSpeeds) (float64, error) {
	kb, err := fleetKVBound(ctx, f, stream, causal, sp)
	if err != nil {
		return 0, err
	}
	return p99Bound(kb.floor, kb.slow), nil
}

// fleetKVBound prepares KVBoundP99's argument for a fleet: its KV blocks
// and each turn's prefill times alone on the fastest pod type.
func fleetKVBound(ctx context.Context, f scenario.Fleet, stream workload.Stream, causal []float64, sp PodSpeeds) (*kvBound, error) {
	if len(causal) != len(stream.Requests) {
		return nil, fmt.Errorf("kv bound: %d floors for %d requests", len(causal), len(stream.Requests))
	}
	f.SetDefaults()
	blocks := 0
	for _, g := range f.Pods {
		e, err := podEngine(f, g)
		if err != nil {
			return nil, fmt.Errorf("kv bound: %w", err)
		}
		blocks += e.Stats().NumBlocks * g.Count
	}
	c, err := newSoloCoster(f, sp)
	if err != nil {
		return nil, err
	}
	return newKVBound(ctx, stream, causal, blocks, func(i, cached int) float64 {
		w := &stream.Requests[i]
		return c.time(w.BlockHashes, w.PromptTokens, cached, w.Adapter) / 1000
	})
}

// kvTurn is one turn whose history another turn of its session computed.
type kvTurn struct {
	session    int
	from, to   float64   // a_p and a_i, seconds
	next       float64   // arrival of the session's next turn, +Inf if none
	groupFloor float64   // max floor over the session's turns up to i
	grid       []int     // history blocks kept, ascending, ending at all of it
	solo       []float64 // prefill time alone with grid[k] of them, seconds
}

// need is the fewest history blocks the turn must find for a TTFT below
// x: one more than the largest grid point still too slow, 0 if
// recomputing it all is fast enough.
func (t *kvTurn) need(x float64) int {
	if t.solo[0] < x {
		return 0
	}
	k := sort.Search(len(t.solo), func(k int) bool { return t.solo[k] < x }) - 1
	if k == len(t.solo)-1 {
		return t.grid[k] // never fast enough: all of it, as a floor
	}
	return t.grid[k] + 1
}

type kvBound struct {
	floor  []float64 // seconds; NaN left out
	turns  []kvTurn
	blocks int
}

// kvGridPoints is how many history lengths each turn's prefill is timed
// at.
const kvGridPoints = 16

func newKVBound(ctx context.Context, stream workload.Stream, causal []float64, blocks int, solo func(i, cached int) float64) (*kvBound, error) {
	reqs := stream.Requests
	kb := &kvBound{blocks: blocks}
	for _, v := range causal {
		kb.floor = append(kb.floor, v/1000)
	}
	// owner[h]: the session whose requests alone hold block h, or -2.
	owner := map[uint64]int{}
	for i := range reqs {
		for _, h := range reqs[i].BlockHashes {
			s := reqs[i].Session
			if o, ok := owner[h]; s < 0 || (ok && o != s) {
				owner[h] = -2
			} else {
				owner[h] = s
			}
		}
	}
	last := map[int]int{}           // session → latest turn so far
	groupFloor := map[int]float64{} // session → max floor so far
	for i := range reqs {
		if i%256 == 0 && ctx.Err() != nil {
			return nil, ctx.Err()
		}
		w := &reqs[i]
		if w.Session < 0 {
			continue
		}
		gf := groupFloor[w.Session]
		if math.IsNaN(kb.floor[i]) || math.IsNaN(gf) {
			gf = math.NaN()
		} else {
			gf = math.Max(gf, kb.floor[i])
		}
		groupFloor[w.Session] = gf
		p, ok := last[w.Session]
		last[w.Session] = i
		if ok {
			// A later turn's arrival bounds how long this one can wait
			// for its history to be recomputed by someone else.
			for k := len(kb.turns) - 1; k >= 0; k-- {
				if kb.turns[k].session == w.Session {
					kb.turns[k].next = w.Arrival.Seconds()
					break
				}
			}
		}
		if !ok {
			continue
		}
		hs, ph := w.BlockHashes, reqs[p].BlockHashes
		shared := 0
		for shared < len(hs) && owner[hs[shared]] == -2 {
			shared++
		}
		lcp := 0
		for lcp < len(hs) && lcp < len(ph) && hs[lcp] == ph[lcp] {
			lcp++
		}
		h := lcp - shared
		if h <= 0 {
			continue
		}
		t := kvTurn{session: w.Session, from: reqs[p].Arrival.Seconds(), to: w.Arrival.Seconds(), next: math.Inf(1), groupFloor: gf}
		step := max(1, (h+kvGridPoints-1)/kvGridPoints)
		for m := 0; ; m += step {
			m = min(m, h)
			t.grid = append(t.grid, m)
			t.solo = append(t.solo, solo(i, shared+m))
			if m == h {
				break
			}
		}
		kb.turns = append(kb.turns, t)
	}
	return kb, nil
}

// slow counts requests with TTFT ≥ x in every schedule: floors ≥ x, plus
// the KV argument at instants chosen greedily (most excess first) among
// request arrivals, each using only sessions no earlier choice used.
func (kb *kvBound) slow(x float64) int {
	certain := 0
	for _, v := range kb.floor {
		if !math.IsNaN(v) && v >= x {
			certain++
		}
	}
	var live []int // turns the argument may use at x
	need := make([]int, len(kb.turns))
	for k := range kb.turns {
		t := &kb.turns[k]
		if !(t.groupFloor < x) || t.next < t.to+x {
			continue
		}
		if need[k] = t.need(x); need[k] > 0 && t.from+x <= t.to {
			live = append(live, k)
		}
	}
	type instant struct {
		slow  int
		turns []int
	}
	var cands []instant
	seen := map[float64]bool{}
	for _, k := range live {
		at := kb.turns[k].to
		if seen[at] {
			continue
		}
		seen[at] = true
		var act []int
		var ws []int
		sum := 0
		for _, j := range live {
			t := &kb.turns[j]
			if t.from+x <= at && at <= t.to {
				act = append(act, j)
				ws = append(ws, need[j])
				sum += need[j]
			}
		}
		n := fewestOver(ws, sum, kb.blocks)
		if n == 0 {
			continue
		}
		cands = append(cands, instant{n, act})
	}
	sort.SliceStable(cands, func(a, b int) bool { return cands[a].slow > cands[b].slow })
	used := map[int]bool{}
	total := certain
	for _, c := range cands {
		// Drop the sessions an earlier instant used; what is left still
		// has to fit.
		var ws []int
		sum := 0
		for _, j := range c.turns {
			if !used[kb.turns[j].session] {
				ws = append(ws, need[j])
				sum += need[j]
			}
		}
		n := fewestOver(ws, sum, kb.blocks)
		if n == 0 {
			continue
		}
		for _, j := range c.turns {
			used[kb.turns[j].session] = true
		}
		total += n
	}
	return total
}

// peak is the most history blocks the turns active at one instant need
// for TTFTs below x (no session excluded), against the fleet's blocks.
func (kb *kvBound) peak(x float64) (need, blocks int) {
	for k := range kb.turns {
		at, sum := kb.turns[k].to, 0
		for j := range kb.turns {
			t := &kb.turns[j]
			if t.from+x <= at && at <= t.to && !(t.next < t.to+x) {
				sum += t.need(x)
			}
		}
		need = max(need, sum)
	}
	return need, kb.blocks
}

// fewestOver is how many of ws (summing to sum), largest first, must go so
// that the rest fit in capacity: 0 when they already fit. It sorts ws.
func fewestOver(ws []int, sum, capacity int) int {
	if sum <= capacity {
		return 0
	}
	sort.Sort(sort.Reverse(sort.IntSlice(ws)))
	n := 0
	for r := sum; r > capacity; n++ {
		r -= ws[n]
	}
	return n
}
