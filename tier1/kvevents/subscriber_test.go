package kvevents

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/infergate/infergate/sim/engine"
	"github.com/infergate/infergate/sim/kvpub"
	"github.com/infergate/infergate/sim/server"
)

// These tests run real ZeroMQ sockets over TCP on loopback. The model
// servers are simulated pods (sim/server, standing in for vLLM on a GPU)
// publishing through sim/kvpub, or hand-driven publishers (testPub) where
// a test needs to control sequence numbers exactly.

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func testLogger(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelInfo}))
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(string(bytes.TrimRight(p, "\n")))
	return len(p), nil
}

type harness struct {
	sub *Subscriber
	idx *Index
	m   *Metrics
	reg *prometheus.Registry
}

// startSubscriber runs a subscriber until the test ends.
func startSubscriber(t *testing.T, cfg Config, opts IndexOptions, targets ...Target) *harness {
	t.Helper()
	cfg.Enabled = true
	cfg.SetDefaults()
	if opts.MaxBlocksPerPod == 0 {
		opts = cfg.IndexOptions()
	}
	idx := NewIndex(opts)
	reg := prometheus.NewRegistry()
	m, err := NewMetrics(reg, idx)
	if err != nil {
		t.Fatal(err)
	}
	sub, err := New(cfg, idx, Options{Logger: testLogger(t), Metrics: m})
	if err != nil {
		t.Fatal(err)
	}
	sub.SetTargets(targets)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- sub.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	select {
	case <-sub.Ready():
	case err := <-done:
		t.Fatalf("Run: %v", err)
	}
	return &harness{sub: sub, idx: idx, m: m, reg: reg}
}

func (h *harness) match(pod string, hashes []uint64) int {
	return h.idx.Match(hashes, 16, []string{pod}, nil)[0]
}

func counter(t *testing.T, c *prometheus.CounterVec, label string) float64 {
	t.Helper()
	return testutil.ToFloat64(c.WithLabelValues(label))
}

// simPod starts a simulated pod with a 48-block KV cache publishing KV
// events per kv. If kv.Topic contains %s it is filled with the pod's
// address (llm-d's kv@<pod-ip>:<port>@<model>).
func simPod(t *testing.T, kv kvpub.Config) (*server.Server, string) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	if bytes.Contains([]byte(kv.Topic), []byte("%s")) {
		kv.Topic = fmt.Sprintf(kv.Topic, addr)
	}
	kv.Logger = testLogger(t)
	s, err := server.New(server.Config{
		TimeScale: 0.01,
		Tune:      func(c *engine.Config) { c.NumBlocks = 48 },
		Logger:    testLogger(t),
		KVEvents:  kv,
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx, ln) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("pod: %v", err)
		}
	})
	if kv.Connect {
		return s, addr
	}
	eventually(t, "the pod's publisher to bind", func() bool { return s.KVEventsAddr() != "" })
	return s, addr
}

// complete sends a prompt of token ids to the pod and waits for the
// answer (max_tokens 1: the prompt's blocks are cached at prefill).
func complete(t *testing.T, addr string, prompt []uint32) {
	t.Helper()
	body, _ := json.Marshal(map[string]any{"model": server.DefaultModel, "prompt": prompt, "max_tokens": 1})
	resp, err := http.Post("http://"+addr+"/v1/completions", "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("completion: %d %s", resp.StatusCode, b)
	}
}

func resetPrefixCache(t *testing.T, addr string) {
	t.Helper()
	resp, err := http.Post("http://"+addr+"/reset_prefix_cache", "application/json", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("reset_prefix_cache: %d", resp.StatusCode)
	}
}

