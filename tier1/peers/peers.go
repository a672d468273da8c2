// Package peers shares routing state between the replicas of one
// cluster's Tier 1 (docs/tier1-replicas.md): each replica streams to every
// peer what it dispatched where (prefix block hashes per pod), its own
// per-pod in-flight counts and its prefill-speed samples, and adds what
// its peers stream to its tracker, so every replica schedules on the
// whole cluster's dispatches. Nothing waits on a peer on the request
// path: the tracker's observer hands each change to a bounded queue
// (dropped and counted when full); a flusher sends it at once when idle,
// else batched into one frame per few milliseconds, over one long-lived
// authenticated TCP connection per peer. A replica's in-flight counts
// vanish from its peers when it has not been heard from for a TTL; a
// periodic full re-announcement heals lost updates.
package peers

import (
	"bufio"
	"context"
	"crypto/hmac"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/infergate/infergate/tier1/picker"
)

// Options configure a Node. The zero value of every duration and size is
// its default; Token is required unless DisableAuth.
type Options struct {
	// ID names this replica to its peers; default hostname plus a random
	// suffix, so a restarted replica is a new one.
	ID string
	// Token is the secret every replica shares; peers prove they know it
	// (HMAC over a per-connection nonce) before anything they send counts.
	Token       string
	DisableAuth bool
	// Discover lists the peers; nil means none (the node only receives).
	Discover Discoverer
	// Refresh is how often Discover is asked again (default 10s).
	Refresh time.Duration
	// Flush is the batching interval (default 5ms): a change goes out at
	// once when nothing was sent for this long, else with the next batch.
	Flush time.Duration
	// Heartbeat is how often the full local state is re-sent, which also
	// keeps the connection alive (default 250ms).
	Heartbeat time.Duration
	// TTL is how long a silent peer's in-flight counts still count
	// (default 2s; at least 4 heartbeats).
	TTL time.Duration
	// QueueLen bounds the changes waiting for the flusher (default 1024);
	// beyond it changes are dropped and counted.
	QueueLen int
	// PeerQueueBytes bounds the frames waiting for one peer's connection
	// (default 4 MiB); a slow peer loses frames, never slows the others.
	PeerQueueBytes int
	// DialTimeout bounds a dial and its handshake (default 2s); every write
	// is bounded by WriteTimeout (default 2s).
	DialTimeout, WriteTimeout time.Duration
	// MaxFrameBytes bounds one frame (default DefaultMaxFrameBytes); a
	// batch that reaches half of it is flushed early.
	MaxFrameBytes int
	Logger        *slog.Logger // default: discard
}

