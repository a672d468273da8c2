package gateway

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/infergate/infergate/shared/cluster"
	"github.com/infergate/infergate/shared/config"
)

func TestErrorStatuses(t *testing.T) {
	pod := newFakePod(t, "p0")
	e := newEnv(t, []*fakePod{pod}, "max_body_bytes: 2048\nmodels:\n  - {name: batch-lora, base: llama, sheddable: true}\n")
	// A second pool whose only pod is down.
	big := strings.Repeat("x", 4096)
	tests := []struct {
		name       string
		method     string
		path       string
		body       string
		hdr        map[string]string
		wantStatus int
		wantCode   string
	}{
		{"no token", "POST", "/v1/chat/completions", chatBody("llama", "hi"), map[string]string{"Authorization": ""}, 401, "invalid_api_key"},
		{"wrong token", "POST", "/v1/chat/completions", chatBody("llama", "hi"), map[string]string{"Authorization": "Bearer nope"}, 401, "invalid_api_key"},
		{"basic auth scheme", "POST", "/v1/chat/completions", chatBody("llama", "hi"), map[string]string{"Authorization": "Basic " + testToken}, 401, "invalid_api_key"},
		{"models without token", "GET", "/v1/models", "", map[string]string{"Authorization": ""}, 401, "invalid_api_key"},
		{"load without token", "GET", cluster.LoadPath, "", map[string]string{"Authorization": ""}, 401, "invalid_api_key"},
		{"debug without token", "GET", "/debug/pods", "", map[string]string{"Authorization": ""}, 401, "invalid_api_key"},
		{"GET on chat", "GET", "/v1/chat/completions", "", nil, 405, "method_not_allowed"},
		{"too large", "POST", "/v1/chat/completions", chatBody("llama", big), nil, 413, "request_too_large"},
		{"empty body", "POST", "/v1/chat/completions", "", nil, 400, "invalid_json"},
		{"malformed json", "POST", "/v1/chat/completions", `{"model":"llama",`, nil, 400, "invalid_json"},
		{"not an object", "POST", "/v1/chat/completions", `[1,2]`, nil, 400, "invalid_json"},
		{"model not a string", "POST", "/v1/chat/completions", `{"model":3,"messages":[]}`, nil, 400, "invalid_type"},
		{"missing model", "POST", "/v1/chat/completions", `{"messages":[{"role":"user","content":"x"}]}`, nil, 400, "missing_model"},
		{"missing messages", "POST", "/v1/chat/completions", `{"model":"llama"}`, nil, 400, "missing_messages"},
		{"missing prompt", "POST", "/v1/completions", `{"model":"llama","messages":[]}`, nil, 400, "missing_prompt"},
		{"negative max_tokens", "POST", "/v1/completions", `{"model":"llama","prompt":"x","max_tokens":-1}`, nil, 400, "invalid_value"},
		{"unknown model", "POST", "/v1/chat/completions", chatBody("gpt-9", "hi"), nil, 404, "model_not_found"},
		{"bad slo header", "POST", "/v1/chat/completions", chatBody("llama", "hi"), map[string]string{HeaderTTFTSLO: "soon"}, 400, "invalid_ttft_slo"},
		{"unknown path", "GET", "/v2/whatever", "", nil, 404, "not_found"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			res := e.do(t, tt.method, tt.path, tt.body, tt.hdr)
			if res.status != tt.wantStatus {
				t.Fatalf("status = %d, want %d (body %s)", res.status, tt.wantStatus, res.body)
			}
			if code := errorCode(t, res.body); code != tt.wantCode {
				t.Errorf("code = %q, want %q", code, tt.wantCode)
			}
		})
	}
	if n := pod.hits.Load(); n != 0 {
		t.Errorf("bad requests reached the pod %d times", n)
	}

	// Saturated pool: the sheddable adapter is shed with 429; the standard
	// base model waits its bounded time, then goes through.
	pod.set(func(p *fakePod) { p.waiting = 50 })
	e.waitScraped(t)
	res := e.do(t, "POST", "/v1/chat/completions", chatBody("batch-lora", "hi"), nil)
	if res.status != 429 || errorCode(t, res.body) != "pool_saturated" {
		t.Errorf("sheddable under saturation: %d %s", res.status, res.body)
	}
	res = e.do(t, "POST", "/v1/chat/completions", chatBody("llama", "hi"), nil)
	if res.status != 200 {
		t.Errorf("standard request under saturation: %d %s", res.status, res.body)
	}

	// The pod goes away: 503, not a hang.
	pod.srv.Close()
	deadline := time.Now().Add(5 * time.Second)
	for {
		res = e.do(t, "POST", "/v1/chat/completions", chatBody("llama", "hi"), nil)
		if res.status == 503 || time.Now().After(deadline) {
			break
		}
	}
	if res.status != 503 {
		t.Fatalf("dead pool: status %d, want 503", res.status)
	}
	if c := errorCode(t, res.body); c != "no_ready_pod" && c != "upstream_unavailable" {
		t.Errorf("dead pool code %q", c)
	}
}

