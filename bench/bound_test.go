package bench

import (
	"context"
	"fmt"
	"math"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/infergate/infergate/bench/scenario"
	"github.com/infergate/infergate/bench/trace"
	"github.com/infergate/infergate/bench/workload"
)

// unitBound builds a boundInput of one-token requests that each take one
// second of work (and whose floor is one second), arriving at the given
// seconds, on a fleet doing rate seconds of work per second.
func unitBound(arrivals []float64, rate float64) *boundInput {
	st := workload.Stream{}
	causal := make([]float64, len(arrivals))
	for i, a := range arrivals {
		st.Requests = append(st.Requests, workload.Request{ID: uint64(i), Arrival: time.Duration(a * float64(time.Second)), PromptTokens: 1, Session: -1})
		causal[i] = 1000
	}
	fc := fleetCapacity{linear: 1, ref: prefillCost{perFlop: 1}, rate: rate}
	return newBoundInput(st, causal, fc)
}

func burst(n int, at float64) []float64 {
	a := make([]float64, n)
	for i := range a {
		a[i] = at
	}
	return a
}

// TestQueueBoundBelowGreedySchedule checks the capacity bound against a
// schedule that exists: the pooled fleet's first-come-first-served
// schedule that drops the largest request of a busy period whenever one
// would be late (greedySlow). The bound counts requests that are late in
// every schedule, so it must never count more than that one has.
func TestQueueBoundBelowGreedySchedule(t *testing.T) {
	for _, tc := range []struct {
		arrivals []float64
		rate     float64
	}{
		{burst(100, 0), 1},
		{burst(100, 0), 2},
		{append(burst(100, 0), burst(30, 40)...), 1.5},
	} {
		b := unitBound(tc.arrivals, tc.rate)
		for _, x := range []float64{1, 2, 10, 49.5, 60, 99} {
			if s, g := b.slow(x), b.greedySlow(x); s > g {
				t.Errorf("hand case %d requests, rate %v, x %v: bound counts %d late, a schedule has %d", len(tc.arrivals), tc.rate, x, s, g)
			}
		}
	}
	for _, name := range []string{"bursty-70b", "priority-mix-8b", "shared-prefix-8b"} {
		sc, err := scenario.Get(name)
		if err != nil {
			t.Fatal(err)
		}
		const seed = 7
		st := sc.Stream(seed)
		_, causal := runFloors(t, sc.Fleet, st, seed)
		b, err := newFleetBound(context.Background(), "test", sc.Fleet, st, causal, seed)
		if err != nil {
			t.Fatal(err)
		}
		for _, x := range []float64{0.2, 0.4, 0.8, 1.6, 3.2} {
			if s, g := b.slow(x), b.greedySlow(x); s > g {
				t.Errorf("%s x %v s: bound counts %d late, a schedule has %d", name, x, s, g)
			}
		}
	}
}

// Hand-computed cases. P99 here is s[lo] + f·(s[lo+1] − s[lo]) over the
// sorted TTFTs. 100 one-second requests at once on one pod: at most ⌊x⌋
// can finish within x, so s[98] ≥ 99 s (two slow) and s[99] ≥ 100 s: the
// bound is 99.01 s, which serving them one after another reaches. Two
// pods: s[98] ≥ 49.5, s[99] ≥ 50 (the best schedule's P99 is 50 s). Two
// such bursts far apart need three slow requests for s[197] and get them
// from both windows together (one window alone proves only 98 s).
// Requests spaced wider than their work get no queueing: the bound is
// their floor.
func TestQueueBoundP99HandCases(t *testing.T) {
	for _, tc := range []struct {
		name     string
		arrivals []float64
		rate     float64
		want     float64 // seconds
	}{
		{"one pod, one burst", burst(100, 0), 1, 99.01},
		{"two pods, one burst", burst(100, 0), 2, 49.505},
		{"one pod, two bursts", append(burst(100, 0), burst(100, 1000)...), 1, 99.01},
		{"spaced", func() []float64 {
			a := make([]float64, 100)
			for i := range a {
				a[i] = 10 * float64(i)
			}
			return a
		}(), 1, 1},
		{"half-rate arrivals on one pod", func() []float64 {
			// One request every 0.5 s for 100 s, twice the rate served: the
			// window of all 200 has 200 s of work against 99.5+x, and 3
			// slow requests are needed, so x < 98.5 (FIFO's P99: 99.5 s).
			a := make([]float64, 200)
			for i := range a {
				a[i] = 0.5 * float64(i)
			}
			return a
		}(), 1, 98.51},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := unitBound(tc.arrivals, tc.rate).p99() / 1000
			if math.Abs(got-tc.want) > 0.01 {
				t.Errorf("bound %.4f s, want %.4f s", got, tc.want)
			}
		})
	}
}