func (o Options) withDefaults() Options {
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	def(&o.Refresh, 10*time.Second)
	def(&o.Flush, 5*time.Millisecond)
	def(&o.Heartbeat, 250*time.Millisecond)
	def(&o.TTL, 2*time.Second)
	o.TTL = max(o.TTL, 4*o.Heartbeat)
	def(&o.DialTimeout, 2*time.Second)
	def(&o.WriteTimeout, 2*time.Second)
	if o.QueueLen <= 0 {
		o.QueueLen = 1024
	}
	if o.PeerQueueBytes <= 0 {
		o.PeerQueueBytes = 4 << 20
	}
	if o.MaxFrameBytes <= 0 {
		o.MaxFrameBytes = DefaultMaxFrameBytes
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.ID == "" {
		var b [4]byte
		_, _ = rand.Read(b[:])
		hn, _ := os.Hostname()
		o.ID = hn + "-" + hex.EncodeToString(b[:])
	}
	return o
}

// Stats counts what a node did since it started.
type Stats struct {
	Dropped     uint64 // changes dropped because the queue was full
	PeerDropped uint64 // frames a slow or absent peer missed
	FramesSent  uint64 // frames written to peers
	BytesSent   uint64
	FramesRecv  uint64 // frames applied from peers
	Rejected    uint64 // inbound connections refused (bad token, bad handshake)
	Expired     uint64 // peers dropped after their TTL
	Connected   int    // outbound connections up now
	Origins     int    // peers whose state counts now
}

// event is one change of the local tracker, queued for the flusher.
type event struct {
	pod    string
	load   picker.ReplicaLoad
	hashes []uint64 // nil: no dispatch
	sample *sample  // a first token's prefill-speed sample, instead of a load
}

// Node is one replica's end of state sharing: it observes the local
// tracker (install it with Tracker.SetObserver), streams changes to peers
// and applies theirs. Create with New, then Run.
type Node struct {
	opts Options
	tr   *picker.Tracker
	ev   chan event

	mu      sync.Mutex
	peers   map[string]*peer // by address
	self    map[string]bool  // addresses found to be this replica
	seen    map[string]time.Time
	dropped atomic.Uint64
	pdrop   atomic.Uint64
	sent    atomic.Uint64
	bytes   atomic.Uint64
	recv    atomic.Uint64
	reject  atomic.Uint64
	expired atomic.Uint64
	conns   atomic.Int64
}

// New returns a node sharing tr's state. It does not install itself as
// tr's observer; Run does, and removes itself when it returns.
func New(tr *picker.Tracker, opts Options) (*Node, error) {
	if opts.Token == "" && !opts.DisableAuth {
		return nil, errors.New("peers: no token (set one, or disable auth explicitly)")
	}
	opts = opts.withDefaults()
	return &Node{
		opts:  opts,
		tr:    tr,
		ev:    make(chan event, opts.QueueLen),
		peers: make(map[string]*peer),
		self:  make(map[string]bool),
		seen:  make(map[string]time.Time),
	}, nil
}

// ID is the replica ID the node announces.
func (n *Node) ID() string { return n.opts.ID }

// Stats returns the node's counters.
func (n *Node) Stats() Stats {
	n.mu.Lock()
	origins := len(n.seen)
	n.mu.Unlock()
	return Stats{
		Dropped: n.dropped.Load(), PeerDropped: n.pdrop.Load(),
		FramesSent: n.sent.Load(), BytesSent: n.bytes.Load(), FramesRecv: n.recv.Load(),
		Rejected: n.reject.Load(), Expired: n.expired.Load(),
		Connected: int(n.conns.Load()), Origins: origins,
	}
}

// Dispatched implements picker.Observer; it never blocks.
func (n *Node) Dispatched(pod string, hashes []uint64, l picker.ReplicaLoad) {
	// A record holds at most maxHashes; its leading blocks are a valid
	// record of a shorter prompt.
	n.push(event{pod: pod, load: l, hashes: slices.Clone(hashes[:min(len(hashes), maxHashes)])})
}

// Changed implements picker.Observer; it never blocks.
func (n *Node) Changed(pod string, l picker.ReplicaLoad) { n.push(event{pod: pod, load: l}) }

// Sampled implements picker.Observer; it never blocks.
func (n *Node) Sampled(pod string, tokens int, ttft time.Duration) {
	n.push(event{pod: pod, sample: &sample{pod: pod, tokens: tokens, micros: int(ttft.Microseconds())}})
}

func (n *Node) push(e event) {
	select {
	case n.ev <- e:
	default:
		n.dropped.Add(1) // the next heartbeat re-sends the counts
	}
}

// Run observes the tracker, accepts peers' streams on ln (nil: send only)
// and streams to the discovered peers until ctx ends. It closes ln.
func (n *Node) Run(ctx context.Context, ln net.Listener) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	n.tr.SetObserver(n)
	defer n.tr.SetObserver(nil)

	var wg sync.WaitGroup
	defer wg.Wait()
	if ln != nil {
		wg.Add(1)
		go func() {
			defer wg.Done()
			n.serve(ctx, ln)
		}()
		go func() { <-ctx.Done(); ln.Close() }()
	}
	wg.Add(2)
	go func() { defer wg.Done(); n.discover(ctx, &wg) }()
	go func() { defer wg.Done(); n.reap(ctx) }()
	n.flush(ctx)
	return nil
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
		p := &peer{addr: a, cancel: cancel, out: make(chan []byte, 256)}
		n.peers[a] = p
		wg.Add(1)
		go func() {
			defer wg.Done()
			n.send(pctx, p)
		}()
	}
}

// flush sends queued changes: at once when nothing was sent for a Flush
// interval (an idle cluster pays only the network's latency), else
// batched until a Flush interval after the last frame (a busy one sends
// at most one frame per interval). Every Heartbeat it sends the full
// local state.
func (n *Node) flush(ctx context.Context) {
	hb := time.NewTicker(n.opts.Heartbeat)
	defer hb.Stop()
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	armed := false
	var last time.Time
	b := batch{loads: make(map[string]picker.ReplicaLoad)}
	size := 0
	var buf []byte
	send := func() {
		if b.empty() {
			return
		}
		buf = encodeBatch(buf[:0], &b)
		n.broadcast(buf)
		clear(b.loads)
		b.records = b.records[:0]
		b.samples = b.samples[:0]
		size = 0
		last = time.Now()
	}
	add := func(e event) {
		if e.sample != nil {
			b.samples = append(b.samples, *e.sample)
			size += len(e.pod) + 12
			return
		}
		if old, ok := b.loads[e.pod]; !ok || e.load.Version >= old.Version {
			b.loads[e.pod] = e.load
		}
		size += len(e.pod) + 32
		if e.hashes != nil {
			b.records = append(b.records, record{pod: e.pod, hashes: e.hashes})
			size += 8 * len(e.hashes)
		}
		if size >= n.opts.MaxFrameBytes/2 {
			send()
		}
	}
	for {
		select {
		case <-ctx.Done():
			return
		case e := <-n.ev:
			add(e)
			for drained := false; !drained; { // take what else is queued
				select {
				case e := <-n.ev:
					add(e)
				default:
					drained = true
				}
			}
			if armed {
				continue
			}
			if wait := n.opts.Flush - time.Since(last); wait > 0 {
				timer.Reset(wait)
				armed = true
			} else {
				send()
			}
		case <-timer.C:
			armed = false
			send()
		case <-hb.C:
			for pod, l := range n.tr.LocalLoads() {
				add(event{pod: pod, load: l})
			}
			if b.empty() {
				b.records = append(b.records, record{}) // keep-alive
			}
			send()
		}
	}
}

