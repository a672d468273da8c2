package gateway_test

import (
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/infergate/infergate/tier2/gateway"
	"github.com/infergate/infergate/tier2/route"
)

// TestTracingFailover follows a request whose first cluster answers 500:
// one trace, not the client's; an attempt span per cluster with its
// status and outcome; each Tier 1 handed its own attempt's traceparent.
func TestTracingFailover(t *testing.T) {
	const clientTrace = "0af7651916cd43dd8448eb211c80319c"
	a := newTier1(t, "a", "east", "m")
	b := newTier1(t, "b", "west", "m")
	a.mode.Store("500")
	sr := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(sr))
	s := newStack(t, stackOpts{src: static(t, a.cluster(1, 100), b.cluster(2, 100)),
		route:   func(o *route.Options) { o.PollInterval = time.Hour },
		gateway: func(o *gateway.Options) { o.TracerProvider = tp }})
	r := s.do(t, "key-cost", "/v1/chat/completions", `{"model":"m"}`,
		"Traceparent", "00-"+clientTrace+"-b7ad6b7169203331-01")
	if r.code != 200 || r.cluster != "b" {
		t.Fatalf("got %d from %q: %s", r.code, r.cluster, r.body)
	}
	var root sdktrace.ReadOnlySpan
	var attempts []sdktrace.ReadOnlySpan
	waitFor(t, 5*time.Second, "the request span", func() bool {
		attempts = attempts[:0]
		for _, sp := range sr.Ended() {
			switch sp.Name() {
			case "tier2.request":
				root = sp
			case "tier2.attempt":
				attempts = append(attempts, sp)
			}
		}
		return root != nil
	})
	tid := root.SpanContext().TraceID()
	if tid.String() == clientTrace || len(root.Links()) != 1 {
		t.Errorf("trace %s links %v: want a new trace linked to the client's", tid, root.Links())
	}
	if len(attempts) != 2 {
		t.Fatalf("%d attempt spans, want 2", len(attempts))
	}
	want := []struct {
		cluster, region, outcome string
		status                   int64
		stub                     *tier1
	}{{"a", "east", "failover", 500, a}, {"b", "west", "done", 200, b}}
	for i, w := range want {
		sp := attempts[i]
		got := map[string]any{}
		for _, kv := range sp.Attributes() {
			got[string(kv.Key)] = kv.Value.AsInterface()
		}
		if got["infergate.cluster"] != w.cluster || got["infergate.region"] != w.region || got["infergate.outcome"] != w.outcome ||
			got["http.response.status_code"] != w.status || got["infergate.attempt"] != int64(i+1) {
			t.Errorf("attempt %d attributes %v, want cluster %s region %s outcome %s status %d", i+1, got, w.cluster, w.region, w.outcome, w.status)
		}
		if sp.Parent().SpanID() != root.SpanContext().SpanID() || sp.SpanContext().TraceID() != tid {
			t.Errorf("attempt %d is not a child of the request span", i+1)
		}
		req, _ := w.stub.lastRequest()
		if tp := req.Header.Get("Traceparent"); tp != "00-"+tid.String()+"-"+sp.SpanContext().SpanID().String()+"-01" {
			t.Errorf("cluster %s got traceparent %q, want attempt %d's", w.cluster, tp, i+1)
		}
	}
}
