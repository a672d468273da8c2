package gateway_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/infergate/infergate/shared/cluster"
	"github.com/infergate/infergate/tier2/discovery"
	"github.com/infergate/infergate/tier2/gateway"
	"github.com/infergate/infergate/tier2/route"
	"github.com/infergate/infergate/tier2/tenant"
)

const tier1Token = "tier1-secret"

// tier1 is a stand-in for a Tier 1 cluster: a real HTTP server on loopback
// that serves the OpenAI endpoints (answers name the cluster) and the load
// summary, checks Tier 2's bearer token, and can be killed and revived on
// the same port.
type tier1 struct {
	t      testing.TB
	name   string
	region string
	addr   string
	models []string

	mu      sync.Mutex
	srv     *http.Server
	load    cluster.ModelLoad
	last    *http.Request
	lastRaw []byte

	mode       atomic.Value // "ok", "500", "429", "503:<code>", "hang", "stall", "die-after-first", "die-after-done", "die-named", "endless", "huge-event"
	chunkDelay atomic.Int64 // ns between stream chunks
	hits       atomic.Int64 // inference requests received
	active     atomic.Int64 // inference requests being answered (reported as running)
}

func newTier1(t testing.TB, name, region string, models ...string) *tier1 {
	t.Helper()
	if len(models) == 0 {
		models = []string{"m"}
	}
	s := &tier1{t: t, name: name, region: region, models: models, load: cluster.ModelLoad{ReadyPods: 2, Pods: 2, KVHeadroom: 1}}
	s.mode.Store("ok")
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s.addr = l.Addr().String()
	s.serve(l)
	t.Cleanup(s.kill)
	return s
}

func (s *tier1) URL() string { return "http://" + s.addr }

func (s *tier1) cluster(cost float64, capacity int) discovery.Cluster {
	return discovery.Cluster{Name: s.name, Region: s.region, Address: s.URL(), Models: s.models, Cost: cost, Capacity: capacity}
}

func (s *tier1) serve(l net.Listener) {
	srv := &http.Server{Handler: http.HandlerFunc(s.handle), ReadHeaderTimeout: 5 * time.Second}
	s.mu.Lock()
	s.srv = srv
	s.mu.Unlock()
	go func() { _ = srv.Serve(l) }()
}

// kill closes the listener and every connection at once, like a crashed
// cluster: new connections are refused.
func (s *tier1) kill() {
	s.mu.Lock()
	srv := s.srv
	s.srv = nil
	s.mu.Unlock()
	if srv != nil {
		_ = srv.Close()
	}
}

