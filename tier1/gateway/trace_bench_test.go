package gateway

import (
	"context"
	"log/slog"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

// BenchmarkProxyTraced is BenchmarkProxy's infergate case with tracing on
// (every request sampled, spans kept in memory, no export), for the cost
// of recording spans; BenchmarkProxy itself runs with tracing off:
//
//	go test -run '^$' -bench 'BenchmarkProxy' -benchtime 5000x ./tier1/gateway/
func BenchmarkProxyTraced(b *testing.B) {
	// A recorder that keeps nothing: the SDK's span cost without memory growth.
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(discard{}))
	defer func() { _ = tp.Shutdown(context.Background()) }()
	gw := benchGateway(b, benchUpstream(b), Options{Logger: slog.New(slog.DiscardHandler), TracerProvider: tp})
	runProxyBench(b, gw, benchBody())
}

// discard is a span processor that drops ended spans.
type discard struct{}

func (discard) OnStart(context.Context, sdktrace.ReadWriteSpan) {}
func (discard) OnEnd(sdktrace.ReadOnlySpan)                     {}
func (discard) Shutdown(context.Context) error                  { return nil }
func (discard) ForceFlush(context.Context) error                { return nil }
