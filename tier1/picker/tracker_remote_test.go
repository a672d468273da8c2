package picker

import (
	"testing"
	"time"

	"github.com/infergate/infergate/tier1/prefix"
)

// TestDropRemoteFreesPeersOnlyPods: entries that only peers' state made
// (loads, samples for pods this replica never used) go with the last
// peer counting on them; pods with local state stay.
func TestDropRemoteFreesPeersOnlyPods(t *testing.T) {
	tr := NewTracker(TrackerOptions{})
	r := &Request{PromptTokens: 100}
	tr.Dispatched("mine", r)
	tr.SetRemote("peer1", "mine", ReplicaLoad{InFlight: 2, Version: 1})
	tr.SetRemote("peer1", "ghost", ReplicaLoad{InFlight: 5, Version: 2})
	tr.SetRemote("peer2", "shared", ReplicaLoad{InFlight: 1, Version: 1})
	tr.SetRemote("peer1", "shared", ReplicaLoad{InFlight: 1, Version: 3})
	tr.RemoteSample("sampled", 4096, 100*time.Millisecond)
	if n := tr.PodStates(); n != 4 {
		t.Fatalf("pods = %d, want 4", n)
	}
	tr.DropRemote("peer1")
	if n := tr.PodStates(); n != 2 || tr.InFlight("mine") != 1 || tr.InFlight("shared") != 1 {
		t.Fatalf("after peer1: %d pods, mine %d, shared %d; want mine and shared (peer2 still counts) only",
			n, tr.InFlight("mine"), tr.InFlight("shared"))
	}
	tr.DropRemote("peer2")
	if n := tr.PodStates(); n != 1 {
		t.Fatalf("after peer2: %d pods, want only the local one", n)
	}
	// A pod first seen from a peer and then used locally is local.
	tr.SetRemote("peer3", "adopted", ReplicaLoad{InFlight: 1, Version: 1})
	tr.Dispatched("adopted", &Request{PromptTokens: 1})
	tr.DropRemote("peer3")
	if tr.InFlight("adopted") != 1 {
		t.Fatal("a pod with local state was freed with the peer's")
	}
}

// TestRecordRemoteKeyed: a peer's records are keyed like the local ones,
// so the local requests' raw hashes match them.
func TestRecordRemoteKeyed(t *testing.T) {
	k, err := prefix.NewKey([]byte("0123456789abcdef"))
	if err != nil {
		t.Fatal(err)
	}
	tr := NewTracker(TrackerOptions{})
	tr.Index().SetKey(k)
	raw := []uint64{7, 8, 9}
	keyed := append([]uint64(nil), raw...)
	k.Apply(keyed)
	tr.RecordRemote("a", keyed)
	if got := tr.Index().Match(raw, []string{"a"}, nil); got[0] != 3 {
		t.Fatalf("match = %v, want 3 blocks", got)
	}
}