// TestSimPodConnect: the vLLM topology (the pod binds, Tier 1 connects),
// tagged maps, replay on. The index credits what the pod cached, stops
// crediting a prefix once the pod evicts it, and empties on
// AllBlocksCleared.
func TestSimPodConnect(t *testing.T) {
	pod, addr := simPod(t, kvpub.Config{Endpoint: "tcp://127.0.0.1:0", ReplayEndpoint: "tcp://127.0.0.1:0"})
	h := startSubscriber(t, Config{}, IndexOptions{}, Target{
		Name: "pod-a", Address: addr, Endpoint: pod.KVEventsAddr(), ReplayEndpoint: pod.KVEventsReplayAddr(),
	})
	eventually(t, "the subscription", pod.KVEventsSubscribed)
	first := seqTokens(1_000, 8*16+5) // 8 full blocks
	hashes := HashTokens(first, 16, "")
	complete(t, addr, first)
	eventually(t, "the pod's 8 blocks in the index", func() bool { return h.match("pod-a", hashes) == 8 })
	if s := h.idx.State("pod-a"); s != StateFresh {
		t.Errorf("state %v, want fresh", s)
	}
	if n := h.match("pod-a", HashTokens(seqTokens(1_000, 64), 16, "other-adapter")); n != 0 {
		t.Errorf("another adapter matched %d", n)
	}

	// 48 blocks: five more 8-block prompts push the first one out (LRU).
	for i := range 5 {
		complete(t, addr, seqTokens(100_000*(i+1), 8*16+5))
	}
	eventually(t, "the evicted prefix to leave the index", func() bool { return h.match("pod-a", hashes) < 8 })
	last := HashTokens(seqTokens(500_000, 8*16+5), 16, "")
	eventually(t, "the newest prompt in the index", func() bool { return h.match("pod-a", last) == 8 })

	resetPrefixCache(t, addr)
	eventually(t, "AllBlocksCleared to empty the pod", func() bool {
		return h.match("pod-a", last) == 0 && h.idx.Stats()[0].Blocks == 0
	})
	if got := counter(t, h.m.events, "AllBlocksCleared"); got != 1 {
		t.Errorf("AllBlocksCleared events %v", got)
	}
	if got := counter(t, h.m.errs, reasonDecode); got != 0 {
		t.Errorf("decode errors %v", got)
	}
}

// TestSimPodBind: llm-d's topology (Tier 1 binds one SUB socket, pods
// dial it), the positional array form, two pods routed by topic, and a
// LoRA adapter's blocks keyed by its name.
func TestSimPodBind(t *testing.T) {
	h := startSubscriber(t, Config{Mode: ModeBind, Listen: "tcp://127.0.0.1:0"}, IndexOptions{})
	ep := "tcp://" + h.sub.Addr().String()
	podA, addrA := simPod(t, kvpub.Config{Endpoint: ep, Connect: true, Legacy: true, Topic: "kv@%s@llama"})
	podB, addrB := simPod(t, kvpub.Config{Endpoint: ep, Connect: true, Topic: "kv@%s@llama"})
	h.sub.SetTargets([]Target{{Name: "a", Address: addrA}, {Name: "b", Address: addrB}})
	// A PUB drops what it sends before the subscription reaches it.
	eventually(t, "pod a's connection", podA.KVEventsSubscribed)
	eventually(t, "pod b's connection", podB.KVEventsSubscribed)

	prompt := seqTokens(7, 4*16)
	hashes := HashTokens(prompt, 16, "")
	complete(t, addrA, prompt)
	eventually(t, "pod a's blocks", func() bool { return h.match("a", hashes) == 4 })
	if n := h.match("b", hashes); n != 0 {
		t.Errorf("pod b credited with pod a's blocks: %d", n)
	}
	other := seqTokens(9_000, 2*16)
	complete(t, addrB, other)
	eventually(t, "pod b's blocks", func() bool { return h.match("b", HashTokens(other, 16, "")) == 2 })
	for _, p := range []string{"a", "b"} {
		if s := h.idx.State(p); s != StateFresh {
			t.Errorf("pod %s %v, want fresh: its stream was seen from seq 0", p, s)
		}
	}
}

