package server

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/infergate/infergate/sim/engine"
)

func chatBody(model, content string, maxTokens int, stream bool) map[string]any {
	b := map[string]any{
		"model":    model,
		"messages": []map[string]any{{"role": "user", "content": content}},
	}
	if maxTokens > 0 {
		b["max_tokens"] = maxTokens
	}
	if stream {
		b["stream"] = true
		b["stream_options"] = map[string]any{"include_usage": true}
	}
	return b
}

func TestBadInput(t *testing.T) {
	p := startPod(t, Config{
		ServedModelName: "m",
		MaxBodyBytes:    64 << 10,
		Tune:            func(c *engine.Config) { c.NumBlocks = 200 }, // max_model_len 3200
	})
	big := `{"model":"m","messages":[{"role":"user","content":"` + strings.Repeat("x", 100<<10) + `"}]}`
	tooLong := chatBody("m", longText("a", 4000), 0, false)
	tests := []struct {
		name   string
		path   string
		body   any
		status int
		code   string
	}{
		{"malformed JSON", "/v1/chat/completions", `{"model": "m", "messages": [`, 400, "invalid_json"},
		{"not an object", "/v1/chat/completions", `[1,2]`, 400, "invalid_json"},
		{"trailing data", "/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"hi"}]} {}`, 400, "invalid_json"},
		{"empty body", "/v1/chat/completions", ``, 400, "invalid_json"},
		{"missing model", "/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}]}`, 400, "missing_model"},
		{"missing messages", "/v1/chat/completions", `{"model":"m"}`, 400, "missing_messages"},
		{"null messages", "/v1/chat/completions", `{"model":"m","messages":null}`, 400, "missing_messages"},
		{"empty messages", "/v1/chat/completions", `{"model":"m","messages":[]}`, 400, "invalid_value"},
		{"messages not array", "/v1/chat/completions", `{"model":"m","messages":"hi"}`, 400, "invalid_value"},
		{"message without role", "/v1/chat/completions", `{"model":"m","messages":[{"content":"hi"}]}`, 400, "invalid_value"},
		{"bad content", "/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":5}]}`, 400, "invalid_value"},
		{"missing prompt", "/v1/completions", `{"model":"m"}`, 400, "missing_prompt"},
		{"empty prompt", "/v1/completions", `{"model":"m","prompt":""}`, 400, "invalid_value"},
		{"two prompts", "/v1/completions", `{"model":"m","prompt":["a","b"]}`, 400, "invalid_value"},
		{"unknown model", "/v1/chat/completions", chatBody("other", "hi", 0, false), 404, "model_not_found"},
		{"unknown model completions", "/v1/completions", `{"model":"other","prompt":"hi"}`, 404, "model_not_found"},
		{"oversized body", "/v1/chat/completions", big, 413, "request_too_large"},
		{"prompt too long", "/v1/chat/completions", tooLong, 400, "context_length_exceeded"},
		{"max_tokens too large", "/v1/completions", `{"model":"m","prompt":"hi","max_tokens":5000}`, 400, "context_length_exceeded"},
		{"max_tokens zero", "/v1/completions", `{"model":"m","prompt":"hi","max_tokens":0}`, 400, "invalid_value"},
		{"max_completion_tokens negative", "/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"hi"}],"max_completion_tokens":-1}`, 400, "invalid_value"},
		{"stream_options without stream", "/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"hi"}],"stream_options":{"include_usage":true}}`, 400, "invalid_value"},
		{"n > 1", "/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"hi"}],"n":2}`, 400, "invalid_value"},
		{"unknown route", "/v1/audio/speech", `{}`, 404, "not_found"},
		{"load lora missing path", "/v1/load_lora_adapter", `{"lora_name":"x"}`, 400, "invalid_value"},
		{"load lora malformed", "/v1/load_lora_adapter", `{"lora_name":`, 400, "invalid_json"},
		{"unload unknown lora", "/v1/unload_lora_adapter", `{"lora_name":"x"}`, 404, "adapter_not_found"},
		{"unload lora missing name", "/v1/unload_lora_adapter", `{}`, 400, "invalid_value"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			status, body := postJSON(t, p.URL+tt.path, tt.body)
			if status != tt.status {
				t.Fatalf("status = %d, want %d; body %s", status, tt.status, body)
			}
			var eb errorBody
			if err := json.Unmarshal(body, &eb); err != nil {
				t.Fatalf("body is not JSON: %v: %s", err, body)
			}
			if eb.Error.Message == "" || eb.Error.Type == "" || eb.Error.Code != tt.code {
				t.Fatalf("error = %+v, want code %q", eb.Error, tt.code)
			}
		})
	}
	// The pod still serves after all that.
	if status, body := postJSON(t, p.URL+"/v1/chat/completions", chatBody("m", "hi", 2, false)); status != 200 {
		t.Fatalf("status %d: %s", status, body)
	}
	resp, err := http.Get(p.URL + "/health")
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("health: %v %v", err, resp)
	}
	resp.Body.Close()
}