func TestAuthDisabledExplicitly(t *testing.T) {
	pod := newFakePod(t, "p0")
	var cfg Config
	yaml := fmt.Sprintf("auth: {disabled: true, trust_priority_header: true}\npools: [{name: a, model: llama}]\npods: [{name: p0, address: %q, pool: a}]\n", pod.addr())
	if err := config.Decode("t.yaml", []byte(yaml), &cfg); err != nil {
		t.Fatal(err)
	}
	e := startEnv(t, &cfg, []*fakePod{pod}, "")
	res := e.do(t, "POST", "/v1/chat/completions", chatBody("llama", "hi"), map[string]string{"Authorization": "", HeaderPriority: "notanumber"})
	if res.status != 200 {
		t.Fatalf("status %d %s", res.status, res.body)
	}
	// With auth disabled the priority header is never trusted, so even a
	// malformed one is ignored (stripped), not parsed.
	pod.mu.Lock()
	defer pod.mu.Unlock()
	if pod.lastReq.Header.Get(HeaderPriority) != "" {
		t.Error("priority header forwarded")
	}
}

func TestHeaderStripping(t *testing.T) {
	pod := newFakePod(t, "p0")
	pod.set(func(p *fakePod) {
		p.handler = func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("X-Infergate-Pod", "spoofed")
			w.Header().Set("X-Upstream", "kept")
			w.Header().Set("Connection", "X-Hop")
			w.Header().Set("X-Hop", "dropped")
			w.Header().Set("Content-Type", "application/json")
			_, _ = w.Write([]byte(`{}`))
		}
	})
	t.Setenv("TEST_UPSTREAM_TOKEN", "pod-secret")
	e := newEnv(t, []*fakePod{pod}, "upstream: {token_env: TEST_UPSTREAM_TOKEN}\n")
	res := e.do(t, "POST", "/v1/chat/completions", chatBody("llama", "hi"), map[string]string{
		"X-Gateway-Destination-Endpoint": "10.0.0.1:8000",
		"X-Infergate-Pod":                "p9",
		"X-Infergate-Anything":           "1",
		"Connection":                     "X-Client-Hop",
		"X-Client-Hop":                   "secret-hop",
		"X-Custom":                       "kept",
		"Cookie":                         "session=1",
	})
	if res.status != 200 {
		t.Fatalf("status %d %s", res.status, res.body)
	}
	pod.mu.Lock()
	got := pod.lastReq.Header
	pod.mu.Unlock()
	for _, h := range []string{"X-Gateway-Destination-Endpoint", "X-Infergate-Pod", "X-Infergate-Anything", "X-Client-Hop", "Cookie"} {
		if v := got.Get(h); v != "" {
			t.Errorf("upstream received %s: %q", h, v)
		}
	}
	if got.Get("Authorization") != "Bearer pod-secret" {
		t.Errorf("upstream Authorization = %q, want the upstream token (never the client's)", got.Get("Authorization"))
	}
	if got.Get("X-Custom") != "kept" || got.Get("X-Forwarded-For") != "127.0.0.1" {
		t.Errorf("end-to-end headers lost: %v", got)
	}
	if res.header.Get("X-Infergate-Pod") != "p0" {
		t.Errorf("pod header = %q, want p0 (the pod's spoof must be replaced)", res.header.Get("X-Infergate-Pod"))
	}
	if res.header.Get("X-Upstream") != "kept" || res.header.Get("X-Hop") != "" {
		t.Errorf("response headers: %v", res.header)
	}
}

