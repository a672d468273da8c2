package peers

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/infergate/infergate/internal/testpki"
	"github.com/infergate/infergate/tier1/peers/meshpb"
	"github.com/infergate/infergate/tier1/picker"
)

// openStream is an insider's stream (a certificate from the mesh CA) to
// addr, hello sent; close it with the returned func.
func openStream(t *testing.T, addr string, m *TLS, id string) (meshpb.Mesh_ShareClient, func()) {
	t.Helper()
	conn, err := grpc.NewClient("passthrough:///"+addr, grpc.WithTransportCredentials(credentials.NewTLS(m.Client)))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	stream, err := meshpb.NewMeshClient(conn).Share(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := stream.Recv(); err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(helloFrame(id)); err != nil {
		t.Fatal(err)
	}
	return stream, func() { cancel(); conn.Close() }
}

func heapMB() float64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return float64(ms.HeapAlloc) / (1 << 20)
}

// floodBatch names per distinct pods, starting at from, with non-zero
// loads, a dispatch record and a prefill sample each.
func floodBatch(from, per int, records bool) *meshpb.Frame {
	b := &meshpb.Batch{}
	for i := from; i < from+per; i++ {
		pod := fmt.Sprintf("ghost-%06d", i)
		b.Loads = append(b.Loads, &meshpb.Load{Pod: pod, Version: uint64(i + 1), InFlight: 3, Prefill: 1, PromptTokens: 900, UncachedTokens: 900})
		b.Samples = append(b.Samples, &meshpb.Sample{Pod: pod, Tokens: 4096, Micros: 90000})
		if records {
			b.Dispatches = append(b.Dispatches, &meshpb.Dispatch{Pod: pod, BlockHashes: []uint64{uint64(i), uint64(i) + 1}})
		}
	}
	return batchFrame(b)
}

// TestUnknownPodFloodBounded: the issue's flood (~62k unknown pod names
// in 10 s took the heap from 7 to 182 MB, still 175 MB after the sender
// expired). A stream holds state for at most MaxPods pods, and what it
// held is freed when it expires: the tracker's entry count returns to
// its baseline.
func TestUnknownPodFloodBounded(t *testing.T) {
	mesh := newMeshPKI(t, "mesh")
	opts := fastOpts(mesh.tls(t))
	opts.MaxPods = 100
	r := start(t, listen(t), opts, nil)
	r.tr.Dispatched("p0", &picker.Request{PromptTokens: 10}) // the replica's own state
	base, heap0 := r.tr.PodStates(), heapMB()

	stream, done := openStream(t, r.addr, mesh.tls(t), "flooder")
	const msgs, per = 60, 1000
	for i := range msgs {
		if err := stream.Send(floodBatch(i*per, per, false)); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, "the flood applied", func() bool { return r.node.Stats().FramesRecv == msgs })
	heap1 := heapMB()
	if got := r.tr.PodStates(); got != base+opts.MaxPods {
		t.Fatalf("tracker holds %d pods during the flood, want %d (baseline %d + the stream's cap)", got, base+opts.MaxPods, base)
	}
	if s := r.node.Stats(); s.Ignored < 2*(msgs*per-uint64(opts.MaxPods)) {
		t.Fatalf("stats %+v: want every entry past the cap ignored and counted", s)
	}
	done()
	eventually(t, "the flooder's entries freed on expiry", func() bool { return r.tr.PodStates() == base })
	t.Logf("heap %.1f MB before, %.1f MB during %d unknown pod names, %.1f MB after expiry (logged, not asserted)",
		heap0, heap1, msgs*per, heapMB())
	if r.tr.InFlight("p0") != 1 {
		t.Fatalf("the replica's own state changed: %d in flight on p0", r.tr.InFlight("p0"))
	}
}

// TestUnknownPodsIgnored: with Known (as tier1/server sets it, from the
// gateway's pods), names the replica does not route to never reach the
// tracker or the prefix index.
func TestUnknownPodsIgnored(t *testing.T) {
	mesh := newMeshPKI(t, "mesh")
	opts := fastOpts(mesh.tls(t))
	opts.Known = func(pod string) bool { return pod == "p0" }
	r := start(t, listen(t), opts, nil)
	stream, done := openStream(t, r.addr, mesh.tls(t), "flooder")
	defer done()
	for i := range 5 {
		if err := stream.Send(floodBatch(i*1000, 1000, true)); err != nil {
			t.Fatal(err)
		}
	}
	if err := stream.Send(batchFrame(&meshpb.Batch{Loads: []*meshpb.Load{{Pod: "p0", Version: 1, InFlight: 2}}})); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the known pod's load", func() bool { return r.tr.InFlight("p0") == 2 })
	if n, x := r.tr.PodStates(), r.tr.Index().Len(); n != 1 || x != 0 {
		t.Fatalf("tracker holds %d pods and %d index entries, want only p0's state", n, x)
	}
	if s := r.node.Stats(); s.Ignored != 3*5000 {
		t.Fatalf("ignored %d entries, want %d", s.Ignored, 3*5000)
	}
}

// syncBuffer is a log destination for concurrent writers.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) count(sub string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return strings.Count(s.b.String(), sub)
}

// TestRefusalLogsRateLimited: every bad handshake used to log a WARN
// line. Thirty connections with a foreign certificate are all counted,
// and logged once.
func TestRefusalLogsRateLimited(t *testing.T) {
	mesh, other := newMeshPKI(t, "mesh"), newMeshPKI(t, "attacker")
	var logs syncBuffer
	opts := fastOpts(mesh.tls(t))
	opts.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	opts.LogEvery = time.Hour
	r := start(t, listen(t), opts, nil)
	cert := other.ca.Issue(t, testpki.LeafOptions{})
	creds := credentials.NewTLS(attackerTLS(t, mesh, &cert))
	for range 30 {
		if err := inject(t, r.addr, creds, helloFrame("attacker")); err == nil {
			t.Fatal("a foreign certificate was accepted")
		}
	}
	eventually(t, "every refusal counted", func() bool { return r.node.Stats().Rejected == 30 })
	if n := logs.count("peer connection refused"); n != 1 {
		t.Fatalf("%d log lines for 30 refusals, want 1:\n%s", n, logs.b.String())
	}
}

func TestRateLog(t *testing.T) {
	var logs syncBuffer
	now := time.Unix(1000, 0)
	r := newRateLog(slog.New(slog.NewTextHandler(&logs, nil)), 10*time.Second, func() time.Time { return now })
	for range 5 {
		r.Warn("refused", "remote", "x")
	}
	r.Flush("more refused") // within the interval: nothing
	if n := logs.count("msg="); n != 1 || logs.count("events=1") != 1 {
		t.Fatalf("after 5 events in one interval:\n%s", logs.b.String())
	}
	now = now.Add(11 * time.Second)
	r.Flush("more refused")
	if logs.count(`msg="more refused" events=4`) != 1 {
		t.Fatalf("flush after the interval did not count the 4 left out:\n%s", logs.b.String())
	}
	now = now.Add(11 * time.Second)
	r.Warn("refused", "remote", "y")
	if logs.count("remote=y events=1") != 1 {
		t.Fatalf("a new event after a quiet interval:\n%s", logs.b.String())
	}
}
