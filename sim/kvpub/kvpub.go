// Package kvpub publishes a simulated pod's KV-cache events over ZeroMQ
// as vLLM does (vllm/distributed/kv_events.py, ZmqEventPublisher): a PUB
// socket sending [topic, 8-byte big-endian sequence, msgpack batch], and
// optionally a ROUTER socket replaying buffered batches from a requested
// sequence on. Batches and events are msgpack maps tagged "type", vLLM's
// form since vllm#42892, or, with Legacy, positional arrays as
// llm-d-inference-sim sends by default (nine BlockStored fields, nil where
// absent, a parent hash of 0 for none).
package kvpub

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/vmihailenco/msgpack/v5"
)

// DefaultBufferSteps is vLLM's replay buffer length (batches).
const DefaultBufferSteps = 10000

// Config configures a publisher.
type Config struct {
	// Endpoint is the PUB socket's address, tcp://host:port. It is bound
	// (vLLM's tcp://*:5557) unless Connect is set, when it is dialled
	// (llm-d's topology: the router binds, pods connect).
	Endpoint string
	Connect  bool
	// ReplayEndpoint, if set, is bound as the ROUTER socket that answers
	// replay requests (vLLM's replay_endpoint, e.g. tcp://*:5558).
	ReplayEndpoint string
	// Topic is sent as every message's first frame (vLLM: "" by default;
	// llm-d: kv@<pod-ip>:<port>@<model>).
	Topic string
	// Legacy sends positional arrays instead of tagged maps.
	Legacy bool
	// BufferSteps is how many batches replay can serve (default 10,000).
	BufferSteps int
	// DataParallelRank is sent in every batch.
	DataParallelRank int
	// Logger (default slog.Default()).
	Logger *slog.Logger
}

// BindsEndpoint reports whether vLLM would bind endpoint rather than
// connect to it: its heuristic binds a wildcard host (* or ::).
func BindsEndpoint(endpoint string) bool {
	return strings.Contains(endpoint, "*") || strings.Contains(endpoint, "::")
}

type eventKind uint8

const (
	stored eventKind = iota + 1
	removed
	cleared
)

type event struct {
	kind      eventKind
	hashes    []uint64
	parent    uint64
	hasParent bool
	tokens    []uint32
	blockSize int
	lora      string
	loraID    int
}

type buffered struct {
	seq     uint64
	payload []byte
}

// Publisher queues events and publishes them in batches. Its methods are
// safe for concurrent use and never block on the network: the engine
// calls them under its lock.
type Publisher struct {
	cfg    Config
	log    *slog.Logger
	pub    zmq4.Socket
	router zmq4.Socket
	cancel context.CancelFunc
	wg     sync.WaitGroup
	wake   chan struct{}

	mu      sync.Mutex
	pending []event
	seq     uint64
	buf     []buffered // ring of the last BufferSteps batches
	bufHead int
	closed  bool
}

// Open binds (or dials) the sockets and starts publishing.
func Open(ctx context.Context, cfg Config) (*Publisher, error) {
	if cfg.Endpoint == "" {
		return nil, errors.New("kv events: no endpoint")
	}
	if cfg.BufferSteps <= 0 {
		cfg.BufferSteps = DefaultBufferSteps
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	ctx, cancel := context.WithCancel(ctx)
	p := &Publisher{cfg: cfg, log: cfg.Logger, cancel: cancel, wake: make(chan struct{}, 1)}
	zlog := log.New(io.Discard, "", 0)
	if cfg.Connect {
		// Keep dialling until the router is there, and after it restarts.
		p.pub = zmq4.NewPub(ctx, zmq4.WithLogger(zlog), zmq4.WithDialerMaxRetries(-1),
			zmq4.WithDialerRetry(100*time.Millisecond), zmq4.WithAutomaticReconnect(true))
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			if err := p.pub.Dial(cfg.Endpoint); err != nil && ctx.Err() == nil {
				p.log.Warn("kv events: cannot connect to the subscriber", "endpoint", cfg.Endpoint, "err", err)
			}
		}()
	} else {
		p.pub = zmq4.NewPub(ctx, zmq4.WithLogger(zlog))
		if err := p.pub.Listen(cfg.Endpoint); err != nil {
			cancel()
			return nil, fmt.Errorf("kv events: bind %s: %w", cfg.Endpoint, err)
		}
	}
	if cfg.ReplayEndpoint != "" {
		p.router = zmq4.NewRouter(ctx, zmq4.WithLogger(zlog), zmq4.WithTimeout(5*time.Second))
		if err := p.router.Listen(cfg.ReplayEndpoint); err != nil {
			cancel()
			p.wg.Wait()
			_ = p.pub.Close()
			return nil, fmt.Errorf("kv events: bind replay %s: %w", cfg.ReplayEndpoint, err)
		}
		p.wg.Add(1)
		go p.serveReplay(ctx)
	}
	p.wg.Add(1)
	go p.run(ctx)
	return p, nil
}

// Addr is the bound PUB address as tcp://host:port ("" when connecting).
func (p *Publisher) Addr() string { return tcpURL(p.pub.Addr()) }

