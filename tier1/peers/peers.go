// Package peers shares routing state between the replicas of one
// cluster's Tier 1 (docs/tier1-replicas.md): each replica streams to every
// peer what it dispatched where (prefix block hashes per pod), its own
// per-pod in-flight counts and its prefill-speed samples, and adds what
// its peers stream to its tracker, so every replica schedules on the
// whole cluster's dispatches.
//
// The mesh is gRPC (service Mesh in meshpb/mesh.proto): one long-lived
// Share stream from each replica to each peer, over mutual TLS where both
// ends must hold a certificate from the mesh CA (LoadTLS). Nothing waits
// on a peer on the request path: the tracker's observer hands each change
// to a bounded queue (dropped and counted when full); a flusher sends it
// at once when idle, else batched into one message per few milliseconds.
//
// What a peer says is bounded and scoped to its stream: counts and
// versions outside fixed limits close the stream, pods this replica does
// not know are ignored (Options.Known) and a stream may name at most
// Options.MaxPods pods; versions are compared only within a stream; and a
// stream's state vanishes when it has been silent for the TTL, or at once
// when a newer stream of the same replica replaces it. A periodic full
// re-announcement heals lost updates.
package peers

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"log/slog"
	"net"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/infergate/infergate/shared/config"
	"github.com/infergate/infergate/tier1/peers/meshpb"
	"github.com/infergate/infergate/tier1/picker"
)

// Options configure a Node. The zero value of every duration and size is
// its default; TLS is required unless InsecurePlaintext.
type Options struct {
	// ID names this replica to its peers; default hostname plus a random
	// suffix, so a restarted replica is a new one.
	ID string
	// TLS authenticates both ends of every stream with certificates from
	// the mesh CA (see LoadTLS).
	TLS *TLS
	// InsecurePlaintext runs the mesh without TLS, so without any
	// authentication: for tests and a single-host development stack only
	// (the config accepts it only on loopback).
	InsecurePlaintext bool
	// Known reports whether this replica routes to pod; a peer's state
	// about other pods is ignored. nil accepts every name (each stream
	// still names at most MaxPods).
	Known func(pod string) bool
	// MaxPods bounds the pods one stream may hold state for (default
	// 4096); entries naming more are ignored and counted.
	MaxPods int
	// Discover lists the peers; nil means none (the node only receives).
	Discover Discoverer
	// Refresh is how often Discover is asked again (default 10s).
	Refresh time.Duration
	// Flush is the batching interval (default 5ms): a change goes out at
	// once when nothing was sent for this long, else with the next batch.
	Flush time.Duration
	// Heartbeat is how often the full local state is re-sent, which also
	// keeps the stream alive (default 250ms).
	Heartbeat time.Duration
	// TTL is how long a silent stream's in-flight counts still count
	// (default 2s; at least 4 heartbeats).
	TTL time.Duration
	// QueueLen bounds the changes waiting for the flusher (default 1024);
	// beyond it changes are dropped and counted.
	QueueLen int
	// PeerQueueBytes bounds the messages waiting for one peer's stream
	// (default 4 MiB); a slow peer loses messages, never slows the others.
	PeerQueueBytes int
	// DialTimeout bounds a connection's TLS handshake and the hello
	// exchange (default 2s); every send is bounded by WriteTimeout
	// (default 2s).
	DialTimeout, WriteTimeout time.Duration
	// MaxMessageBytes bounds one message (default DefaultMaxMessageBytes);
	// a batch that reaches half of it is sent early.
	MaxMessageBytes int
	// LogEvery is the least interval between two log lines about refused
	// or misbehaving peers (default 10s); each line counts those it
	// stands for.
	LogEvery time.Duration
	Logger   *slog.Logger // default: discard
}

// DefaultMaxMessageBytes bounds one message of a stream.
const DefaultMaxMessageBytes = 1 << 20

