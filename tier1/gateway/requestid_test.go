package gateway

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/infergate/infergate/shared/config"
	"github.com/infergate/infergate/shared/openai"
)

type lockedBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuf) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuf) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// The request ID: the caller's when well-formed, else generated; sent to
// the pod, returned to the caller (the pod's own is replaced) and on the
// log lines about the request.
func TestRequestIDHeader(t *testing.T) {
	pods := []*fakePod{newFakePod(t, "p1"), newFakePod(t, "p2")}
	var failed atomic.Bool
	for _, p := range pods {
		p.set(func(p *fakePod) {
			p.handler = func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("X-Request-Id", "pod-own")
				if failed.CompareAndSwap(false, true) { // the first attempt fails: a retry is logged
					http.Error(w, "boom", http.StatusInternalServerError)
					return
				}
				w.Header().Set("Content-Type", "application/json")
				fmt.Fprint(w, `{"id":"x","object":"chat.completion"}`)
			}
		})
	}
	var b strings.Builder
	fmt.Fprintf(&b, "auth: {tokens: [%s]}\nretry: {max_attempts: 3}\nscrape: {interval: 10ms}\n", testToken)
	b.WriteString("pools:\n  - {name: llama-pool, model: llama}\npods:\n")
	for _, p := range pods {
		fmt.Fprintf(&b, "  - {name: %s, address: %q, pool: llama-pool, engine: vllm}\n", p.name, p.addr())
	}
	var cfg Config
	if err := config.Decode("test.yaml", []byte(b.String()), &cfg); err != nil {
		t.Fatal(err)
	}
	var logs lockedBuf
	ctx, cancel := context.WithCancel(context.Background())
	gw, err := New(ctx, &cfg, Options{Logger: slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { defer close(done); _ = gw.Serve(ctx, ln, time.Second) }()
	t.Cleanup(func() { cancel(); <-done; gw.Close() })
	e := &env{gw: gw, url: "http://" + ln.Addr().String(), pods: map[string]*fakePod{"p1": pods[0], "p2": pods[1]}, cfg: &cfg}
	e.waitReady(t)

	for _, tc := range []struct {
		name, sent string
		keep       bool
	}{
		{"valid", "abc-123", true},
		{"absent", "", false},
		{"too long", strings.Repeat("y", openai.MaxRequestIDLen+1), false},
		{"space", "a b", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			failed.Store(false)
			r := e.do(t, http.MethodPost, "/v1/chat/completions", chatBody("llama", "hi"), map[string]string{"X-Request-Id": tc.sent})
			if r.status != 200 {
				t.Fatalf("status %d: %s", r.status, r.body)
			}
			got := r.header.Get("X-Request-Id")
			if !openai.ValidRequestID(got) || got == "pod-own" || (got == tc.sent) != tc.keep {
				t.Fatalf("X-Request-Id %q for sent %q", got, tc.sent)
			}
			var seen int
			for _, p := range pods {
				p.mu.Lock()
				if p.lastReq != nil && p.lastReq.Header.Get("X-Request-Id") == got {
					seen++
				}
				p.mu.Unlock()
			}
			if seen != 2 { // both attempts carried it
				t.Errorf("pods saw X-Request-Id %q on %d of 2 attempts", got, seen)
			}
			if !strings.Contains(logs.String(), `"msg":"retrying on next pod","request_id":"`+got+`"`) {
				t.Errorf("no retry log line with request_id %q:\n%s", got, logs.String())
			}
		})
	}
	// Errors carry it too.
	r := e.do(t, http.MethodPost, "/v1/chat/completions", `{"model":"nope","messages":[]}`, map[string]string{"X-Request-Id": "err-1"})
	if r.status < 400 || r.header.Get("X-Request-Id") != "err-1" {
		t.Errorf("error %d: X-Request-Id %q", r.status, r.header.Get("X-Request-Id"))
	}
}