func TestRetryOnNextPod(t *testing.T) {
	tests := []struct {
		name   string
		breakA func(a *fakePod)
		reason string
	}{
		{"5xx", func(a *fakePod) {
			a.set(func(p *fakePod) {
				p.handler = func(w http.ResponseWriter, r *http.Request) { http.Error(w, "boom", 500) }
			})
		}, "status_5xx"},
		{"429", func(a *fakePod) {
			a.set(func(p *fakePod) {
				p.handler = func(w http.ResponseWriter, r *http.Request) { http.Error(w, "busy", http.StatusTooManyRequests) }
			})
		}, "status_429"},
		{"dies before first byte", func(a *fakePod) {
			a.set(func(p *fakePod) {
				p.handler = func(w http.ResponseWriter, r *http.Request) {
					// Headers out, then the connection drops.
					w.Header().Set("Content-Type", "text/event-stream")
					w.WriteHeader(200)
					w.(http.Flusher).Flush()
					panic(http.ErrAbortHandler)
				}
			})
		}, "reset"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a, b := newFakePod(t, "a"), newFakePod(t, "b")
			// b looks busier, so a is the first choice.
			b.set(func(p *fakePod) { p.waiting = 3; p.kv = 0.5 })
			e := newEnv(t, []*fakePod{a, b}, "")
			tt.breakA(a)
			res := e.do(t, "POST", "/v1/chat/completions", chatBody("llama", "hello"), nil)
			if res.status != 200 || res.header.Get("X-Infergate-Pod") != "b" {
				t.Fatalf("status %d pod %q body %s", res.status, res.header.Get("X-Infergate-Pod"), res.body)
			}
			if a.hits.Load() != 1 || b.hits.Load() != 1 {
				t.Errorf("hits a=%d b=%d, want 1 and 1", a.hits.Load(), b.hits.Load())
			}
			if v := counterValue(t, e.gw, "infergate_tier1_retries_total", "reason", tt.reason); v != 1 {
				t.Errorf("retries{reason=%s} = %v, want 1", tt.reason, v)
			}
		})
	}
}

func TestRetryConnectRefused(t *testing.T) {
	a, b := newFakePod(t, "a"), newFakePod(t, "b")
	b.set(func(p *fakePod) { p.waiting = 3 })
	e := newEnv(t, []*fakePod{a, b}, "scrape: {interval: 1h}\n")
	a.srv.Close() // scrapes are hourly: the router still thinks a is fine
	res := e.do(t, "POST", "/v1/chat/completions", chatBody("llama", "hello"), nil)
	if res.status != 200 || res.header.Get("X-Infergate-Pod") != "b" {
		t.Fatalf("status %d pod %q", res.status, res.header.Get("X-Infergate-Pod"))
	}
	// The failed pod is held out until rescraped: the next request goes
	// straight to b without a retry.
	res = e.do(t, "POST", "/v1/chat/completions", chatBody("llama", "again"), nil)
	if res.status != 200 || counterValue(t, e.gw, "infergate_tier1_retries_total", "reason", "connect") != 1 {
		t.Errorf("second request: %d, retries %v", res.status, counterValue(t, e.gw, "infergate_tier1_retries_total", "reason", "connect"))
	}
}

// The last pod's 5xx is relayed as is when no attempt is left.
func TestNoRetryLeftRelaysError(t *testing.T) {
	a := newFakePod(t, "a")
	a.set(func(p *fakePod) {
		p.handler = func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(500)
			_, _ = w.Write([]byte(`{"error":{"message":"engine died","type":"server_error","code":"x"}}`))
		}
	})
	e := newEnv(t, []*fakePod{a}, "")
	res := e.do(t, "POST", "/v1/chat/completions", chatBody("llama", "hello"), nil)
	if res.status != 500 || !strings.Contains(res.body, "engine died") {
		t.Errorf("got %d %s", res.status, res.body)
	}
}

func TestStreamIsIncremental(t *testing.T) {
	release := make(chan struct{})
	upstreamDone := make(chan error, 1)
	pod := newFakePod(t, "p0")
	pod.set(func(p *fakePod) {
		p.handler = func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "text/event-stream")
			fmt.Fprint(w, "data: {\"n\":1}\n\n")
			w.(http.Flusher).Flush()
			select {
			case <-release:
			case <-r.Context().Done():
				upstreamDone <- r.Context().Err()
				return
			}
			fmt.Fprint(w, "data: {\"n\":2}\n\ndata: [DONE]\n\n")
			upstreamDone <- nil
		}
	})
	e := newEnv(t, []*fakePod{pod}, "")
	req, _ := http.NewRequest("POST", e.url+"/v1/chat/completions", strings.NewReader(`{"model":"llama","stream":true,"messages":[{"role":"user","content":"x"}]}`))
	req.Header.Set("Authorization", "Bearer "+testToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	// The first event arrives while the pod is still holding the second.
	line, err := br.ReadString('\n')
	if err != nil || line != "data: {\"n\":1}\n" {
		t.Fatalf("first line %q, %v", line, err)
	}
	close(release)
	rest, _ := io.ReadAll(br)
	if !strings.Contains(string(rest), "[DONE]") {
		t.Errorf("rest = %q", rest)
	}
	if err := <-upstreamDone; err != nil {
		t.Errorf("upstream: %v", err)
	}
}

