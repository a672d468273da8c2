package integration

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/infergate/infergate/devstack"
)

// podLog records the traceparent header each simulated pod received: the
// simulator logs it (at debug) with every request it accepts.
type podLog struct {
	mu           sync.Mutex
	traceparents []string
}

func (l *podLog) Enabled(context.Context, slog.Level) bool { return true }
func (l *podLog) WithAttrs([]slog.Attr) slog.Handler       { return l }
func (l *podLog) WithGroup(string) slog.Handler            { return l }
func (l *podLog) Handle(_ context.Context, r slog.Record) error {
	if r.Message != "request accepted" {
		return nil
	}
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == "traceparent" {
			l.mu.Lock()
			l.traceparents = append(l.traceparents, a.Value.String())
			l.mu.Unlock()
		}
		return true
	})
	return nil
}

func (l *podLog) all() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.traceparents...)
}

// clientTraceparent is what an external client claims as its trace: Tier 2
// must not adopt it, only link to it.
const (
	clientTraceID     = "0af7651916cd43dd8448eb211c80319c"
	clientSpanID      = "b7ad6b7169203331"
	clientTraceparent = "00-" + clientTraceID + "-" + clientSpanID + "-01"
)

// TestTracingEndToEnd runs the stack with an in-memory span recorder wired
// into both tiers and follows one chat request, then one stream, through
// Tier 2, Tier 1 and the simulated pod: one trace, the spans of each step
// with their parents and attributes, and the pod handed the trace's
// traceparent.
func TestTracingEndToEnd(t *testing.T) {
	if testing.Short() {
		t.Skip("integration suite: skipped under -short")
	}
	sr := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(sr))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	pods := &podLog{}
	st, _ := startOnePodStack(t, func(o *devstack.Options) {
		o.TimeScale, o.Logger, o.TracerProvider = 0.05, slog.New(pods), tp
	})

	for _, tc := range []struct {
		name   string
		stream bool
	}{{"chat", false}, {"stream", true}} {
		t.Run(tc.name, func(t *testing.T) {
			before := len(pods.all())
			body := `{"model":"` + devstack.LlamaModel + `","messages":[{"role":"user","content":"Trace me, please."}],"max_tokens":8`
			if tc.stream {
				body += `,"stream":true`
			}
			body += "}"
			sendTraced(t, st, body)

			root := waitSpan(t, sr, "tier2.request", before)
			tid := root.SpanContext().TraceID()
			if tid.String() == clientTraceID {
				t.Fatalf("tier2 adopted the client's trace ID %s", tid)
			}
			if links := root.Links(); len(links) != 1 || links[0].SpanContext.TraceID().String() != clientTraceID ||
				links[0].SpanContext.SpanID().String() != clientSpanID {
				t.Errorf("tier2.request links = %+v, want one link to the client's span %s/%s", links, clientTraceID, clientSpanID)
			}
			if root.Parent().IsValid() {
				t.Errorf("tier2.request has parent %s, want a root span", root.Parent().SpanID())
			}
			// Tier 1 ends its spans when its handler returns, which may be
			// after Tier 2 has relayed the last byte.
			spans := waitTrace(t, sr, tid, "tier2.auth", "tier2.route", "tier2.limits", "tier2.attempt",
				"tier1.request", "tier1.admission", "tier1.schedule", "tier1.upstream")
			one := func(name string) sdktrace.ReadOnlySpan {
				t.Helper()
				var found []sdktrace.ReadOnlySpan
				for _, s := range spans {
					if s.Name() == name {
						found = append(found, s)
					}
				}
				if len(found) != 1 {
					t.Fatalf("trace %s has %d %q spans, want 1 (spans: %v)", tid, len(found), name, names(spans))
				}
				return found[0]
			}
			childOf := func(child, parent sdktrace.ReadOnlySpan) {
				t.Helper()
				if child.Parent().SpanID() != parent.SpanContext().SpanID() {
					t.Errorf("%s's parent is %s, want %s (%s)", child.Name(), child.Parent().SpanID(), parent.Name(), parent.SpanContext().SpanID())
				}
			}

			auth, route, limits, attempt := one("tier2.auth"), one("tier2.route"), one("tier2.limits"), one("tier2.attempt")
			for _, s := range []sdktrace.ReadOnlySpan{auth, route, limits, attempt} {
				childOf(s, root)
			}
			t1 := one("tier1.request")
			childOf(t1, attempt)
			if !t1.Parent().IsRemote() {
				t.Errorf("tier1.request's parent should be remote (from traceparent)")
			}
			adm := one("tier1.admission")
			childOf(adm, t1)
			sched := one("tier1.schedule") // one cycle: the pod has room
			childOf(sched, adm)
			up := one("tier1.upstream")
			childOf(up, t1)

			wantAttrs(t, root, map[string]any{"gen_ai.request.model": devstack.LlamaModel, "gen_ai.operation.name": "chat",
				"http.response.status_code": int64(200), "infergate.tenant": devstack.TenantID, "infergate.stream": tc.stream})
			positive(t, root, "gen_ai.usage.input_tokens", "gen_ai.usage.output_tokens")
			wantAttrs(t, route, map[string]any{"infergate.cluster": "solo", "infergate.outcome": "ok"})
			wantAttrs(t, limits, map[string]any{"infergate.outcome": "ok"})
			wantAttrs(t, attempt, map[string]any{"infergate.cluster": "solo", "infergate.region": devstack.HomeRegion,
				"infergate.attempt": int64(1), "http.response.status_code": int64(200), "infergate.outcome": "done"})
			wantAttrs(t, t1, map[string]any{"gen_ai.request.model": devstack.LlamaModel, "infergate.pool": "llama"})
			wantAttrs(t, adm, map[string]any{"infergate.admission": "dispatch"})
			wantAttrs(t, sched, map[string]any{"infergate.pod": "solo-0", "infergate.candidates": int64(1)})
			if v, ok := attr(sched, "infergate.ranked"); !ok || len(v.([]string)) != 1 || !strings.HasPrefix(v.([]string)[0], "solo-0=") {
				t.Errorf("tier1.schedule infergate.ranked = %v, want [solo-0=<total>]", v)
			}
			if _, ok := attr(sched, "infergate.score.total"); !ok {
				t.Errorf("tier1.schedule has no infergate.score.total")
			}
			wantAttrs(t, up, map[string]any{"infergate.pod": "solo-0", "http.response.status_code": int64(200),
				"gen_ai.system": "vllm", "infergate.attempt": int64(1)})
			positive(t, up, "infergate.ttft_ms")
			if ev := up.Events(); len(ev) != 1 || ev[0].Name != "first_token" {
				t.Errorf("tier1.upstream events = %v, want one first_token", ev)
			}

			// The pod got the upstream attempt's context, not the client's.
			got := pods.all()[before:]
			want := "00-" + tid.String() + "-" + up.SpanContext().SpanID().String() + "-01"
			if len(got) != 1 || got[0] != want {
				t.Errorf("pod traceparents = %q, want [%q]", got, want)
			}
		})
	}
}

