package gateway

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/infergate/infergate/shared/config"
)

// TestTraceparentTrust checks whose trace a Tier 1 request joins: an
// authenticated caller's traceparent is the parent; an anonymous one
// (auth disabled) only gets a link; the pod always receives the upstream
// attempt's context. Without a
// provider the caller's headers pass through untouched, as before tracing.
func TestTraceparentTrust(t *testing.T) {
	const (
		callerTrace = "4bf92f3577b34da6a3ce929d0e0e4736"
		callerSpan  = "00f067aa0ba902b7"
		callerTP    = "00-" + callerTrace + "-" + callerSpan + "-01"
	)
	for _, tc := range []struct {
		name       string
		auth       string
		traced     bool
		wantParent bool // the caller's span is the request span's parent
	}{
		{"authenticated caller is the parent", "auth: {tokens: [" + testToken + "]}", true, true},
		{"anonymous caller is only linked", "auth: {disabled: true}", true, false},
		{"tracing off passes headers through", "auth: {tokens: [" + testToken + "]}", false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pod := newFakePod(t, "p0")
			cfg := fmt.Sprintf("%s\nscrape: {interval: 10ms}\npools: [{name: llama-pool, model: llama}]\npods: [{name: p0, address: %q, pool: llama-pool, engine: vllm}]\n", tc.auth, pod.addr())
			var c Config
			if err := config.Decode("t.yaml", []byte(cfg), &c); err != nil {
				t.Fatal(err)
			}
			sr := tracetest.NewSpanRecorder()
			opts := Options{Logger: slog.New(slog.DiscardHandler)}
			if tc.traced {
				opts.TracerProvider = sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(sr))
			}
			e := startEnvOpts(t, &c, []*fakePod{pod}, opts)
			r := e.do(t, "POST", "/v1/chat/completions", chatBody("llama", "hi"),
				map[string]string{"Traceparent": callerTP, "Tracestate": "caller=1"})
			if r.status != 200 {
				t.Fatalf("status %d: %s", r.status, r.body)
			}
			pod.mu.Lock()
			gotTP, gotTS := pod.lastReq.Header.Get("Traceparent"), pod.lastReq.Header.Get("Tracestate")
			pod.mu.Unlock()
			if !tc.traced {
				if gotTP != callerTP || gotTS != "caller=1" {
					t.Errorf("pod got traceparent %q tracestate %q, want the caller's", gotTP, gotTS)
				}
				return
			}
			var req, up sdktrace.ReadOnlySpan
			deadline := time.Now().Add(5 * time.Second)
			for (req == nil || up == nil) && time.Now().Before(deadline) {
				time.Sleep(5 * time.Millisecond)
				for _, s := range sr.Ended() {
					switch s.Name() {
					case "tier1.request":
						req = s
					case "tier1.upstream":
						up = s
					}
				}
			}
			if req == nil || up == nil {
				t.Fatalf("spans missing: request %v upstream %v", req != nil, up != nil)
			}
			tid := req.SpanContext().TraceID().String()
			if got := tid == callerTrace; got != tc.wantParent {
				t.Errorf("request joined the caller's trace: %v, want %v", got, tc.wantParent)
			}
			if tc.wantParent {
				if req.Parent().SpanID().String() != callerSpan || !req.Parent().IsRemote() {
					t.Errorf("parent %v, want the caller's remote span %s", req.Parent(), callerSpan)
				}
			} else if l := req.Links(); len(l) != 1 || l[0].SpanContext.TraceID().String() != callerTrace || req.Parent().IsValid() {
				t.Errorf("links %v parent %v, want a root span linked to the caller's", l, req.Parent())
			}
			// tracestate belongs to the trace: it goes on with a trusted
			// parent (W3C), and is dropped with an untrusted one.
			want, wantTS := "00-"+tid+"-"+up.SpanContext().SpanID().String()+"-01", ""
			if tc.wantParent {
				wantTS = "caller=1"
			}
			if gotTP != want || gotTS != wantTS {
				t.Errorf("pod got traceparent %q tracestate %q, want %q and %q", gotTP, gotTS, want, wantTS)
			}
		})
	}
}

// startEnvOpts is startEnv with gateway Options.
func startEnvOpts(t testing.TB, cfg *Config, pods []*fakePod, opts Options) *env {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	gw, err := New(ctx, cfg, opts)
	if err != nil {
		cancel()
		t.Fatalf("gateway: %v", err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { defer close(done); _ = gw.Serve(ctx, ln, time.Second) }()
	t.Cleanup(func() { cancel(); <-done; gw.Close() })
	e := &env{gw: gw, url: "http://" + ln.Addr().String(), pods: map[string]*fakePod{}, cfg: cfg}
	for _, p := range pods {
		e.pods[strings.TrimSpace(p.name)] = p
	}
	e.waitReady(t)
	return e
}

// An ext_proc pick is traced too: a tier1.pick span in the authenticated
// caller's trace (Envoy forwards its traceparent), with the admission and
// scheduling spans under it.
func TestTracePick(t *testing.T) {
	const callerTrace, callerSpan = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
	pod := newFakePod(t, "p0")
	cfg := fmt.Sprintf("auth: {tokens: [%s]}\nscrape: {interval: 10ms}\npools: [{name: llama-pool, model: llama}]\npods: [{name: p0, address: %q, pool: llama-pool, engine: vllm}]\n", testToken, pod.addr())
	var c Config
	if err := config.Decode("t.yaml", []byte(cfg), &c); err != nil {
		t.Fatal(err)
	}
	sr := tracetest.NewSpanRecorder()
	e := startEnvOpts(t, &c, []*fakePod{pod}, Options{Logger: slog.New(slog.DiscardHandler),
		TracerProvider: sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(sr))})
	h := http.Header{}
	h.Set("Authorization", "Bearer "+testToken)
	h.Set("Traceparent", "00-"+callerTrace+"-"+callerSpan+"-01")
	p, err := e.gw.Pick(context.Background(), PickRequest{Path: "/v1/chat/completions", Header: h, Body: []byte(chatBody("llama", "hi"))})
	if err != nil {
		t.Fatal(err)
	}
	p.Done(true)
	byName := map[string]sdktrace.ReadOnlySpan{}
	for _, s := range sr.Ended() {
		byName[s.Name()] = s
	}
	pick, sched := byName["tier1.pick"], byName["tier1.schedule"]
	if pick == nil || sched == nil {
		t.Fatalf("spans %v, want tier1.pick and tier1.schedule", byName)
	}
	if pick.SpanContext().TraceID().String() != callerTrace || pick.Parent().SpanID().String() != callerSpan {
		t.Errorf("pick span in trace %s under %s, want the caller's", pick.SpanContext().TraceID(), pick.Parent().SpanID())
	}
	if sched.SpanContext().TraceID() != pick.SpanContext().TraceID() {
		t.Errorf("schedule span in another trace")
	}
}