// testPub is a publisher driven by hand: it sends exactly the sequence
// numbers a test chooses, keeps every batch for replay, and serves
// vLLM's replay protocol on a ROUTER socket.
type testPub struct {
	t      *testing.T
	pub    zmq4.Socket
	router zmq4.Socket
	topic  string
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu  sync.Mutex
	buf map[uint64][]byte
}

// newTestPub binds ep (or dials it, connect) and, with replay, a ROUTER
// on replayEp.
func newTestPub(t *testing.T, ep string, dial bool, replayEp string, topic string) *testPub {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	p := &testPub{t: t, topic: topic, cancel: cancel, buf: map[uint64][]byte{}}
	p.pub = zmq4.NewPub(ctx)
	var err error
	if dial {
		err = p.pub.Dial(ep)
	} else {
		err = p.pub.Listen(ep)
	}
	if err != nil {
		t.Fatal(err)
	}
	if replayEp != "" {
		p.router = zmq4.NewRouter(ctx)
		if err := p.router.Listen(replayEp); err != nil {
			t.Fatal(err)
		}
		p.wg.Add(1)
		go p.serveReplay(ctx)
	}
	t.Cleanup(p.Close)
	return p
}

func (p *testPub) Close() {
	p.cancel()
	p.wg.Wait()
	_ = p.pub.Close()
	if p.router != nil {
		_ = p.router.Close()
	}
}

func (p *testPub) addr() string { return "tcp://" + p.pub.Addr().String() }

func (p *testPub) replayAddr() string { return "tcp://" + p.router.Addr().String() }

// waitSubscribed waits until a subscriber's subscription reached the
// PUB socket, so nothing sent after it is dropped.
func (p *testPub) waitSubscribed() {
	eventually(p.t, "a subscriber", func() bool {
		return len(p.pub.(zmq4.Topics).Topics()) > 0
	})
}

// send records batch seq for replay and, if live, publishes it.
func (p *testPub) send(seq uint64, payload []byte, live bool) {
	p.mu.Lock()
	p.buf[seq] = payload
	p.mu.Unlock()
	if !live {
		return
	}
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], seq)
	if err := p.pub.SendMulti(zmq4.NewMsgFrom([]byte(p.topic), b[:], payload)); err != nil {
		p.t.Errorf("send %d: %v", seq, err)
	}
}

func (p *testPub) serveReplay(ctx context.Context) {
	defer p.wg.Done()
	for {
		msg, err := p.router.Recv()
		if ctx.Err() != nil {
			return
		}
		if err != nil || len(msg.Frames) != 3 {
			continue
		}
		start := binary.BigEndian.Uint64(msg.Frames[2])
		p.mu.Lock()
		var seqs []uint64
		for s := range p.buf {
			if s >= start {
				seqs = append(seqs, s)
			}
		}
		slices.Sort(seqs)
		payloads := make([][]byte, len(seqs))
		for i, s := range seqs {
			payloads[i] = p.buf[s]
		}
		p.mu.Unlock()
		for i, s := range seqs {
			var b [8]byte
			binary.BigEndian.PutUint64(b[:], s)
			_ = p.router.SendMulti(zmq4.NewMsgFrom(msg.Frames[0], []byte{}, b[:], payloads[i]))
		}
		_ = p.router.SendMulti(zmq4.NewMsgFrom(msg.Frames[0], []byte{}, bytes.Repeat([]byte{0xff}, 8), []byte{}))
	}
}

// chain is a prompt of n blocks and the payloads that store each block,
// chained by engine hashes 1000+i.
type chain struct {
	tokens []uint32
	hashes []uint64
}

func newChain(start, blocks int) chain {
	toks := seqTokens(start, blocks*16)
	return chain{tokens: toks, hashes: HashTokens(toks, 16, "")}
}

