package bench

import (
	"context"
	"testing"
	"time"

	"github.com/infergate/infergate/sim/engine"
)

// TestOracleGreedyPicksTheEarliestFirstToken runs oracle-greedy on the
// small mixed fleet (realism on: step jitter, pod speeds) and checks its
// two claims: each request goes to a pod where its predicted first token
// is the earliest of all pods, and the prediction is exact, i.e. a request
// whose pod received nothing else before its first token gets that token
// at the predicted time to the nanosecond.
func TestOracleGreedyPicksTheEarliestFirstToken(t *testing.T) {
	f, st := smallFleet(), smallStream(4)
	s, err := newSim(context.Background(), Setup{Name: "t", Fleet: f}, mustPolicy(t, PolicyOracleGreedy), 4, st, Options{})
	if err != nil {
		t.Fatal(err)
	}
	predicted := make([]time.Duration, len(st.Requests))
	dispatched := make([]time.Duration, len(st.Requests))
	pods := make([]int, len(st.Requests))
	byPod := make([][]time.Duration, len(s.pods))
	s.onDispatch = func(i, pod int, now time.Duration) {
		w := &st.Requests[i]
		best := time.Duration(-1)
		for k, p := range s.pods {
			at, ok := firstTokenIf(p.eng, now, engineRequest(w))
			if !ok {
				continue
			}
			if k == pod {
				predicted[i] = at
			}
			if best < 0 || at < best {
				best = at
			}
		}
		if predicted[i] != best {
			t.Errorf("request %d sent to pod %d (first token at %v), but another pod had %v", i, pod, predicted[i], best)
		}
		dispatched[i], pods[i] = now, pod
		byPod[pod] = append(byPod[pod], now)
	}
	exact, checked := 0, 0
	s.onDone = func(i int, _ time.Duration, res engine.Result) {
		for _, at := range byPod[pods[i]] {
			if at > dispatched[i] && at < res.FirstTokenAt {
				return // something else arrived on the pod first: not comparable
			}
		}
		checked++
		if res.FirstTokenAt == predicted[i] {
			exact++
		} else {
			t.Errorf("request %d: first token at %v, predicted %v", i, res.FirstTokenAt, predicted[i])
		}
	}
	if _, err := s.run(); err != nil {
		t.Fatal(err)
	}
	if checked < len(st.Requests)/4 {
		t.Fatalf("only %d of %d requests had their pod to themselves until their first token", checked, len(st.Requests))
	}
	t.Logf("%d of %d requests checked, %d exact", checked, len(st.Requests), exact)
}