// revive listens again on the same address.
func (s *tier1) revive() {
	s.t.Helper()
	var l net.Listener
	var err error
	for range 50 {
		if l, err = net.Listen("tcp", s.addr); err == nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil {
		s.t.Fatalf("revive %s: %v", s.name, err)
	}
	s.serve(l)
}

func (s *tier1) setLoad(running, queue int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.load.Running, s.load.Queue = running, queue
}

func (s *tier1) lastRequest() (*http.Request, []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.last, s.lastRaw
}

func (s *tier1) handle(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path == "/ready" { // Consul's health check: no token
		w.WriteHeader(http.StatusOK)
		return
	}
	if r.Header.Get("Authorization") != "Bearer "+tier1Token {
		http.Error(w, `{"error":{"message":"bad token"}}`, http.StatusUnauthorized)
		return
	}
	if r.URL.Path == cluster.LoadPath {
		s.mu.Lock()
		sum := cluster.LoadSummary{Cluster: s.name, Region: s.region, At: time.Now(), Models: map[string]cluster.ModelLoad{}}
		for _, m := range s.models {
			ml := s.load
			ml.Running += int(s.active.Load())
			ml.InFlight = ml.Running + ml.Queue
			sum.Models[m] = ml
		}
		s.mu.Unlock()
		_ = json.NewEncoder(w).Encode(sum)
		return
	}
	body, _ := io.ReadAll(r.Body)
	s.hits.Add(1)
	s.active.Add(1)
	defer s.active.Add(-1)
	s.mu.Lock()
	s.last, s.lastRaw = r.Clone(context.Background()), body
	s.mu.Unlock()
	mode := s.mode.Load().(string)
	if code, ok := strings.CutPrefix(mode, "503:"); ok { // refused, with Tier 1's cause
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusServiceUnavailable)
		fmt.Fprintf(w, `{"error":{"message":"refused","type":"service_unavailable","code":%q}}`, code)
		return
	}
	// The pod that serves it, as Tier 1 names it (pod_header).
	w.Header().Set(cluster.HeaderPod, s.name+"-pod-0")
	switch mode {
	case "500":
		http.Error(w, `{"error":{"message":"boom"}}`, http.StatusInternalServerError)
		return
	case "429":
		http.Error(w, `{"error":{"message":"busy"}}`, http.StatusTooManyRequests)
		return
	case "401":
		http.Error(w, `{"error":{"message":"bad token"}}`, http.StatusUnauthorized)
		return
	case "404":
		http.Error(w, `{"error":{"message":"no such model"}}`, http.StatusNotFound)
		return
	case "hang": // nothing at all
		<-r.Context().Done()
		return
	case "endless", "huge-event": // a stream that never ends, or one event too big
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		fl := w.(http.Flusher)
		fmt.Fprint(w, "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"first\"}}]}\n\n")
		fl.Flush()
		if s.mode.Load().(string) == "huge-event" {
			fmt.Fprintf(w, "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"%s\"}}]}\n\n", strings.Repeat("x", 1<<20))
			fl.Flush()
			<-r.Context().Done()
			return
		}
		chunk := "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"" + strings.Repeat("y", 16<<10) + "\"}}]}\n\n"
		for r.Context().Err() == nil {
			if _, err := io.WriteString(w, chunk); err != nil {
				return
			}
			fl.Flush()
			if d := time.Duration(s.chunkDelay.Load()); d > 0 {
				time.Sleep(d)
			}
		}
		return
	case "die-named": // a Responses or Anthropic stream, cut after its first events
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		if r.URL.Path == "/v1/responses" {
			fmt.Fprint(w, "event: response.created\ndata: {\"type\":\"response.created\",\"sequence_number\":0,\"response\":{\"id\":\"resp_stub\",\"object\":\"response\",\"status\":\"in_progress\",\"output\":[]}}\n\n"+
				"event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"sequence_number\":1,\"delta\":\"hi\"}\n\n")
		} else {
			fmt.Fprint(w, "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_stub\",\"usage\":{\"input_tokens\":5}}}\n\n"+
				"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"hi\"}}\n\n")
		}
		w.(http.Flusher).Flush()
		if hj, ok := w.(http.Hijacker); ok {
			if conn, _, err := hj.Hijack(); err == nil {
				conn.Close()
			}
		}
		return
	case "stall": // headers, then nothing
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		w.(http.Flusher).Flush()
		<-r.Context().Done()
		return
	}
	var req struct {
		Model         string `json:"model"`
		Stream        bool   `json:"stream"`
		StreamOptions struct {
			IncludeUsage bool `json:"include_usage"`
		} `json:"stream_options"`
	}
	if err := json.Unmarshal(body, &req); err != nil {
		http.Error(w, `{"error":{"message":"bad json"}}`, http.StatusBadRequest)
		return
	}
	if req.Model == "bad-request" {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusBadRequest)
		_, _ = io.WriteString(w, `{"error":{"message":"tier1 says no","type":"invalid_request_error","code":"bad"}}`)
		return
	}
	if !req.Stream {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"id":"x","object":"chat.completion","model":%q,"choices":[{"index":0,"message":{"role":"assistant","content":"hello from %s"}}],"usage":{"prompt_tokens":5,"completion_tokens":7,"total_tokens":12}}`, req.Model, s.name)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	fl := w.(http.Flusher)
	for i := range 3 {
		fmt.Fprintf(w, "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"%s-%d \"}}]}\n\n", s.name, i)
		fl.Flush()
		if i == 0 && s.mode.Load().(string) == "die-after-first" {
			// Crash mid-stream: hijack and close the connection.
			if hj, ok := w.(http.Hijacker); ok {
				conn, _, err := hj.Hijack()
				if err == nil {
					conn.Close()
				}
			}
			return
		}
		if d := time.Duration(s.chunkDelay.Load()); d > 0 {
			time.Sleep(d)
		}
	}
	if req.StreamOptions.IncludeUsage {
		fmt.Fprint(w, "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":3,\"total_tokens\":8}}\n\n")
	}
	fmt.Fprint(w, "data: [DONE]\n\n")
	if s.mode.Load().(string) == "die-after-done" {
		// The stream is whole; then the connection breaks.
		fl.Flush()
		if conn, _, err := w.(http.Hijacker).Hijack(); err == nil {
			conn.Close()
		}
	}
}

// keys is a fixed key → tenant authenticator for tests.
type keys map[string]*tenant.Tenant

func (k keys) Authenticate(_ context.Context, r *http.Request) (*tenant.Tenant, error) {
	raw := strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")
	t, ok := k[raw]
	if !ok {
		return nil, tenant.ErrUnauthenticated
	}
	if t.Disabled {
		return nil, tenant.ErrDisabled
	}
	return t, nil
}

var testKeys = keys{
	"key-cost":   {ID: "acme", Policy: tenant.PolicyCostFirst},
	"key-lat":    {ID: "fast", Policy: tenant.PolicyLatencyFirst},
	"key-west":   {ID: "westco", Policy: tenant.PolicyRegionPinned, Region: "west"},
	"key-closed": {ID: "gone", Disabled: true},
}

// stack is a gateway over a router over a cluster source, all real.
type stack struct {
	gw     *gateway.Gateway
	router *route.Router
	reg    *prometheus.Registry
	url    string
	cancel context.CancelFunc
}

type stackOpts struct {
	src     route.Source
	route   func(*route.Options)
	gateway func(*gateway.Options)
}

func newStack(t testing.TB, so stackOpts) *stack {
	t.Helper()
	reg := prometheus.NewRegistry()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	ro := route.Options{Region: "east", RegionOrder: []string{"west"}, Token: tier1Token, PollInterval: 50 * time.Millisecond,
		Registry: reg, Logger: log, Breaker: route.BreakerOptions{OpenTimeout: 300 * time.Millisecond}}
	if so.route != nil {
		so.route(&ro)
	}
	r, err := route.New(so.src, ro)
	if err != nil {
		t.Fatal(err)
	}
	gwo := gateway.Options{Router: r, Auth: testKeys, Tier1Token: tier1Token, Registry: reg, Logger: log,
		FirstByteTimeout: 2 * time.Second, ResponseTimeout: 5 * time.Second}
	if so.gateway != nil {
		so.gateway(&gwo)
	}
	gw, err := gateway.New(gwo)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = r.Run(ctx); close(done) }()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: gw}
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() { cancel(); <-done; _ = srv.Close() })
	return &stack{gw: gw, router: r, reg: reg, url: "http://" + l.Addr().String(), cancel: cancel}
}

type reply struct {
	code    int
	header  http.Header
	body    string
	cluster string
}

var client = &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}, Timeout: 20 * time.Second}

func (s *stack) do(t testing.TB, key, path, body string, hdr ...string) reply {
	t.Helper()
	r, err := s.try(key, path, body, hdr...)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// try is do for goroutines other than the test's: errors are returned.
func (s *stack) try(key, path, body string, hdr ...string) (reply, error) {
	req, err := http.NewRequest(http.MethodPost, s.url+path, strings.NewReader(body))
	if err != nil {
		return reply{}, err
	}
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := client.Do(req)
	if err != nil {
		return reply{}, fmt.Errorf("POST %s: %w", path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return reply{}, fmt.Errorf("POST %s: reading: %w", path, err)
	}
	return reply{code: resp.StatusCode, header: resp.Header, body: string(b), cluster: resp.Header.Get("X-Infergate-Cluster")}, nil
}

func (s *stack) chat(t testing.TB, key string) reply {
	return s.do(t, key, "/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"hi"}]}`)
}

// metric sums a counter's samples whose labels include want.
func (s *stack) metric(t testing.TB, name string, want map[string]string) float64 {
	t.Helper()
	mfs, err := s.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	metrics:
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			for k, v := range want {
				if labels[k] != v {
					continue metrics
				}
			}
			if m.GetCounter() != nil {
				sum += m.GetCounter().GetValue()
			} else if m.GetGauge() != nil {
				sum += m.GetGauge().GetValue()
			}
		}
	}
	return sum
}

func waitFor(t testing.TB, limit time.Duration, what string, cond func() bool) time.Duration {
	t.Helper()
	start := time.Now()
	for time.Since(start) < limit {
		if cond() {
			return time.Since(start)
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("%s: not within %v", what, limit)
	return 0
}

// errorBody decodes an OpenAI error envelope.
func errorBody(t testing.TB, body string) (typ, code string) {
	t.Helper()
	var e struct {
		Error struct {
			Type string `json:"type"`
			Code any    `json:"code"`
		} `json:"error"`
	}
	if err := json.Unmarshal([]byte(body), &e); err != nil {
		t.Fatalf("not an OpenAI error body: %q", body)
	}
	c, _ := e.Error.Code.(string)
	return e.Error.Type, c
}