// A request's work counts the prefix another request holds only when that
// request arrives before the deadline; the request's own prompt never
// counts as cached.
func TestQueueBoundWorkUsesOnlyPromptsArrivedInTime(t *testing.T) {
	segs := func(own uint64) []uint64 {
		return workload.HashSegments([]workload.Segment{{Key: 1, Tokens: 1024}, {Key: own, Tokens: 32}})
	}
	st := workload.Stream{Requests: []workload.Request{
		{ID: 0, Arrival: 0, PromptTokens: 1056, BlockHashes: segs(10), Session: -1},
		{ID: 1, Arrival: time.Second, PromptTokens: 1056, BlockHashes: segs(11), Session: -1},
	}}
	fc := fleetCapacity{linear: 1, ref: prefillCost{perFlop: 1}, rate: 1}
	b := newBoundInput(st, []float64{1, 1}, fc)
	if got := b.work(0, 0.5); got != 1056 {
		t.Errorf("first request, deadline before the second arrives: work %v, want 1056 (all of it)", got)
	}
	if got := b.work(0, 2); got != 32 {
		t.Errorf("first request, deadline after the second arrives: work %v, want 32 (own blocks)", got)
	}
	if got := b.work(1, 0); got != 32 {
		t.Errorf("second request: work %v, want 32", got)
	}
}

// The fleet's rate is one per pod of the reference type and less for a
// slower type; pod speed factors scale it.
func TestFleetPrefillCapacity(t *testing.T) {
	same := scenario.Fleet{Model: "llama-3.1-8b", Pods: []scenario.PodGroup{{GPU: "h100", Count: 2, TensorParallel: 1}}}
	fc, err := fleetPrefillCapacity(same, 1, 0)
	if err != nil {
		t.Fatal(err)
	}
	if math.Abs(fc.rate-2) > 1e-12 {
		t.Errorf("2 H100: rate %v, want 2", fc.rate)
	}
	mixed := scenario.Fleet{Model: "llama-3.1-8b", Pods: []scenario.PodGroup{{GPU: "h100", Count: 1, TensorParallel: 1}, {GPU: "a10g", Count: 1, TensorParallel: 1}}}
	if fc, err = fleetPrefillCapacity(mixed, 1, 0); err != nil {
		t.Fatal(err)
	}
	if fc.rate <= 1 || fc.rate >= 1.5 {
		t.Errorf("H100 + A10G: rate %v in H100 units, want in (1, 1.5)", fc.rate)
	}
	if fc, err = fleetPrefillCapacity(same, 7, 0.03); err != nil {
		t.Fatal(err)
	}
	if fc.rate == 2 || math.Abs(fc.rate-2) > 0.07 {
		t.Errorf("2 H100 with ±3%% speed: rate %v, want near 2 but not 2", fc.rate)
	}
}

// On a real scenario the bound is at least the causal floor's P99 and
// rises with load.
func TestQueueBoundP99AtLeastFloor(t *testing.T) {
	sc, err := scenario.Get("bursty-70b")
	if err != nil {
		t.Fatal(err)
	}
	sc.Duration = 30 * time.Second
	st := sc.Stream(1)
	floors, err := Floors(context.Background(), sc.Fleet, st, PodSpeeds{})
	if err != nil {
		t.Fatal(err)
	}
	b, err := QueueBoundP99(context.Background(), sc.Fleet, st, floors, 1)
	if err != nil {
		t.Fatal(err)
	}
	if f := p99(floors); b < f-1e-6 {
		t.Errorf("bound %.1f ms below the floor's P99 %.1f ms", b, f)
	}
	hot := sc.ScaleRate(3).Stream(1)
	hf, err := Floors(context.Background(), sc.Fleet, hot, PodSpeeds{})
	if err != nil {
		t.Fatal(err)
	}
	hb, err := QueueBoundP99(context.Background(), sc.Fleet, hot, hf, 1)
	if err != nil {
		t.Fatal(err)
	}
	if hb <= p99(hf)*1.5 {
		t.Errorf("3× load: bound %.1f ms, floor P99 %.1f ms; want queueing to show", hb, p99(hf))
	}
}

