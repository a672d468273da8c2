// Package tracing builds the OpenTelemetry TracerProvider both tiers use
// from their `tracing:` configuration block, and carries W3C trace context
// across the hops of a request (Tier 2 → Tier 1 → pod).
//
// Nothing here is global: the provider is passed to the gateways, and the
// W3C propagator is used directly rather than installed with
// otel.SetTextMapPropagator. Tracing is off by default; then the gateways
// hold a disabled Tracer whose methods do nothing and allocate nothing.
package tracing

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/exporters/stdout/stdouttrace"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
)

// Exporters.
const (
	ExporterNone    = "none"    // default: no tracing
	ExporterOTLP    = "otlp"    // OTLP over HTTP (protobuf) to Endpoint
	ExporterConsole = "console" // pretty-printed JSON spans on stdout
)

// Config is the `tracing:` block of both tiers' configuration files.
type Config struct {
	// Exporter is none (default), otlp or console.
	Exporter string `yaml:"exporter"`
	// Endpoint is the OTLP/HTTP collector URL, e.g.
	// http://otel-collector:4318 (/v1/traces is added when the URL has no
	// path). Empty: the OTEL_EXPORTER_OTLP_TRACES_ENDPOINT or
	// OTEL_EXPORTER_OTLP_ENDPOINT environment variable, else
	// https://localhost:4318. Only for exporter otlp.
	Endpoint string `yaml:"endpoint"`
	// SampleRatio is the share of new traces recorded, in [0,1]; absent
	// means 1. A trace started upstream keeps its parent's decision.
	SampleRatio *float64 `yaml:"sample_ratio"`
	// ServiceName is the service.name resource attribute; default
	// infergate-tier1 or infergate-tier2.
	ServiceName string `yaml:"service_name"`
}

// Enabled reports whether spans are exported.
func (c Config) Enabled() bool { return c.Exporter != "" && c.Exporter != ExporterNone }

// Validate checks the block; the zero Config is valid (tracing off).
func (c Config) Validate() error {
	var errs []error
	switch c.Exporter {
	case "", ExporterNone, ExporterOTLP, ExporterConsole:
	default:
		errs = append(errs, fmt.Errorf("tracing.exporter %q: want none, otlp or console", c.Exporter))
	}
	if c.Endpoint != "" {
		if c.Exporter != ExporterOTLP {
			errs = append(errs, errors.New("tracing.endpoint is only used with exporter: otlp"))
		}
		if u, err := url.Parse(c.Endpoint); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			errs = append(errs, fmt.Errorf("tracing.endpoint %q: want an http:// or https:// URL", c.Endpoint))
		}
	}
	if r := c.SampleRatio; r != nil && (*r < 0 || *r > 1) {
		errs = append(errs, fmt.Errorf("tracing.sample_ratio %v: want [0,1]", *r))
	}
	return errors.Join(errs...)
}

// Options are a provider's process-level settings.
type Options struct {
	// ServiceName applies when Config.ServiceName is empty.
	ServiceName string
	// Console receives the console exporter's output; default os.Stdout.
	Console io.Writer
}

// Provider is a TracerProvider built from a Config, with its shutdown.
type Provider struct {
	trace.TracerProvider
	shutdown func(context.Context) error
}

// Shutdown flushes buffered spans and stops the exporter; ctx bounds the
// flush. It is a no-op for a disabled provider.
func (p *Provider) Shutdown(ctx context.Context) error {
	if p == nil || p.shutdown == nil {
		return nil
	}
	return p.shutdown(ctx)
}

// New builds the provider cfg describes: a no-op one when tracing is off.
// Exporters connect lazily, so New does not fail on an unreachable
// collector; exports that fail are dropped (and reported by otel's error
// handler), never slowing requests.
func New(ctx context.Context, cfg Config, opts Options) (*Provider, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if !cfg.Enabled() {
		return &Provider{TracerProvider: noop.NewTracerProvider()}, nil
	}
	var (
		exp sdktrace.SpanExporter
		err error
		bo  []sdktrace.BatchSpanProcessorOption
	)
	switch cfg.Exporter {
	case ExporterOTLP:
		var o []otlptracehttp.Option
		if cfg.Endpoint != "" {
			o = append(o, otlptracehttp.WithEndpointURL(tracesURL(cfg.Endpoint)))
		}
		exp, err = otlptracehttp.New(ctx, o...)
	case ExporterConsole:
		w := opts.Console
		if w == nil {
			w = os.Stdout
		}
		exp, err = stdouttrace.New(stdouttrace.WithWriter(w), stdouttrace.WithPrettyPrint())
		// A developer watching the console wants spans soon.
		bo = append(bo, sdktrace.WithBatchTimeout(500*time.Millisecond))
	}
	if err != nil {
		return nil, fmt.Errorf("tracing: %s exporter: %w", cfg.Exporter, err)
	}
	name := cfg.ServiceName
	if name == "" {
		name = opts.ServiceName
	}
	ratio := 1.0
	if cfg.SampleRatio != nil {
		ratio = *cfg.SampleRatio
	}
	tp := sdktrace.NewTracerProvider(
		sdktrace.WithBatcher(exp, bo...),
		sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.TraceIDRatioBased(ratio))),
		sdktrace.WithResource(resource.NewSchemaless(attribute.String("service.name", name))),
	)
	return &Provider{TracerProvider: tp, shutdown: tp.Shutdown}, nil
}

