package kvevents

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log"
	"log/slog"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/go-zeromq/zmq4"
)

// The subscriber follows the protocol of vLLM's ZmqEventPublisher
// (vllm/distributed/kv_events.py): live messages on PUB are
// [topic, 8-byte big-endian sequence, payload], the sequence counting
// from 0 per publisher; a replay request to the ROUTER socket is
// ["", start sequence] from a DEALER, answered by [ "", seq, payload ] per
// buffered batch from start on, then [ "", -1, "" ]. llm-d-router's
// pkg/kvevents/zmq_subscriber.go reads replies that also carry the topic
// ([ "", topic, seq, payload ]); both are accepted.

// Options are a subscriber's collaborators.
type Options struct {
	Logger  *slog.Logger // nil: slog.Default()
	Metrics *Metrics     // nil: none
}

// Subscriber receives KV-cache events from the pods it follows and
// applies them to an Index. Give it pods with SetTargets (before or
// while Run runs); Run blocks until its context ends.
type Subscriber struct {
	cfg Config
	idx *Index
	log *slog.Logger
	m   *Metrics
	lim *limits

	mu      sync.Mutex
	ctx     context.Context // set while Run runs
	streams map[string]*stream
	byAddr  map[string]*stream
	wg      sync.WaitGroup

	ready     chan struct{} // closed once Run is listening (bind) or started (connect)
	readyOnce sync.Once
	addr      net.Addr

	unknownLog logLimiter
	limitLog   logLimiter
	// replays bounds replays running at once: after a restart of Tier 1
	// every pod would otherwise send its whole buffer together.
	replays chan struct{}
}

// maxConcurrentReplays is how many pods may replay at once (llm-d-router
// uses 8 too).
const maxConcurrentReplays = 8

// replayTotalFactor: a replay may last ReplayTimeout between messages and
// this many ReplayTimeouts in all (vLLM buffers 10,000 batches).
const replayTotalFactor = 12