// TestQueueAndRunningRise checks the scheduler gauges under concurrent load.
func TestQueueAndRunningRise(t *testing.T) {
	p := startPod(t, Config{ServedModelName: "m", MaxNumSeqs: 2, TimeScale: 0.05})
	var wg sync.WaitGroup
	for i := range 6 {
		wg.Go(func() {
			status, body := postJSON(t, p.URL+"/v1/completions",
				map[string]any{"model": "m", "prompt": longText(string(rune('a'+i)), 50), "max_tokens": 1000})
			if status != 200 {
				t.Errorf("status %d: %s", status, body)
			}
		})
	}
	eventually(t, "2 running and some waiting", func() bool {
		f := scrape(t, p)
		return value(f, "vllm:num_requests_running") == 2 && value(f, "vllm:num_requests_waiting") >= 1
	})
	wg.Wait()
	f := scrape(t, p)
	if r, w := value(f, "vllm:num_requests_running"), value(f, "vllm:num_requests_waiting"); r != 0 || w != 0 {
		t.Fatalf("after the load: running %v waiting %v, want 0 0", r, w)
	}
	if got := value(f, "vllm:generation_tokens_total"); got != 6000 {
		t.Errorf("generation_tokens_total = %v, want 6000", got)
	}
}

// TestKVUsageRisesAndFalls checks KV usage with a long prompt in flight.
func TestKVUsageRisesAndFalls(t *testing.T) {
	p := startPod(t, Config{ServedModelName: "m", TimeScale: 0.05,
		Tune: func(c *engine.Config) { c.NumBlocks = 1000 }})
	if got := value(scrape(t, p), "vllm:kv_cache_usage_perc"); got != 0 {
		t.Fatalf("idle KV usage = %v", got)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		status, body := postJSON(t, p.URL+"/v1/completions",
			map[string]any{"model": "m", "prompt": longText("kv", 8000), "max_tokens": 1000})
		if status != 200 {
			t.Errorf("status %d: %s", status, body)
		}
	}()
	eventually(t, "KV usage above 40%", func() bool {
		return value(scrape(t, p), "vllm:kv_cache_usage_perc") > 0.4
	})
	<-done
	if got := value(scrape(t, p), "vllm:kv_cache_usage_perc"); got != 0 {
		t.Fatalf("KV usage after the request = %v, want 0", got)
	}
}

// ttftOf sends one request and returns its simulated TTFT, read from the
// TTFT histogram's sum, plus the response's cached token count.
func ttftOf(t *testing.T, p *Pod, hist, model, prompt string) (ttft float64, cached int) {
	t.Helper()
	before := scrape(t, p)
	status, body := postJSON(t, p.URL+"/v1/completions", map[string]any{"model": model, "prompt": prompt, "max_tokens": 1})
	if status != 200 {
		t.Fatalf("status %d: %s", status, body)
	}
	var resp struct {
		Usage usage `json:"usage"`
	}
	if err := json.Unmarshal(body, &resp); err != nil {
		t.Fatal(err)
	}
	after := scrape(t, p)
	if histCount(after, hist)-histCount(before, hist) != 1 {
		t.Fatalf("%s count did not grow by one", hist)
	}
	if resp.Usage.PromptTokensDetails != nil {
		cached = resp.Usage.PromptTokensDetails.CachedTokens
	}
	return value(after, hist) - value(before, hist), cached
}