// broadcast hands one encoded frame to every connected peer's queue. The
// peers share the bytes read-only.
func (n *Node) broadcast(frame []byte) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if len(n.peers) == 0 {
		return
	}
	f := slices.Clone(frame)
	for _, p := range n.peers {
		if !p.up.Load() {
			continue // a full state follows the connection on the next heartbeat
		}
		if p.queued.Load()+int64(len(f)) > int64(n.opts.PeerQueueBytes) {
			n.pdrop.Add(1)
			continue
		}
		select {
		case p.out <- f:
			p.queued.Add(int64(len(f)))
		default:
			n.pdrop.Add(1)
		}
	}
}

// peer is the sending side towards one address.
type peer struct {
	addr   string
	cancel context.CancelFunc
	out    chan []byte
	queued atomic.Int64 // bytes in out
	up     atomic.Bool
}

// send keeps a connection to p open and writes its frames, reconnecting
// with backoff.
func (n *Node) send(ctx context.Context, p *peer) {
	backoff := 50 * time.Millisecond
	for ctx.Err() == nil {
		err := n.sendOnce(ctx, p)
		if errors.Is(err, errSelf) {
			n.mu.Lock()
			n.self[p.addr] = true
			if n.peers[p.addr] == p {
				delete(n.peers, p.addr)
			}
			n.mu.Unlock()
			return
		}
		if err != nil && ctx.Err() == nil {
			n.opts.Logger.Debug("peer connection ended", "peer", p.addr, "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 2*time.Second)
	}
}

var errSelf = errors.New("peers: dialled self")

// maxInbound bounds the inbound connections served at once: a replica has
// one per peer, so this only stops a flood of unauthenticated ones.
const maxInbound = 256

func (n *Node) sendOnce(ctx context.Context, p *peer) error {
	d := net.Dialer{Timeout: n.opts.DialTimeout, KeepAlive: 15 * time.Second}
	c, err := d.DialContext(ctx, "tcp", p.addr)
	if err != nil {
		return err
	}
	defer c.Close()
	stop := context.AfterFunc(ctx, func() { c.Close() })
	defer stop()
	if err := n.handshake(c); err != nil {
		return err
	}
	// Drop what the previous connection left unsent: the next heartbeat
	// carries the state.
	for len(p.out) > 0 {
		p.queued.Add(-int64(len(<-p.out)))
	}
	p.up.Store(true)
	n.conns.Add(1)
	defer func() { p.up.Store(false); n.conns.Add(-1) }()
	// The receiver never writes after the handshake: a read returning
	// means the connection is gone.
	gone := make(chan struct{})
	go func() { _, _ = io.Copy(io.Discard, c); close(gone) }()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-gone:
			return errors.New("closed by peer")
		case f := <-p.out:
			p.queued.Add(-int64(len(f)))
			_ = c.SetWriteDeadline(time.Now().Add(n.opts.WriteTimeout))
			if _, err := c.Write(f); err != nil {
				return err
			}
			n.sent.Add(1)
			n.bytes.Add(uint64(len(f)))
		}
	}
}

func (n *Node) handshake(c net.Conn) error {
	_ = c.SetDeadline(time.Now().Add(n.opts.DialTimeout))
	var hdr [len(magic) + nonceLen]byte
	if _, err := io.ReadFull(c, hdr[:]); err != nil {
		return fmt.Errorf("handshake: %w", err)
	}
	if string(hdr[:len(magic)]) != magic {
		return errors.New("handshake: not an infergate peer listener")
	}
	if _, err := c.Write(encodeHello(n.opts.ID, mac(n.opts.Token, hdr[len(magic):], n.opts.ID))); err != nil {
		return fmt.Errorf("handshake: %w", err)
	}
	var st [1]byte
	if _, err := io.ReadFull(c, st[:]); err != nil {
		return fmt.Errorf("handshake: %w", err)
	}
	_ = c.SetDeadline(time.Time{})
	switch st[0] {
	case statusOK:
		return nil
	case statusSelf:
		return errSelf
	default:
		return errors.New("handshake: peer refused our token")
	}
}

