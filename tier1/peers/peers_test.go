package peers

import (
	"sync"
	"testing"
	"time"

	"github.com/infergate/infergate/internal/testpki"
	"github.com/infergate/infergate/tier1/picker"
	"github.com/infergate/infergate/tier1/prefix"
)

func TestDispatchSharedAndCompleted(t *testing.T) {
	rs := replicas(t, 3, newMeshPKI(t, "mesh"), nil)
	req := &picker.Request{PromptTokens: 640, BlockHashes: []uint64{11, 12, 13, 14}}
	sent := time.Now()
	rs[0].tr.Dispatched("pod-a", req)
	for deadline := sent.Add(10 * time.Second); rs[1].tr.InFlight("pod-a") != 1 && time.Now().Before(deadline); {
		time.Sleep(50 * time.Microsecond)
	}
	t.Logf("dispatch visible on a peer after %v (logged, not asserted)", time.Since(sent))
	for _, r := range rs[1:] {
		eventually(t, "the dispatch on the peers", func() bool {
			p := &picker.Pod{Name: "pod-a"}
			r.tr.Apply([]*picker.Pod{p})
			return p.InFlight == 1 && p.InFlightPromptTokens == 640 && r.tr.Index().PodLen("pod-a") == 4
		})
		got := r.tr.Index().Match([]uint64{11, 12, 13, 14, 15}, []string{"pod-a", "pod-b"}, nil)
		if got[0] != 4 || got[1] != 0 {
			t.Fatalf("prefix match on a peer = %v, want [4 0]", got)
		}
	}
	if n := rs[0].tr.RemoteInFlight("pod-a"); n != 0 {
		t.Fatalf("origin counts its own dispatch as remote too: %d", n)
	}
	rs[0].tr.FirstToken("pod-a", req, 50*time.Millisecond)
	for _, r := range rs[1:] {
		eventually(t, "the prefill-speed sample on the peers", func() bool { return r.tr.PrefillTokensPerSec("pod-a") == 640/0.05 })
	}
	rs[0].tr.Done("pod-a", req)
	for _, r := range rs[1:] {
		eventually(t, "the completion on the peers", func() bool {
			p := &picker.Pod{Name: "pod-a"}
			r.tr.Apply([]*picker.Pod{p})
			return p.InFlight == 0 && p.InFlightPrefill == 0 && p.InFlightPromptTokens == 0
		})
	}
	for _, r := range rs {
		if s := r.node.Stats(); s.Rejected != 0 || s.Ignored != 0 {
			t.Errorf("stats %+v: a replica of the mesh was refused or ignored", s)
		}
	}
}

// TestLongPromptShared: a prompt with more block hashes than a record
// carries reaches the peers as its leading maxHashes blocks, not as a
// message that would close the stream.
func TestLongPromptShared(t *testing.T) {
	rs := replicas(t, 2, newMeshPKI(t, "mesh"), nil)
	hashes := make([]uint64, prefix.DefaultPromptBlocks+100)
	for i := range hashes {
		hashes[i] = uint64(i) + 1
	}
	rs[0].tr.Dispatched("pod-a", &picker.Request{PromptTokens: 16 * len(hashes), BlockHashes: hashes})
	eventually(t, "the long prompt on the peer", func() bool { return rs[1].tr.Index().PodLen("pod-a") == min(len(hashes), maxHashes) })
	if s := rs[1].node.Stats(); s.Rejected != 0 {
		t.Fatalf("peer stats %+v: message rejected", s)
	}
	rs[0].tr.Dispatched("pod-b", &picker.Request{PromptTokens: 1, BlockHashes: []uint64{7}})
	eventually(t, "sharing after the long prompt", func() bool { return rs[1].tr.Index().PodLen("pod-b") == 1 })
}