func TestPrefixCacheHitShortensTTFT(t *testing.T) {
	p := startPod(t, Config{ServedModelName: "m", GPU: "a10g"})
	prompt := longText("shared", 3000)
	cold, cached1 := ttftOf(t, p, "vllm:time_to_first_token_seconds", "m", prompt)
	before := scrape(t, p)
	warm, cached2 := ttftOf(t, p, "vllm:time_to_first_token_seconds", "m", prompt)
	after := scrape(t, p)
	if cached1 != 0 || cached2 < 2900 {
		t.Errorf("cached tokens: first %d, second %d; want 0 then most of the prompt", cached1, cached2)
	}
	if !(warm < cold) {
		t.Errorf("TTFT with a prefix hit %.4fs, without %.4fs: want shorter", warm, cold)
	}
	hits := value(after, "vllm:prefix_cache_hits_total") - value(before, "vllm:prefix_cache_hits_total")
	queries := value(after, "vllm:prefix_cache_queries_total") - value(before, "vllm:prefix_cache_queries_total")
	if hits < 2900 || queries < hits {
		t.Errorf("prefix cache hits %v of %v queried tokens", hits, queries)
	}
}

func TestFasterGPUAnswersSooner(t *testing.T) {
	h100 := startPod(t, Config{ServedModelName: "m", GPU: "h100"})
	a10g := startPod(t, Config{ServedModelName: "m", GPU: "a10g"})
	prompt := longText("gpu", 4000)
	fast, _ := ttftOf(t, h100, "vllm:time_to_first_token_seconds", "m", prompt)
	slow, _ := ttftOf(t, a10g, "vllm:time_to_first_token_seconds", "m", prompt)
	if !(fast < slow) {
		t.Fatalf("H100 TTFT %.4fs, A10G %.4fs: want H100 sooner", fast, slow)
	}
}

func TestAdapterLoadsOnDemand(t *testing.T) {
	p := startPod(t, Config{ServedModelName: "m", MaxLoras: 1,
		LoRAModules: []LoRAModule{{Name: "a", Path: "/a"}, {Name: "b"}}})
	const hist = "vllm:time_to_first_token_seconds"
	if st := p.Stats(); len(st.LoadedAdapters) != 0 || st.LoraLoads != 0 {
		t.Fatalf("adapters resident before use: %+v", st.LoadedAdapters)
	}
	cold, _ := ttftOf(t, p, hist, "a", "first prompt for a")
	st := p.Stats()
	if !slices.Equal(st.LoadedAdapters, []string{"a"}) || st.LoraLoads != 1 {
		t.Fatalf("after a request for a: loaded %v, loads %d", st.LoadedAdapters, st.LoraLoads)
	}
	warm, _ := ttftOf(t, p, hist, "a", "another prompt for a")
	if !(warm < cold) || cold < engine.DefaultLoRALoadTime.Seconds() {
		t.Errorf("TTFT cold %.4fs warm %.4fs: want the cold one to include the %v load", cold, warm, engine.DefaultLoRALoadTime)
	}
	// One slot: b evicts a.
	ttftOf(t, p, hist, "b", "prompt for b")
	if st := p.Stats(); !slices.Equal(st.LoadedAdapters, []string{"b"}) || st.LoraLoads != 2 {
		t.Fatalf("after b: loaded %v, loads %d", st.LoadedAdapters, st.LoraLoads)
	}
	f := scrape(t, p)
	lora, ok := f["vllm:lora_requests_info"]
	if !ok || len(lora.Metric) == 0 {
		t.Fatal("vllm:lora_requests_info missing")
	}
	for _, m := range lora.Metric {
		labels := map[string]string{}
		for _, l := range m.Label {
			labels[l.GetName()] = l.GetValue()
		}
		if labels["max_lora"] != "1" || m.Gauge.GetValue() < 1e9 {
			t.Errorf("lora_requests_info series %v = %v, want max_lora 1 and a timestamp", labels, m.Gauge.GetValue())
		}
	}
}