func TestClientCancelStopsUpstream(t *testing.T) {
	upstreamDone := make(chan error, 1)
	pod := newFakePod(t, "p0")
	pod.set(func(p *fakePod) {
		p.handler = func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "text/event-stream")
			fmt.Fprint(w, "data: {\"n\":1}\n\n")
			w.(http.Flusher).Flush()
			select {
			case <-r.Context().Done():
				upstreamDone <- r.Context().Err()
			case <-time.After(10 * time.Second):
				upstreamDone <- fmt.Errorf("upstream was never cancelled")
			}
		}
	})
	e := newEnv(t, []*fakePod{pod}, "")
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, "POST", e.url+"/v1/chat/completions", strings.NewReader(`{"model":"llama","stream":true,"messages":[]}`))
	req.Header.Set("Authorization", "Bearer "+testToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = bufio.NewReader(resp.Body).ReadString('\n')
	cancel()
	resp.Body.Close()
	if err := <-upstreamDone; err == nil || strings.Contains(err.Error(), "never") {
		t.Errorf("upstream: %v", err)
	}
}

func TestIdleTimeoutEndsHungStream(t *testing.T) {
	pod := newFakePod(t, "p0")
	pod.set(func(p *fakePod) {
		p.handler = func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "text/event-stream")
			fmt.Fprint(w, "data: {\"n\":1}\n\n")
			w.(http.Flusher).Flush()
			<-r.Context().Done() // hangs until the router gives up
		}
	})
	e := newEnv(t, []*fakePod{pod}, "timeouts: {idle: 100ms}\n")
	res := e.do(t, "POST", "/v1/chat/completions", `{"model":"llama","stream":true,"messages":[]}`, nil)
	if res.status != 200 || !strings.Contains(res.body, "upstream_interrupted") {
		t.Errorf("hung stream: %d %q", res.status, res.body)
	}
}

func TestAdapterResolution(t *testing.T) {
	a, b := newFakePod(t, "a"), newFakePod(t, "b")
	// Only b lists the discovered adapter.
	b.set(func(p *fakePod) { p.models = []string{"llama", "pod-lora:llama"}; p.waiting = 2 })
	e := newEnv(t, []*fakePod{a, b}, "")
	for i := 0; i < 5; i++ {
		res := e.do(t, "POST", "/v1/chat/completions", chatBody("pod-lora", fmt.Sprint("q", i)), nil)
		if res.status != 200 || res.header.Get("X-Infergate-Pod") != "b" {
			t.Fatalf("adapter request: %d on %q", res.status, res.header.Get("X-Infergate-Pod"))
		}
	}
	// /v1/models is the union: base, configured and discovered adapters.
	res := e.do(t, "GET", "/v1/models", "", nil)
	var list struct {
		Data []struct {
			ID     string  `json:"id"`
			Parent *string `json:"parent"`
		} `json:"data"`
	}
	if err := json.Unmarshal([]byte(res.body), &list); err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, m := range list.Data {
		p := ""
		if m.Parent != nil {
			p = *m.Parent
		}
		got[m.ID] = p
	}
	want := map[string]string{"llama": "", "cfg-lora": "llama", "pod-lora": "llama"}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("models = %v, want %v", got, want)
	}
	// Load summary lists every served name.
	res = e.do(t, "GET", cluster.LoadPath, "", nil)
	var sum cluster.LoadSummary
	if err := json.Unmarshal([]byte(res.body), &sum); err != nil {
		t.Fatal(err)
	}
	if len(sum.Models) != 3 || sum.Models["pod-lora"].ReadyPods != 2 || sum.Models["llama"].Pool != "llama-pool" {
		t.Errorf("load summary = %+v", sum)
	}
	// Adapters name their base, so Tier 2's per-model limits cover them.
	if sum.Models["cfg-lora"].Base != "llama" || sum.Models["pod-lora"].Base != "llama" || sum.Models["llama"].Base != "" {
		t.Errorf("load summary bases = %+v", sum.Models)
	}
}

func TestDebugPods(t *testing.T) {
	a := newFakePod(t, "a")
	e := newEnv(t, []*fakePod{a}, "")
	e.do(t, "POST", "/v1/chat/completions", chatBody("llama", "hi"), nil)
	res := e.do(t, "GET", "/debug/pods", "", nil)
	var d struct {
		Pods []podDebug `json:"pods"`
	}
	if err := json.Unmarshal([]byte(res.body), &d); err != nil {
		t.Fatal(err)
	}
	if len(d.Pods) != 1 || !d.Pods[0].Ready || d.Pods[0].LastScores == nil || !d.Pods[0].LastScores.Picked ||
		len(d.Pods[0].LastScores.Scores) == 0 || d.Pods[0].Engine != "vllm" {
		t.Errorf("debug = %s", res.body)
	}
}