func TestKilledReplicaExpires(t *testing.T) {
	rs := replicas(t, 3, newMeshPKI(t, "mesh"), nil)
	rs[2].tr.Dispatched("pod-b", &picker.Request{PromptTokens: 100})
	rs[2].tr.Dispatched("pod-b", &picker.Request{PromptTokens: 100})
	for _, r := range rs[:2] {
		eventually(t, "the dispatches on the peers", func() bool { return r.tr.InFlight("pod-b") == 2 })
	}
	rs[2].stop() // dies with two requests in flight, never completes them
	for _, r := range rs[:2] {
		eventually(t, "the dead replica's in-flight expiring", func() bool { return r.tr.InFlight("pod-b") == 0 })
		if s := r.node.Stats(); s.Expired == 0 || s.Origins != 1 {
			t.Fatalf("stats %+v: want the dead replica expired and one peer live", s)
		}
	}
	// The survivors still share.
	rs[0].tr.Dispatched("pod-c", &picker.Request{PromptTokens: 1})
	eventually(t, "sharing between the survivors", func() bool { return rs[1].tr.InFlight("pod-c") == 1 })
}

// TestReachedTwiceCountsOnce: a replica discovered under two addresses
// (a static entry and a DNS name, say) opens two streams to the same
// peer; only the newer one counts, so nothing is counted twice.
func TestReachedTwiceCountsOnce(t *testing.T) {
	pki := newMeshPKI(t, "mesh")
	ln := listen(t)
	recv := start(t, ln, fastOpts(pki.tls(t)), nil)
	_, port, _ := splitHostPort(recv.addr)
	sender := start(t, listen(t), fastOpts(pki.tls(t)), &Static{recv.addr, "localhost:" + port})
	eventually(t, "two streams to the same peer", func() bool { return sender.node.Stats().Connected == 2 })
	for range 3 {
		sender.tr.Dispatched("pod-a", &picker.Request{PromptTokens: 10})
	}
	eventually(t, "the dispatches on the peer", func() bool { return recv.tr.InFlight("pod-a") == 3 })
	time.Sleep(100 * time.Millisecond) // several heartbeats on both streams
	if n, s := recv.tr.InFlight("pod-a"), recv.node.Stats(); n != 3 || s.Origins != 1 {
		t.Fatalf("in flight %d, stats %+v: want 3 counted once, from one origin", n, s)
	}
}

func TestNoTLSNeedsExplicitOptOut(t *testing.T) {
	tr := picker.NewTracker(picker.TrackerOptions{Index: exactIndex})
	if _, err := New(tr, Options{}); err == nil {
		t.Fatal("New without TLS or InsecurePlaintext succeeded")
	}
	if _, err := New(tr, Options{TLS: &TLS{}}); err == nil {
		t.Fatal("New with an empty TLS succeeded")
	}
	if _, err := New(tr, Options{InsecurePlaintext: true}); err != nil {
		t.Fatal(err)
	}
}

// TestPlaintextMesh: the explicit development opt-out still shares.
func TestPlaintextMesh(t *testing.T) {
	a, b := listen(t), listen(t)
	addrs := Static{a.Addr().String(), b.Addr().String()}
	opts := fastOpts(nil)
	opts.InsecurePlaintext = true
	ra := start(t, a, opts, &addrs)
	rb := start(t, b, opts, &addrs)
	ra.tr.Dispatched("pod-a", &picker.Request{PromptTokens: 1})
	eventually(t, "sharing in plaintext", func() bool { return rb.tr.InFlight("pod-a") == 1 })
}

func TestLoadTLSRefusesForeignCertificate(t *testing.T) {
	mesh, other := newMeshPKI(t, "mesh"), newMeshPKI(t, "other")
	f := other.files(t, testpki.LeafOptions{})
	f.CAFile = mesh.files(t, testpki.LeafOptions{}).CAFile
	_, err := LoadTLS(t.Context(), f, tlsOptions())
	if err == nil || !contains(err.Error(), f.CertFile) || !contains(err.Error(), f.CAFile) {
		t.Fatalf("err = %v, want it to name %s and %s", err, f.CertFile, f.CAFile)
	}
	if _, err := LoadTLS(t.Context(), TLSFiles{CertFile: f.CertFile, KeyFile: f.KeyFile}, tlsOptions()); err == nil {
		t.Fatal("LoadTLS without a CA succeeded")
	}
}