// serve accepts peers' streams.
func (n *Node) serve(ctx context.Context, ln net.Listener) {
	var wg sync.WaitGroup
	defer wg.Wait()
	slots := make(chan struct{}, maxInbound)
	for {
		c, err := ln.Accept()
		if err != nil {
			if ctx.Err() == nil {
				n.opts.Logger.Error("peer listener failed", "err", err)
			}
			return
		}
		select {
		case slots <- struct{}{}:
		default:
			n.reject.Add(1) // more connections than any cluster has replicas
			c.Close()
			continue
		}
		wg.Add(1)
		go func() {
			defer func() { <-slots }()
			defer wg.Done()
			defer c.Close()
			stop := context.AfterFunc(ctx, func() { c.Close() })
			defer stop()
			if err := n.receive(c); err != nil && ctx.Err() == nil {
				n.opts.Logger.Debug("peer stream ended", "remote", c.RemoteAddr().String(), "err", err)
			}
		}()
	}
}

// receive authenticates one inbound stream and applies its frames.
func (n *Node) receive(c net.Conn) error {
	_ = c.SetDeadline(time.Now().Add(n.opts.DialTimeout))
	hdr := make([]byte, len(magic)+nonceLen)
	copy(hdr, magic)
	if _, err := rand.Read(hdr[len(magic):]); err != nil {
		return err
	}
	if _, err := c.Write(hdr); err != nil {
		return err
	}
	buf, err := readFrame(c, nil, 4096)
	if err != nil {
		n.reject.Add(1)
		return err
	}
	id, sum, err := decodeHello(buf)
	switch {
	case err != nil:
		n.reject.Add(1)
		return err
	case !n.opts.DisableAuth && !hmac.Equal(sum, mac(n.opts.Token, hdr[len(magic):], id)):
		n.reject.Add(1)
		_, _ = c.Write([]byte{statusBadAuth})
		n.opts.Logger.Warn("peer refused: bad token", "remote", c.RemoteAddr().String())
		return errors.New("bad token")
	case id == n.opts.ID:
		_, _ = c.Write([]byte{statusSelf})
		return nil
	}
	if _, err := c.Write([]byte{statusOK}); err != nil {
		return err
	}
	r := bufio.NewReaderSize(c, 64<<10) // only once authenticated
	var scratch []uint64
	for {
		// A live peer sends at least every heartbeat.
		_ = c.SetReadDeadline(time.Now().Add(n.opts.TTL))
		if buf, err = readFrame(r, buf, n.opts.MaxFrameBytes); err != nil {
			return err
		}
		n.mu.Lock()
		n.seen[id] = time.Now()
		n.mu.Unlock()
		scratch, err = decodeBatch(buf, scratch,
			func(pod string, l picker.ReplicaLoad) { n.tr.SetRemote(id, pod, l) },
			func(pod string, h []uint64) {
				if pod != "" && len(h) > 0 {
					n.tr.RecordRemote(pod, h)
				}
			},
			func(s sample) { n.tr.RemoteSample(s.pod, s.tokens, time.Duration(s.micros)*time.Microsecond) })
		if err != nil {
			return err
		}
		n.recv.Add(1)
	}
}

// reap drops the in-flight counts of peers silent for longer than the
// TTL, and warns (at most every 10 s) when updates were dropped.
func (n *Node) reap(ctx context.Context) {
	t := time.NewTicker(max(n.opts.TTL/4, 10*time.Millisecond))
	defer t.Stop()
	var warned time.Time
	var lastDrops uint64
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			if d := n.dropped.Load() + n.pdrop.Load(); d != lastDrops && now.Sub(warned) >= 10*time.Second {
				n.opts.Logger.Warn("peer state updates dropped (queues full); heartbeats repair counts, prefix records are lost",
					"dropped_total", d, "since_last_warning", d-lastDrops)
				lastDrops, warned = d, now
			}
			var gone []string
			n.mu.Lock()
			for id, at := range n.seen {
				if now.Sub(at) > n.opts.TTL {
					gone = append(gone, id)
					delete(n.seen, id)
				}
			}
			n.mu.Unlock()
			for _, id := range gone {
				n.tr.DropRemote(id)
				n.expired.Add(1)
				n.opts.Logger.Info("peer replica expired", "peer", id)
			}
		}
	}
}
