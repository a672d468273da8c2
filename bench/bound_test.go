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
	floors, err := Floors(context.Background(), sc.Fleet, st)
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
	hf, err := Floors(context.Background(), sc.Fleet, hot)
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

// TestQueueBoundReport prints, per seed, the P99 of Floors, of
// CausalFloors and QueueBoundP99. BOUND=scenario:seed-base:seeds, or
// BOUND=path.jsonl:seed-base:seeds for the first 10 minutes of a trace on
// the bench's default trace fleet (skipped when the file is absent), e.g.
// BOUND=bursty-70b:201:5 go test ./bench -run TestQueueBoundReport -v.
func TestQueueBoundReport(t *testing.T) {
	spec := os.Getenv("BOUND")
	if spec == "" {
		t.Skip("BOUND not set")
	}
	parts := strings.Split(spec, ":")
	if len(parts) != 3 {
		t.Fatalf("BOUND=%q: want scenario:seed-base:seeds", spec)
	}
	base, _ := strconv.Atoi(parts[1])
	n, _ := strconv.Atoi(parts[2])
	var name string
	var fleet scenario.Fleet
	var stream func(seed uint64) workload.Stream
	if strings.HasSuffix(parts[0], ".jsonl") {
		if _, err := os.Stat(parts[0]); err != nil {
			t.Skipf("trace: %v", err)
		}
		fleet = scenario.Fleet{Model: "llama-3.1-8b", Pods: []scenario.PodGroup{{GPU: "h100", Count: 4, TensorParallel: 1}, {GPU: "a10g", Count: 4, TensorParallel: 1}}}
		fleet.SetDefaults()
		maxLen, err := MaxModelLen(fleet)
		if err != nil {
			t.Fatal(err)
		}
		st, err := trace.Load(parts[0], trace.Options{Duration: 10 * time.Minute, MaxTotalTokens: maxLen})
		if err != nil {
			t.Fatal(err)
		}
		name, stream = "trace", func(uint64) workload.Stream { return st }
	} else {
		sc, err := scenario.Get(parts[0])
		if err != nil {
			t.Fatal(err)
		}
		name, fleet, stream = sc.Name, sc.Fleet, sc.Stream
	}
	var sf, sc99, sb float64
	var floors, causal []float64
	var lastStream workload.Stream
	for seed := base; seed < base+n; seed++ {
		st := stream(uint64(seed))
		// A trace is one stream: its floors do not depend on the seed.
		if floors == nil || len(st.Requests) != len(lastStream.Requests) || name != "trace" {
			var err error
			if floors, err = Floors(context.Background(), fleet, st); err != nil {
				t.Fatal(err)
			}
			if causal, err = CausalFloors(context.Background(), fleet, st, floors); err != nil {
				t.Fatal(err)
			}
			lastStream = st
		}
		b, err := QueueBoundP99(context.Background(), fleet, st, causal, uint64(seed))
		if err != nil {
			t.Fatal(err)
		}
		f, c := p99(floors), p99(causal)
		sf, sc99, sb = sf+f, sc99+c, sb+b
		fmt.Printf("%s seed %d: %d requests, floor p99 %.0f ms, causal floor p99 %.0f ms, queue bound p99 %.0f ms\n", name, seed, len(st.Requests), f, c, b)
	}
	k := float64(n)
	fmt.Printf("%s seeds %d–%d: mean floor p99 %.0f ms, causal floor p99 %.0f ms, queue bound p99 %.0f ms\n", name, base, base+n-1, sf/k, sc99/k, sb/k)
}
