package peers

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"math"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/infergate/infergate/internal/testpki"
	"github.com/infergate/infergate/internal/testservice"
	"github.com/infergate/infergate/tier1/peers/meshpb"
	"github.com/infergate/infergate/tier1/picker"
	"github.com/infergate/infergate/tier1/register"
)

// The attacks of issue #28, replayed against the gRPC mesh. The old mesh
// let anything a replica dialled relay another replica's challenge and
// hold an authenticated stream under the dialler's ID, then inject a pod
// with 2^31 requests in flight at version 2^64−1, which outranked every
// later real update. Here every hop is real TLS on a real socket.

// poison is the issue's payload: the count that made every replica route
// away from p0, at a version no later update could beat.
func poison(pod string) *meshpb.Frame {
	return batchFrame(&meshpb.Batch{Loads: []*meshpb.Load{{Pod: pod, Version: math.MaxUint64, InFlight: 1 << 31, Prefill: 1 << 31}}})
}

func batchFrame(b *meshpb.Batch) *meshpb.Frame {
	return &meshpb.Frame{Kind: &meshpb.Frame_Batch{Batch: b}}
}

func helloFrame(id string) *meshpb.Frame {
	return &meshpb.Frame{Kind: &meshpb.Frame_Hello{Hello: &meshpb.Hello{ReplicaId: id}}}
}

// attackerTLS is a client configuration an attacker can build: it trusts
// the mesh CA (a certificate is public) and presents cert, or nothing.
func attackerTLS(t *testing.T, mesh *meshPKI, cert *testpki.Leaf) *tls.Config {
	t.Helper()
	pool := x509.NewCertPool()
	pool.AddCert(mesh.ca.Cert)
	cfg := &tls.Config{RootCAs: pool, ServerName: "localhost", MinVersion: tls.VersionTLS12}
	if cert != nil {
		pair, err := tls.X509KeyPair(cert.CertPEM, cert.KeyPEM)
		if err != nil {
			t.Fatal(err)
		}
		cfg.Certificates = []tls.Certificate{pair}
	}
	return cfg
}