// New returns a subscriber for cfg (defaults applied to a copy) feeding
// idx.
func New(cfg Config, idx *Index, opts Options) (*Subscriber, error) {
	cfg.SetDefaults()
	if !cfg.Enabled {
		return nil, errors.New("kvevents: config is not enabled")
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if idx == nil {
		return nil, errors.New("kvevents: nil index")
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	s := &Subscriber{
		cfg:     cfg,
		idx:     idx,
		log:     opts.Logger.With("component", "kv-events"),
		m:       opts.Metrics,
		streams: map[string]*stream{},
		byAddr:  map[string]*stream{},
		ready:   make(chan struct{}),
		replays: make(chan struct{}, maxConcurrentReplays),
	}
	s.lim = &limits{
		maxMessage: uint64(cfg.MaxMessageBytes),
		maxFrames:  8,
		handshake:  10 * time.Second,
		maxConns:   cfg.MaxConnections,
		onReject:   s.rejected,
	}
	return s, nil
}

// Ready is closed once Run has started (and, in bind mode, is listening).
func (s *Subscriber) Ready() <-chan struct{} { return s.ready }

// Addr is the bound address in bind mode once Ready; nil otherwise.
func (s *Subscriber) Addr() net.Addr {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.addr
}

func (s *Subscriber) rejected(err error) {
	s.m.err(reasonLimit)
	if ok, n := s.limitLog.allow(time.Now()); ok {
		s.log.Warn("kv events: peer cut off", "err", err, "suppressed", n)
	}
}

// zmqLogger routes go-zeromq's own log lines to ours at debug level.
func (s *Subscriber) zmqLogger() *log.Logger {
	return slog.NewLogLogger(s.log.Handler(), slog.LevelDebug)
}

// Run follows the targets until ctx ends. In bind mode it binds
// cfg.Listen and fails if it cannot.
func (s *Subscriber) Run(ctx context.Context) error {
	registerTransport()
	s.mu.Lock()
	if s.ctx != nil {
		s.mu.Unlock()
		return errors.New("kvevents: Run called twice")
	}
	s.ctx = ctx
	for _, st := range s.streams {
		s.start(st)
	}
	s.mu.Unlock()
	defer s.stopAll()

	if s.cfg.Mode != ModeBind {
		s.readyOnce.Do(func() { close(s.ready) })
		<-ctx.Done()
		return nil
	}
	ep, err := endpoint(s.cfg.Listen)
	if err != nil {
		return fmt.Errorf("kv_events.listen: %w", err)
	}
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	sub := zmq4.NewSub(withLimits(sctx, s.lim), zmq4.WithLogger(s.zmqLogger()))
	defer func() { _ = sub.Close() }()
	if err := sub.SetOption(zmq4.OptionSubscribe, s.cfg.Topic); err != nil {
		return fmt.Errorf("kv events: subscribe: %w", err)
	}
	if err := sub.Listen(ep); err != nil {
		return fmt.Errorf("kv_events.listen: %w", err)
	}
	s.mu.Lock()
	s.addr = sub.Addr()
	s.mu.Unlock()
	s.readyOnce.Do(func() { close(s.ready) })
	s.log.Info("kv events: listening for pod publishers", "addr", s.addr.String())
	for {
		msg, err := sub.Recv()
		if ctx.Err() != nil {
			return nil
		}
		if err != nil {
			// One publisher's connection ended or broke a limit; the
			// socket serves the others. (Which pod it was is unknown
			// here: its sequence resets when it comes back, and its
			// state goes stale meanwhile.)
			if !errors.Is(err, ErrLimit) {
				s.m.err(reasonRecv)
			}
			continue
		}
		s.m.message()
		topic, seq, payload, ok := parseFrames(msg.Frames)
		if !ok {
			s.m.err(reasonFrame)
			continue
		}
		addr, ok := topicAddr(topic)
		var st *stream
		if ok {
			s.mu.Lock()
			st = s.byAddr[addr]
			s.mu.Unlock()
		}
		if st == nil {
			s.m.err(reasonUnknownPod)
			if ok, n := s.unknownLog.allow(time.Now()); ok {
				s.log.Warn("kv events: topic names no followed pod", "topic", truncate(topic, 200), "suppressed", n)
			}
			continue
		}
		select {
		case st.in <- rawMsg{seq: seq, payload: payload}:
		default:
			// The pod's worker is behind (a replay, a flood): drop. The
			// sequence gap this leaves is handled like any other.
			s.m.err(reasonOverflow)
		}
	}
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

// topicAddr extracts <pod-ip>:<port> from kv@<pod-ip>:<port>@<model>.
func topicAddr(topic string) (string, bool) {
	rest, ok := strings.CutPrefix(topic, DefaultTopicPrefix)
	if !ok {
		return "", false
	}
	addr, _, ok := strings.Cut(rest, "@")
	return addr, ok && addr != ""
}

// parseFrames splits a live message [topic, seq, payload].
func parseFrames(frames [][]byte) (string, uint64, []byte, bool) {
	if len(frames) != 3 || len(frames[1]) != 8 {
		return "", 0, nil, false
	}
	return string(frames[0]), binary.BigEndian.Uint64(frames[1]), frames[2], true
}

// SetTargets replaces the followed pods. Pods no longer listed are
// dropped from the index; new ones start absent; a pod whose endpoints
// or address changed starts over.
func (s *Subscriber) SetTargets(targets []Target) {
	s.mu.Lock()
	defer s.mu.Unlock()
	want := make(map[string]Target, len(targets))
	for _, t := range targets {
		if t.Name != "" {
			want[t.Name] = t
		}
	}
	for name, st := range s.streams {
		if t, ok := want[name]; ok && t == st.t {
			continue
		}
		s.stop(st)
		delete(s.streams, name)
		if s.byAddr[st.t.Address] == st {
			delete(s.byAddr, st.t.Address)
		}
		s.idx.Remove(name)
	}
	for name, t := range want {
		if _, ok := s.streams[name]; ok {
			continue
		}
		st := &stream{s: s, t: t, dec: NewDecoder(Limits{}), in: make(chan rawMsg, 64)}
		s.streams[name] = st
		if t.Address != "" {
			s.byAddr[t.Address] = st
		}
		s.idx.Forget(name)
		if s.ctx != nil {
			s.start(st)
		}
	}
}

// start runs st's worker; s.mu is held.
func (s *Subscriber) start(st *stream) {
	ctx, cancel := context.WithCancel(s.ctx)
	st.cancel = cancel
	st.done = make(chan struct{})
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		defer close(st.done)
		if s.cfg.Mode == ModeBind {
			st.runBind(ctx)
		} else {
			st.runConnect(ctx)
		}
	}()
}

// stop ends st's worker without waiting (s.mu is held, and the worker may
// be waiting for it).
func (s *Subscriber) stop(st *stream) {
	if st.cancel != nil {
		st.cancel()
	}
}

func (s *Subscriber) stopAll() {
	s.mu.Lock()
	for _, st := range s.streams {
		s.stop(st)
	}
	s.mu.Unlock()
	s.wg.Wait()
}

type rawMsg struct {
	seq     uint64
	payload []byte
}

// stream is one pod's event stream: its sequence numbers, replay and
// decoding. Only its worker goroutine touches the fields below t.
type stream struct {
	s      *Subscriber
	t      Target
	in     chan rawMsg // bind mode: messages routed to this pod
	cancel context.CancelFunc
	done   chan struct{}

	dec         *Decoder
	batch       Batch
	haveLive    bool
	lastLive    uint64
	haveApplied bool
	lastApplied uint64
	logs        logLimiter
}

func (st *stream) logf(msg string, args ...any) {
	if ok, n := st.logs.allow(time.Now()); ok {
		st.s.log.Warn(msg, append(args, "pod", st.t.Name, "suppressed", n)...)
	}
}

func (st *stream) resetSeq() {
	st.haveLive, st.lastLive = false, 0
	st.haveApplied, st.lastApplied = false, 0
}

func (st *stream) runBind(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case m := <-st.in:
			st.handle(ctx, m.seq, m.payload)
		}
	}
}

