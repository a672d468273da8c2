package gateway

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/infergate/infergate/shared/config"
)

// BenchmarkProxy compares infergate's full request path (auth, body parse,
// prefix hashing, scheduling over 4 pods, tracking, metrics, streaming
// relay) with a bare httputil.ReverseProxy, both in front of the same
// upstream in the same run:
//
//	go test -run '^$' -bench BenchmarkProxy -benchtime 5000x ./tier1/gateway/
//
// Besides wall time it reports cpu-ns/op, the process CPU per request,
// which a busy shared machine does not distort.
func BenchmarkProxy(b *testing.B) {
	upstream := benchUpstream(b)
	body := benchBody()

	b.Run("bare", func(b *testing.B) {
		target, _ := url.Parse(upstream.URL)
		rp := &httputil.ReverseProxy{
			Rewrite:       func(pr *httputil.ProxyRequest) { pr.SetURL(target) },
			FlushInterval: -1,
			ErrorLog:      nil,
		}
		rp.Transport = newTransport(2*time.Second, nil)
		runProxyBench(b, rp, body)
	})
	b.Run("infergate", func(b *testing.B) {
		runProxyBench(b, benchGateway(b, upstream, Options{Logger: slog.New(slog.DiscardHandler)}), body)
	})
}

// BenchmarkProxyStream is BenchmarkProxy for a streamed chat completion
// of 32 events and [DONE]:
//
//	go test -run '^$' -bench BenchmarkProxyStream -benchtime 5000x ./tier1/gateway/
func BenchmarkProxyStream(b *testing.B) {
	upstream := benchUpstream(b)
	body := []byte(strings.Replace(string(benchBody()), `"max_tokens":64`, `"max_tokens":64,"stream":true`, 1))
	b.Run("bare", func(b *testing.B) {
		target, _ := url.Parse(upstream.URL)
		rp := &httputil.ReverseProxy{
			Rewrite:       func(pr *httputil.ProxyRequest) { pr.SetURL(target) },
			FlushInterval: -1,
		}
		rp.Transport = newTransport(2*time.Second, nil)
		runProxyBench(b, rp, body)
	})
	b.Run("infergate", func(b *testing.B) {
		runProxyBench(b, benchGateway(b, upstream, Options{Logger: slog.New(slog.DiscardHandler)}), body)
	})
}

// streamEvents is the fake pod's streamed answer: a role-only event, 32
// one-token events, a finish event and [DONE], written one by one.
var streamEvents = func() []string {
	evs := []string{`data: {"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}` + "\n\n"}
	for range 32 {
		evs = append(evs, `data: {"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":" word"}}]}`+"\n\n")
	}
	return append(evs, `data: {"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}`+"\n\n", "data: [DONE]\n\n")
}()

// benchUpstream is one fast fake pod: an idle vLLM metrics page, a model
// list, a fixed chat completion, and a fixed stream when asked for one.
func benchUpstream(b *testing.B) *httptest.Server {
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/metrics":
			fmt.Fprint(w, "vllm:num_requests_waiting 0\nvllm:num_requests_running 1\nvllm:kv_cache_usage_perc 0.2\n")
			return
		case "/v1/models":
			fmt.Fprint(w, `{"object":"list","data":[{"id":"llama","object":"model"}]}`)
			return
		}
		req, _ := io.ReadAll(r.Body)
		if strings.Contains(string(req), `"stream":true`) {
			w.Header().Set("Content-Type", "text/event-stream")
			for _, ev := range streamEvents {
				_, _ = io.WriteString(w, ev)
				w.(http.Flusher).Flush()
			}
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(completion)
	}))
	b.Cleanup(upstream.Close)
	return upstream
}

