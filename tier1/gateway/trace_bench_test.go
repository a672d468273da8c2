package gateway

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/infergate/infergate/shared/config"
)

// BenchmarkProxyTraced is BenchmarkProxy's infergate case with tracing on
// (every request sampled, spans kept in memory, no export), for the cost
// of recording spans; BenchmarkProxy itself runs with tracing off:
//
//	go test -run '^$' -bench 'BenchmarkProxy' -benchtime 5000x ./tier1/gateway/
func BenchmarkProxyTraced(b *testing.B) {
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/metrics":
			fmt.Fprint(w, "vllm:num_requests_waiting 0\nvllm:num_requests_running 1\nvllm:kv_cache_usage_perc 0.2\n")
			return
		case "/v1/models":
			fmt.Fprint(w, `{"object":"list","data":[{"id":"llama","object":"model"}]}`)
			return
		}
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(completion)
	}))
	defer upstream.Close()
	addr := strings.TrimPrefix(upstream.URL, "http://")
	var y strings.Builder
	fmt.Fprintf(&y, "auth: {tokens: [%s]}\npools: [{name: p, model: llama}]\npods:\n", testToken)
	for i := 0; i < 4; i++ {
		fmt.Fprintf(&y, "  - {name: pod-%d, address: %q, pool: p, engine: vllm}\n", i, addr)
	}
	var cfg Config
	if err := config.Decode("bench.yaml", []byte(y.String()), &cfg); err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// A recorder that keeps nothing: the SDK's span cost without memory growth.
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(discard{}))
	defer func() { _ = tp.Shutdown(context.Background()) }()
	gw, err := New(ctx, &cfg, Options{Logger: slog.New(slog.DiscardHandler), TracerProvider: tp})
	if err != nil {
		b.Fatal(err)
	}
	defer gw.Close()
	deadline := time.Now().Add(5 * time.Second)
	for {
		if s, ok := gw.scraper.Get("pod-3"); ok && !s.LastSuccess.IsZero() {
			break
		}
		if time.Now().After(deadline) {
			b.Fatal("pods never scraped")
		}
		time.Sleep(5 * time.Millisecond)
	}
	runProxyBench(b, gw, benchBody())
}

// discard is a span processor that drops ended spans.
type discard struct{}

func (discard) OnStart(context.Context, sdktrace.ReadWriteSpan) {}
func (discard) OnEnd(sdktrace.ReadOnlySpan)                     {}
func (discard) Shutdown(context.Context) error                  { return nil }
func (discard) ForceFlush(context.Context) error                { return nil }