// inject opens a Share stream to addr with creds and sends frames; it
// returns the first error (nil: everything was sent and the stream was
// not refused within a moment).
func inject(t *testing.T, addr string, creds credentials.TransportCredentials, frames ...*meshpb.Frame) error {
	t.Helper()
	conn, err := grpc.NewClient("passthrough:///"+addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	stream, err := meshpb.NewMeshClient(conn).Share(ctx)
	if err != nil {
		return err
	}
	if _, err := stream.Recv(); err != nil { // the server's hello
		return err
	}
	for _, f := range frames {
		if err := stream.Send(f); err != nil {
			return err
		}
	}
	_ = stream.CloseSend()
	_, err = stream.Recv() // the server ends the stream: with an error if it refused
	if errors.Is(err, io.EOF) {
		return nil
	}
	return err
}

// TestForeignOrNoCertificateCannotJoin: a process holding a certificate
// from another CA, none, or no TLS at all cannot open a stream to a
// replica; one serving such a certificate is not streamed to when a
// replica dials it. Nothing of theirs is applied.
func TestForeignOrNoCertificateCannotJoin(t *testing.T) {
	mesh, other := newMeshPKI(t, "mesh"), newMeshPKI(t, "attacker")
	good := start(t, listen(t), fastOpts(mesh.tls(t)), nil)
	foreign := other.ca.Issue(t, testpki.LeafOptions{})
	for _, tt := range []struct {
		name  string
		creds credentials.TransportCredentials
	}{
		{"certificate from another CA", credentials.NewTLS(attackerTLS(t, mesh, &foreign))},
		{"no certificate", credentials.NewTLS(attackerTLS(t, mesh, nil))},
		{"no TLS", insecureCreds()},
	} {
		t.Run(tt.name, func(t *testing.T) {
			before := good.node.Stats().Rejected
			if err := inject(t, good.addr, tt.creds, helloFrame("attacker"), poison("p0")); err == nil {
				t.Fatal("the stream was accepted")
			}
			eventually(t, "the refusal counted", func() bool { return good.node.Stats().Rejected > before })
		})
	}
	// A node of another mesh (another CA) dialling the replica, and the
	// replica dialling it: neither end accepts the other.
	attacker := start(t, listen(t), fastOpts(other.tls(t)), &Static{good.addr})
	attacker.tr.Dispatched("p0", &picker.Request{PromptTokens: 1 << 20, BlockHashes: []uint64{1, 2}})
	dialler := start(t, listen(t), fastOpts(mesh.tls(t)), &Static{attacker.addr})
	time.Sleep(200 * time.Millisecond) // several reconnects and heartbeats
	if s := attacker.node.Stats(); s.Connected != 0 || s.FramesRecv != 0 {
		t.Errorf("attacker node %+v: it connected or received", s)
	}
	if s := dialler.node.Stats(); s.Connected != 0 {
		t.Errorf("replica %+v: streams to a server with a foreign certificate", s)
	}
	if good.tr.PodStates() != 0 || good.tr.Index().Len() != 0 || good.node.Stats().FramesRecv != 0 {
		t.Fatalf("state from outside the mesh applied: %d pods, %d index entries", good.tr.PodStates(), good.tr.Index().Len())
	}
}

// fakePeer is an attacker's Mesh server: it records every stream that
// reached it, whatever certificate the client showed.
type fakePeer struct {
	meshpb.UnimplementedMeshServer
	streams atomic.Int64
}

func (f *fakePeer) Share(s meshpb.Mesh_ShareServer) error {
	f.streams.Add(1)
	_ = s.Send(&meshpb.Hello{ReplicaId: "attacker"})
	for {
		if _, err := s.Recv(); err != nil {
			return nil
		}
	}
}

// serveFake serves an attacker's Mesh on ln with cert. It asks for a
// client certificate and accepts any: certs counts those it was shown.
// A replica verifies the server before it sends its own, so a replica
// dialling it shows none.
func serveFake(t *testing.T, ln net.Listener, cert testpki.Leaf) (*fakePeer, *atomic.Int64) {
	t.Helper()
	pair, err := tls.X509KeyPair(cert.CertPEM, cert.KeyPEM)
	if err != nil {
		t.Fatal(err)
	}
	var certs atomic.Int64
	cfg := &tls.Config{Certificates: []tls.Certificate{pair}, NextProtos: []string{"h2"}, ClientAuth: tls.RequestClientCert,
		VerifyPeerCertificate: func(raw [][]byte, _ [][]*x509.Certificate) error {
			if len(raw) > 0 {
				certs.Add(1)
			}
			return nil
		}}
	f := &fakePeer{}
	srv := grpc.NewServer(grpc.Creds(credentials.NewTLS(cfg)))
	meshpb.RegisterMeshServer(srv, f)
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(srv.Stop)
	return f, &certs
}

// TestConsulRegisteredAttackerCannotJoin: one service registration in
// Consul got the attacker dialled by every replica of the old mesh. Here
// a replica finds a peer and an attacker through a real Consul agent,
// streams to the peer, and the attacker (a certificate from another CA)
// gets neither a stream from it nor one into it.
func TestConsulRegisteredAttackerCannotJoin(t *testing.T) {
	if testing.Short() {
		t.Skip("starts Consul")
	}
	// Discovery pairs every instance's address with one peer port, as in
	// a cluster: replica, peer and attacker listen on the same port of
	// three loopback addresses.
	lnR := listen(t)
	_, port, _ := net.SplitHostPort(lnR.Addr().String())
	lnPeer, err := net.Listen("tcp", "127.0.0.3:"+port)
	if err != nil {
		t.Skipf("second loopback address: %v", err)
	}
	lnAttacker := listenOn(t, "127.0.0.2:"+port)

	consul := testservice.StartConsul(t)
	client, err := api.NewClient(&api.Config{Address: consul.Addr()})
	if err != nil {
		t.Fatal(err)
	}
	ready := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	defer ready.Close()
	u, _ := url.Parse(ready.URL)
	apiPort, _ := strconv.Atoi(u.Port())
	for _, addr := range []string{"127.0.0.1", "127.0.0.2", "127.0.0.3"} {
		if _, err := register.Register(context.Background(), client, register.Registration{
			ID: "infergate-tier1-" + addr, Address: addr, Port: apiPort, Region: "r", Cluster: "east", Models: []string{"m"},
			CheckHTTP: ready.URL + "/ready", CheckInterval: time.Second, InitialStatus: "passing",
		}); err != nil {
			t.Fatal(err)
		}
	}
	p, _ := strconv.Atoi(port)
	disc := Consul{Client: client, Cluster: "east", Port: p}
	eventually(t, "three instances in Consul", func() bool {
		got, err := disc.Peers(context.Background())
		return err == nil && len(got) == 3
	})

	// Certificates name the mesh's Service, as in Kubernetes, where
	// peers are dialled by pod IP.
	mesh, other := newMeshPKI(t, "mesh"), newMeshPKI(t, "attacker")
	issue := func(p *meshPKI) TLSFiles {
		f := p.files(t, testpki.LeafOptions{DNSNames: []string{"tier1-peers.mesh"}})
		f.ServerName = "tier1-peers.mesh"
		return f
	}
	fake, shown := serveFake(t, lnAttacker, other.ca.Issue(t, testpki.LeafOptions{DNSNames: []string{"tier1-peers.mesh"}}))
	peerOpts := fastOpts(loadTLS(t, issue(mesh)))
	peerOpts.Refresh = time.Hour
	peerR := start(t, lnPeer, peerOpts, nil)
	opts := fastOpts(loadTLS(t, issue(mesh)))
	opts.Discover = disc
	r := start(t, lnR, opts, nil)

	eventually(t, "the replica streaming to its peer found in Consul", func() bool { return peerR.node.Stats().Origins == 1 })
	eventually(t, "the replica recognising itself", func() bool {
		r.node.mu.Lock()
		defer r.node.mu.Unlock()
		return r.node.self[lnR.Addr().String()]
	})
	r.tr.Dispatched("p0", &picker.Request{PromptTokens: 10, BlockHashes: []uint64{5}})
	eventually(t, "the dispatch on the peer", func() bool { return peerR.tr.InFlight("p0") == 1 })
	time.Sleep(200 * time.Millisecond) // the replica keeps redialling the attacker meanwhile
	if n := fake.streams.Load(); n != 0 {
		t.Fatalf("the attacker registered in Consul got %d streams", n)
	}
	if n := shown.Load(); n != 0 {
		t.Fatalf("the replica showed the attacker its certificate %d times", n)
	}
	if s := r.node.Stats(); s.Connected != 1 {
		t.Fatalf("replica stats %+v: want one stream (to the peer), none to the attacker", s)
	}
	// And the attacker, with its certificate, cannot stream into either.
	cert := other.ca.Issue(t, testpki.LeafOptions{})
	for _, target := range []*replica{r, peerR} {
		if err := inject(t, target.addr, credentials.NewTLS(attackerTLS(t, mesh, &cert)), helloFrame(r.node.ID()), poison("p0")); err == nil {
			t.Fatalf("the attacker streamed into %s", target.addr)
		}
	}
	if n := peerR.tr.InFlight("p0"); n != 1 {
		t.Fatalf("peer counts %d in flight on p0, want the replica's 1", n)
	}
}

// relay is the issue's man in the middle, reached because a replica
// dials it: it forwards bytes to target and, once told to, writes forged
// bytes into the replica → target direction.
type relay struct {
	ln     net.Listener
	target string
	inject chan []byte
	cut    chan struct{} // closed when target dropped a connection after an injection
	once   sync.Once
}

func startRelay(t *testing.T, target string) *relay {
	t.Helper()
	r := &relay{ln: listen(t), target: target, inject: make(chan []byte, 1), cut: make(chan struct{})}
	go func() {
		for {
			c, err := r.ln.Accept()
			if err != nil {
				return
			}
			go r.serve(c)
		}
	}()
	t.Cleanup(func() { r.ln.Close() })
	return r
}

func (r *relay) serve(c net.Conn) {
	defer c.Close()
	up, err := net.Dial("tcp", r.target)
	if err != nil {
		return
	}
	defer up.Close()
	injected := make(chan struct{})
	go func() {
		_, _ = io.Copy(c, up) // target → replica; ends when target drops the connection
		select {
		case <-injected:
			r.once.Do(func() { close(r.cut) })
		default:
		}
		c.Close()
	}()
	buf := make([]byte, 32<<10)
	for {
		select {
		case b := <-r.inject:
			// Marked before the write: the target may drop the
			// connection before Write returns.
			close(injected)
			_, _ = up.Write(b)
			_, _ = io.Copy(up, c)
			return
		default:
		}
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Millisecond))
		n, err := c.Read(buf)
		if n > 0 {
			if _, err := up.Write(buf[:n]); err != nil {
				return
			}
		}
		if err != nil && !errors.Is(err, os.ErrDeadlineExceeded) {
			return
		}
	}
}