// benchGateway starts a gateway over 4 pods at upstream's address and
// waits until they are scraped; it is closed when b ends.
func benchGateway(b *testing.B, upstream *httptest.Server, opts Options) *Gateway {
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
	b.Cleanup(cancel)
	gw, err := New(ctx, &cfg, opts)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(gw.Close)
	deadline := time.Now().Add(5 * time.Second)
	for {
		if s, ok := gw.scraper.Get("pod-3"); ok && !s.LastSuccess.IsZero() {
			return gw
		}
		if time.Now().After(deadline) {
			b.Fatal("pods never scraped")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

var completion = []byte(`{"id":"cmpl-1","object":"chat.completion","created":1,"model":"llama","choices":[{"index":0,"message":{"role":"assistant","content":"Hello there, how can I help you today?"},"finish_reason":"stop"}],"usage":{"prompt_tokens":200,"completion_tokens":10,"total_tokens":210}}`)

func benchBody() []byte {
	sys := strings.Repeat("You are a helpful assistant that answers briefly. ", 16)
	return []byte(fmt.Sprintf(`{"model":"llama","max_tokens":64,"messages":[{"role":"system","content":%q},{"role":"user","content":"What is the capital of France?"}]}`, sys))
}

func runProxyBench(b *testing.B, h http.Handler, body []byte) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	srv := &http.Server{Handler: h}
	go func() { _ = srv.Serve(ln) }()
	defer srv.Close()
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64, MaxIdleConns: 64}}
	u := "http://" + ln.Addr().String() + "/v1/chat/completions"
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	b.SetParallelism(4)
	b.ResetTimer()
	cpu0 := processCPU()
	defer func() {
		// Client, proxy and upstream share the process, so the difference
		// between the two sub-benchmarks is the proxies' difference.
		b.ReportMetric(float64(processCPU()-cpu0)/float64(b.N), "cpu-ns/op")
	}()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			req, _ := http.NewRequest(http.MethodPost, u, strings.NewReader(string(body)))
			req.Header.Set("Authorization", "Bearer "+testToken)
			req.Header.Set("Content-Type", "application/json")
			resp, err := client.Do(req)
			if err != nil {
				b.Error(err)
				return
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 {
				b.Errorf("status %d", resp.StatusCode)
				return
			}
		}
	})
}

// BenchmarkProxy32K is BenchmarkProxy with the load benchmark's requests:
// 32 KB chat bodies, every prompt distinct after a shared 8 KB system
// prompt (so each request brings new prefix blocks to record), every
// other one streamed:
//
//	go test -run '^$' -bench BenchmarkProxy32K -benchtime 5000x ./tier1/gateway/
func BenchmarkProxy32K(b *testing.B) {
	upstream := benchUpstream(b)
	var n atomic.Uint64
	bodies := func() []byte { return body32K(n.Add(1)) }
	b.Run("bare", func(b *testing.B) {
		target, _ := url.Parse(upstream.URL)
		rp := &httputil.ReverseProxy{
			Rewrite:       func(pr *httputil.ProxyRequest) { pr.SetURL(target) },
			FlushInterval: -1,
		}
		rp.Transport = newTransport(2*time.Second, nil)
		runProxyBenchBodies(b, rp, bodies)
	})
	b.Run("infergate", func(b *testing.B) {
		runProxyBenchBodies(b, benchGateway(b, upstream, Options{Logger: slog.New(slog.DiscardHandler)}), bodies)
	})
}

// body32K is request i of BenchmarkProxy32K: 32,768 bytes, streamed when
// i is odd.
func body32K(i uint64) []byte {
	sys := strings.Repeat("You are a careful assistant; answer briefly and cite the table. ", 128)[:8<<10]
	head := fmt.Sprintf(`{"model":"llama","max_tokens":16,"stream":%t,"messages":[{"role":"system","content":%q},{"role":"user","content":"[req %012d] `, i%2 == 1, sys, i)
	const tail = `"}]}`
	user := strings.Repeat("which model request token cache prefix router latency ", 700)[:32<<10-len(head)-len(tail)]
	return []byte(head + user + tail)
}

// runProxyBenchBodies is runProxyBench with a body per request.
func runProxyBenchBodies(b *testing.B, h http.Handler, body func() []byte) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	srv := &http.Server{Handler: h}
	go func() { _ = srv.Serve(ln) }()
	defer srv.Close()
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64, MaxIdleConns: 64}}
	u := "http://" + ln.Addr().String() + "/v1/chat/completions"
	b.SetBytes(32 << 10)
	b.ReportAllocs()
	b.SetParallelism(4)
	b.ResetTimer()
	cpu0 := processCPU()
	defer func() {
		b.ReportMetric(float64(processCPU()-cpu0)/float64(b.N), "cpu-ns/op")
	}()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			req, _ := http.NewRequest(http.MethodPost, u, bytes.NewReader(body()))
			req.Header.Set("Authorization", "Bearer "+testToken)
			req.Header.Set("Content-Type", "application/json")
			resp, err := client.Do(req)
			if err != nil {
				b.Error(err)
				return
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 {
				b.Errorf("status %d", resp.StatusCode)
				return
			}
		}
	})
}
