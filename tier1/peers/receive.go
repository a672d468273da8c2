package peers

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync"
	"time"

	"golang.org/x/net/netutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/keepalive"
	grpcpeer "google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/infergate/infergate/shared/clock"
	"github.com/infergate/infergate/tier1/peers/meshpb"
	"github.com/infergate/infergate/tier1/picker"
)

// Bounds on what one peer may say. A message outside them closes its
// stream and drops everything the stream said: no sane replica sends it.
const (
	maxInbound        = 256 // connections served at once (a replica has one per peer)
	maxStreamsPerConn = 4
	maxString         = 1024    // pod names, replica IDs, in bytes
	maxHashes         = 4096    // block hashes in one dispatch record
	maxInFlight       = 1 << 16 // one replica's requests in flight on one pod
	maxTokens         = 1 << 36 // one replica's prompt tokens in prefill on one pod
	maxMicros         = 3600 * 1_000_000
	// Versions are the sender's change counter: at a million changes a
	// second it takes 285 years to pass maxVersion, and no two messages
	// of one stream, at most a TTL apart, are maxVersionJump apart.
	maxVersion     = 1 << 53
	maxVersionJump = 1 << 32

	keepaliveTime    = 10 * time.Second
	keepaliveTimeout = 5 * time.Second
)

func limitListener(ln net.Listener, n int) net.Listener { return netutil.LimitListener(ln, n) }

// server is the gRPC server of the mesh: mutual TLS, bounded handshakes,
// messages and streams.
func (n *Node) server() *grpc.Server {
	var creds credentials.TransportCredentials = insecure.NewCredentials()
	if n.opts.TLS != nil {
		creds = &watchedCreds{TransportCredentials: credentials.NewTLS(n.opts.TLS.Server), fail: n.handshakeRefused}
	}
	srv := grpc.NewServer(
		grpc.Creds(creds),
		grpc.ConnectionTimeout(n.opts.DialTimeout),
		grpc.MaxRecvMsgSize(n.opts.MaxMessageBytes),
		grpc.MaxSendMsgSize(4<<10),
		grpc.MaxConcurrentStreams(maxStreamsPerConn),
		grpc.MaxHeaderListSize(16<<10),
		grpc.KeepaliveParams(keepalive.ServerParameters{Time: keepaliveTime, Timeout: keepaliveTimeout}),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: keepaliveTime / 2, PermitWithoutStream: true}),
		grpc.WaitForHandlers(true),
	)
	meshpb.RegisterMeshServer(srv, n)
	return srv
}

// handshakeRefused: a connection failed its TLS handshake, most likely
// with no certificate from the mesh CA.
func (n *Node) handshakeRefused(addr net.Addr, err error) {
	n.reject.Add(1)
	n.refused.Warn("peer connection refused: TLS handshake failed (a certificate from the mesh CA is required)",
		"remote", addrString(addr), "err", err)
}

// dialRefused: a peer we dialled failed the TLS handshake (its
// certificate is not from the mesh CA, or not for the name dialled).
func (n *Node) dialRefused(addr net.Addr, err error) {
	n.unreach.Warn("peer not dialled: TLS handshake failed (its certificate must be from the mesh CA and name peers.tls.server_name or the address)",
		"peer", addrString(addr), "err", err)
}

func addrString(a net.Addr) string {
	if a == nil {
		return ""
	}
	return a.String()
}

// origin is one inbound stream. Its state is in the tracker under key,
// unique per stream, so versions are only ever compared within a stream
// and everything the stream said can be dropped at once.
type origin struct {
	id     string // the replica ID its hello named
	key    string
	seq    uint64 // later streams have higher seq
	remote string // address and certificate subject, for logs

	// mu is held while the stream's state changes in the tracker.
	mu   sync.Mutex
	pods map[string]struct{} // pods it holds state for
	top  uint64              // highest version applied

	// Under Node.mu.
	seen time.Time // last message
	live bool      // the stream is open
}

