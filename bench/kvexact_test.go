package bench

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/infergate/infergate/bench/scenario"
	"github.com/infergate/infergate/bench/workload"
	"github.com/infergate/infergate/sim/engine"
	"github.com/infergate/infergate/tier1/picker"
)

// On cache-pressure-32b (a prefix working set several times the fleet's
// KV) the precise policies' exact index follows the engines: every pod
// stores more distinct blocks over the run than it can hold, yet the index
// never holds more for a pod than the pod's KV blocks (its evictions were
// heard). Tier 1's precise-prefix scorer took all its evidence from it.
func TestExactIndexFollowsEngines(t *testing.T) {
	sc, err := scenario.Get("cache-pressure-32b")
	if err != nil {
		t.Fatal(err)
	}
	st := sc.Stream(201)
	st.Requests = slices.DeleteFunc(st.Requests, func(r workload.Request) bool { return r.Arrival > 90*time.Second })
	st.Duration = 90 * time.Second
	for _, name := range []string{PolicyInfergatePrecise, PolicyLLMDPrecise} {
		t.Run(name, func(t *testing.T) {
			pol := mustPolicy(t, name)
			if !pol.Precise {
				t.Fatalf("%s is not precise", name)
			}
			s, err := newSim(context.Background(), Setup{Name: sc.Name, Fleet: sc.Fleet}, pol, 201, st, Options{})
			if err != nil {
				t.Fatal(err)
			}
			stored := map[string]map[uint64]bool{}
			for _, p := range s.pods {
				set := map[uint64]bool{}
				stored[p.view.Name] = set
				x := s.exact
				p.eng.SetKVEvents(tee{podEvents{x.held[p.view.Name]}, set})
			}
			run, err := s.run()
			if err != nil {
				t.Fatal(err)
			}
			if run.Completed == 0 {
				t.Fatal("nothing completed")
			}
			for _, p := range s.pods {
				n, blocks := len(s.exact.held[p.view.Name]), p.eng.Stats().NumBlocks
				ever := len(stored[p.view.Name])
				t.Logf("%s: %d blocks stored over the run, %d held at the end, capacity %d", p.view.Name, ever, n, blocks)
				if ever <= blocks {
					t.Errorf("%s stored %d distinct blocks, not beyond its %d: no cache pressure", p.view.Name, ever, blocks)
				}
				if n > blocks || n == 0 {
					t.Errorf("%s: index holds %d blocks, capacity %d", p.view.Name, n, blocks)
				}
			}
			if name == PolicyInfergatePrecise {
				if got := s.tracker.PrefixSourceCount(picker.PrefixExact); got == 0 {
					t.Error("no dispatch took the exact index's evidence")
				}
				if got := s.tracker.PrefixSourceCount(picker.PrefixApproximate); got != 0 {
					t.Errorf("%d dispatches fell back to the approximate index", got)
				}
			}
		})
	}
}

// tee hears a pod's events for the index and records every stored block.
type tee struct {
	podEvents
	ever map[uint64]bool
}

func (t tee) BlockStored(r *engine.Request, i int, hash, parent uint64, hasParent bool) {
	t.ever[hash] = true
	t.podEvents.BlockStored(r, i, hash, parent, hasParent)
}