func TestQueueFullDropsAndCounts(t *testing.T) {
	tr := picker.NewTracker(picker.TrackerOptions{Index: exactIndex})
	n, err := New(tr, Options{InsecurePlaintext: true, QueueLen: 4})
	if err != nil {
		t.Fatal(err)
	}
	// Observe without a flusher draining: the queue fills, and the request
	// path must neither block nor lose its own accounting.
	tr.SetObserver(n)
	var wg sync.WaitGroup
	for range 10 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tr.Dispatched("pod-a", &picker.Request{PromptTokens: 1, BlockHashes: []uint64{1}})
		}()
	}
	wg.Wait()
	if s := n.Stats(); s.Dropped != 6 {
		t.Fatalf("dropped %d changes, want 6 (10 into a queue of 4)", s.Dropped)
	}
	if got := tr.InFlight("pod-a"); got != 10 {
		t.Fatalf("local in flight = %d, want 10", got)
	}
}

func TestHeartbeatHealsDroppedUpdates(t *testing.T) {
	rs := replicas(t, 2, newMeshPKI(t, "mesh"), func(o *Options) { o.QueueLen = 1 })
	reqs := make([]*picker.Request, 50)
	for i := range reqs {
		reqs[i] = &picker.Request{PromptTokens: 10}
		rs[0].tr.Dispatched("pod-a", reqs[i])
	}
	for _, r := range reqs[:20] {
		rs[0].tr.Done("pod-a", r)
	}
	eventually(t, "the peer converging on 30 in flight", func() bool { return rs[1].tr.InFlight("pod-a") == 30 })
}

// TestHashKey: replicas sharing a hash key share prefix records that
// match their own requests' raw hashes; the index holds only keyed
// values; a replica with another key is refused and applies nothing.
func TestHashKey(t *testing.T) {
	key, err := prefix.NewKey([]byte("0123456789abcdef-deployment-one"))
	if err != nil {
		t.Fatal(err)
	}
	pki := newMeshPKI(t, "mesh")
	keyed := func() *picker.Tracker {
		tr := picker.NewTracker(picker.TrackerOptions{Index: exactIndex})
		tr.Index().SetKey(key)
		return tr
	}
	a, b := listen(t), listen(t)
	addrs := Static{a.Addr().String(), b.Addr().String()}
	ra := startWith(t, keyed(), a, fastOpts(pki.tls(t)), &addrs)
	rb := startWith(t, keyed(), b, fastOpts(pki.tls(t)), &addrs)
	eventually(t, "the keyed replicas connected", func() bool {
		return ra.node.Stats().Connected == 1 && rb.node.Stats().Connected == 1
	})
	raw := []uint64{101, 102, 103}
	ra.tr.Dispatched("pod-a", &picker.Request{PromptTokens: 48, BlockHashes: raw})
	eventually(t, "the keyed record on the peer", func() bool { return rb.tr.Index().PodLen("pod-a") == 3 })
	if got := rb.tr.Index().Match(raw, []string{"pod-a"}, nil); got[0] != 3 {
		t.Fatalf("peer's match of the raw hashes = %v, want 3 blocks", got)
	}
	// The peer's index holds keyed values: without the key, the raw
	// hashes match nothing there.
	if got := rb.tr.Index().Match([]uint64{key.Sum(raw[0])}, []string{"pod-a"}, nil); got[0] != 0 {
		t.Fatalf("a keyed value matched as raw: %v", got)
	}

	// A replica with another key (or none) cannot feed records that can
	// never match: its streams are refused.
	c := listen(t)
	rc := start(t, c, fastOpts(pki.tls(t)), &Static{rb.addr})
	rc.tr.Dispatched("pod-z", &picker.Request{PromptTokens: 1, BlockHashes: []uint64{9}})
	eventually(t, "the unkeyed replica refused", func() bool { return rb.node.Stats().Rejected >= 1 })
	time.Sleep(100 * time.Millisecond)
	if rb.tr.InFlight("pod-z") != 0 || rb.tr.Index().PodLen("pod-z") != 0 || rc.node.Stats().Connected != 0 {
		t.Fatalf("state from a replica with another hash key was applied (connected %d)", rc.node.Stats().Connected)
	}
}