func TestLoRAEndpoints(t *testing.T) {
	p := startPod(t, Config{ServedModelName: "m"})
	chat := func(model string) int {
		status, _ := postJSON(t, p.URL+"/v1/chat/completions", chatBody(model, "hi", 2, false))
		return status
	}
	if s := chat("c"); s != 404 {
		t.Fatalf("unregistered adapter: status %d", s)
	}
	status, body := postJSON(t, p.URL+"/v1/load_lora_adapter", `{"lora_name":"c","lora_path":"/loras/c"}`)
	if status != 200 || !strings.Contains(string(body), "Success") {
		t.Fatalf("load: %d %s", status, body)
	}
	if status, _ := postJSON(t, p.URL+"/v1/load_lora_adapter", `{"lora_name":"c","lora_path":"/loras/c"}`); status != 400 {
		t.Fatalf("second load: status %d, want 400", status)
	}
	resp, err := http.Get(p.URL + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	var ml modelList
	if err := json.NewDecoder(resp.Body).Decode(&ml); err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if len(ml.Data) != 2 || ml.Data[1].ID != "c" || ml.Data[1].Parent == nil || *ml.Data[1].Parent != "m" || ml.Data[1].Root != "/loras/c" {
		t.Fatalf("models = %+v", ml.Data)
	}
	if s := chat("c"); s != 200 {
		t.Fatalf("loaded adapter: status %d", s)
	}
	if status, body := postJSON(t, p.URL+"/v1/unload_lora_adapter", `{"lora_name":"c"}`); status != 200 {
		t.Fatalf("unload: %d %s", status, body)
	}
	if s := chat("c"); s != 404 {
		t.Fatalf("unloaded adapter: status %d", s)
	}
}

// TestFlavorMetricNames checks each --engine exports its own names and
// none of the others'.
func TestFlavorMetricNames(t *testing.T) {
	tests := []struct {
		flavor Flavor
		prefix string
		want   []string
		absent []string
	}{
		{FlavorVLLM, "vllm:", []string{
			"vllm:num_requests_waiting", "vllm:num_requests_running", "vllm:kv_cache_usage_perc",
			"vllm:lora_requests_info", "vllm:cache_config_info", "vllm:prefix_cache_queries_total",
			"vllm:prefix_cache_hits_total", "vllm:time_to_first_token_seconds", "vllm:inter_token_latency_seconds",
			"vllm:e2e_request_latency_seconds", "vllm:prompt_tokens_total", "vllm:generation_tokens_total",
			"vllm:request_success_total", "vllm:num_preemptions_total",
			"vllm:lora_adapter_loaded", "vllm:num_gpu_loaded_lora_adapters", "vllm:num_cpu_loaded_lora_adapters",
		}, []string{"vllm:gpu_cache_usage_perc", "vllm:gpu_prefix_cache_hits_total", "vllm:time_per_output_token_seconds"}},
		{FlavorVLLMLegacy, "vllm:", []string{
			"vllm:num_requests_waiting", "vllm:num_requests_running", "vllm:gpu_cache_usage_perc",
			"vllm:gpu_prefix_cache_queries_total", "vllm:gpu_prefix_cache_hits_total", "vllm:cache_config_info",
			"vllm:time_to_first_token_seconds", "vllm:time_per_output_token_seconds", "vllm:lora_requests_info",
		}, []string{"vllm:kv_cache_usage_perc", "vllm:prefix_cache_hits_total", "vllm:inter_token_latency_seconds", "vllm:lora_adapter_loaded"}},
		{FlavorSGLang, "sglang:", []string{
			"sglang:num_queue_reqs", "sglang:num_running_reqs", "sglang:token_usage", "sglang:cache_hit_rate",
			"sglang:page_size", "sglang:num_pages", "sglang:num_used_tokens", "sglang:max_total_num_tokens",
			"sglang:prompt_tokens_total", "sglang:generation_tokens_total", "sglang:cached_tokens_total",
			"sglang:num_requests_total", "sglang:time_to_first_token_seconds", "sglang:inter_token_latency_seconds",
			"sglang:e2e_request_latency_seconds",
		}, []string{"sglang:cache_config_info"}},
		{FlavorTGI, "tgi_", []string{
			"tgi_queue_size", "tgi_batch_current_size", "tgi_batch_current_max_tokens", "tgi_request_count",
			"tgi_request_success", "tgi_request_duration", "tgi_request_mean_time_per_token_duration",
			"tgi_request_input_length", "tgi_request_generated_tokens",
		}, nil},
		{FlavorTRTLLM, "trtllm_", []string{
			"trtllm_num_requests_waiting", "trtllm_num_requests_running", "trtllm_kv_cache_utilization",
			"trtllm_kv_cache_max_blocks", "trtllm_kv_cache_tokens_per_block", "trtllm_kv_cache_used_blocks",
			"trtllm_time_to_first_token_seconds", "trtllm_time_per_output_token_seconds", "trtllm_e2e_request_latency_seconds",
			"trtllm_request_success_total", "trtllm_prompt_tokens_total", "trtllm_generation_tokens_total",
		}, nil},
		{FlavorDynamo, "dynamo_", []string{
			"dynamo_frontend_queued_requests", "dynamo_frontend_inflight_requests", "dynamo_frontend_model_kv_cache_block_size",
			"dynamo_frontend_model_total_kv_blocks", "dynamo_frontend_time_to_first_token_seconds",
			"dynamo_frontend_inter_token_latency_seconds", "dynamo_frontend_request_duration_seconds",
		}, nil},
	}
	for _, tt := range tests {
		t.Run(string(tt.flavor), func(t *testing.T) {
			p := startPod(t, Config{ServedModelName: "m", Flavor: tt.flavor, LoRAModules: []LoRAModule{{Name: "a"}}})
			// Two tokens, so the inter-token histograms see a sample.
			if status, body := postJSON(t, p.URL+"/v1/chat/completions", chatBody("m", "hello there", 3, false)); status != 200 {
				t.Fatalf("status %d: %s", status, body)
			}
			// And one on the adapter, which then sits in a GPU slot.
			if status, body := postJSON(t, p.URL+"/v1/chat/completions", chatBody("a", "hello there", 2, false)); status != 200 {
				t.Fatalf("adapter: status %d: %s", status, body)
			}
			f := scrape(t, p)
			for _, name := range tt.want {
				if _, ok := f[name]; !ok {
					t.Errorf("missing %s", name)
				}
			}
			for _, name := range tt.absent {
				if _, ok := f[name]; ok {
					t.Errorf("unexpected %s", name)
				}
			}
			for name := range f {
				if !strings.HasPrefix(name, tt.prefix) {
					t.Errorf("%s exports %s, which is not its engine's", tt.flavor, name)
				}
			}
			if tt.flavor != FlavorTGI && tt.flavor != FlavorTRTLLM && tt.flavor != FlavorDynamo {
				// model_name carries the served name, as the engines do
				// (trtllm-serve says "undefined"; Dynamo's label is model).
				running := f[tt.want[1]]
				found := false
				for _, l := range running.Metric[0].Label {
					found = found || (l.GetName() == "model_name" && l.GetValue() == "m")
				}
				if !found {
					t.Errorf("%s lacks model_name=\"m\": %v", tt.want[1], running.Metric[0].Label)
				}
			}
		})
	}
}

// streamEvents posts a streaming request and returns its SSE data
// payloads, checking the framing as it goes.
func streamEvents(t *testing.T, url string, body any) []string {
	t.Helper()
	enc, _ := json.Marshal(body)
	resp, err := http.Post(url, "application/json", strings.NewReader(string(enc)))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "text/event-stream" {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("status %d content-type %q: %s", resp.StatusCode, resp.Header.Get("Content-Type"), b)
	}
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	text := string(raw)
	if !strings.HasSuffix(text, "data: [DONE]\n\n") {
		t.Fatalf("stream does not end with [DONE]: %q", text[max(0, len(text)-80):])
	}
	var out []string
	for _, ev := range strings.Split(strings.TrimSuffix(text, "\n\n"), "\n\n") {
		payload, ok := strings.CutPrefix(ev, "data: ")
		if !ok || strings.Contains(payload, "\n") {
			t.Fatalf("malformed event %q", ev)
		}
		out = append(out, payload)
	}
	return out
}

func TestStreamShape(t *testing.T) {
	p := startPod(t, Config{ServedModelName: "m"})
	t.Run("chat", func(t *testing.T) {
		evs := streamEvents(t, p.URL+"/v1/chat/completions", chatBody("m", "hi", 5, true))
		if len(evs) != 1+5+1+1+1 { // role, tokens, finish, usage, [DONE]
			t.Fatalf("%d events: %q", len(evs), evs)
		}
		var chunks []chatChunk
		for _, e := range evs[:len(evs)-1] {
			var c chatChunk
			if err := json.Unmarshal([]byte(e), &c); err != nil {
				t.Fatalf("%v: %s", err, e)
			}
			if c.Object != "chat.completion.chunk" || c.ID != evs0ID(t, evs[0]) || c.Model != "m" {
				t.Fatalf("bad chunk %s", e)
			}
			chunks = append(chunks, c)
		}
		if chunks[0].Choices[0].Delta.Role != "assistant" {
			t.Errorf("first chunk %s: want the assistant role", evs[0])
		}
		for _, c := range chunks[1:6] {
			if c.Choices[0].Delta.Content == nil || *c.Choices[0].Delta.Content == "" || c.Choices[0].FinishReason != nil {
				t.Errorf("token chunk %+v", c)
			}
		}
		fin := chunks[6].Choices[0]
		if fin.FinishReason == nil || *fin.FinishReason != "length" || fin.Delta.Content != nil {
			t.Errorf("finish chunk %s", evs[6])
		}
		if !strings.Contains(evs[7], `"choices":[]`) || chunks[7].Usage == nil || chunks[7].Usage.CompletionTokens != 5 {
			t.Errorf("usage chunk %s", evs[7])
		}
	})
	t.Run("completion without usage", func(t *testing.T) {
		evs := streamEvents(t, p.URL+"/v1/completions", map[string]any{"model": "m", "prompt": "hi", "max_tokens": 4, "stream": true})
		if len(evs) != 4+1+1 { // tokens, finish, [DONE]
			t.Fatalf("%d events: %q", len(evs), evs)
		}
		var fin textCompletion
		if err := json.Unmarshal([]byte(evs[4]), &fin); err != nil || fin.Object != "text_completion" ||
			fin.Choices[0].FinishReason == nil || *fin.Choices[0].FinishReason != "length" {
			t.Errorf("finish chunk %s (%v)", evs[4], err)
		}
	})
}

func evs0ID(t *testing.T, first string) string {
	t.Helper()
	var c chatChunk
	if err := json.Unmarshal([]byte(first), &c); err != nil {
		t.Fatal(err)
	}
	return c.ID
}

// TestDisconnectFreesSlot: a client that goes away must not keep its seat.
func TestDisconnectFreesSlot(t *testing.T) {
	for _, stream := range []bool{true, false} {
		name := map[bool]string{true: "stream", false: "non-stream"}[stream]
		t.Run(name, func(t *testing.T) {
			p := startPod(t, Config{ServedModelName: "m", MaxNumSeqs: 1, TimeScale: 0.5})
			ctx, cancel := context.WithCancel(context.Background())
			enc, _ := json.Marshal(chatBody("m", "a long answer please", 20000, stream))
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, p.URL+"/v1/chat/completions", strings.NewReader(string(enc)))
			errc := make(chan error, 1)
			go func() {
				resp, err := http.DefaultClient.Do(req)
				if err == nil {
					// Stay connected until the test hangs up.
					_, err = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				}
				errc <- err
			}()
			eventually(t, "the request to run", func() bool { return p.Stats().Running == 1 })
			cancel()
			eventually(t, "the slot to be freed", func() bool {
				st := p.Stats()
				return st.Running == 0 && st.Waiting == 0
			})
			if err := <-errc; err == nil {
				t.Error("the request completed; want it cut short")
			}
			// The seat is usable again.
			if status, body := postJSON(t, p.URL+"/v1/chat/completions", chatBody("m", "hi", 2, false)); status != 200 {
				t.Fatalf("status %d: %s", status, body)
			}
		})
	}
}

