package gateway

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/infergate/infergate/shared/config"
)

const testToken = "test-token-123"

// fakePod is a real model-server stand-in on loopback: vLLM-style /metrics
// and /v1/models, and a programmable completion handler.
type fakePod struct {
	name string
	srv  *httptest.Server

	mu       sync.Mutex
	waiting  int
	kv       float64
	models   []string // ids; adapters are "name:parent"
	metrics  string   // more exposition lines for /metrics
	handler  http.HandlerFunc
	lastReq  *http.Request
	lastBody []byte
	hits     atomic.Int64
}

func newFakePod(t testing.TB, name string) *fakePod {
	p := &fakePod{name: name, models: []string{"llama"}}
	p.srv = httptest.NewServer(http.HandlerFunc(p.serve))
	t.Cleanup(p.srv.Close)
	return p
}

func (p *fakePod) addr() string { return strings.TrimPrefix(p.srv.URL, "http://") }

func (p *fakePod) set(fn func(p *fakePod)) {
	p.mu.Lock()
	defer p.mu.Unlock()
	fn(p)
}

func (p *fakePod) serve(w http.ResponseWriter, r *http.Request) {
	switch r.URL.Path {
	case "/metrics":
		p.mu.Lock()
		fmt.Fprintf(w, "# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting %d\n"+
			"# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running 0\n"+
			"# TYPE vllm:kv_cache_usage_perc gauge\nvllm:kv_cache_usage_perc %g\n%s", p.waiting, p.kv, p.metrics)
		p.mu.Unlock()
		return
	case "/v1/models":
		p.mu.Lock()
		var data []map[string]any
		for _, m := range p.models {
			id, parent, _ := strings.Cut(m, ":")
			e := map[string]any{"id": id, "object": "model", "root": id, "parent": nil}
			if parent != "" {
				e["parent"] = parent
			}
			data = append(data, e)
		}
		p.mu.Unlock()
		_ = json.NewEncoder(w).Encode(map[string]any{"object": "list", "data": data})
		return
	}
	body, _ := io.ReadAll(r.Body)
	p.hits.Add(1)
	p.mu.Lock()
	p.lastReq, p.lastBody = r.Clone(context.Background()), body
	h := p.handler
	p.mu.Unlock()
	if h != nil {
		h(w, r)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	fmt.Fprintf(w, `{"id":"x","object":"chat.completion","pod":%q}`, p.name)
}

// env is a gateway fronting fake pods.
type env struct {
	gw   *Gateway
	url  string
	pods map[string]*fakePod
	cfg  *Config
}

// newEnv starts a gateway over the given pods (all in pool "llama",
// model "llama") with extra YAML appended to the config.
func newEnv(t testing.TB, pods []*fakePod, extra string) *env {
	t.Helper()
	var b strings.Builder
	fmt.Fprintf(&b, "auth: {tokens: [%s]}\nretry: {max_attempts: 3}\n", testToken)
	if !strings.Contains(extra, "scrape:") {
		b.WriteString("scrape: {interval: 10ms}\n")
	}
	b.WriteString("pools:\n  - {name: llama-pool, model: llama, adapters: [cfg-lora]}\npods:\n")
	for _, p := range pods {
		fmt.Fprintf(&b, "  - {name: %s, address: %q, pool: llama-pool, engine: vllm}\n", p.name, p.addr())
	}
	b.WriteString(extra)
	var cfg Config
	if err := config.Decode("test.yaml", []byte(b.String()), &cfg); err != nil {
		t.Fatalf("config: %v\n%s", err, b.String())
	}
	return startEnv(t, &cfg, pods, "")
}

func startEnv(t testing.TB, cfg *Config, pods []*fakePod, path string) *env {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	gw, err := New(ctx, cfg, Options{Logger: slog.New(slog.DiscardHandler), ConfigPath: path})
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
		e.pods[p.name] = p
	}
	e.waitReady(t)
	return e
}

// waitReady waits until every pod has been scraped.
func (e *env) waitReady(t testing.TB) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for name := range e.pods {
		for {
			s, ok := e.gw.scraper.Get(name)
			if ok && !s.LastSuccess.IsZero() && s.Models != nil {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("pod %s never scraped", name)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
}

// waitScraped waits for one more scrape of every pod, so state set on the
// fake pods is visible to the router.
func (e *env) waitScraped(t testing.TB) {
	t.Helper()
	start := time.Now()
	deadline := start.Add(10 * time.Second)
	// A scrape already on the wire when the caller changed a pod may land
	// after start with the old metrics, so wait for two completions: the
	// second began after the first ended, hence after the change.
	for name := range e.pods {
		after := start
		for seen := 0; seen < 2; {
			s, _ := e.gw.scraper.Get(name)
			if s.LastSuccess.After(after) {
				after = s.LastSuccess
				seen++
				continue
			}
			if time.Now().After(deadline) {
				t.Fatalf("pod %s not rescraped", name)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
}

type result struct {
	status int
	header http.Header
	body   string
}

func (e *env) do(t testing.TB, method, path, body string, hdr map[string]string) result {
	t.Helper()
	req, err := http.NewRequest(method, e.url+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+testToken)
	for k, v := range hdr {
		if v == "" {
			req.Header.Del(k)
		} else {
			req.Header.Set(k, v)
		}
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return result{resp.StatusCode, resp.Header, string(b)}
}

func chatBody(model, content string) string {
	b, _ := json.Marshal(map[string]any{
		"model":    model,
		"messages": []map[string]string{{"role": "user", "content": content}},
	})
	return string(b)
}

// errorCode returns the code of an OpenAI JSON error body, failing the
// test if the body is not one.
func errorCode(t testing.TB, body string) string {
	t.Helper()
	var e struct {
		Error struct {
			Message string `json:"message"`
			Type    string `json:"type"`
			Code    string `json:"code"`
		} `json:"error"`
	}
	if err := json.Unmarshal([]byte(body), &e); err != nil || e.Error.Message == "" || e.Error.Type == "" {
		t.Fatalf("not an OpenAI error body: %q (%v)", body, err)
	}
	return e.Error.Code
}