// TestQueueBoundReport prints, per seed, the P99 of Floors and of
// CausalFloors, QueueBoundP99 and KVBoundP99. BOUND=scenario:seed-base:seeds, or
// BOUND=path.jsonl:seed-base:seeds (or .csv) for the first 10 minutes
// (BOUNDDUR; BOUNDSTART and BOUNDRATE choose a window and --rate-scale)
// of a trace on the bench's default trace fleet (skipped when
// the file is absent), e.g.
// BOUND=bursty-70b:201:5 go test ./bench -run TestQueueBoundReport -v.
// BOUNDTARGET=ms also prints how much of the peak prefill rate the fleet
// would have to lose on top of the decode charge for the decode bound to
// reach that P99.
func TestQueueBoundReport(t *testing.T) {
	src, base, n := seedsSpec(t, "BOUND")
	var name string
	var fleet scenario.Fleet
	var stream func(seed uint64) workload.Stream
	if strings.HasSuffix(src, ".jsonl") || strings.HasSuffix(src, ".csv") {
		opts := trace.Options{Duration: 10 * time.Minute}
		var err error
		if v := os.Getenv("BOUNDDUR"); v != "" {
			if opts.Duration, err = time.ParseDuration(v); err != nil {
				t.Fatal(err)
			}
		}
		if v := os.Getenv("BOUNDSTART"); v != "" {
			if opts.Start, err = time.ParseDuration(v); err != nil {
				t.Fatal(err)
			}
		}
		if v := os.Getenv("BOUNDRATE"); v != "" {
			if opts.RateScale, err = strconv.ParseFloat(v, 64); err != nil {
				t.Fatal(err)
			}
		}
		var st workload.Stream
		fleet, st = traceOnDefaultFleet(t, src, opts)
		name, stream = "trace", func(uint64) workload.Stream { return st }
	} else {
		sc, err := scenario.Get(src)
		if err != nil {
			t.Fatal(err)
		}
		name, fleet, stream = sc.Name, sc.Fleet, sc.Stream
	}
	var sf, sc99, sb, skv, sdb, stb float64
	for seed := base; seed < base+n; seed++ {
		st := stream(uint64(seed))
		// Even a trace's floors depend on the seed: it sets the pods' speeds.
		sp := RunSpeeds(nil, uint64(seed))
		floors, causal := runFloors(t, fleet, st, uint64(seed))
		b, err := QueueBoundP99(context.Background(), fleet, st, causal, uint64(seed))
		if err != nil {
			t.Fatal(err)
		}
		if gb, err := newFleetBound(context.Background(), "greedy", fleet, st, causal, uint64(seed)); err == nil {
			// The pooled optimum's P99 lies between the bound and this.
			fmt.Printf("%s seed %d: queue bound p99 %.1f ms; a pooled first-come-first-served schedule dropping the largest (greedySlow) has p99 %.1f ms\n",
				name, seed, b, p99Bound(gb.floor, gb.greedySlow))
		}
		db, err := DecodeBoundP99(context.Background(), fleet, st, causal, uint64(seed))
		if err != nil {
			t.Fatal(err)
		}
		fc0, err := fleetPrefillCapacity(fleet, uint64(seed), 0.03)
		if err != nil {
			t.Fatal(err)
		}
		tb, err := TypedQueueBoundP99(context.Background(), fleet, st, causal, uint64(seed))
		if err != nil {
			t.Fatal(err)
		}
		stb += tb
		fmt.Printf("%s seed %d: typed queue bound p99 %.1f ms%s\n", name, seed, tb, typedLoad(newBoundInput(st, causal, fc0), 10, p99(causal)/1000))
		kb, err := fleetKVBound(context.Background(), fleet, st, causal, sp)
		if err != nil {
			t.Fatal(err)
		}
		kv := p99Bound(kb.floor, kb.slow)
		need, blocks := kb.peak(p99(causal) / 1000)
		fc, err := fleetPrefillCapacity(fleet, uint64(seed), 0.03)
		if err != nil {
			t.Fatal(err)
		}
		in := newBoundInput(st, causal, fc)
		dc, err := fleetDecodeCharge(fleet, st, uint64(seed), 0.03, fc)
		if err != nil {
			t.Fatal(err)
		}
		in.dec = dc
		if tgt, err := strconv.ParseFloat(os.Getenv("BOUNDTARGET"), 64); err == nil {
			// The largest share of the peak prefill rate the fleet could
			// keep with the capacity bound still reaching tgt ms: what
			// decode (or anything else pooled) would have to take away.
			full := in.cap.rate
			lo, hi := 0.0, 1.0
			for hi-lo > 0.005 {
				mid := (lo + hi) / 2
				in.cap.rate = mid * full
				if in.p99() >= tgt {
					lo = mid
				} else {
					hi = mid
				}
			}
			in.cap.rate = full
			fmt.Printf("%s seed %d: the decode bound reaches %.0f ms only with the peak prefill rate cut by a further %.1f%% or more\n", name, seed, tgt, 100*(1-lo))
		}
		f, c := p99(floors), p99(causal)
		sf, sc99, sb, skv, sdb = sf+f, sc99+c, sb+b, skv+kv, sdb+db
		fmt.Printf("%s seed %d: %d requests, floor p99 %.0f ms, causal floor p99 %.0f ms, queue bound p99 %.1f ms, decode bound p99 %.1f ms, kv bound p99 %.0f ms; prefill work / peak prefill rate: run %.0f%%, busiest 10 s %.0f%%; decode charge in the busiest 10 s at x = causal p99: %.2f%% of peak prefill rate (σ %.3g per request, shortest step %.1f ms); history blocks needed at once for TTFT < causal p99: %d of %d\n",
			name, seed, len(st.Requests), f, c, b, db, kv, 100*prefillLoad(in, st.Duration.Seconds(), true), 100*prefillLoad(in, 10, false), 100*decodeLoad(in, 10, c/1000), dc.sigma, 1000*dc.stepMin, need, blocks)
	}
	k := float64(n)
	fmt.Printf("%s seeds %d–%d: mean floor p99 %.0f ms, causal floor p99 %.0f ms, queue bound p99 %.1f ms, typed queue bound p99 %.1f ms, decode bound p99 %.1f ms, kv bound p99 %.0f ms\n", name, base, base+n-1, sf/k, sc99/k, sb/k, stb/k, sdb/k, skv/k)
}

