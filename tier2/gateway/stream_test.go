package gateway_test

import (
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/infergate/infergate/tier2/gateway"
)

// A client that asks for a stream and never reads it is dropped once a
// write stalls for StreamWriteTimeout, and its reservation is finished
// (which frees its concurrency slot) rather than held for as long as the
// cluster keeps generating.
func TestStalledReaderDropped(t *testing.T) {
	a := newTier1(t, "a", "east", "m")
	a.mode.Store("endless")
	lim := &fakeLimiter{}
	s := newStack(t, stackOpts{src: static(t, a.cluster(1, 10)), gateway: func(o *gateway.Options) {
		o.Limiter = lim
		o.StreamWriteTimeout = 200 * time.Millisecond
	}})
	conn, err := net.Dial("tcp", strings.TrimPrefix(s.url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if tc, ok := conn.(*net.TCPConn); ok {
		_ = tc.SetReadBuffer(4 << 10) // fill up sooner
	}
	body := `{"model":"m","stream":true}`
	fmt.Fprintf(conn, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer key-cost\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
	// Never read. The reservation must be finished.
	waitFor(t, 15*time.Second, "reservation finished", func() bool { return len(lim.lastFinished()) == 1 })
	waitFor(t, 5*time.Second, "tier1 request ended", func() bool { return a.active.Load() == 0 })
}

// A stream longer than MaxStreamDuration ends with an error event.
func TestMaxStreamDuration(t *testing.T) {
	a := newTier1(t, "a", "east", "m")
	a.mode.Store("endless")
	a.chunkDelay.Store(int64(20 * time.Millisecond))
	lim := &fakeLimiter{}
	s := newStack(t, stackOpts{src: static(t, a.cluster(1, 10)), gateway: func(o *gateway.Options) {
		o.Limiter = lim
		o.MaxStreamDuration = 300 * time.Millisecond
	}})
	r := s.do(t, "key-cost", "/v1/chat/completions", `{"model":"m","stream":true}`)
	d := sseData(r.body)
	if r.code != 200 || len(d) < 2 || !strings.Contains(d[len(d)-1], `"code":"stream_too_long"`) {
		t.Fatalf("got %d, %d events, last %.200q", r.code, len(d), d[len(d)-1])
	}
	if len(lim.lastFinished()) != 1 {
		t.Fatal("reservation not finished")
	}
}

// An event over MaxEventBytes ends the stream with an error event instead
// of being buffered without bound.
func TestEventTooLarge(t *testing.T) {
	a := newTier1(t, "a", "east", "m")
	a.mode.Store("huge-event")
	s := newStack(t, stackOpts{src: static(t, a.cluster(1, 10)), gateway: func(o *gateway.Options) {
		o.MaxEventBytes = 64 << 10
	}})
	r := s.do(t, "key-cost", "/v1/chat/completions", `{"model":"m","stream":true}`)
	d := sseData(r.body)
	if r.code != 200 || len(d) != 2 || !strings.Contains(d[0], "first") || !strings.Contains(d[1], `"code":"upstream_event_too_large"`) {
		t.Fatalf("got %d %.300q", r.code, r.body)
	}
}