func (st *stream) runConnect(ctx context.Context) {
	const first = 100 * time.Millisecond
	backoff := first
	for ctx.Err() == nil {
		if st.session(ctx) {
			backoff = first
		}
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		backoff = min(2*backoff, DefaultReconnectMax)
	}
}

// session connects to the pod's publisher and follows it until the
// connection ends; it reports whether it connected.
func (st *stream) session(ctx context.Context) bool {
	s := st.s
	ep, err := endpoint(st.t.Endpoint)
	if err != nil {
		s.m.err(reasonConnect)
		st.logf("kv events: bad publisher endpoint", "endpoint", st.t.Endpoint, "err", err)
		return false
	}
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	sub := zmq4.NewSub(withLimits(sctx, s.lim), zmq4.WithDialerMaxRetries(0),
		zmq4.WithDialerTimeout(5*time.Second), zmq4.WithLogger(s.zmqLogger()))
	defer func() { _ = sub.Close() }()
	if err := sub.SetOption(zmq4.OptionSubscribe, s.cfg.Topic); err != nil {
		return false
	}
	if err := sub.Dial(ep); err != nil {
		s.m.err(reasonConnect)
		st.logf("kv events: cannot connect to the pod's publisher", "endpoint", st.t.Endpoint, "err", err)
		return false
	}
	s.log.Debug("kv events: connected", "pod", st.t.Name, "endpoint", st.t.Endpoint)
	st.resetSeq()
	if st.t.ReplayEndpoint != "" {
		// Rebuild from the publisher's buffer without waiting for
		// traffic (an idle pod's warm cache is known at once).
		st.catchUp(ctx, 0, 0)
	}
	for {
		msg, err := sub.Recv()
		if ctx.Err() != nil {
			return true
		}
		if err != nil {
			// The publisher went away (go-zeromq: EOF) or broke a limit.
			// Its cache may be gone with it (a restart): forget the pod
			// until it is back.
			if !errors.Is(err, ErrLimit) {
				s.m.err(reasonRecv)
			}
			s.idx.Forget(st.t.Name)
			s.m.reset("publisher_gone")
			st.logf("kv events: publisher connection ended; pod's entries dropped until it is back", "err", err)
			return true
		}
		s.m.message()
		topic, seq, payload, ok := parseFrames(msg.Frames)
		if !ok || !strings.HasPrefix(topic, s.cfg.Topic) {
			s.m.err(reasonFrame)
			st.logf("kv events: message not shaped [topic, seq, payload] or off-topic", "frames", len(msg.Frames))
			continue
		}
		st.handle(ctx, seq, payload)
	}
}

// handle applies one live message, detecting restarts and gaps.
func (st *stream) handle(ctx context.Context, seq uint64, payload []byte) {
	s := st.s
	if st.haveLive {
		switch {
		case seq == st.lastLive:
			return // a duplicate
		case seq < st.lastLive:
			// The publisher's sequence restarted: the engine restarted,
			// and its cache is empty.
			s.idx.Clear(st.t.Name, false)
			s.m.reset("restart")
			st.haveApplied, st.lastApplied = false, 0
			s.log.Info("kv events: pod's event sequence restarted; its entries were dropped", "pod", st.t.Name, "seq", seq, "last", st.lastLive)
		}
	}
	st.haveLive, st.lastLive = true, seq
	if st.haveApplied && seq <= st.lastApplied {
		return // already applied from a replay
	}
	if (!st.haveApplied && seq > 0) || (st.haveApplied && seq > st.lastApplied+1) {
		var from uint64
		joining := !st.haveApplied
		if !joining {
			from = st.lastApplied + 1
		}
		st.catchUp(ctx, from, seq)
	}
	if !st.haveApplied || seq == st.lastApplied+1 {
		st.apply(seq, payload)
	}
}

