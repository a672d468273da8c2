package picker

import (
	"testing"
	"time"
)

type recObserver struct {
	loads  []ReplicaLoad
	blocks int
}

func (o *recObserver) Dispatched(pod string, h []uint64, l ReplicaLoad) {
	o.blocks += len(h)
	o.loads = append(o.loads, l)
}
func (o *recObserver) Changed(pod string, l ReplicaLoad)  { o.loads = append(o.loads, l) }
func (o *recObserver) Sampled(string, int, time.Duration) {}

func TestTrackerRemote(t *testing.T) {
	tr := NewTracker(TrackerOptions{Index: exactIndex})
	obs := &recObserver{}
	tr.SetObserver(obs)
	r := &Request{PromptTokens: 100, BlockHashes: hashes(4, 0, "")}
	tr.Dispatched("a", r)
	tr.SetRemote("peer1", "a", ReplicaLoad{InFlight: 3, Prefill: 2, PromptTokens: 200, Uncached: 150, Version: 5})
	tr.SetRemote("peer2", "a", ReplicaLoad{InFlight: 1, Version: 1})
	tr.SetRemote("peer1", "a", ReplicaLoad{InFlight: 9, Version: 4}) // stale: ignored

	apply := func() *Pod {
		p := mkPod("a")
		tr.Apply([]*Pod{p})
		return p
	}
	if p := apply(); p.InFlight != 5 || p.InFlightPrefill != 3 || p.InFlightPromptTokens != 300 || p.InFlightUncachedTokens != 250 {
		t.Fatalf("sum = %d/%d/%d/%d, want 5/3/300/250", p.InFlight, p.InFlightPrefill, p.InFlightPromptTokens, p.InFlightUncachedTokens)
	}
	if got := tr.LocalLoads()["a"]; got.InFlight != 1 || got.PromptTokens != 100 {
		t.Fatalf("local load = %+v, want only the local request", got)
	}
	tr.DropRemote("peer1")
	if p := apply(); p.InFlight != 2 {
		t.Fatalf("after dropping peer1 in flight = %d, want 2", p.InFlight)
	}
	tr.SetRemote("peer2", "a", ReplicaLoad{Version: 2}) // completed
	tr.Done("a", r)
	if p := apply(); p.InFlight != 0 || p.InFlightUncachedTokens != 0 {
		t.Fatalf("after completions in flight = %d, uncached %d, want 0", p.InFlight, p.InFlightUncachedTokens)
	}
	if len(obs.loads) != 2 || obs.blocks != 4 || obs.loads[0].InFlight != 1 || obs.loads[1].InFlight != 0 || obs.loads[1].Version <= obs.loads[0].Version {
		t.Fatalf("observer saw %+v (%d blocks), want dispatch then done with growing versions", obs.loads, obs.blocks)
	}
	// A pod removed and added again keeps growing versions, or peers
	// would ignore it as stale.
	v := obs.loads[len(obs.loads)-1].Version
	tr.RemovePod("a")
	tr.Dispatched("a", &Request{PromptTokens: 1})
	if got := obs.loads[len(obs.loads)-1].Version; got <= v {
		t.Fatalf("version after re-adding the pod = %d, want > %d", got, v)
	}
	tr.RecordRemote("b", hashes(4, 0, ""))
	if n := tr.Index().PodLen("b"); n != 4 {
		t.Fatalf("remote blocks recorded = %d, want 4", n)
	}
}