// kvCase is three two-turn conversations: first turns at 0 s, second
// turns at 10 s, each second turn's history 8 blocks of its own. A turn
// takes 2 s alone with no history cached and 0.2375 s less per cached
// block; every floor is 0.1 s.
func kvCase(t *testing.T, blocks int) *kvBound {
	t.Helper()
	var st workload.Stream
	for turn := range 2 {
		for s := range 3 {
			segs := []workload.Segment{{Key: uint64(100 + s), Tokens: 8 * workload.BlockSize}}
			if turn == 1 {
				segs = append(segs, workload.Segment{Key: uint64(200 + s), Tokens: 2 * workload.BlockSize})
			}
			h := workload.HashSegments(segs)
			st.Requests = append(st.Requests, workload.Request{ID: uint64(len(st.Requests)), Arrival: time.Duration(turn) * 10 * time.Second, PromptTokens: len(h) * workload.BlockSize, BlockHashes: h, Session: s})
		}
	}
	causal := []float64{100, 100, 100, 100, 100, 100}
	kb, err := newKVBound(context.Background(), st, causal, blocks, func(_, cached int) float64 { return 2 - float64(cached)*1.9/8 })
	if err != nil {
		t.Fatal(err)
	}
	return kb
}

// With room for 10 history blocks, three turns that each need m blocks
// for a TTFT below x cannot all be fast once 3m > 10, i.e. m ≥ 4, i.e.
// for x ≤ 2 − 3·0.2375 = 1.2875 s: s[5] ≥ 1.2875 s. Two must be slow
// once 2m > 10, m ≥ 6, x ≤ 0.8125 s: s[4] ≥ 0.8125 s. The P99 (lo = 4,
// f = 0.95) is at least 0.8125 + 0.95·0.475 = 1.264 s; the best schedule
// (keep one history whole and 2 blocks of another) has s[4] = 1.525 s and
// s[5] = 2 s. With room for all 24 blocks the bound is the floor.
func TestKVBoundP99HandCases(t *testing.T) {
	for _, tc := range []struct {
		blocks int
		want   float64 // ms
	}{{10, 1263.75}, {24, 100}} {
		kb := kvCase(t, tc.blocks)
		if got := p99Bound(kb.floor, kb.slow); math.Abs(got-tc.want) > 0.2 {
			t.Errorf("%d blocks: bound %.2f ms, want %.1f ms", tc.blocks, got, tc.want)
		}
	}
}

// A turn whose session has a later turn arriving within x could have its
// history recomputed by that turn, so the argument leaves it out.
func TestKVBoundSkipsTurnsWithACloseSuccessor(t *testing.T) {
	kb := kvCase(t, 10)
	for k := range kb.turns {
		kb.turns[k].next = kb.turns[k].to + 0.05 // within every x ≥ the floor
	}
	if got := p99Bound(kb.floor, kb.slow); math.Abs(got-100) > 0.2 {
		t.Errorf("bound %.2f ms, want the floor's 100 ms", got)
	}
}

