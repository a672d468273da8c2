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

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/infergate/infergate/shared/config"
	"github.com/infergate/infergate/shared/openai"
	"github.com/infergate/infergate/shared/tracing"
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

// Both front ends of the request lifecycle take the request ID the same
// way: the caller's when well-formed, else a fresh one (the ext_proc front
// end used to pass any header through).
func TestRequestIDFrontEndsAgree(t *testing.T) {
	pod := newFakePod(t, "p0")
	e := newEnv(t, []*fakePod{pod}, "")
	for _, tc := range []struct {
		name, sent string
		keep       bool
	}{
		{"valid", "abc-123", true},
		{"absent", "", false},
		{"too long", strings.Repeat("y", openai.MaxRequestIDLen+1), false},
		{"space", "a b", false},
		{"control", "a\x01b", false},
		{"non-ASCII", "é", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := http.Header{"Authorization": {"Bearer " + testToken}}
			if tc.sent != "" {
				h["X-Request-Id"] = []string{tc.sent}
			}
			p, err := e.gw.Pick(context.Background(), PickRequest{Path: "/v1/chat/completions", Header: h, Body: []byte(chatBody("llama", "hi"))})
			if err != nil {
				t.Fatal(err)
			}
			p.Done(true)
			viaPick := p.RequestID
			hdr := map[string]string{}
			if tc.sent != "" && !strings.ContainsAny(tc.sent, "\x01") { // net/http refuses to send a control byte
				hdr["X-Request-Id"] = tc.sent
			}
			r := e.do(t, http.MethodPost, "/v1/chat/completions", chatBody("llama", "hi"), hdr)
			if r.status != 200 {
				t.Fatalf("status %d: %s", r.status, r.body)
			}
			viaHTTP := r.header.Get("X-Request-Id")
			for name, got := range map[string]string{"pick": viaPick, "http": viaHTTP} {
				if !openai.ValidRequestID(got) || (got == tc.sent) != tc.keep {
					t.Errorf("%s: ID %q for sent %q", name, got, tc.sent)
				}
			}
		})
	}
}

// Tier 2's tenant (X-Infergate-Tenant) is used from a caller that
// authenticated with a configured token: on the request's log lines and
// trace span. From an anonymous caller (auth disabled) it is ignored. It
// never reaches the pod.
func TestTenantHeader(t *testing.T) {
	for _, tc := range []struct {
		name, auth string
		want       bool
	}{
		{"authenticated", "auth: {tokens: [" + testToken + "]}", true},
		{"anonymous", "auth: {disabled: true}", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pods := []*fakePod{newFakePod(t, "p1"), newFakePod(t, "p2")}
			var failed atomic.Bool
			for _, p := range pods {
				p.set(func(p *fakePod) {
					p.handler = func(w http.ResponseWriter, r *http.Request) {
						if failed.CompareAndSwap(false, true) { // a retry is logged
							http.Error(w, "boom", http.StatusInternalServerError)
							return
						}
						w.Header().Set("Content-Type", "application/json")
						fmt.Fprint(w, `{"id":"x","object":"chat.completion"}`)
					}
				})
			}
			var b strings.Builder
			fmt.Fprintf(&b, "%s\nretry: {max_attempts: 3}\nscrape: {interval: 10ms}\npools: [{name: llama-pool, model: llama}]\npods:\n", tc.auth)
			for _, p := range pods {
				fmt.Fprintf(&b, "  - {name: %s, address: %q, pool: llama-pool, engine: vllm}\n", p.name, p.addr())
			}
			var cfg Config
			if err := config.Decode("test.yaml", []byte(b.String()), &cfg); err != nil {
				t.Fatal(err)
			}
			var logs lockedBuf
			sr := tracetest.NewSpanRecorder()
			e := startEnvOpts(t, &cfg, pods, Options{
				Logger:         slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
				TracerProvider: sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(sr)),
			})
			r := e.do(t, http.MethodPost, "/v1/chat/completions", chatBody("llama", "hi"),
				map[string]string{"X-Infergate-Tenant": "acme", "X-Request-Id": "rid-t"})
			if r.status != 200 {
				t.Fatalf("status %d: %s", r.status, r.body)
			}
			logged := strings.Contains(logs.String(), `"msg":"retrying on next pod","request_id":"rid-t","tenant":"acme"`)
			var spanTenant string
			found := false
			for deadline := time.Now().Add(5 * time.Second); !found && time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
				for _, s := range sr.Ended() {
					if s.Name() != "tier1.request" {
						continue
					}
					found = true
					for _, a := range s.Attributes() {
						if string(a.Key) == tracing.Tenant {
							spanTenant = a.Value.AsString()
						}
					}
				}
			}
			if !found {
				t.Fatal("no request span")
			}
			if logged != tc.want || (spanTenant == "acme") != tc.want {
				t.Errorf("tenant logged %v, on the span %q; want used: %v\n%s", logged, spanTenant, tc.want, logs.String())
			}
			for _, p := range pods {
				p.mu.Lock()
				if p.lastReq != nil && p.lastReq.Header.Get("X-Infergate-Tenant") != "" {
					t.Errorf("%s got the tenant header", p.name)
				}
				p.mu.Unlock()
			}
		})
	}
}
