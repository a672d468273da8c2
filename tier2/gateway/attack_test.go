package gateway_test

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/infergate/infergate/tier2/gateway"
)

// stalledPost opens a connection, sends a request's headers announcing a
// body of bodyLen bytes and only the first 10 of them, and returns the
// connection and a reader for the answer.
func stalledPost(t *testing.T, s *stack, key string, bodyLen int) (net.Conn, *bufio.Reader) {
	t.Helper()
	conn, err := net.Dial("tcp", strings.TrimPrefix(s.url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	auth := ""
	if key != "" {
		auth = "Authorization: Bearer " + key + "\r\n"
	}
	fmt.Fprintf(conn, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n%sContent-Type: application/json\r\nContent-Length: %d\r\n\r\n{\"model\":", auth, bodyLen)
	// Generous: the server answers at once or after its short body
	// timeout; the old code answered never.
	_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	return conn, bufio.NewReader(conn)
}

// closed reports whether the server closed the connection after its answer.
func closed(t *testing.T, br *bufio.Reader) {
	t.Helper()
	if _, err := br.ReadByte(); !errors.Is(err, io.EOF) {
		t.Fatalf("connection still open after the answer (read: %v)", err)
	}
}

// An answer given before the body is read (no credential) closes the
// connection instead of waiting to drain a body the client stalls: a
// stalled body costs the server nothing after the answer.
func TestEarlyAnswerDoesNotWaitForBody(t *testing.T) {
	a := newTier1(t, "a", "east", "m")
	s := newStack(t, stackOpts{src: static(t, a.cluster(1, 10))})
	for _, key := range []string{"", "wrong-key"} {
		_, br := stalledPost(t, s, key, 200_000) // under net/http's 256 KiB drain
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("key %q: no answer: %v", key, err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusUnauthorized || !resp.Close {
			t.Fatalf("key %q: %d, Connection: close %v", key, resp.StatusCode, resp.Close)
		}
		closed(t, br)
	}
}

// An authenticated client that stalls its body is answered 400 after
// BodyReadTimeout and its connection closed.
func TestStalledBodyTimesOut(t *testing.T) {
	a := newTier1(t, "a", "east", "m")
	s := newStack(t, stackOpts{src: static(t, a.cluster(1, 10)), gateway: func(o *gateway.Options) {
		o.BodyReadTimeout = 300 * time.Millisecond
	}})
	_, br := stalledPost(t, s, "key-cost", 1000)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("no answer: %v", err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(b), "body_timeout") {
		t.Fatalf("%d %s", resp.StatusCode, b)
	}
	closed(t, br)
	if a.hits.Load() != 0 {
		t.Fatal("a request without its body reached tier1")
	}
}

// The body deadline is lifted once the body is read: a stream longer
// than BodyReadTimeout completes.
func TestStreamOutlivesBodyTimeout(t *testing.T) {
	a := newTier1(t, "a", "east", "m")
	a.chunkDelay.Store(int64(250 * time.Millisecond))
	s := newStack(t, stackOpts{src: static(t, a.cluster(1, 10)), gateway: func(o *gateway.Options) {
		o.BodyReadTimeout = 200 * time.Millisecond
	}})
	r := s.do(t, "key-cost", "/v1/chat/completions", `{"model":"m","stream":true}`)
	if r.code != 200 || !strings.Contains(r.body, "[DONE]") {
		t.Fatalf("%d %q", r.code, r.body)
	}
}