func TestHotReload(t *testing.T) {
	a, b := newFakePod(t, "a"), newFakePod(t, "b")
	dir := t.TempDir()
	path := filepath.Join(dir, "tier1.yaml")
	write := func(pods string, weight int) {
		y := fmt.Sprintf("auth: {tokens: [%s]}\nreload_interval: 20ms\nscrape: {interval: 10ms}\n"+
			"scheduler: {scorers: [{name: queue, weight: %d}]}\n"+
			"pools: [{name: p, model: llama}, {name: q, model: qwen}]\npods:\n%s", testToken, weight, pods)
		if err := os.WriteFile(path, []byte(y), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write(fmt.Sprintf("  - {name: a, address: %q, pool: p}\n", a.addr()), 2)
	var cfg Config
	if err := config.Load(path, &cfg); err != nil {
		t.Fatal(err)
	}
	e := startEnv(t, &cfg, []*fakePod{a}, path)
	if res := e.do(t, "POST", "/v1/chat/completions", chatBody("qwen", "hi"), nil); res.status != 503 {
		t.Fatalf("qwen before reload: %d", res.status)
	}
	// Add a qwen pod and change one weight; no restart.
	time.Sleep(30 * time.Millisecond) // distinct mtime on coarse filesystems
	write(fmt.Sprintf("  - {name: a, address: %q, pool: p}\n  - {name: b, address: %q, pool: q}\n", a.addr(), b.addr()), 5)
	deadline := time.Now().Add(10 * time.Second)
	for {
		res := e.do(t, "POST", "/v1/chat/completions", chatBody("qwen", "hi"), nil)
		if res.status == 200 {
			if res.header.Get("X-Infergate-Pod") != "b" {
				t.Errorf("served by %q", res.header.Get("X-Infergate-Pod"))
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("reload never applied: %d %s", res.status, res.body)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if w := e.gw.sched.Profile().Weight("queue"); w != 5 {
		t.Errorf("queue weight after reload = %v, want 5", w)
	}
	// A broken file is rejected and the running config stays.
	if err := os.WriteFile(path, []byte("auth: {tokens: [x]}\nbogus_field: 1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := e.gw.Reload(path); err == nil || !strings.Contains(err.Error(), "bogus_field") {
		t.Errorf("reload of bad file: %v", err)
	}
	if res := e.do(t, "POST", "/v1/chat/completions", chatBody("qwen", "hi"), nil); res.status != 200 {
		t.Errorf("after bad reload: %d", res.status)
	}
}

func TestPriorityHeaderTrust(t *testing.T) {
	pod := newFakePod(t, "p0")
	e := newEnv(t, []*fakePod{pod}, "")
	// Not trusted by config: a malformed value is ignored, not parsed.
	if res := e.do(t, "POST", "/v1/chat/completions", chatBody("llama", "hi"), map[string]string{HeaderPriority: "x"}); res.status != 200 {
		t.Errorf("untrusted priority header: %d", res.status)
	}
	e2 := newEnv(t, []*fakePod{pod}, "")
	st := *e2.gw.state.Load()
	cfg := *st.cfg
	cfg.Auth.TrustPriorityHeader = true
	if err := e2.gw.Apply(&cfg); err != nil {
		t.Fatal(err)
	}
	if res := e2.do(t, "POST", "/v1/chat/completions", chatBody("llama", "hi"), map[string]string{HeaderPriority: "x"}); res.status != 400 {
		t.Errorf("trusted malformed priority: %d", res.status)
	}
	// Trusted: priority -1 makes the request sheddable.
	pod.set(func(p *fakePod) { p.waiting = 50 })
	e2.waitScraped(t)
	if res := e2.do(t, "POST", "/v1/chat/completions", chatBody("llama", "hi"), map[string]string{HeaderPriority: "-1"}); res.status != 429 {
		t.Errorf("trusted sheddable priority under saturation: %d", res.status)
	}
}

// counterValue reads one counter series from the gateway's registry.
func counterValue(t testing.TB, g *Gateway, name, label, value string) float64 {
	t.Helper()
	fams, err := g.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	var total float64
	for _, f := range fams {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, lp := range m.GetLabel() {
				if lp.GetName() == label && lp.GetValue() == value {
					total += m.GetCounter().GetValue()
				}
			}
		}
	}
	return total
}
