package bench

import (
	"context"
	"fmt"
	"math"
	"os"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/infergate/infergate/bench/scenario"
	"github.com/infergate/infergate/bench/trace"
	"github.com/infergate/infergate/bench/workload"
)

// A request whose prefix another request is still computing cannot find it
// cached anywhere: its causal floor is that computation's remaining time
// (or its own cold prefill), far above Floors' value; once the prefix is
// done, the two agree.
func TestCausalFloorsWaitForTheFirstComputation(t *testing.T) {
	f := scenario.Fleet{Model: "llama-3.1-8b", Pods: []scenario.PodGroup{{GPU: "a10g", Count: 2, TensorParallel: 1}}}
	f.SetDefaults()
	req := func(id uint64, at time.Duration, own uint64) workload.Request {
		segs := []workload.Segment{{Key: 1, Tokens: 4096}, {Key: own, Tokens: 160}}
		return workload.Request{ID: id, Arrival: at, PromptTokens: 4256, OutputTokens: 1, BlockHashes: workload.HashSegments(segs), Session: -1}
	}
	st := workload.Stream{Duration: time.Minute, Requests: []workload.Request{
		req(0, 0, 100),                    // computes the prefix cold
		req(1, 100*time.Millisecond, 101), // arrives while it is computed
		req(2, 30*time.Second, 102),       // long after
		{ID: 3, Arrival: 31 * time.Second, PromptTokens: 8, OutputTokens: 1, Session: -1}, // no full block
	}}
	floors, err := Floors(context.Background(), f, st, PodSpeeds{})
	if err != nil {
		t.Fatal(err)
	}
	causal, err := CausalFloors(context.Background(), f, st, floors, PodSpeeds{})
	if err != nil {
		t.Fatal(err)
	}
	cold := floors[0]
	if math.Abs(causal[0]-cold) > 1e-9 {
		t.Errorf("first request: causal %.1f ms, floor %.1f ms; want equal", causal[0], cold)
	}
	// The follower waits for the prefix (cold − 100 ms) then computes its
	// own 160 tokens, or computes it all itself: at least cold − 100 ms.
	if causal[1] < cold-100 || floors[1] > cold/4 {
		t.Errorf("follower: causal %.1f ms, floor %.1f ms, cold %.1f ms", causal[1], floors[1], cold)
	}
	if causal[1] > cold+1 {
		t.Errorf("follower: causal %.1f ms above computing it all itself (%.1f ms)", causal[1], cold)
	}
	if math.Abs(causal[2]-floors[2]) > 1e-9 || math.Abs(causal[3]-floors[3]) > 1e-9 {
		t.Errorf("later requests: causal %.1f / %.1f, floor %.1f / %.1f; want equal", causal[2], causal[3], floors[2], floors[3])
	}
}

// TestCausalFloorReport prints, per seed, the P99 of Floors and of
// CausalFloors (CAUSAL=scenario:seed-base:seeds, e.g.
// CAUSAL=shared-prefix-8b:201:5 go test ./bench -run TestCausalFloorReport -v).
func TestCausalFloorReport(t *testing.T) {
	name, base, n := seedsSpec(t, "CAUSAL")
	sc, err := scenario.Get(name)
	if err != nil {
		t.Fatal(err)
	}
	var sf, sc99 float64
	for seed := base; seed < base+n; seed++ {
		st := sc.Stream(uint64(seed))
		floors, err := Floors(context.Background(), sc.Fleet, st, PodSpeeds{})
		if err != nil {
			t.Fatal(err)
		}
		causal, err := CausalFloors(context.Background(), sc.Fleet, st, floors, PodSpeeds{})
		if err != nil {
			t.Fatal(err)
		}
		f, c := p99(floors), p99(causal)
		sf += f
		sc99 += c
		fmt.Printf("%s seed %d: floor p99 %.0f ms, causal floor p99 %.0f ms\n", sc.Name, seed, f, c)
	}
	fmt.Printf("%s seeds %d–%d: mean floor p99 %.0f ms, mean causal floor p99 %.0f ms\n", sc.Name, base, base+n-1, sf/float64(n), sc99/float64(n))
}

// p99 is the 99th percentile (linear interpolation) of the non-NaN values.
func p99(v []float64) float64 {
	var s []float64
	for _, x := range v {
		if !math.IsNaN(x) {
			s = append(s, x)
		}
	}
	sort.Float64s(s)
	if len(s) == 0 {
		return math.NaN()
	}
	r := 0.99 * float64(len(s)-1)
	lo := int(r)
	if lo+1 >= len(s) {
		return s[lo]
	}
	return s[lo] + (r-float64(lo))*(s[lo+1]-s[lo])
}

// seedsSpec reads the report tests' environment variable env as
// name:seed-base:seeds (name a scenario, or a trace path where the test
// takes one), skipping the test when env is unset.
func seedsSpec(t *testing.T, env string) (name string, base, n int) {
	t.Helper()
	spec := os.Getenv(env)
	if spec == "" {
		t.Skip(env + " not set")
	}
	parts := strings.Split(spec, ":")
	if len(parts) != 3 {
		t.Fatalf("%s=%q: want scenario:seed-base:seeds", env, spec)
	}
	base, _ = strconv.Atoi(parts[1])
	n, _ = strconv.Atoi(parts[2])
	return parts[0], base, n
}

// runFloors is st's floors and causal floors at the pod speeds the run of
// seed draws (RunSpeeds with the default realism).
func runFloors(t testing.TB, f scenario.Fleet, st workload.Stream, seed uint64) (floors, causal []float64) {
	t.Helper()
	sp := RunSpeeds(nil, seed)
	floors, err := Floors(context.Background(), f, st, sp)
	if err != nil {
		t.Fatal(err)
	}
	causal, err = CausalFloors(context.Background(), f, st, floors, sp)
	if err != nil {
		t.Fatal(err)
	}
	return floors, causal
}

// traceOnDefaultFleet is a window of the trace at path (opts, less
// MaxTotalTokens, which it sets) on the bench's default trace fleet, as
// `infergate bench --trace` replays it; skipped when the file is absent.
func traceOnDefaultFleet(t testing.TB, path string, opts trace.Options) (scenario.Fleet, workload.Stream) {
	t.Helper()
	if _, err := os.Stat(path); err != nil {
		t.Skipf("trace: %v", err)
	}
	f := scenario.DefaultTraceFleet()
	f.SetDefaults()
	maxLen, err := MaxModelLen(f)
	if err != nil {
		t.Fatal(err)
	}
	opts.MaxTotalTokens = maxLen
	st, err := trace.Load(path, opts)
	if err != nil {
		t.Fatal(err)
	}
	return f, st
}