func (o Options) withDefaults() Options {
	config.Default(&o.Refresh, 10*time.Second)
	config.Default(&o.Flush, 5*time.Millisecond)
	config.Default(&o.Heartbeat, 250*time.Millisecond)
	config.Default(&o.TTL, 2*time.Second)
	o.TTL = max(o.TTL, 4*o.Heartbeat)
	config.Default(&o.DialTimeout, 2*time.Second)
	config.Default(&o.WriteTimeout, 2*time.Second)
	config.Default(&o.LogEvery, 10*time.Second)
	config.Default(&o.QueueLen, 1024)
	config.Default(&o.PeerQueueBytes, 4<<20)
	config.Default(&o.MaxMessageBytes, DefaultMaxMessageBytes)
	config.Default(&o.MaxPods, 4096)
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
	PeerDropped uint64 // messages a slow or absent peer missed
	FramesSent  uint64 // messages sent to peers
	BytesSent   uint64
	FramesRecv  uint64 // messages applied from peers
	// Rejected counts inbound connections and streams refused: a failed
	// TLS handshake (no certificate from the mesh CA), a malformed or
	// out-of-bounds message, a different prefix hash key.
	Rejected uint64
	// Ignored counts entries of peers' messages not applied: pods this
	// replica does not know, or beyond a stream's MaxPods.
	Ignored   uint64
	Expired   uint64 // peers' state dropped after their TTL
	Connected int    // outbound streams up now
	Origins   int    // peers whose state counts now
}

// event is one change of the local tracker, queued for the flusher.
type event struct {
	pod    string
	load   picker.ReplicaLoad
	hashes []uint64 // nil: no dispatch; raw, keyed by the flusher
	sample *meshpb.Sample
}

// Node is one replica's end of state sharing: it observes the local
// tracker (Run installs it with Tracker.SetObserver), streams changes to
// peers and applies theirs. Create with New, then Run.
type Node struct {
	meshpb.UnimplementedMeshServer

	opts Options
	tr   *picker.Tracker
	ev   chan event

	mu      sync.Mutex
	peers   map[string]*peer   // outbound, by address
	self    map[string]bool    // addresses found to be this replica
	streams map[*origin]bool   // inbound streams whose state may count
	active  map[string]*origin // the stream whose state counts, by replica ID
	seq     uint64             // numbers inbound streams

	refused *rateLog // inbound refusals and violations
	unreach *rateLog // outbound failures
	dropLog *rateLog // queue drops
	dropped atomic.Uint64
	pdrop   atomic.Uint64
	sent    atomic.Uint64
	bytes   atomic.Uint64
	recv    atomic.Uint64
	reject  atomic.Uint64
	ignored atomic.Uint64
	expired atomic.Uint64
	conns   atomic.Int64
}

// New returns a node sharing tr's state. It does not install itself as
// tr's observer; Run does, and removes itself when it returns.
func New(tr *picker.Tracker, opts Options) (*Node, error) {
	switch {
	case opts.TLS == nil && !opts.InsecurePlaintext:
		return nil, errors.New("peers: no TLS (the mesh needs mutual TLS; plaintext only when asked for explicitly)")
	case opts.TLS != nil && opts.InsecurePlaintext:
		return nil, errors.New("peers: TLS and InsecurePlaintext are exclusive")
	case opts.TLS != nil && (opts.TLS.Server == nil || opts.TLS.Client == nil):
		return nil, errors.New("peers: TLS needs both a server and a client configuration")
	}
	opts = opts.withDefaults()
	n := &Node{
		opts:    opts,
		tr:      tr,
		ev:      make(chan event, opts.QueueLen),
		peers:   make(map[string]*peer),
		self:    make(map[string]bool),
		streams: make(map[*origin]bool),
		active:  make(map[string]*origin),
	}
	n.refused = newRateLog(opts.Logger, opts.LogEvery, nil)
	n.unreach = newRateLog(opts.Logger, opts.LogEvery, nil)
	n.dropLog = newRateLog(opts.Logger, opts.LogEvery, nil)
	return n, nil
}

// ID is the replica ID the node announces.
func (n *Node) ID() string { return n.opts.ID }

// Stats returns the node's counters.
func (n *Node) Stats() Stats {
	n.mu.Lock()
	origins := len(n.active)
	n.mu.Unlock()
	return Stats{
		Dropped: n.dropped.Load(), PeerDropped: n.pdrop.Load(),
		FramesSent: n.sent.Load(), BytesSent: n.bytes.Load(), FramesRecv: n.recv.Load(),
		Rejected: n.reject.Load(), Ignored: n.ignored.Load(), Expired: n.expired.Load(),
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
	n.push(event{pod: pod, sample: &meshpb.Sample{Pod: pod, Tokens: uint64(max(tokens, 0)), Micros: uint64(max(ttft.Microseconds(), 0))}})
}

func (n *Node) push(e event) {
	select {
	case n.ev <- e:
	default:
		n.dropped.Add(1) // the next heartbeat re-sends the counts
	}
}

// Run observes the tracker, serves peers' streams on ln (nil: send only)
// and streams to the discovered peers until ctx ends. It closes ln.
func (n *Node) Run(ctx context.Context, ln net.Listener) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	n.tr.SetObserver(n)
	defer n.tr.SetObserver(nil)

	var wg sync.WaitGroup
	defer wg.Wait()
	if ln != nil {
		srv := n.server()
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := srv.Serve(limitListener(ln, maxInbound)); err != nil && ctx.Err() == nil {
				n.opts.Logger.Error("peer listener failed", "err", err)
			}
		}()
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-ctx.Done()
			srv.Stop() // closes the listener and every stream, waits for their handlers
		}()
	}
	wg.Add(2)
	go func() { defer wg.Done(); n.discover(ctx, &wg) }()
	go func() { defer wg.Done(); n.reap(ctx) }()
	n.flush(ctx)
	return nil
}

