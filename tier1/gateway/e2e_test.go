package gateway

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/infergate/infergate/shared/config"
	"github.com/infergate/infergate/shared/sse"
	"github.com/infergate/infergate/sim/engine"
	"github.com/infergate/infergate/sim/server"
)

// End-to-end tests: the gateway in front of simulated GPU pods
// (sim/server), everything over real HTTP on loopback.

type simPod struct {
	name string
	gpu  string
	gpus int // pods[].gpus; 0: unset
	cfg  server.Config
	pod  *server.Pod
	once sync.Once
}

// close stops the pod once (server.Pod.Close blocks if called twice).
func (sp *simPod) close() { sp.once.Do(func() { _ = sp.pod.Close() }) }

type simEnv struct {
	*env
	sims map[string]*simPod
}

// newSimEnv starts the given simulated pods (all serving llama-3.1-8b in
// pool "llama") and a gateway over them.
func newSimEnv(t *testing.T, pods []simPod, extra string) *simEnv {
	t.Helper()
	if testing.Short() {
		t.Skip("end-to-end test")
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	se := &simEnv{sims: map[string]*simPod{}}
	var b strings.Builder
	fmt.Fprintf(&b, "auth: {tokens: [%s]}\nscrape: {interval: 20ms}\n%s", testToken, extra)
	b.WriteString("pools: [{name: llama, model: llama-3.1-8b}]\npods:\n")
	for i := range pods {
		sp := &pods[i]
		sp.cfg.Name = sp.name
		if sp.cfg.GPU == "" {
			sp.cfg.GPU = sp.gpu
		}
		sp.cfg.Model = "llama-3.1-8b"
		sp.cfg.Logger = slog.New(slog.DiscardHandler)
		p, err := server.Listen(ctx, sp.cfg, "127.0.0.1:0")
		if err != nil {
			t.Fatalf("sim pod %s: %v", sp.name, err)
		}
		sp.pod = p
		t.Cleanup(sp.close)
		se.sims[sp.name] = sp
		fmt.Fprintf(&b, "  - {name: %s, address: %q, pool: llama, gpu: %s, gpus: %d}\n", sp.name, p.Addr, sp.cfg.GPU, sp.gpus)
	}
	var cfg Config
	if err := config.Decode("e2e.yaml", []byte(b.String()), &cfg); err != nil {
		t.Fatalf("config: %v\n%s", err, b.String())
	}
	se.env = startSimGateway(t, &cfg, se)
	return se
}

func startSimGateway(t *testing.T, cfg *Config, se *simEnv) *env {
	fake := make([]*fakePod, 0, len(se.sims))
	for name := range se.sims {
		fake = append(fake, &fakePod{name: name}) // names only, for waitReady
	}
	return startEnv(t, cfg, fake, "")
}

// direct sends a request straight to a simulated pod (bypassing the
// router) in the background, to load it; it returns when the pod has
// accepted it.
func (se *simEnv) direct(t *testing.T, pod, model string, promptWords, maxTokens int) {
	t.Helper()
	body := fmt.Sprintf(`{"model":%q,"max_tokens":%d,"prompt":%q}`, model, maxTokens, words(promptWords, pod))
	req, _ := http.NewRequest("POST", se.sims[pod].pod.URL+"/v1/completions", strings.NewReader(body))
	go func() {
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
	}()
}

func words(n int, salt string) string {
	var b strings.Builder
	for i := 0; i < n; i++ {
		fmt.Fprintf(&b, "w%s%d ", salt, i)
	}
	return b.String()
}

// waitPod waits until the router's view of pod satisfies cond.
func (se *simEnv) waitPod(t *testing.T, pod, what string, cond func(s *podDebug) bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		st := se.gw.state.Load()
		cb := &cycleBuf{}
		se.gw.snapshotAll(st, st.pools["llama"], cb)
		for i, p := range cb.pods {
			if p.Name == pod {
				d := &podDebug{Name: p.Name, Metrics: cb.pods[i].Metrics, Ready: p.Ready, InFlight: p.InFlight}
				if cond(d) {
					return
				}
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s on %s", what, pod)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// stream sends a streaming chat request through the router and returns
// the serving pod, the time to the first event and the whole body.
func (se *simEnv) stream(t *testing.T, model, content string, maxTokens int) (pod string, ttft time.Duration, body string) {
	t.Helper()
	reqBody, _ := json.Marshal(map[string]any{
		"model": model, "stream": true, "max_tokens": maxTokens,
		"stream_options": map[string]bool{"include_usage": true},
		"messages":       []map[string]string{{"role": "user", "content": content}},
	})
	req, _ := http.NewRequest("POST", se.url+"/v1/chat/completions", strings.NewReader(string(reqBody)))
	req.Header.Set("Authorization", "Bearer "+testToken)
	start := time.Now()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("status %d: %s", resp.StatusCode, b)
	}
	br := bufio.NewReader(resp.Body)
	var head strings.Builder
	for {
		// TTFT is the first event with generated text, not the opening
		// role-only event.
		line, err := br.ReadString('\n')
		head.WriteString(line)
		if sse.IsToken([]byte(line)) {
			break
		}
		if err != nil {
			t.Fatalf("no token event: %v", err)
		}
	}
	ttft = time.Since(start)
	rest, _ := io.ReadAll(br)
	return resp.Header.Get("X-Infergate-Pod"), ttft, head.String() + string(rest)
}

func TestE2EAdapterAffinity(t *testing.T) {
	lora := []server.LoRAModule{{Name: "sql-lora", Path: "/adapters/sql"}, {Name: "chat-lora", Path: "/adapters/chat"}}
	se := newSimEnv(t, []simPod{
		{name: "a", gpu: "h100", cfg: server.Config{LoRAModules: lora, MaxLoras: 2, TimeScale: 1}},
		{name: "b", gpu: "h100", cfg: server.Config{LoRAModules: lora, MaxLoras: 2, TimeScale: 1}},
		{name: "c", gpu: "h100", cfg: server.Config{LoRAModules: lora, MaxLoras: 2, TimeScale: 1}},
		// This test checks that adapter state flows from the pods' metrics
		// to the scheduler, so it makes LoRA affinity decisive; how much it
		// weighs by default is the profile's business (tier1/picker).
	}, "scheduler: {scorers: [{name: lora-affinity, weight: 10}]}\n")
	// Nobody runs the adapter, a and c are busy: the adapter request goes
	// to the pod with most capacity.
	se.direct(t, "a", "llama-3.1-8b", 50, 3000)
	se.direct(t, "a", "llama-3.1-8b", 50, 3000)
	se.direct(t, "c", "llama-3.1-8b", 50, 3000)
	se.waitPod(t, "a", "2 running", func(d *podDebug) bool { return d.Metrics.Running+d.Metrics.Waiting >= 2 })
	se.waitPod(t, "c", "1 running", func(d *podDebug) bool { return d.Metrics.Running >= 1 })
	res := se.do(t, "POST", "/v1/chat/completions", `{"model":"sql-lora","max_tokens":4,"messages":[{"role":"user","content":"first"}]}`, nil)
	if res.status != 200 || res.header.Get("X-Infergate-Pod") != "b" {
		t.Fatalf("adapter with none loaded: %d on %q, want b (least loaded)", res.status, res.header.Get("X-Infergate-Pod"))
	}

	// Now c runs another adapter; with equal load elsewhere (b gets base
	// requests too), its requests follow it to c. (b keeps sql-lora
	// resident after serving it, which vLLM's lora_adapter_loaded reports
	// and the scheduler counts as loaded, so this half uses chat-lora.)
	se.direct(t, "c", "chat-lora", 50, 3000)
	se.direct(t, "b", "llama-3.1-8b", 50, 3000)
	se.direct(t, "b", "llama-3.1-8b", 50, 3000)
	se.waitPod(t, "c", "adapter running", func(d *podDebug) bool {
		for _, a := range d.Metrics.ActiveAdapters {
			if a == "chat-lora" {
				return true
			}
		}
		return false
	})
	se.waitPod(t, "b", "2 running", func(d *podDebug) bool { return d.Metrics.Running >= 2 })
	for i := 0; i < 4; i++ {
		res := se.do(t, "POST", "/v1/chat/completions", fmt.Sprintf(`{"model":"chat-lora","max_tokens":4,"messages":[{"role":"user","content":"q%d"}]}`, i), nil)
		if res.status != 200 || res.header.Get("X-Infergate-Pod") != "c" {
			t.Errorf("adapter request %d: %d on %q, want c (adapter active)\n%s", i, res.status, res.header.Get("X-Infergate-Pod"),
				se.do(t, "GET", "/debug/pods", "", nil).body)
		}
	}
}

func TestE2EPrefixAffinity(t *testing.T) {
	se := newSimEnv(t, []simPod{
		{name: "a", gpu: "a10g", cfg: server.Config{TimeScale: 1}},
		{name: "b", gpu: "a10g", cfg: server.Config{TimeScale: 1}},
		{name: "c", gpu: "a10g", cfg: server.Config{TimeScale: 1}},
	}, "")
	shared := words(1500, "sys") // ~ a long shared system prompt
	first, ttft1, body := se.stream(t, "llama-3.1-8b", shared+"question one", 2)
	if strings.Contains(body, `"cached_tokens":`) && !strings.Contains(body, `"cached_tokens":0`) {
		t.Logf("first request already cached: %s", lastLine(body))
	}
	var ttfts []time.Duration
	for i := 0; i < 3; i++ {
		pod, ttft, body := se.stream(t, "llama-3.1-8b", shared+fmt.Sprintf("question %d", i+2), 2)
		if pod != first {
			t.Errorf("repeat %d went to %s, the prefix is cached on %s", i, pod, first)
		}
		if !strings.Contains(body, `"cached_tokens":`) || strings.Contains(body, `"cached_tokens":0`) {
			t.Errorf("repeat %d: no cached tokens reported: %s", i, lastLine(body))
		}
		ttfts = append(ttfts, ttft)
	}
	for i, ttft := range ttfts {
		if ttft >= ttft1 {
			t.Errorf("repeat %d TTFT %v not shorter than the cold request's %v", i, ttft, ttft1)
		}
	}
	t.Logf("cold TTFT %v, warm %v", ttft1, ttfts)
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		if strings.Contains(lines[i], "usage") {
			return lines[i]
		}
	}
	return ""
}

func TestE2EAvoidsQueuedAndFullPods(t *testing.T) {
	se := newSimEnv(t, []simPod{
		// a: two sequence slots, so direct requests queue up.
		{name: "a", gpu: "h100", cfg: server.Config{MaxNumSeqs: 2, TimeScale: 0.2}},
		// b: a tiny KV cache, filled by one long request.
		{name: "b", gpu: "h100", cfg: server.Config{TimeScale: 1, Tune: func(c *engine.Config) { c.NumBlocks = 100 }}},
		{name: "c", gpu: "h100", cfg: server.Config{TimeScale: 0.2}},
	}, "")
	for i := 0; i < 6; i++ {
		se.direct(t, "a", "llama-3.1-8b", 20, 3000)
	}
	se.direct(t, "b", "llama-3.1-8b", 600, 380) // ~1200 of 1600 KV tokens, growing
	se.waitPod(t, "a", "queue", func(d *podDebug) bool { return d.Metrics.Waiting >= 3 })
	se.waitPod(t, "b", "full KV", func(d *podDebug) bool { return d.Metrics.KVUsage >= 0.8 })
	for i := 0; i < 6; i++ {
		res := se.do(t, "POST", "/v1/chat/completions", fmt.Sprintf(`{"model":"llama-3.1-8b","max_tokens":4,"messages":[{"role":"user","content":"hello %d"}]}`, i), nil)
		if res.status != 200 || res.header.Get("X-Infergate-Pod") != "c" {
			t.Errorf("request %d: %d on %q, want c", i, res.status, res.header.Get("X-Infergate-Pod"))
		}
	}
}

// A pod whose KV cache is full loses a request it holds the prefix of
// (predicted-latency's memory-bound wait, kv_full): vLLM would make the
// request wait there for running requests to finish. With kv_full 0 the
// same request follows its prefix onto the full pod, so the check is what
// moves it. Two simulated H100 pods with 100-block (1,600-token) caches;
// the one holding the prefix is filled by requests sent to it directly.
func TestE2EMemoryBoundPodLosesItsCache(t *testing.T) {
	for _, tc := range []struct {
		name, extra string
		wantHolder  bool
	}{
		{"default", "", false},
		{"kv_full off", "scheduler: {scorers: [{name: predicted-latency, weight: 5, kv_full: 0}]}\n", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tiny := func(c *engine.Config) { c.NumBlocks = 100 }
			se := newSimEnv(t, []simPod{
				{name: "a", gpu: "h100", cfg: server.Config{TimeScale: 1, Tune: tiny}},
				{name: "b", gpu: "h100", cfg: server.Config{TimeScale: 1, Tune: tiny}},
			}, tc.extra)
			prefix := words(150, "shared")
			first := se.do(t, "POST", "/v1/completions", fmt.Sprintf(`{"model":"llama-3.1-8b","max_tokens":2,"prompt":%q}`, prefix+"one"), nil)
			holder := first.header.Get("X-Infergate-Pod")
			if first.status != 200 || holder == "" {
				t.Fatalf("first request: %d on %q: %s", first.status, holder, first.body)
			}
			other := map[string]string{"a": "b", "b": "a"}[holder]
			// Two ~600-token prompts decoding 600 tokens each: more than
			// the 1,600 tokens of KV, so the holder stays full (preempting)
			// for seconds.
			se.direct(t, holder, "llama-3.1-8b", 380, 600)
			se.direct(t, holder, "llama-3.1-8b", 380, 600)
			se.waitPod(t, holder, "KV at 95%", func(d *podDebug) bool { return d.Metrics.KVUsage >= 0.95 })
			res := se.do(t, "POST", "/v1/completions", fmt.Sprintf(`{"model":"llama-3.1-8b","max_tokens":2,"prompt":%q}`, prefix+"two"), nil)
			want := other
			if tc.wantHolder {
				want = holder
			}
			if got := res.header.Get("X-Infergate-Pod"); res.status != 200 || got != want {
				t.Errorf("prefix holder %s at >= 95%% KV: request went to %q (status %d), want %s", holder, got, res.status, want)
			}
		})
	}
}

func TestE2ESlowGPUGetsLessTraffic(t *testing.T) {
	se := newSimEnv(t, []simPod{
		{name: "fast", gpu: "h100", cfg: server.Config{TimeScale: 0.5}},
		{name: "slow", gpu: "a10g", cfg: server.Config{TimeScale: 0.5}},
	}, "")
	var mu sync.Mutex
	count := map[string]int{}
	var wg sync.WaitGroup
	sem := make(chan struct{}, 8)
	for i := 0; i < 48; i++ {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			body := fmt.Sprintf(`{"model":"llama-3.1-8b","max_tokens":32,"prompt":%q}`, words(400, fmt.Sprint("r", i)))
			res := se.do(t, "POST", "/v1/completions", body, nil)
			if res.status != 200 {
				t.Errorf("status %d", res.status)
				return
			}
			mu.Lock()
			count[res.header.Get("X-Infergate-Pod")]++
			mu.Unlock()
		}()
	}
	wg.Wait()
	t.Logf("requests per pod: %v", count)
	if count["fast"] <= count["slow"] {
		t.Errorf("fast GPU got %d requests, slow got %d; want fast > slow", count["fast"], count["slow"])
	}
}