// ReplayAddr is the bound ROUTER address ("" without replay).
func (p *Publisher) ReplayAddr() string {
	if p.router == nil {
		return ""
	}
	return tcpURL(p.router.Addr())
}

func tcpURL(a net.Addr) string {
	if a == nil {
		return ""
	}
	return "tcp://" + a.String()
}

// Close stops publishing; queued events not yet sent are dropped.
func (p *Publisher) Close() error {
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	p.cancel()
	p.wg.Wait()
	err := p.pub.Close()
	if p.router != nil {
		_ = p.router.Close()
	}
	return err
}

// Subscribed reports whether a subscriber's subscription has reached the
// PUB socket: what is published from then on reaches it (a PUB drops
// what it sends before).
func (p *Publisher) Subscribed() bool {
	t, ok := p.pub.(zmq4.Topics)
	return ok && len(t.Topics()) > 0
}

// NextSeq is the sequence number the next batch will carry.
func (p *Publisher) NextSeq() uint64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.seq
}

func (p *Publisher) queue(e event) {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return
	}
	p.merge(e)
	p.mu.Unlock()
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

// merge appends e to the pending batch; p.mu is held.
func (p *Publisher) merge(e event) {
	n := len(p.pending)
	switch {
	case n > 0 && e.kind == stored && e.hasParent && p.pending[n-1].kind == stored:
		// Continue the previous BlockStored when this block extends its
		// chain, as vLLM reports one request's newly cached blocks.
		last := &p.pending[n-1]
		if last.lora == e.lora && last.blockSize == e.blockSize && last.hashes[len(last.hashes)-1] == e.parent {
			last.hashes = append(last.hashes, e.hashes...)
			last.tokens = append(last.tokens, e.tokens...)
			break
		}
		p.pending = append(p.pending, e)
	case n > 0 && e.kind == removed && p.pending[n-1].kind == removed:
		p.pending[n-1].hashes = append(p.pending[n-1].hashes, e.hashes...)
	default:
		p.pending = append(p.pending, e)
	}
}

// Stored queues a BlockStored of one block (consecutive blocks of a chain
// are merged into one event). tokens are the block's token ids; lora ""
// and loraID 0 are the base model.
func (p *Publisher) Stored(hash, parent uint64, hasParent bool, tokens []uint32, lora string, loraID int) {
	p.queue(event{kind: stored, hashes: []uint64{hash}, parent: parent, hasParent: hasParent,
		tokens: append([]uint32(nil), tokens...), blockSize: len(tokens), lora: lora, loraID: loraID})
}

// Removed queues a BlockRemoved.
func (p *Publisher) Removed(hash uint64) {
	p.queue(event{kind: removed, hashes: []uint64{hash}})
}

// Cleared queues an AllBlocksCleared.
func (p *Publisher) Cleared() { p.queue(event{kind: cleared}) }

// run sends what is queued as one batch per wake-up, as vLLM sends one
// batch per engine step.
func (p *Publisher) run(ctx context.Context) {
	defer p.wg.Done()
	var enc bytes.Buffer
	for {
		select {
		case <-ctx.Done():
			return
		case <-p.wake:
		}
		p.mu.Lock()
		events := p.pending
		p.pending = nil
		p.mu.Unlock()
		if len(events) == 0 {
			continue
		}
		enc.Reset()
		if err := encodeBatch(&enc, events, p.cfg.Legacy, p.cfg.DataParallelRank); err != nil {
			p.log.Error("kv events: encode", "err", err)
			continue
		}
		payload := bytes.Clone(enc.Bytes())
		p.mu.Lock()
		seq := p.seq
		p.seq++
		p.remember(seq, payload)
		p.mu.Unlock()
		var seqb [8]byte
		binary.BigEndian.PutUint64(seqb[:], seq)
		if err := p.pub.SendMulti(zmq4.NewMsgFrom([]byte(p.cfg.Topic), seqb[:], payload)); err != nil && ctx.Err() == nil {
			p.log.Debug("kv events: send", "seq", seq, "err", err)
		}
	}
}

// remember keeps a batch for replay; p.mu is held.
func (p *Publisher) remember(seq uint64, payload []byte) {
	if len(p.buf) < p.cfg.BufferSteps {
		p.buf = append(p.buf, buffered{seq, payload})
		return
	}
	p.buf[p.bufHead] = buffered{seq, payload}
	p.bufHead = (p.bufHead + 1) % len(p.buf)
}

// endSeq marks the end of a replay (vLLM: (-1).to_bytes(8, signed)).
var endSeq = []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}