func (c chain) store(i int) []byte {
	var parent uint64
	if i > 0 {
		parent = uint64(1000 + i - 1)
	}
	return batchMap(1, mp{}.storedMap([]uint64{uint64(1000 + i)}, parent, c.tokens[i*16:(i+1)*16], 16, ""))
}

// TestGapReplayed: a batch missing from the live stream is fetched from
// the replay socket and the index converges to the full chain.
func TestGapReplayed(t *testing.T) {
	p := newTestPub(t, "tcp://127.0.0.1:0", false, "tcp://127.0.0.1:0", "")
	h := startSubscriber(t, Config{}, IndexOptions{}, Target{Name: "p", Endpoint: p.addr(), ReplayEndpoint: p.replayAddr()})
	p.waitSubscribed()
	c := newChain(0, 3)
	p.send(0, c.store(0), true)
	eventually(t, "block 0", func() bool { return h.match("p", c.hashes) == 1 })
	p.send(1, c.store(1), false) // lost on the way
	p.send(2, c.store(2), true)
	eventually(t, "the chain after replay", func() bool { return h.match("p", c.hashes) == 3 })
	if got := counter(t, h.m.gaps, "replayed"); got != 1 {
		t.Errorf("gaps replayed = %v, want 1", got)
	}
	if s := h.idx.State("p"); s != StateFresh {
		t.Errorf("state %v, want fresh", s)
	}
}

// TestGapUnrepaired: without replay a gap drops the pod's entries (they
// may include blocks since evicted) and marks it stale until the rebuild
// window passes; new events refill it meanwhile.
func TestGapUnrepaired(t *testing.T) {
	clk := newFakeClock()
	p := newTestPub(t, "tcp://127.0.0.1:0", false, "", "")
	cfg := Config{RebuildWindow: time.Minute}
	cfg.SetDefaults()
	opts := cfg.IndexOptions()
	opts.Now = clk.Now
	h := startSubscriber(t, cfg, opts, Target{Name: "p", Endpoint: p.addr()})
	p.waitSubscribed()
	c := newChain(0, 3)
	p.send(0, c.store(0), true)
	eventually(t, "block 0", func() bool { return h.match("p", c.hashes) == 1 })
	p.send(2, c.store(2), true) // seq 1 never comes
	eventually(t, "the gap", func() bool { return counter(t, h.m.gaps, "unrepaired") == 1 })
	if n := h.match("p", c.hashes); n != 0 {
		t.Errorf("after an unrepaired gap the index still credits %d blocks", n)
	}
	if s := h.idx.State("p"); s != StateStale {
		t.Errorf("state %v, want stale", s)
	}
	d := newChain(50_000, 2)
	p.send(3, batchMap(1, mp{}.storedMap([]uint64{77, 78}, 0, d.tokens, 16, "")), true)
	eventually(t, "new events to rebuild", func() bool { return h.match("p", d.hashes) == 2 })
	clk.Advance(61 * time.Second)
	p.send(4, batchMap(1, mp{}.removedMap(12345)), true)
	eventually(t, "fresh after the rebuild window", func() bool { return h.idx.State("p") == StateFresh })
}

// TestRestartConnect: a pod's publisher goes away (go-zeromq's Recv
// returns EOF) and comes back on the same port with its sequence from 0:
// the pod is absent meanwhile and its old blocks are gone after.
func TestRestartConnect(t *testing.T) {
	p1 := newTestPub(t, "tcp://127.0.0.1:0", false, "", "")
	ep := p1.addr()
	h := startSubscriber(t, Config{}, IndexOptions{}, Target{Name: "p", Endpoint: ep})
	p1.waitSubscribed()
	old := newChain(0, 2)
	p1.send(0, old.store(0), true)
	p1.send(1, old.store(1), true)
	eventually(t, "the old chain", func() bool { return h.match("p", old.hashes) == 2 })
	p1.Close()
	eventually(t, "the pod to be forgotten", func() bool { return h.idx.State("p") == StateAbsent })
	if n := h.match("p", old.hashes); n != 0 {
		t.Errorf("absent pod still credited %d", n)
	}
	p2 := newTestPub(t, ep, false, "", "")
	p2.waitSubscribed()
	fresh := newChain(70_000, 1)
	p2.send(0, fresh.store(0), true)
	eventually(t, "the restarted pod's block", func() bool { return h.match("p", fresh.hashes) == 1 })
	if s := h.idx.State("p"); s != StateFresh {
		t.Errorf("state %v, want fresh (a stream from seq 0 is complete)", s)
	}
	if got := counter(t, h.m.resets, "publisher_gone"); got < 1 {
		t.Errorf("publisher_gone resets %v", got)
	}
}