// sendTraced posts a chat request carrying a client traceparent and reads
// the whole answer.
func sendTraced(t *testing.T, st *devstack.Stack, body string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, st.BaseURL+"/chat/completions", strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+st.APIKey)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Traceparent", clientTraceparent)
	req.Header.Set("Tracestate", "client=secret")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d, err %v: %s", resp.StatusCode, err, b)
	}
}

// waitSpan waits for the next ended span named name (the handler may
// still be finishing when the client has its answer); skip is how many
// requests came before.
func waitSpan(t *testing.T, sr *tracetest.SpanRecorder, name string, skip int) sdktrace.ReadOnlySpan {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		n := 0
		for _, s := range sr.Ended() {
			if s.Name() == name {
				if n == skip {
					return s
				}
				n++
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no %s span #%d ended", name, skip+1)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// waitTrace waits until trace tid has ended spans of every name given
// and returns its spans.
func waitTrace(t *testing.T, sr *tracetest.SpanRecorder, tid trace.TraceID, want ...string) []sdktrace.ReadOnlySpan {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		spans := spansOf(sr, tid)
		have := map[string]bool{}
		for _, s := range spans {
			have[s.Name()] = true
		}
		missing := 0
		for _, n := range want {
			if !have[n] {
				missing++
			}
		}
		if missing == 0 || time.Now().After(deadline) {
			return spans
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func spansOf(sr *tracetest.SpanRecorder, tid trace.TraceID) []sdktrace.ReadOnlySpan {
	var out []sdktrace.ReadOnlySpan
	for _, s := range sr.Ended() {
		if s.SpanContext().TraceID() == tid {
			out = append(out, s)
		}
	}
	return out
}

func names(spans []sdktrace.ReadOnlySpan) []string {
	var out []string
	for _, s := range spans {
		out = append(out, s.Name())
	}
	return out
}

func attr(s sdktrace.ReadOnlySpan, key string) (any, bool) {
	for _, kv := range s.Attributes() {
		if string(kv.Key) == key {
			return kv.Value.AsInterface(), true
		}
	}
	return nil, false
}

func wantAttrs(t *testing.T, s sdktrace.ReadOnlySpan, want map[string]any) {
	t.Helper()
	for k, v := range want {
		if got, ok := attr(s, k); !ok || got != v {
			t.Errorf("%s: %s = %v (present %v), want %v", s.Name(), k, got, ok, v)
		}
	}
}

func positive(t *testing.T, s sdktrace.ReadOnlySpan, keys ...string) {
	t.Helper()
	for _, k := range keys {
		got, _ := attr(s, k)
		switch v := got.(type) {
		case int64:
			if v > 0 {
				continue
			}
		case float64:
			if v > 0 {
				continue
			}
		}
		t.Errorf("%s: %s = %v, want > 0", s.Name(), k, got)
	}
}
