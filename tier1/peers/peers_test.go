package peers

import (
	"context"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/infergate/infergate/tier1/picker"
	"github.com/infergate/infergate/tier1/prefix"
)

// replica is one Tier 1 replica's tracker and node, on a real socket.
type replica struct {
	tr     *picker.Tracker
	node   *Node
	addr   string
	cancel context.CancelFunc
	done   chan struct{}
}

func fastOpts(token string) Options {
	return Options{Token: token, Flush: 2 * time.Millisecond, Heartbeat: 20 * time.Millisecond,
		TTL: 300 * time.Millisecond, Refresh: 50 * time.Millisecond}
}

func listen(t *testing.T) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return ln
}

func start(t *testing.T, ln net.Listener, opts Options, peers *Static) *replica {
	t.Helper()
	tr := picker.NewTracker(picker.TrackerOptions{})
	if peers != nil {
		opts.Discover = discoverFunc(func() []string { return *peers })
	}
	n, err := New(tr, opts)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &replica{tr: tr, node: n, addr: ln.Addr().String(), cancel: cancel, done: make(chan struct{})}
	go func() { defer close(r.done); _ = n.Run(ctx, ln) }()
	t.Cleanup(r.stop)
	return r
}

func (r *replica) stop() {
	r.cancel()
	<-r.done
}

type discoverFunc func() []string

func (f discoverFunc) Peers(context.Context) ([]string, error) { return f(), nil }

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func replicas(t *testing.T, n int, opts Options) []*replica {
	t.Helper()
	lns := make([]net.Listener, n)
	addrs := make(Static, n)
	for i := range lns {
		lns[i] = listen(t)
		addrs[i] = lns[i].Addr().String()
	}
	rs := make([]*replica, n)
	for i := range rs {
		// Every replica is given the full list, itself included, as a
		// headless Service's DNS answer would be.
		rs[i] = start(t, lns[i], opts, &addrs)
	}
	for _, r := range rs {
		eventually(t, "every replica connected to its peers", func() bool { return r.node.Stats().Connected == n-1 })
	}
	return rs
}

func TestDispatchSharedAndCompleted(t *testing.T) {
	rs := replicas(t, 3, fastOpts("s3cret"))
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
}

// TestLongPromptShared: a prompt with more block hashes than a record
// carries reaches the peers as its leading maxHashes blocks, not as a
// malformed frame that would drop the connection.
func TestLongPromptShared(t *testing.T) {
	rs := replicas(t, 2, fastOpts("s3cret"))
	hashes := make([]uint64, prefix.DefaultPromptBlocks+100)
	for i := range hashes {
		hashes[i] = uint64(i) + 1
	}
	rs[0].tr.Dispatched("pod-a", &picker.Request{PromptTokens: 16 * len(hashes), BlockHashes: hashes})
	eventually(t, "the long prompt on the peer", func() bool { return rs[1].tr.Index().PodLen("pod-a") == min(len(hashes), maxHashes) })
	if s := rs[1].node.Stats(); s.Rejected != 0 {
		t.Fatalf("peer stats %+v: frame rejected", s)
	}
	rs[0].tr.Dispatched("pod-b", &picker.Request{PromptTokens: 1, BlockHashes: []uint64{7}})
	eventually(t, "sharing after the long prompt", func() bool { return rs[1].tr.Index().PodLen("pod-b") == 1 })
}

func TestKilledReplicaExpires(t *testing.T) {
	rs := replicas(t, 3, fastOpts("s3cret"))
	rs[2].tr.Dispatched("pod-b", &picker.Request{PromptTokens: 100})
	rs[2].tr.Dispatched("pod-b", &picker.Request{PromptTokens: 100})
	for _, r := range rs[:2] {
		eventually(t, "the dispatches on the peers", func() bool { return r.tr.InFlight("pod-b") == 2 })
	}
	rs[2].stop() // dies with two requests in flight, never completes them
	for _, r := range rs[:2] {
		eventually(t, "the dead replica's in-flight expiring", func() bool { return r.tr.InFlight("pod-b") == 0 })
		if s := r.node.Stats(); s.Expired == 0 {
			t.Fatalf("stats %+v: no expiry counted", s)
		}
	}
	// The survivors still share.
	rs[0].tr.Dispatched("pod-c", &picker.Request{PromptTokens: 1})
	eventually(t, "sharing between the survivors", func() bool { return rs[1].tr.InFlight("pod-c") == 1 })
}

func TestBadTokenRefused(t *testing.T) {
	ln := listen(t)
	good := start(t, ln, fastOpts("right"), nil)
	bad := start(t, listen(t), fastOpts("wrong"), &Static{good.addr})
	bad.tr.Dispatched("pod-a", &picker.Request{PromptTokens: 1, BlockHashes: []uint64{1, 2}})
	eventually(t, "the connection refused", func() bool { return good.node.Stats().Rejected >= 1 })
	time.Sleep(100 * time.Millisecond) // several heartbeats: nothing may count
	if n := good.tr.InFlight("pod-a"); n != 0 || good.tr.Index().Len() != 0 || good.node.Stats().FramesRecv != 0 {
		t.Fatalf("state from a peer with a bad token was applied: in flight %d, index %d", n, good.tr.Index().Len())
	}
	if s := bad.node.Stats(); s.Connected != 0 {
		t.Fatalf("sender with a bad token counts %d connections", s.Connected)
	}
}

func TestNoTokenNeedsExplicitOptOut(t *testing.T) {
	if _, err := New(picker.NewTracker(picker.TrackerOptions{}), Options{}); err == nil {
		t.Fatal("New without token or DisableAuth succeeded")
	}
	if _, err := New(picker.NewTracker(picker.TrackerOptions{}), Options{DisableAuth: true}); err != nil {
		t.Fatal(err)
	}
}

func TestQueueFullDropsAndCounts(t *testing.T) {
	tr := picker.NewTracker(picker.TrackerOptions{})
	n, err := New(tr, Options{Token: "t", QueueLen: 4})
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
	opts := fastOpts("s3cret")
	opts.QueueLen = 1
	rs := replicas(t, 2, opts)
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