// TestRestartBind: in bind mode a restarted pod is seen by its sequence
// starting over; its old entries are dropped.
func TestRestartBind(t *testing.T) {
	h := startSubscriber(t, Config{Mode: ModeBind, Listen: "tcp://127.0.0.1:0"}, IndexOptions{},
		Target{Name: "p", Address: "10.0.0.7:8000"})
	ep := "tcp://" + h.sub.Addr().String()
	topic := "kv@10.0.0.7:8000@llama"
	p1 := newTestPub(t, ep, true, "", topic)
	p1.waitSubscribed()
	old := newChain(0, 2)
	for i := range 2 {
		p1.send(uint64(i), old.store(i), true)
	}
	eventually(t, "the old chain", func() bool { return h.match("p", old.hashes) == 2 })
	p1.Close()
	p2 := newTestPub(t, ep, true, "", topic)
	p2.waitSubscribed()
	fresh := newChain(70_000, 1)
	p2.send(0, fresh.store(0), true)
	eventually(t, "the restarted pod's block", func() bool { return h.match("p", fresh.hashes) == 1 })
	if n := h.match("p", old.hashes); n != 0 {
		t.Errorf("restarted pod still credited with %d old blocks", n)
	}
	if got := counter(t, h.m.resets, "restart"); got != 1 {
		t.Errorf("restart resets %v, want 1", got)
	}
	// A topic naming no followed pod is dropped and counted.
	p2.topic = "kv@10.9.9.9:8000@llama"
	p2.send(1, fresh.store(0), true)
	eventually(t, "the unknown pod to be counted", func() bool { return counter(t, h.m.errs, reasonUnknownPod) >= 1 })
}

// TestHostilePublisher: a pod publishing garbage and oversized batches
// costs no more than the cap, and errors are counted.
func TestHostilePublisher(t *testing.T) {
	p := newTestPub(t, "tcp://127.0.0.1:0", false, "", "")
	cfg := Config{MaxBlocksPerPod: 1000, MaxMessageBytes: 1 << 20}
	h := startSubscriber(t, cfg, IndexOptions{}, Target{Name: "p", Endpoint: p.addr()})
	p.waitSubscribed()
	seq := uint64(0)
	for i := range 20 {
		garbage := bytes.Repeat([]byte{0xdc, 0xff, byte(i)}, 100)
		p.send(seq, garbage, true)
		seq++
		// 5,000 blocks per batch, far past the pod's cap.
		hashes := make([]uint64, 5000)
		for j := range hashes {
			hashes[j] = uint64(i*5000 + j + 1)
		}
		p.send(seq, batchArray(1, mp{}.arr(5).str("BlockStored").uints(hashes...).null().tokens(make([]uint32, 5000)).uint(1)), true)
		seq++
	}
	eventually(t, "every batch", func() bool { return testutil.ToFloat64(h.m.messages) >= 40 })
	st := h.idx.Stats()
	if len(st) != 1 || st[0].Blocks > 1000 {
		t.Fatalf("stats %+v: the cap is 1000 blocks", st)
	}
	if got := counter(t, h.m.errs, reasonDecode); got != 20 {
		t.Errorf("decode errors %v, want 20", got)
	}
	if got := testutil.ToFloat64(h.m.dropped.WithLabelValues("cap")); got < 5000 {
		t.Errorf("blocks dropped at the cap: %v", got)
	}
}

