package peers

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/protobuf/proto"

	"github.com/infergate/infergate/tier1/peers/meshpb"
)

// queued is a message waiting for one peer's stream.
type queued struct {
	f    *meshpb.Frame
	size int64
}

func frameSize(f *meshpb.Frame) int { return proto.Size(f) }

// peer is the sending side towards one address.
type peer struct {
	addr   string
	cancel context.CancelFunc
	out    chan queued
	queued atomic.Int64 // bytes in out
	up     atomic.Bool
}

// discover keeps one sender per discovered peer address.
func (n *Node) discover(ctx context.Context, wg *sync.WaitGroup) {
	if n.opts.Discover == nil {
		return
	}
	t := time.NewTicker(n.opts.Refresh)
	defer t.Stop()
	for {
		addrs, err := n.opts.Discover.Peers(ctx)
		if err != nil {
			n.opts.Logger.Warn("peer discovery failed; keeping the previous peers", "err", err)
		} else {
			n.setPeers(ctx, addrs, wg)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (n *Node) setPeers(ctx context.Context, addrs []string, wg *sync.WaitGroup) {
	n.mu.Lock()
	defer n.mu.Unlock()
	want := make(map[string]bool, len(addrs))
	for _, a := range addrs {
		if !n.self[a] {
			want[a] = true
		}
	}
	for a, p := range n.peers {
		if !want[a] {
			p.cancel()
			delete(n.peers, a)
		}
	}
	for a := range want {
		if n.peers[a] != nil {
			continue
		}
		pctx, cancel := context.WithCancel(ctx)
		p := &peer{addr: a, cancel: cancel, out: make(chan queued, 256)}
		n.peers[a] = p
		wg.Add(1)
		go func() {
			defer wg.Done()
			n.send(pctx, p)
		}()
	}
}

var (
	errSelf        = errors.New("peers: dialled self")
	errKeyMismatch = errors.New("peers: the peer's prefix hash key differs from ours")
)

// send keeps a stream to p open and writes its messages, reconnecting
// with backoff.
func (n *Node) send(ctx context.Context, p *peer) {
	conn, err := grpc.NewClient("passthrough:///"+p.addr, n.dialOptions()...)
	if err != nil {
		n.opts.Logger.Error("peer address unusable", "peer", p.addr, "err", err)
		return
	}
	defer conn.Close()
	client := meshpb.NewMeshClient(conn)
	backoff := 50 * time.Millisecond
	for ctx.Err() == nil {
		err := n.sendOnce(ctx, p, client)
		switch {
		case errors.Is(err, errSelf):
			n.mu.Lock()
			n.self[p.addr] = true
			if n.peers[p.addr] == p {
				delete(n.peers, p.addr)
			}
			n.mu.Unlock()
			return
		case errors.Is(err, errKeyMismatch):
			n.unreach.Warn("peer refused: its prefix hash key differs; set the same peers.hash_key_* on every replica", "peer", p.addr)
		case err != nil && ctx.Err() == nil:
			n.opts.Logger.Debug("peer stream ended", "peer", p.addr, "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 2*time.Second)
	}
}

func (n *Node) dialOptions() []grpc.DialOption {
	var creds credentials.TransportCredentials = insecure.NewCredentials()
	if n.opts.TLS != nil {
		var c credentials.TransportCredentials = credentials.NewTLS(n.opts.TLS.Client)
		if n.opts.TLS.ClientFunc != nil {
			c = newFreshClientCreds(n.opts.TLS.ClientFunc)
		}
		creds = &watchedCreds{TransportCredentials: c, fail: n.dialRefused}
	}
	return []grpc.DialOption{
		grpc.WithTransportCredentials(creds),
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: 50 * time.Millisecond, Multiplier: 2, Jitter: 0.2, MaxDelay: 2 * time.Second},
			MinConnectTimeout: n.opts.DialTimeout,
		}),
		// A peer that vanished without closing is found by pings.
		grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: keepaliveTime, Timeout: keepaliveTimeout}),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(4<<10), grpc.MaxCallSendMsgSize(n.opts.MaxMessageBytes)),
	}
}

// sendOnce opens one stream to p, says hello, sends the full local state,
// then every message queued for p until the stream or ctx ends.
func (n *Node) sendOnce(ctx context.Context, p *peer, client meshpb.MeshClient) error {
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	// One timer bounds the hello exchange (connecting included), then
	// each send: a peer that stops reading cannot hold the sender.
	deadline := time.AfterFunc(n.opts.DialTimeout, cancel)
	defer deadline.Stop()
	stream, err := client.Share(sctx)
	if err != nil {
		return err
	}
	keyID := n.tr.Index().Key().ID()
	if err := stream.Send(&meshpb.Frame{Kind: &meshpb.Frame_Hello{Hello: &meshpb.Hello{ReplicaId: n.opts.ID, HashKeyId: keyID}}}); err != nil {
		return fmt.Errorf("hello: %w", err)
	}
	h, err := stream.Recv()
	if err != nil {
		return fmt.Errorf("hello: %w", err)
	}
	if !deadline.Stop() {
		return errors.New("hello: timed out")
	}
	switch {
	case h.ReplicaId == n.opts.ID:
		return errSelf
	case !bytes.Equal(h.HashKeyId, keyID):
		return errKeyMismatch
	}
	// Drop what the previous stream left unsent: this one starts with
	// the full state.
	for len(p.out) > 0 {
		p.queued.Add(-(<-p.out).size)
	}
	p.up.Store(true)
	n.conns.Add(1)
	defer func() { p.up.Store(false); n.conns.Add(-1) }()
	write := func(f *meshpb.Frame, size int64) error {
		deadline.Reset(n.opts.WriteTimeout)
		err := stream.Send(f)
		if !deadline.Stop() {
			return errors.New("send timed out")
		}
		if err != nil {
			return err
		}
		n.sent.Add(1)
		n.bytes.Add(uint64(size))
		return nil
	}
	full := n.fullState()
	if err := write(full, int64(frameSize(full))); err != nil {
		return err
	}
	// The peer sends nothing after its hello: Recv returns when the
	// stream ends.
	gone := make(chan error, 1)
	go func() {
		_, err := stream.Recv()
		gone <- err
	}()
	for {
		select {
		case <-ctx.Done():
			return nil
		case err := <-gone:
			return fmt.Errorf("closed by peer: %w", err)
		case q := <-p.out:
			p.queued.Add(-q.size)
			if err := write(q.f, q.size); err != nil {
				return err
			}
		}
	}
}
