package tracing

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/infergate/infergate/shared/config"
)

func TestConfigDecode(t *testing.T) {
	type file struct {
		Tracing Config `yaml:"tracing"`
	}
	for _, tc := range []struct {
		name, yaml string
		wantErr    string // "" for valid
		enabled    bool
	}{
		{"absent", "", "", false},
		{"none", "tracing: {exporter: none}", "", false},
		{"console", "tracing: {exporter: console, service_name: edge}", "", true},
		{"otlp default endpoint", "tracing: {exporter: otlp}", "", true},
		{"otlp endpoint and ratio", "tracing: {exporter: otlp, endpoint: 'http://collector:4318', sample_ratio: 0.25}", "", true},
		{"ratio zero is allowed", "tracing: {exporter: otlp, sample_ratio: 0}", "", true},
		{"unknown exporter", "tracing: {exporter: jaeger}", `tracing.exporter "jaeger"`, false},
		{"unknown key", "tracing: {exporter: otlp, endpoints: x}", `tracing.endpoints: unknown key "endpoints"; did you mean "endpoint"?`, false},
		{"ratio above 1", "tracing: {exporter: otlp, sample_ratio: 1.5}", "tracing.sample_ratio 1.5", false},
		{"negative ratio", "tracing: {exporter: console, sample_ratio: -0.1}", "tracing.sample_ratio -0.1", false},
		{"endpoint without scheme", "tracing: {exporter: otlp, endpoint: 'collector:4318'}", "want an http:// or https:// URL", false},
		{"endpoint without otlp", "tracing: {exporter: console, endpoint: 'http://c:4318'}", "only used with exporter: otlp", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var f file
			err := config.Decode("t.yaml", []byte(tc.yaml), &f)
			if err == nil {
				err = f.Tracing.Validate()
			}
			switch {
			case tc.wantErr == "" && err != nil:
				t.Fatalf("unexpected error: %v", err)
			case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
				t.Fatalf("error %v, want one containing %q", err, tc.wantErr)
			case tc.wantErr == "" && f.Tracing.Enabled() != tc.enabled:
				t.Fatalf("Enabled() = %v, want %v", f.Tracing.Enabled(), tc.enabled)
			}
		})
	}
}

func TestTracesURL(t *testing.T) {
	for in, want := range map[string]string{
		"http://c:4318":             "http://c:4318/v1/traces",
		"http://c:4318/":            "http://c:4318/v1/traces",
		"https://c/otlp/v1/traces":  "https://c/otlp/v1/traces",
		"http://c:4318/custom/path": "http://c:4318/custom/path",
	} {
		if got := tracesURL(in); got != want {
			t.Errorf("tracesURL(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestDisabledTracer(t *testing.T) {
	p, err := New(context.Background(), Config{}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	for name, tp := range map[string]trace.TracerProvider{"nil": nil, "noop": noop.NewTracerProvider(), "provider off": p} {
		tr := NewTracer(tp, "x")
		if tr.Enabled() {
			t.Errorf("%s: tracer enabled", name)
		}
		ctx := context.Background()
		got, sp := tr.Start(ctx, "s")
		if got != ctx || sp.IsRecording() {
			t.Errorf("%s: disabled Start changed the context or records", name)
		}
	}
	if err := p.Shutdown(context.Background()); err != nil {
		t.Errorf("shutdown of a disabled provider: %v", err)
	}
	if n := testing.AllocsPerRun(100, func() {
		_, sp := Tracer{}.Start(context.Background(), "s")
		sp.End()
	}); n != 0 {
		t.Errorf("disabled Start allocates %v times", n)
	}
}

func TestConsoleExporter(t *testing.T) {
	var buf bytes.Buffer
	p, err := New(context.Background(), Config{Exporter: ExporterConsole}, Options{ServiceName: "infergate-test", Console: &buf})
	if err != nil {
		t.Fatal(err)
	}
	_, sp := NewTracer(p, "test").Start(context.Background(), "hello.span")
	sp.End()
	if err := p.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`"Name": "hello.span"`, `"infergate-test"`} {
		if !strings.Contains(buf.String(), want) {
			t.Errorf("console output lacks %s:\n%s", want, buf.String())
		}
	}
}

// TestOTLPExporter exports to a real HTTP server standing in for a
// collector: the span arrives as OTLP protobuf at /v1/traces on Shutdown.
func TestOTLPExporter(t *testing.T) {
	var mu sync.Mutex
	var got []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		got = append(got, r.Method+" "+r.URL.Path+" "+r.Header.Get("Content-Type"))
		mu.Unlock()
		w.Header().Set("Content-Type", "application/x-protobuf")
	}))
	defer srv.Close()
	zero := 0.0
	cases := []struct {
		ratio *float64
		want  int
	}{{nil, 1}, {&zero, 0}}
	for _, tc := range cases {
		mu.Lock()
		got = nil
		mu.Unlock()
		p, err := New(context.Background(), Config{Exporter: ExporterOTLP, Endpoint: srv.URL, SampleRatio: tc.ratio}, Options{ServiceName: "s"})
		if err != nil {
			t.Fatal(err)
		}
		_, sp := NewTracer(p, "test").Start(context.Background(), "exported")
		sp.End()
		if err := p.Shutdown(context.Background()); err != nil {
			t.Fatal(err)
		}
		mu.Lock()
		if len(got) != tc.want || (tc.want == 1 && got[0] != "POST /v1/traces application/x-protobuf") {
			t.Errorf("ratio %v: collector got %q, want %d POST /v1/traces", tc.ratio, got, tc.want)
		}
		mu.Unlock()
	}
}

func TestInjectReplacesCallerHeaders(t *testing.T) {
	h := http.Header{"Traceparent": {"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}, "Tracestate": {"a=1"}}
	sc, ok := Remote(h)
	if !ok || sc.TraceID().String() != "0af7651916cd43dd8448eb211c80319c" {
		t.Fatalf("Remote = %v, %v", sc, ok)
	}
	if _, ok := Remote(http.Header{"Traceparent": {"garbage"}}); ok {
		t.Error("Remote accepted an invalid traceparent")
	}
	// No span in the context: both headers go, none are written.
	Inject(context.Background(), h)
	if len(h) != 0 {
		t.Errorf("headers after Inject without a span: %v", h)
	}
	own := trace.NewSpanContext(trace.SpanContextConfig{TraceID: trace.TraceID{1}, SpanID: trace.SpanID{2}, TraceFlags: trace.FlagsSampled})
	h = http.Header{"Tracestate": {"a=1"}}
	Inject(trace.ContextWithSpanContext(context.Background(), own), h)
	if h.Get("Traceparent") != "00-01000000000000000000000000000000-0200000000000000-01" || h.Get("Tracestate") != "" {
		t.Errorf("headers after Inject: %v", h)
	}
}