// prefillLoad is the prefill work (Floors' caching) arriving over the
// whole run (all) or in the busiest window of span seconds, over what the
// fleet computes at its peak prefill rate in that time.
func prefillLoad(b *boundInput, span float64, all bool) float64 {
	w := make([]float64, len(b.arrival))
	total := 0.0
	for i := range w {
		w[i] = b.work(i, 0)
		total += w[i]
	}
	if all {
		return total / (b.cap.rate * span)
	}
	best, sum, j := 0.0, 0.0, 0
	for i := range w {
		for j < len(w) && b.arrival[j] < b.arrival[i]+span {
			sum += w[j]
			j++
		}
		best = math.Max(best, sum)
		sum -= w[i]
	}
	return best / (b.cap.rate * span)
}

// typedLoad describes, for each proper set T of pod types, the requests
// (floor below x) that can be fast only on T at TTFT bound x: how many,
// and the most work any span seconds of them bring over what T's pods
// compute in span+x.
func typedLoad(b *boundInput, span, x float64) string {
	all := 1<<len(b.cap.types) - 1
	out := ""
	for T := 1; T < all; T++ {
		rate, names := 0.0, ""
		for k, t := range b.cap.types {
			if T&(1<<k) != 0 {
				rate += t.rate
				names += "+" + t.key
			}
		}
		var at, w []float64
		for i := range b.arrival {
			if math.IsNaN(b.floor[i]) || b.floor[i] >= x {
				continue
			}
			if m, v := b.fastTypes(i, x); m&^T == 0 {
				at, w = append(at, b.arrival[i]), append(w, v)
			}
		}
		best, sum, j := 0.0, 0.0, 0
		for i := range at {
			for j < len(at) && at[j] < at[i]+span {
				sum += w[j]
				j++
			}
			best = math.Max(best, sum)
			sum -= w[i]
		}
		out += fmt.Sprintf("; at x = %.0f ms, %d requests fast only on %s, busiest %.0f s: %.0f%% of its rate over span+x", 1000*x, len(at), names[1:], span, 100*best/(rate*(span+x)))
	}
	return out
}

// decodeLoad is the most decode charge (σ times the time the window's
// requests surely decode in it if all are fast, at TTFT bound x) any
// window of span seconds carries, over the fleet's peak prefill rate.
func decodeLoad(b *boundInput, span, x float64) float64 {
	best := 0.0
	for i := range b.arrival {
		var dr decodeRun
		for j := i; j < len(b.arrival) && b.arrival[j] < b.arrival[i]+span; j++ {
			if math.IsNaN(b.floor[j]) {
				continue
			}
			dr.add(b.arrival[j], b.dec.running(b.floor[j], b.out[j], x))
		}
		best = math.Max(best, b.dec.sigma*dr.total)
	}
	return best / (b.cap.rate * (span + x))
}

// The work a request is charged never exceeds what the engine takes to
// prefill it alone (its floor, on a fleet of one pod type), and is close
// to it once the prefill is compute-bound (≥ 100 ms here): the bound
// leaves out the memory term (a step reads all weights: ~32 ms for an 8B
// model on an A10G, so a short prefill costs far more alone than its
// share of a batch), per-sequence costs and unfilled steps' overhead.
func TestQueueBoundWorkBelowEngineSoloTime(t *testing.T) {
	for _, name := range []string{"bursty-70b", "multi-turn-chat"} {
		sc, err := scenario.Get(name)
		if err != nil {
			t.Fatal(err)
		}
		sc.Duration = 20 * time.Second
		st := sc.Stream(3)
		floors, err := Floors(context.Background(), sc.Fleet, st, PodSpeeds{})
		if err != nil {
			t.Fatal(err)
		}
		fc, err := fleetPrefillCapacity(sc.Fleet, 3, 0)
		if err != nil {
			t.Fatal(err)
		}
		b := newBoundInput(st, floors, fc)
		for i := range st.Requests {
			w, f := 1000*b.work(i, 0), floors[i]
			if w > f+1e-6 || (f >= 100 && w < 0.9*f) {
				t.Errorf("%s request %d (%d tokens): work %.2f ms, engine alone %.2f ms", name, i, st.Requests[i].PromptTokens, w, f)
			}
		}
	}
}