// TestHostilePeers: on the bound socket, a peer announcing a 1 TiB
// message is cut off before anything is allocated for it, an idle peer
// and one that is not ZeroMQ at all do not stall others, and a real pod
// keeps publishing through all of it.
func TestHostilePeers(t *testing.T) {
	h := startSubscriber(t, Config{Mode: ModeBind, Listen: "tcp://127.0.0.1:0", MaxMessageBytes: 1 << 20}, IndexOptions{},
		Target{Name: "p", Address: "10.0.0.8:8000"})
	addr := h.sub.Addr().String()

	idle, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer idle.Close()
	junk, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer junk.Close()
	_, _ = junk.Write([]byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n"))
	eventually(t, "the non-ZeroMQ peer to be refused", func() bool { return counter(t, h.m.errs, reasonLimit) == 1 })

	// A ZMTP 3.0 PUB speaking NULL, then a frame header claiming 1 TiB.
	huge, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer huge.Close()
	greeting := make([]byte, 64)
	greeting[0], greeting[9], greeting[10] = 0xff, 0x7f, 3
	copy(greeting[12:], "NULL")
	ready := append([]byte("\x05READY\x0bSocket-Type"), 0, 0, 0, 3)
	ready = append(ready, "PUB"...)
	msg := slices.Concat(greeting, []byte{0x04, byte(len(ready))}, ready,
		[]byte{0x02}, binary.BigEndian.AppendUint64(nil, 1<<40))
	if _, err := huge.Write(msg); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the oversized peer to be cut off", func() bool { return counter(t, h.m.errs, reasonLimit) == 2 })
	_ = huge.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.Copy(io.Discard, huge); err != nil {
		t.Errorf("the oversized peer's connection was not closed: %v", err)
	}

	p := newTestPub(t, "tcp://"+addr, true, "", "kv@10.0.0.8:8000@llama")
	p.waitSubscribed()
	c := newChain(0, 1)
	p.send(0, c.store(0), true)
	eventually(t, "the honest pod's block", func() bool { return h.match("p", c.hashes) == 1 })
}

// TestKVPubForms: both of the simulator's wire forms decode to the same
// events (the simulator's encoder checked against this decoder).
func TestKVPubForms(t *testing.T) {
	for _, legacy := range []bool{false, true} {
		t.Run(fmt.Sprintf("legacy=%v", legacy), func(t *testing.T) {
			p, err := kvpub.Open(context.Background(), kvpub.Config{Endpoint: "tcp://127.0.0.1:0", ReplayEndpoint: "tcp://127.0.0.1:0", Legacy: legacy, Logger: testLogger(t)})
			if err != nil {
				t.Fatal(err)
			}
			defer p.Close()
			toks := seqTokens(0, 48)
			h := startSubscriber(t, Config{}, IndexOptions{}, Target{Name: "p", Endpoint: p.Addr(), ReplayEndpoint: p.ReplayAddr()})
			eventually(t, "the subscription", p.Subscribed)
			p.Stored(1, 0, false, toks[:16], "ad", 4)
			p.Stored(2, 1, true, toks[16:32], "ad", 4)
			p.Stored(3, 2, true, toks[32:48], "ad", 4)
			eventually(t, "the adapter's chain", func() bool { return h.match("p", HashTokens(toks, 16, "ad")) == 3 })
			p.Removed(2)
			eventually(t, "the removal", func() bool { return h.match("p", HashTokens(toks, 16, "ad")) == 1 })
			p.Cleared()
			eventually(t, "the clear", func() bool { return h.match("p", HashTokens(toks, 16, "ad")) == 0 })
		})
	}
}