// Share serves one peer's stream (meshpb.MeshServer).
func (n *Node) Share(stream meshpb.Mesh_ShareServer) error {
	remote := describe(stream.Context())
	keyID := n.tr.Index().Key().ID()
	if err := stream.Send(&meshpb.Hello{ReplicaId: n.opts.ID, HashKeyId: keyID}); err != nil {
		return err
	}
	f, err := stream.Recv()
	if err != nil {
		return err
	}
	h := f.GetHello()
	switch {
	case h == nil || h.ReplicaId == "" || len(h.ReplicaId) > maxString:
		return n.refuse(remote, "", codes.InvalidArgument, "the first message must be a hello naming the replica")
	case h.ReplicaId == n.opts.ID:
		return status.Error(codes.FailedPrecondition, "that is this replica")
	case !bytes.Equal(h.HashKeyId, keyID):
		return n.refuse(remote, h.ReplicaId, codes.FailedPrecondition, "its prefix hash key differs from this replica's (peers.hash_key_*)")
	}
	o := n.open(h.ReplicaId, remote)
	defer n.closed(o)
	for {
		f, err := stream.Recv()
		if err != nil {
			return nil // ended by the peer, or by Run's end
		}
		b := f.GetBatch()
		if b == nil {
			err = errors.New("a second hello")
		} else {
			err = n.apply(o, b)
		}
		if err != nil {
			n.forget(o) // nothing it said counts any more
			return n.refuse(remote, o.id, codes.InvalidArgument, err.Error())
		}
		n.recv.Add(1)
	}
}

// describe names a stream's peer for logs: address and certificate
// subject.
func describe(ctx context.Context) string {
	p, ok := grpcpeer.FromContext(ctx)
	if !ok {
		return ""
	}
	s := addrString(p.Addr)
	if ti, ok := p.AuthInfo.(credentials.TLSInfo); ok && len(ti.State.PeerCertificates) > 0 {
		s += " (" + ti.State.PeerCertificates[0].Subject.String() + ")"
	}
	return s
}

func (n *Node) refuse(remote, id string, code codes.Code, why string) error {
	n.reject.Add(1)
	n.refused.Warn("peer stream refused", "remote", remote, "replica", id, "reason", why)
	return status.Error(code, why)
}

func (n *Node) open(id, remote string) *origin {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.seq++
	o := &origin{id: id, key: id + "#" + strconv.FormatUint(n.seq, 10), seq: n.seq, remote: remote,
		pods: make(map[string]struct{}), seen: time.Now(), live: true}
	n.streams[o] = true
	return o
}

// closed: the stream ended. What it said counts until the TTL (a replica
// that reconnects at once replaces it sooner).
func (n *Node) closed(o *origin) {
	n.mu.Lock()
	defer n.mu.Unlock()
	o.live = false
}

// forget drops o and its state now.
func (n *Node) forget(o *origin) {
	n.mu.Lock()
	delete(n.streams, o)
	if n.active[o.id] == o {
		delete(n.active, o.id)
	}
	n.mu.Unlock()
	n.dropState(o)
}

// dropState removes everything o said from the tracker.
func (n *Node) dropState(o *origin) {
	o.mu.Lock()
	defer o.mu.Unlock()
	n.tr.DropRemote(o.key)
	clear(o.pods)
	o.top = 0
}

// check validates a whole batch before anything of it applies.
func check(b *meshpb.Batch, top uint64) error {
	pod := func(p string) error {
		if p == "" || len(p) > maxString {
			return fmt.Errorf("a pod name of %d bytes", len(p))
		}
		return nil
	}
	for _, l := range b.Loads {
		if err := pod(l.Pod); err != nil {
			return err
		}
		if l.InFlight > maxInFlight || l.Prefill > l.InFlight || l.PromptTokens > maxTokens || l.UncachedTokens > l.PromptTokens {
			return fmt.Errorf("load of pod %.64q out of bounds (%d in flight, %d in prefill, %d prompt tokens, %d uncached)",
				l.Pod, l.InFlight, l.Prefill, l.PromptTokens, l.UncachedTokens)
		}
		if l.Version > maxVersion || (top > 0 && l.Version > top+maxVersionJump) {
			return fmt.Errorf("load of pod %.64q claims version %d (highest so far %d)", l.Pod, l.Version, top)
		}
	}
	for _, d := range b.Dispatches {
		if err := pod(d.Pod); err != nil {
			return err
		}
		if len(d.BlockHashes) > maxHashes {
			return fmt.Errorf("a dispatch of %d block hashes (limit %d)", len(d.BlockHashes), maxHashes)
		}
	}
	for _, s := range b.Samples {
		if err := pod(s.Pod); err != nil {
			return err
		}
		if s.Tokens > maxTokens || s.Micros > maxMicros {
			return fmt.Errorf("a prefill sample of %d tokens in %d µs", s.Tokens, s.Micros)
		}
	}
	return nil
}

