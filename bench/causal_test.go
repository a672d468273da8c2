package bench

import (
	"context"
	"math"
	"testing"
	"time"

	"github.com/infergate/infergate/bench/scenario"
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