// catchUp fills [from, upTo) by replay when the pod has a replay socket
// (upTo 0: whatever the buffer holds); what cannot be filled is lost
// history, and the pod's entries start over, stale.
func (st *stream) catchUp(ctx context.Context, from, upTo uint64) {
	s := st.s
	joining := !st.haveApplied
	complete, lost := false, false
	if st.t.ReplayEndpoint != "" {
		complete, lost = st.replay(ctx, from)
	}
	if upTo == 0 {
		return // proactive replay on connect: nothing is known missing yet
	}
	filled := st.haveApplied && st.lastApplied+1 >= upTo
	switch {
	case filled && !lost:
		if !joining {
			s.m.gap("replayed")
		}
	case filled: // replayed, but the buffer had already dropped part of it
		s.m.gap("unrepaired")
	default:
		s.idx.Clear(st.t.Name, true)
		if joining {
			s.m.reset("joined")
		} else {
			s.m.gap("unrepaired")
			s.m.reset("gap")
		}
		st.haveApplied, st.lastApplied = true, upTo-1
		st.logf("kv events: missed events could not be replayed; pod's entries rebuild from new events",
			"from", from, "to", upTo-1, "replay", st.t.ReplayEndpoint != "", "replay_complete", complete)
	}
}

// replay asks the pod's ROUTER socket for batches from seq from on and
// applies them. complete: the end marker came; lost: the buffer no longer
// held from (the pod's entries were cleared before applying the rest).
func (st *stream) replay(ctx context.Context, from uint64) (complete, lost bool) {
	s := st.s
	ep, err := endpoint(st.t.ReplayEndpoint)
	if err != nil {
		s.m.err(reasonReplay)
		return false, false
	}
	select {
	case s.replays <- struct{}{}:
		defer func() { <-s.replays }()
	case <-ctx.Done():
		return false, false
	}
	rctx, cancel := context.WithTimeout(ctx, replayTotalFactor*s.cfg.ReplayTimeout)
	defer cancel()
	// Each message must come within ReplayTimeout of the last.
	idle := time.AfterFunc(s.cfg.ReplayTimeout, cancel)
	defer idle.Stop()
	d := zmq4.NewDealer(withLimits(rctx, s.lim), zmq4.WithDialerMaxRetries(0),
		zmq4.WithDialerTimeout(s.cfg.ReplayTimeout), zmq4.WithTimeout(s.cfg.ReplayTimeout), zmq4.WithLogger(s.zmqLogger()))
	defer func() { _ = d.Close() }()
	if err := d.Dial(ep); err != nil {
		s.m.err(reasonReplay)
		st.logf("kv events: cannot connect to the pod's replay socket", "endpoint", st.t.ReplayEndpoint, "err", err)
		return false, false
	}
	var start [8]byte
	binary.BigEndian.PutUint64(start[:], from)
	if err := d.SendMulti(zmq4.NewMsgFrom([]byte{}, start[:])); err != nil {
		s.m.err(reasonReplay)
		return false, false
	}
	expected, first := from, true
	for {
		msg, err := d.Recv()
		if err != nil {
			s.m.err(reasonReplay)
			st.logf("kv events: replay ended early", "endpoint", st.t.ReplayEndpoint, "err", err)
			return false, lost
		}
		idle.Reset(s.cfg.ReplayTimeout)
		s.m.message()
		seq, payload, end, ok := parseReplay(msg.Frames)
		if !ok {
			s.m.err(reasonReplay)
			return false, lost
		}
		if end {
			return true, lost
		}
		if seq < expected {
			continue
		}
		if seq > expected {
			if !first {
				s.m.err(reasonReplay)
				return false, lost
			}
			// The buffer starts after what we asked for: that history
			// is gone, so entries from before it cannot be trusted.
			lost = true
			s.idx.Clear(st.t.Name, true)
		}
		first = false
		st.apply(seq, payload)
		expected = seq + 1
	}
}

// parseReplay reads a replay reply: ["", seq, payload] (vLLM) or
// ["", topic, seq, payload]; the end marker has an empty payload.
func parseReplay(frames [][]byte) (seq uint64, payload []byte, end, ok bool) {
	if len(frames) > 0 && len(frames[0]) == 0 {
		frames = frames[1:]
	}
	switch len(frames) {
	case 2:
	case 3:
		frames = frames[1:]
	default:
		return 0, nil, false, false
	}
	if len(frames[0]) != 8 {
		return 0, nil, false, false
	}
	if len(frames[1]) == 0 {
		return 0, nil, true, true
	}
	return binary.BigEndian.Uint64(frames[0]), frames[1], false, true
}

// apply decodes and applies message seq.
func (st *stream) apply(seq uint64, payload []byte) {
	s := st.s
	st.haveApplied, st.lastApplied = true, seq
	if err := st.dec.Decode(payload, &st.batch); err != nil {
		// What this batch changed is unknown: start over.
		s.m.err(reasonDecode)
		s.m.reset("decode_error")
		s.idx.Clear(st.t.Name, true)
		st.logf("kv events: undecodable batch; pod's entries rebuild from new events", "seq", seq, "bytes", len(payload), "err", err)
		return
	}
	stats := s.idx.Apply(st.t.Name, &st.batch)
	s.m.applied(&st.batch, stats)
}