// TestRelayAttackChangesNothing replays the issue's attack on a two-
// replica mesh and checks that the victim's routing decisions are those
// it makes on the real state alone: before, during and after.
func TestRelayAttackChangesNothing(t *testing.T) {
	mesh, other := newMeshPKI(t, "mesh"), newMeshPKI(t, "attacker")
	lnVictim, lnDialler := listen(t), listen(t)
	// The attacker stands at an address the dialling replica has in its
	// peer list (registered in Consul, say), next to the real peer.
	terminator := listen(t)
	fake, shown := serveFake(t, terminator, other.ca.Issue(t, testpki.LeafOptions{}))
	rl := startRelay(t, lnVictim.Addr().String())
	victim := start(t, lnVictim, fastOpts(mesh.tls(t)), nil)
	list := Static{lnVictim.Addr().String(), terminator.Addr().String(), rl.ln.Addr().String()}
	dialler := start(t, lnDialler, fastOpts(mesh.tls(t)), &list)

	// The real state: the dialler has requests in flight on both pods.
	for range 2 {
		dialler.tr.Dispatched("p0", &picker.Request{PromptTokens: 3000})
	}
	for range 3 {
		dialler.tr.Dispatched("p1", &picker.Request{PromptTokens: 1000})
	}
	eventually(t, "the real state on the victim", func() bool {
		return victim.tr.InFlight("p0") == 2 && victim.tr.InFlight("p1") == 3
	})
	before := picks(t, victim.tr, "p0", "p1")
	// The check can fail: applied, the issue's payload sends every pick
	// to p1.
	poisoned := picker.NewTracker(picker.TrackerOptions{Index: exactIndex})
	poisoned.SetRemote("x", "p0", picker.ReplicaLoad{InFlight: 1 << 31, Prefill: 1 << 31, Version: math.MaxUint64})
	if got := picks(t, poisoned, "p0", "p1"); slices.Equal(got, before) {
		t.Fatalf("picks %v do not depend on the poisoned count; the test could not fail", got)
	}

	// 1. The terminating relay: the dialler refuses its certificate, so
	// it holds nothing to relay; its own streams into the victim are
	// refused.
	cert := other.ca.Issue(t, testpki.LeafOptions{})
	if err := inject(t, victim.addr, credentials.NewTLS(attackerTLS(t, mesh, &cert)), helloFrame(dialler.node.ID()), poison("p0")); err == nil {
		t.Fatal("the attacker's stream was accepted")
	}
	if n, m := shown.Load(), fake.streams.Load(); n != 0 || m != 0 {
		t.Fatalf("the dialler showed the attacker its certificate %d times and opened %d streams", n, m)
	}

	// 2. The transparent relay: the dialler's TLS session runs through
	// it to the victim, so it carries the dialler's real state, and
	// bytes the relay adds break the session instead of being applied.
	eventually(t, "the dialler's stream through the relay", func() bool { return dialler.node.Stats().Connected == 2 })
	forged := append([]byte{23, 3, 3, 0, 64}, make([]byte, 64)...) // a TLS application-data record
	rl.inject <- forged
	select {
	case <-rl.cut:
	case <-time.After(10 * time.Second):
		t.Fatal("the victim kept the session the relay wrote into")
	}

	// 3. An insider (a certificate from the mesh CA) claiming the
	// dialler's ID with the issue's payload: refused as out of bounds.
	insider := credentials.NewTLS(mesh.tls(t).Client)
	if err := inject(t, victim.addr, insider, helloFrame(dialler.node.ID()), poison("p0")); err == nil {
		t.Fatal("out-of-bounds counts were accepted")
	}
	time.Sleep(100 * time.Millisecond)
	if got := picks(t, victim.tr, "p0", "p1"); !slices.Equal(got, before) {
		t.Fatalf("picks changed by the attack: %v, want %v", got, before)
	}
	if victim.tr.InFlight("p0") != 2 || victim.tr.InFlight("p1") != 3 {
		t.Fatalf("victim counts %d/%d in flight, want the real 2/3", victim.tr.InFlight("p0"), victim.tr.InFlight("p1"))
	}

	// 4. The insider again, within bounds but at a far-future version,
	// then gone. Its claim counts only while its stream lives; the
	// dialler's real updates, at lower versions, count again after.
	if err := inject(t, victim.addr, insider, helloFrame(dialler.node.ID()),
		batchFrame(&meshpb.Batch{Loads: []*meshpb.Load{{Pod: "p0", Version: 1 << 50, InFlight: 60000}}})); err != nil {
		t.Fatalf("a bounded stream from the mesh was refused: %v", err)
	}
	r := &picker.Request{PromptTokens: 500}
	dialler.tr.Dispatched("p0", r)
	eventually(t, "the dialler's next update counted", func() bool { return victim.tr.InFlight("p0") == 3 })
	dialler.tr.Done("p0", r)
	eventually(t, "the real state back", func() bool { return victim.tr.InFlight("p0") == 2 && victim.tr.InFlight("p1") == 3 })
	if got := picks(t, victim.tr, "p0", "p1"); !slices.Equal(got, before) {
		t.Fatalf("picks after the insider left: %v, want %v", got, before)
	}
	if s := victim.node.Stats(); s.Rejected < 2 {
		t.Errorf("victim stats %+v: want the refusals counted", s)
	}
}