// TestCloseEndsStreams: shutting a pod down ends in-flight streams.
func TestCloseEndsStreams(t *testing.T) {
	p, err := Listen(context.Background(), Config{ServedModelName: "m", TimeScale: 1, Logger: quietLogger()}, "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	enc, _ := json.Marshal(chatBody("m", "go on forever", 50000, true))
	resp, err := http.Post(p.URL+"/v1/chat/completions", "application/json", strings.NewReader(string(enc)))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	r := bufio.NewReader(resp.Body)
	if _, err := r.ReadString('\n'); err != nil {
		t.Fatal(err)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	// The body ends (EOF or reset) instead of hanging.
	_, _ = io.Copy(io.Discard, r)
}

func TestSGLangCacheHitRate(t *testing.T) {
	p := startPod(t, Config{ServedModelName: "m", Flavor: FlavorSGLang})
	prompt := longText("sg", 2000)
	ttftOf(t, p, "sglang:time_to_first_token_seconds", "m", prompt)
	if got := value(scrape(t, p), "sglang:cache_hit_rate"); got != 0 {
		t.Fatalf("hit rate after a cold prompt = %v, want 0", got)
	}
	ttftOf(t, p, "sglang:time_to_first_token_seconds", "m", prompt)
	f := scrape(t, p)
	if got := value(f, "sglang:cache_hit_rate"); got < 0.9 {
		t.Fatalf("hit rate after a repeated prompt = %v, want most tokens cached", got)
	}
	if got := value(f, "sglang:cached_tokens_total"); got < 1900 {
		t.Fatalf("cached_tokens_total = %v", got)
	}
}