func TestE2EPodDiesRetried(t *testing.T) {
	se := newSimEnv(t, []simPod{
		{name: "a", gpu: "h100", cfg: server.Config{TimeScale: 0.1}},
		{name: "b", gpu: "h100", cfg: server.Config{TimeScale: 0.1}},
	}, "")
	// a dies; requests sent right away must all succeed on b.
	se.sims["a"].close()
	for i := 0; i < 5; i++ {
		res := se.do(t, "POST", "/v1/chat/completions", chatBody("llama-3.1-8b", fmt.Sprint("q", i)), nil)
		if res.status != 200 || res.header.Get("X-Infergate-Pod") != "b" {
			t.Errorf("request %d: %d on %q: %s", i, res.status, res.header.Get("X-Infergate-Pod"), res.body)
		}
	}
}

func TestE2EStreamRelayedIncrementally(t *testing.T) {
	se := newSimEnv(t, []simPod{{name: "a", gpu: "a10g", cfg: server.Config{TimeScale: 1}}}, "")
	reqBody := `{"model":"llama-3.1-8b","stream":true,"max_tokens":40,"messages":[{"role":"user","content":"tell me"}]}`
	req, _ := http.NewRequest("POST", se.url+"/v1/chat/completions", strings.NewReader(reqBody))
	req.Header.Set("Authorization", "Bearer "+testToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	var events int
	var firstAt, lastAt time.Time
	for {
		line, err := br.ReadString('\n')
		if strings.HasPrefix(line, "data: ") {
			events++
			if firstAt.IsZero() {
				firstAt = time.Now()
			}
			lastAt = time.Now()
		}
		if err != nil {
			break
		}
	}
	if events < 10 {
		t.Fatalf("only %d events", events)
	}
	// 40 tokens on an A10G take ~1s of decode: relayed as produced, the
	// first event arrives well before the last.
	if gap := lastAt.Sub(firstAt); gap < 200*time.Millisecond {
		t.Errorf("events arrived within %v: the stream was buffered", gap)
	}
}

// Engines are detected from real simulated /metrics pages, and a TGI pod's
// missing KV usage is reported where an operator looks.
func TestE2EEngineDetectionAndMissingMetrics(t *testing.T) {
	se := newSimEnv(t, []simPod{
		{name: "legacy", gpu: "a10g", cfg: server.Config{Flavor: server.FlavorVLLMLegacy, TimeScale: 0.1}},
		{name: "sglang", gpu: "l4", cfg: server.Config{Flavor: server.FlavorSGLang, TimeScale: 0.1}},
		{name: "tgi", gpu: "l4", cfg: server.Config{Flavor: server.FlavorTGI, TimeScale: 0.1}},
	}, "")
	res := se.do(t, "GET", "/debug/pods", "", nil)
	var d struct {
		Pods []podDebug `json:"pods"`
	}
	if err := json.Unmarshal([]byte(res.body), &d); err != nil {
		t.Fatal(err)
	}
	want := map[string]struct {
		engine  string
		hasKV   bool
		missing string
	}{
		"legacy": {"vllm-legacy", true, ""},
		"sglang": {"sglang", true, ""},
		"tgi":    {"tgi", false, "kv_cache_usage"},
	}
	for _, p := range d.Pods {
		w := want[p.Name]
		if p.Engine != w.engine || p.Metrics.HasKV != w.hasKV || strings.Join(p.Metrics.Missing, ",") != w.missing || !p.Ready {
			t.Errorf("%s: engine %q hasKV %v missing %q ready %v; want %+v", p.Name, p.Engine, p.Metrics.HasKV, p.Metrics.Missing, p.Ready, w)
		}
	}
	if v := gaugeSeries(t, se.gw, "infergate_tier1_scorer_input_missing"); v != 1 {
		t.Errorf("infergate_tier1_scorer_input_missing series = %d, want 1 (tgi kv)", v)
	}
	// All three serve traffic.
	for i := 0; i < 3; i++ {
		if r := se.do(t, "POST", "/v1/completions", fmt.Sprintf(`{"model":"llama-3.1-8b","max_tokens":2,"prompt":"p%d"}`, i), nil); r.status != 200 {
			t.Errorf("status %d %s", r.status, r.body)
		}
	}
}

// Pods of one hardware class (GPU × GPUs per pod) report the prefill speed
// the scheduler uses for them: their learned speeds pooled halfway to the
// class mean (the default speed_pooling). Two simulated H100 pods learn
// from real first tokens; a third of another class keeps its own.
func TestE2EPooledPrefillSpeeds(t *testing.T) {
	se := newSimEnv(t, []simPod{
		{name: "h100-a", gpu: "h100", gpus: 1, cfg: server.Config{TimeScale: 0.05}},
		{name: "h100-b", gpu: "h100", gpus: 1, cfg: server.Config{TimeScale: 0.05}},
		{name: "h100-tp2", gpu: "h100", gpus: 2, cfg: server.Config{TimeScale: 0.05}},
	}, "")
	type pod struct {
		Name      string  `json:"name"`
		GPUs      int     `json:"gpus"`
		Learned   float64 `json:"prefill_tokens_per_sec"`
		Scheduled float64 `json:"scheduling_prefill_tokens_per_sec"`
	}
	var pods map[string]pod
	deadline := time.Now().Add(20 * time.Second)
	for i := 0; ; i++ {
		// Prompts of a few hundred tokens, so that samples count.
		prompt := strings.Repeat(fmt.Sprintf("word%d ", i), 200+10*(i%7))
		if r := se.do(t, "POST", "/v1/completions", fmt.Sprintf(`{"model":"llama-3.1-8b","max_tokens":2,"prompt":%q}`, prompt), nil); r.status != 200 {
			t.Fatalf("status %d %s", r.status, r.body)
		}
		var d struct {
			Pods []pod `json:"pods"`
		}
		if err := json.Unmarshal([]byte(se.do(t, "GET", "/debug/pods", "", nil).body), &d); err != nil {
			t.Fatal(err)
		}
		pods = map[string]pod{}
		learned := 0
		for _, p := range d.Pods {
			pods[p.Name] = p
			if p.Learned > 0 {
				learned++
			}
		}
		if learned == 3 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %d requests not every pod has learned a speed: %+v", i+1, pods)
		}
	}
	a, b, c := pods["h100-a"], pods["h100-b"], pods["h100-tp2"]
	mean := (a.Learned + b.Learned) / 2
	for _, p := range []pod{a, b} {
		if want := 0.5*p.Learned + 0.5*mean; math.Abs(p.Scheduled-want) > 1e-6*want {
			t.Errorf("%s: scheduled at %v tokens/s, want %v (learned %v, class mean %v)", p.Name, p.Scheduled, want, p.Learned, mean)
		}
	}
	if c.GPUs != 2 || c.Scheduled != c.Learned {
		t.Errorf("h100-tp2 (its own class): %+v, want its learned speed", c)
	}
}

func gaugeSeries(t *testing.T, g *Gateway, name string) int {
	t.Helper()
	fams, err := g.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() == name {
			return len(f.GetMetric())
		}
	}
	return 0
}