// serveReplay answers [identity, "", start] with [identity, "", seq,
// payload] for every buffered batch from start on, then the end marker.
func (p *Publisher) serveReplay(ctx context.Context) {
	defer p.wg.Done()
	for {
		msg, err := p.router.Recv()
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			continue
		}
		if len(msg.Frames) != 3 || len(msg.Frames[2]) != 8 {
			p.log.Warn("kv events: invalid replay request", "frames", len(msg.Frames))
			continue
		}
		id := msg.Frames[0]
		start := binary.BigEndian.Uint64(msg.Frames[2])
		p.mu.Lock()
		var out []buffered
		for i := range p.buf {
			b := p.buf[(p.bufHead+i)%len(p.buf)]
			if b.seq >= start {
				out = append(out, b)
			}
		}
		p.mu.Unlock()
		for _, b := range out {
			var seqb [8]byte
			binary.BigEndian.PutUint64(seqb[:], b.seq)
			if err := p.router.SendMulti(zmq4.NewMsgFrom(id, []byte{}, seqb[:], b.payload)); err != nil {
				break
			}
		}
		_ = p.router.SendMulti(zmq4.NewMsgFrom(id, []byte{}, endSeq, []byte{}))
	}
}

// encodeBatch writes one batch. Tagged form (vLLM's EventBatch and
// events as msgspec encodes them without array_like: maps, the tag first,
// fields with defaults omitted when unset); legacy form: arrays.
func encodeBatch(w io.Writer, events []event, legacy bool, dpRank int) error {
	enc := msgpack.NewEncoder(w)
	ts := float64(time.Now().UnixNano()) / 1e9
	var err error
	put := func(f func() error) {
		if err == nil {
			err = f()
		}
	}
	if legacy {
		put(func() error { return enc.EncodeArrayLen(3) })
		put(func() error { return enc.EncodeFloat64(ts) })
	} else {
		put(func() error { return enc.EncodeMapLen(3) })
		put(func() error { return enc.EncodeString("ts") })
		put(func() error { return enc.EncodeFloat64(ts) })
		put(func() error { return enc.EncodeString("events") })
	}
	put(func() error { return enc.EncodeArrayLen(len(events)) })
	for i := range events {
		put(func() error { return encodeEvent(enc, &events[i], legacy) })
	}
	if !legacy {
		put(func() error { return enc.EncodeString("data_parallel_rank") })
	}
	put(func() error { return enc.EncodeInt(int64(dpRank)) })
	return err
}

func encodeEvent(enc *msgpack.Encoder, e *event, legacy bool) error {
	var err error
	put := func(f func() error) {
		if err == nil {
			err = f()
		}
	}
	field := func(name string, f func() error) {
		if !legacy {
			put(func() error { return enc.EncodeString(name) })
		}
		put(f)
	}
	hashes := func() error {
		if err := enc.EncodeArrayLen(len(e.hashes)); err != nil {
			return err
		}
		for _, h := range e.hashes {
			if err := enc.EncodeUint(h); err != nil {
				return err
			}
		}
		return nil
	}
	nilOr := func(set bool, f func() error) func() error {
		if set {
			return f
		}
		return enc.EncodeNil
	}
	header := func(tag string, fields int) {
		if legacy {
			put(func() error { return enc.EncodeArrayLen(fields + 1) })
			put(func() error { return enc.EncodeString(tag) })
			return
		}
		put(func() error { return enc.EncodeMapLen(fields + 1) })
		put(func() error { return enc.EncodeString("type") })
		put(func() error { return enc.EncodeString(tag) })
	}
	switch e.kind {
	case stored:
		n := 7 // block_hashes … lora_name
		if legacy || e.lora != "" {
			n = 8 // extra_keys: always in the simulator's array; vLLM sends it for LoRA blocks
		}
		header("BlockStored", n)
		field("block_hashes", hashes)
		if legacy {
			// llm-d-inference-sim: 0 for "no parent".
			field("parent_block_hash", func() error { return enc.EncodeUint(e.parent) })
		} else {
			field("parent_block_hash", nilOr(e.hasParent, func() error { return enc.EncodeUint(e.parent) }))
		}
		field("token_ids", func() error {
			if err := enc.EncodeArrayLen(len(e.tokens)); err != nil {
				return err
			}
			for _, t := range e.tokens {
				if err := enc.EncodeUint(uint64(t)); err != nil {
					return err
				}
			}
			return nil
		})
		field("block_size", func() error { return enc.EncodeInt(int64(e.blockSize)) })
		field("lora_id", nilOr(e.loraID != 0, func() error { return enc.EncodeInt(int64(e.loraID)) }))
		field("medium", func() error { return enc.EncodeString("GPU") })
		field("lora_name", nilOr(e.lora != "", func() error { return enc.EncodeString(e.lora) }))
		if n == 8 {
			// vLLM's extra keys of a LoRA block: the tuple (lora_name,).
			field("extra_keys", nilOr(e.lora != "", func() error {
				if err := enc.EncodeArrayLen(len(e.hashes)); err != nil {
					return err
				}
				for range e.hashes {
					if err := enc.EncodeArrayLen(1); err != nil {
						return err
					}
					if err := enc.EncodeString(e.lora); err != nil {
						return err
					}
				}
				return nil
			}))
		}
	case removed:
		header("BlockRemoved", 2)
		field("block_hashes", hashes)
		field("medium", func() error { return enc.EncodeString("GPU") })
	case cleared:
		header("AllBlocksCleared", 0)
	}
	return err
}