// batch is what the flusher gathers into one message.
type batch struct {
	loads   map[string]picker.ReplicaLoad
	records []*meshpb.Dispatch
	samples []*meshpb.Sample
	size    int // about the bytes it encodes to
}

func (b *batch) empty() bool { return len(b.loads) == 0 && len(b.records) == 0 && len(b.samples) == 0 }

// frame builds the message for b and resets b.
func (b *batch) frame() *meshpb.Frame {
	out := &meshpb.Batch{Dispatches: b.records, Samples: b.samples}
	out.Loads = make([]*meshpb.Load, 0, len(b.loads))
	for pod, l := range b.loads {
		out.Loads = append(out.Loads, loadMsg(pod, l))
	}
	clear(b.loads)
	b.records, b.samples, b.size = nil, nil, 0
	return &meshpb.Frame{Kind: &meshpb.Frame_Batch{Batch: out}}
}

func loadMsg(pod string, l picker.ReplicaLoad) *meshpb.Load {
	return &meshpb.Load{Pod: pod, Version: l.Version, InFlight: uint64(max(l.InFlight, 0)), Prefill: uint64(max(l.Prefill, 0)),
		PromptTokens: uint64(max(l.PromptTokens, 0)), UncachedTokens: uint64(max(l.Uncached, 0))}
}

// fullState is a message with every local count, the first of a stream.
func (n *Node) fullState() *meshpb.Frame {
	b := batch{loads: n.tr.LocalLoads()}
	return b.frame()
}

// flush sends queued changes: at once when nothing was sent for a Flush
// interval (an idle cluster pays only the network's latency), else
// batched until a Flush interval after the last message (a busy one sends
// at most one message per interval). Every Heartbeat it sends the full
// local state.
func (n *Node) flush(ctx context.Context) {
	hb := time.NewTicker(n.opts.Heartbeat)
	defer hb.Stop()
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	armed := false
	var last time.Time
	b := batch{loads: make(map[string]picker.ReplicaLoad)}
	send := func() {
		if b.empty() {
			return
		}
		n.broadcast(b.frame())
		last = time.Now()
	}
	add := func(e event) {
		if e.sample != nil {
			b.samples = append(b.samples, e.sample)
			b.size += len(e.pod) + 24
			return
		}
		if old, ok := b.loads[e.pod]; !ok || e.load.Version >= old.Version {
			b.loads[e.pod] = e.load
		}
		b.size += len(e.pod) + 48
		if e.hashes != nil {
			// Keyed here, off the request path, as the local index keys
			// what it records.
			n.tr.Index().Key().Apply(e.hashes)
			b.records = append(b.records, &meshpb.Dispatch{Pod: e.pod, BlockHashes: e.hashes})
			b.size += len(e.pod) + 8 + 8*len(e.hashes)
		}
		if b.size >= n.opts.MaxMessageBytes/2 {
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
				n.broadcast(&meshpb.Frame{Kind: &meshpb.Frame_Batch{Batch: &meshpb.Batch{}}}) // keep-alive
				last = time.Now()
				continue
			}
			send()
		}
	}
}

// broadcast hands one message to every connected peer's queue. The peers
// share it read-only.
func (n *Node) broadcast(f *meshpb.Frame) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if len(n.peers) == 0 {
		return
	}
	size := int64(frameSize(f))
	for _, p := range n.peers {
		if !p.up.Load() {
			continue // a stream starts with the full state
		}
		if p.queued.Load()+size > int64(n.opts.PeerQueueBytes) {
			n.pdrop.Add(1)
			continue
		}
		select {
		case p.out <- queued{f, size}:
			p.queued.Add(size)
		default:
			n.pdrop.Add(1)
		}
	}
}