// apply checks one batch of o's and adds it to the tracker, unless a newer
// stream of the same replica counts instead.
func (n *Node) apply(o *origin, b *meshpb.Batch) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	if err := check(b, o.top); err != nil {
		return err
	}
	n.mu.Lock()
	o.seen = time.Now()
	cur := n.active[o.id]
	var prev *origin
	switch {
	case cur == o:
	case cur == nil || o.seq > cur.seq || !cur.live:
		// A replica's newest stream counts (it reconnected, or reached us
		// under two addresses); the one it replaces stops counting now
		// instead of at its TTL. A stream opens with the full state, so
		// nothing is missing in between.
		prev = cur
		n.active[o.id] = o
		if prev != nil && !prev.live {
			delete(n.streams, prev)
		}
	default:
		n.mu.Unlock()
		return nil
	}
	n.mu.Unlock()
	if prev != nil {
		n.dropState(prev)
	}

	known := func(pod string) bool {
		if n.opts.Known != nil && !n.opts.Known(pod) {
			n.ignored.Add(1)
			return false
		}
		if _, ok := o.pods[pod]; ok {
			return true
		}
		if len(o.pods) >= n.opts.MaxPods {
			n.ignored.Add(1)
			return false
		}
		o.pods[pod] = struct{}{}
		return true
	}
	for _, l := range b.Loads {
		if !known(l.Pod) {
			continue
		}
		o.top = max(o.top, l.Version)
		n.tr.SetRemote(o.key, l.Pod, loadOf(l))
	}
	for _, d := range b.Dispatches {
		if len(d.BlockHashes) > 0 && known(d.Pod) {
			n.tr.RecordRemote(d.Pod, d.BlockHashes)
		}
	}
	for _, s := range b.Samples {
		if known(s.Pod) {
			n.tr.RemoteSample(s.Pod, int(s.Tokens), time.Duration(s.Micros)*time.Microsecond)
		}
	}
	return nil
}

// reap drops the state of streams silent for longer than the TTL, and
// warns (rate-limited) when updates were dropped.
func (n *Node) reap(ctx context.Context) {
	var lastDrops uint64
	for now := range clock.Ticks(ctx, max(n.opts.TTL/4, 10*time.Millisecond)) {
		if d := n.dropped.Load() + n.pdrop.Load(); d != lastDrops {
			n.dropLog.Warn("peer state updates dropped (queues full); heartbeats repair counts, prefix records are lost", "dropped_total", d)
			lastDrops = d
		}
		n.refused.Flush("more peers refused since the previous line (infergate_tier1_peers_rejected_total)")
		n.unreach.Flush("more peers not dialled since the previous line")
		var gone []*origin
		n.mu.Lock()
		for o := range n.streams {
			if now.Sub(o.seen) <= n.opts.TTL {
				continue
			}
			if n.active[o.id] == o {
				delete(n.active, o.id)
				gone = append(gone, o)
				n.expired.Add(1)
				n.opts.Logger.Info("peer replica expired", "peer", o.id, "remote", o.remote)
			}
			if !o.live {
				delete(n.streams, o)
			}
		}
		n.mu.Unlock()
		for _, o := range gone {
			n.dropState(o)
		}
	}
}

func loadOf(l *meshpb.Load) picker.ReplicaLoad {
	return picker.ReplicaLoad{InFlight: int(l.InFlight), Prefill: int(l.Prefill), PromptTokens: int(l.PromptTokens),
		Uncached: int(l.UncachedTokens), Version: l.Version}
}
