package bench

import (
	"context"
	"math"
	"testing"
	"time"

	"github.com/infergate/infergate/bench/scenario"
)

// typedUnit is unitBound on a fleet of pod types, each one pod doing a
// one-token request in solo seconds (its rate 1/solo reference seconds per
// second).
func typedUnit(arrivals []float64, solo ...float64) *boundInput {
	b := unitBound(arrivals, 0)
	for k, s := range solo {
		b.cap.types = append(b.cap.types, typeCapacity{key: string(rune('a' + k)), terms: podTerms{perFlop: s}, budget: 1, speed: 1, rate: 1 / s})
		b.cap.rate += 1 / s
	}
	return b
}

// Hand cases, 20 one-second requests at once (P99: lo = 18, f = 0.81).
// With a second pod 100 times slower, no request can be fast there for
// x < 100 s, so the fast pod alone must do them: s[18] ≥ 19, s[19] ≥ 20,
// bound 19.81 s, which serving them in turn on the fast pod reaches; the
// pooled bound (rate 1.01) says only 19.61 s. With the second pod twice as
// slow, every request can be fast on either for x ≥ 2 s and the bound is
// the pooled one.
func TestTypedQueueBoundHandCases(t *testing.T) {
	for _, tc := range []struct {
		name          string
		solo          []float64
		typed, pooled float64 // seconds
	}{
		{"one type", []float64{1}, 19.81, 19.81},
		{"second pod 100× slower", []float64{1, 100}, 19.81, 19.6138},
		{"second pod 2× slower", []float64{1, 2}, 13.2067, 13.2067},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := typedUnit(burst(20, 0), tc.solo...)
			typed, pooled := p99Bound(b.floor, b.slowTyped)/1000, b.p99()/1000
			if math.Abs(typed-tc.typed) > 0.001 || math.Abs(pooled-tc.pooled) > 0.001 {
				t.Errorf("typed %.4f s, pooled %.4f s; want %.4f, %.4f", typed, pooled, tc.typed, tc.pooled)
			}
		})
	}
}

// On fleets of one pod type the typed bound is the capacity bound,
// exactly; on a mixed fleet it is never below it.
func TestTypedQueueBoundMatchesPooled(t *testing.T) {
	for _, name := range []string{"bursty-70b", "shared-prefix-8b", "mixed-gpu-8b"} {
		sc, err := scenario.Get(name)
		if err != nil {
			t.Fatal(err)
		}
		sc.Duration = 30 * time.Second
		st := sc.Stream(201)
		floors, err := Floors(context.Background(), sc.Fleet, st, PodSpeeds{})
		if err != nil {
			t.Fatal(err)
		}
		qb, err := QueueBoundP99(context.Background(), sc.Fleet, st, floors, 201)
		if err != nil {
			t.Fatal(err)
		}
		tb, err := TypedQueueBoundP99(context.Background(), sc.Fleet, st, floors, 201)
		if err != nil {
			t.Fatal(err)
		}
		if mixed := len(podTypes(sc.Fleet)) > 1; (!mixed && tb != qb) || tb < qb {
			t.Errorf("%s: typed bound %.3f ms, capacity bound %.3f ms", name, tb, qb)
		}
	}
}

// A type's solo time never exceeds the engine's own TTFT for the request
// alone on that type (Floors on a fleet of that type only, nominal speed),
// and is close to it on long, compute-bound prefills.
func TestTypedSoloBelowEngine(t *testing.T) {
	sc, err := scenario.Get("mixed-gpu-8b")
	if err != nil {
		t.Fatal(err)
	}
	sc.Duration = 20 * time.Second
	st := sc.Stream(3)
	fc, err := fleetPrefillCapacity(sc.Fleet, 3, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(fc.types) != 2 {
		t.Fatalf("%d pod types, want 2", len(fc.types))
	}
	for k, g := range podTypes(sc.Fleet) {
		one := sc.Fleet
		one.Pods = []scenario.PodGroup{g}
		floors, err := Floors(context.Background(), one, st, PodSpeeds{})
		if err != nil {
			t.Fatal(err)
		}
		b := newBoundInput(st, floors, fc)
		checked := 0
		for i := range st.Requests {
			if math.IsNaN(floors[i]) {
				continue
			}
			checked++
			u, c := b.uncached(i, 0)
			if s := 1000 * fc.types[k].solo(fc.flops(u, c), u); s > floors[i]+1e-6 || (floors[i] >= 200 && s < 0.9*floors[i]) {
				t.Errorf("%s request %d (%d tokens): solo %.2f ms, engine alone %.2f ms", g.GPU, i, st.Requests[i].PromptTokens, s, floors[i])
			}
		}
		if checked < 50 {
			t.Errorf("%s: %d requests checked", g.GPU, checked)
		}
	}
}