// tracesURL adds the OTLP traces path to a collector base URL.
func tracesURL(endpoint string) string {
	u, err := url.Parse(endpoint)
	if err != nil || (u.Path != "" && u.Path != "/") {
		return endpoint
	}
	u.Path = "/v1/traces"
	return u.String()
}

// w3c is the W3C Trace Context propagator (traceparent, tracestate). It is
// used directly: no global propagator is installed.
var w3c propagation.TraceContext

// Tracer is a gateway's tracer. Its zero value is disabled: Start returns
// the context unchanged and a no-op span, so the request path pays nothing
// for tracing it does not do.
type Tracer struct {
	t trace.Tracer // nil: disabled
}

// NewTracer returns the named tracer of tp; disabled when tp is nil or a
// no-op provider.
func NewTracer(tp trace.TracerProvider, name string) Tracer {
	if p, ok := tp.(*Provider); ok && p != nil {
		tp = p.TracerProvider
	}
	switch tp.(type) {
	case nil, noop.TracerProvider:
		return Tracer{}
	}
	return Tracer{t: tp.Tracer(name)}
}

// Enabled reports whether spans are recorded at all.
func (t Tracer) Enabled() bool { return t.t != nil }

var noSpan = trace.SpanFromContext(context.Background())

// Start starts a span (see trace.Tracer); disabled, it returns ctx and a
// no-op span.
func (t Tracer) Start(ctx context.Context, name string, opts ...trace.SpanStartOption) (context.Context, trace.Span) {
	if t.t == nil {
		return ctx, noSpan
	}
	return t.t.Start(ctx, name, opts...)
}

// StartServer starts the server span of one incoming request (method,
// path) and its attributes. The caller's traceparent in h becomes the
// parent only when trustParent (the caller authenticated as a router);
// otherwise the span starts a new trace linked to the caller's span, so a
// client cannot choose trace IDs or force sampling.
func (t Tracer) StartServer(ctx context.Context, name string, h http.Header, method, path string, trustParent bool) (context.Context, trace.Span) {
	if t.t == nil {
		return ctx, noSpan
	}
	opts := []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindServer),
		trace.WithAttributes(attribute.String(HTTPMethod, method), attribute.String(HTTPRoute, path))}
	if op := Operation(path); op != "" {
		opts = append(opts, trace.WithAttributes(attribute.String(GenAIOperation, op)))
	}
	if sc, ok := Remote(h); ok {
		if trustParent {
			ctx = trace.ContextWithRemoteSpanContext(ctx, sc)
		} else {
			opts = append(opts, trace.WithNewRoot(), trace.WithLinks(trace.Link{SpanContext: sc,
				Attributes: []attribute.KeyValue{attribute.String("infergate.link", "client")}}))
		}
	} else if !trustParent {
		opts = append(opts, trace.WithNewRoot())
	}
	return t.t.Start(ctx, name, opts...)
}

// Extract returns ctx carrying the remote span context of h's traceparent
// (and tracestate), if valid.
func Extract(ctx context.Context, h http.Header) context.Context {
	return w3c.Extract(ctx, propagation.HeaderCarrier(h))
}

// Remote returns the valid span context h's traceparent names, if any.
func Remote(h http.Header) (trace.SpanContext, bool) {
	if h.Get("Traceparent") == "" {
		return trace.SpanContext{}, false
	}
	sc := trace.SpanContextFromContext(Extract(context.Background(), h))
	return sc, sc.IsValid()
}

// Inject replaces h's traceparent and tracestate with the span context of
// ctx; any the client sent are removed first so they cannot ride along.
func Inject(ctx context.Context, h http.Header) {
	h.Del("Traceparent")
	h.Del("Tracestate")
	w3c.Inject(ctx, propagation.HeaderCarrier(h))
}
