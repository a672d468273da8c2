package scrape

import (
	"bytes"
	"os"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/infergate/infergate/tier1/picker"
)

// The dialect table is consistent: every family of a dialect carries its
// prefix (or detection would name another engine), a marker is one of the
// dialect's own families, and names the parser's 8-byte lookup can hold.
func TestDialectTable(t *testing.T) {
	seen := map[string]bool{}
	for _, d := range dialects {
		if seen[d.engine] {
			t.Errorf("engine %q listed twice", d.engine)
		}
		seen[d.engine] = true
		var all []string
		for m, names := range d.families {
			if m == 0 || m&(m-1) != 0 || m&^picker.AllMetrics != 0 {
				t.Errorf("%s: key %v is not one metric", d.engine, m)
			}
			all = append(all, names...)
		}
		all = append(all, d.extraFamilies()...)
		for _, n := range all {
			if !strings.HasPrefix(n, d.prefix) || len(n) < 8 {
				t.Errorf("%s: family %q lacks prefix %q or is under 8 bytes", d.engine, n, d.prefix)
			}
			if e := engineByPrefix(n); dialectOf(e).prefix != d.prefix {
				t.Errorf("%s: family %q detects as %s", d.engine, n, e)
			}
		}
		if d.marker != "" && !strings.Contains(strings.Join(all, "\n")+"\n", d.marker+"\n") {
			t.Errorf("%s: marker %q is not one of its families", d.engine, d.marker)
		}
	}
	for _, tt := range []struct {
		engine string
		in     Input
		want   string
	}{
		{EngineVLLM, InputKV, "vllm:kv_cache_usage_perc"},
		{EngineVLLMLegacy, InputKV, "vllm:gpu_cache_usage_perc"},
		{EngineSGLang, InputWaiting, "sglang:num_queue_reqs"},
		{EngineTGI, InputKV, "kv_cache_usage"},
		{EngineSGLang, InputLoRA, "lora"},
		{EngineTRTLLM, InputKV, "trtllm_kv_cache_utilization"},
		{EngineDynamo, InputWaiting, "dynamo_frontend_queued_requests"},
		{EngineDynamo, InputLoRA, "lora"},
		{"triton", InputRunning, "running"},
	} {
		if got := MetricName(tt.engine, tt.in); got != tt.want {
			t.Errorf("MetricName(%s, %v) = %q, want %q", tt.engine, tt.in, got, tt.want)
		}
	}
	// A family breaks down under at most one label, and only a counted
	// family does.
	for name := range breakdownOf {
		if infoFamily[famIndex[name]] {
			t.Errorf("breakdown family %s is also an info family", name)
		}
	}
	for engine, want := range map[string]string{EngineVLLM: "/metrics", EngineTRTLLM: "/prometheus/metrics", "": "/metrics", "triton": "/metrics"} {
		if got := MetricsPath(engine); got != want {
			t.Errorf("MetricsPath(%q) = %q, want %q", engine, got, want)
		}
	}
}

// TestDialectFixtures reads a page of each current engine (testdata, each
// written after the engine's source, cited in its header) and checks what
// it says, detected and configured, with both parsers agreeing.
func TestDialectFixtures(t *testing.T) {
	tests := []struct {
		file, engine string
		want         picker.Metrics
		have         Input
	}{
		{
			// Totals only (priority=""), summed over two DP ranks; KV the
			// mean; page size and count from the current gauges.
			file: "sglang_metrics.txt", engine: EngineSGLang,
			want: picker.Metrics{Waiting: 3, Running: 9, KVUsage: 0.375, HasKV: true, BlockSize: 16, NumBlocks: 4096},
			have: InputWaiting | InputRunning | InputKV,
		},
		{
			file: "trtllm_metrics.txt", engine: EngineTRTLLM,
			want: picker.Metrics{Waiting: 5, Running: 12, KVUsage: 0.375, HasKV: true, BlockSize: 32, NumBlocks: 8192},
			have: InputWaiting | InputRunning | InputKV,
		},
		{
			// Ten in flight, three queued: seven running. No KV usage on
			// a frontend's page.
			file: "dynamo_frontend_metrics.txt", engine: EngineDynamo,
			want: picker.Metrics{Waiting: 3, Running: 7, BlockSize: 16, NumBlocks: 28467},
			have: InputWaiting | InputRunning,
		},
		{
			// a runs (old metric) and sits in a GPU slot; c is GPU-resident
			// and idle (new metric only); d is on the CPU only; b waits.
			file: "vllm_lora_loaded_metrics.txt", engine: EngineVLLM,
			want: picker.Metrics{Waiting: 1, Running: 2, KVUsage: 0.125, HasKV: true, BlockSize: 16, NumBlocks: 28467,
				ActiveAdapters: []string{"a", "c"}, WaitingAdapters: []string{"b"}, MaxLoras: 4, HasLoRA: true},
			have: AllInputs,
		},
	}
	for _, tt := range tests {
		t.Run(tt.file, func(t *testing.T) {
			page, err := os.ReadFile("testdata/" + tt.file)
			if err != nil {
				t.Fatal(err)
			}
			for _, e := range []string{"", tt.engine} {
				s, err := Parse(e, bytes.NewReader(page))
				if err != nil {
					t.Fatal(err)
				}
				if s.Engine != tt.engine || s.Have != tt.have || !reflect.DeepEqual(s.Metrics, tt.want) {
					t.Errorf("engine %q: parsed as %s %v %+v, want %s %v %+v", e, s.Engine, s.Have, s.Metrics, tt.engine, tt.have, tt.want)
				}
			}
			for _, e := range append([]string{""}, Engines...) {
				sameAsReference(t, e, page)
			}
		})
	}
}

// TestLoRAAdapterLoaded covers vllm:lora_adapter_loaded alone (a vLLM
// after lora_requests_info is hidden) and beside an idle info series.
func TestLoRAAdapterLoaded(t *testing.T) {
	tests := []struct {
		name, page string
		active     []string
		hasLoRA    bool
	}{
		{"new metric only", `vllm:lora_adapter_loaded{adapter_name="z",level="gpu",pinned="false"} 1` + "\n" +
			`vllm:lora_adapter_loaded{adapter_name="y",level="gpu",pinned="false"} 1` + "\n", []string{"y", "z"}, true},
		{"cpu only", `vllm:lora_adapter_loaded{adapter_name="z",level="cpu",pinned="false"} 1` + "\n", nil, true},
		{"idle info and a resident adapter", `vllm:lora_requests_info{max_lora="1",running_lora_adapters="",waiting_lora_adapters=""} 5` + "\n" +
			`vllm:lora_adapter_loaded{adapter_name="z",level="gpu",pinned="false"} 1` + "\n", []string{"z"}, true},
		{"zero value is not loaded", `vllm:lora_adapter_loaded{adapter_name="z",level="gpu",pinned="false"} 0` + "\n", nil, true},
		{"neither", "vllm:num_requests_running 1\n", nil, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := Parse(EngineVLLM, strings.NewReader(tt.page))
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(s.Metrics.ActiveAdapters, tt.active) || s.Metrics.HasLoRA != tt.hasLoRA || (s.Have&InputLoRA != 0) != tt.hasLoRA {
				t.Errorf("parsed as %+v (have %v), want active %v, HasLoRA %v", s.Metrics, s.Have, tt.active, tt.hasLoRA)
			}
			sameAsReference(t, EngineVLLM, []byte(tt.page))
		})
	}
}

// TestLoRAAdapterLoadedSharesPrevious: given the last scrape's metrics, an
// unchanged vllm:lora_adapter_loaded page reuses the last adapter list
// (the running adapters from lora_requests_info, then the idle resident
// ones) instead of building it again; a changed page builds a new one.
func TestLoRAAdapterLoadedSharesPrevious(t *testing.T) {
	page, err := os.ReadFile("testdata/vllm_lora_loaded_metrics.txt")
	if err != nil {
		t.Fatal(err)
	}
	first, err := parsePage(EngineVLLM, page, nil)
	if err != nil {
		t.Fatal(err)
	}
	prev := first.Metrics
	again, err := parsePage(EngineVLLM, page, &prev)
	if err != nil {
		t.Fatal(err)
	}
	got, was := again.Metrics.ActiveAdapters, prev.ActiveAdapters
	if !slices.Equal(got, []string{"a", "c"}) || &got[0] != &was[0] {
		t.Errorf("active %q (shared %v), want the previous scrape's [a c]", got, len(got) > 0 && &got[0] == &was[0])
	}
	// c leaves its GPU slot: a new list, the previous one untouched.
	changed := bytes.Replace(page, []byte(`adapter_name="c",engine="0",level="gpu",pinned="false"} 1.0`), []byte(`adapter_name="c",engine="0",level="gpu",pinned="false"} 0.0`), 1)
	if bytes.Equal(changed, page) {
		t.Fatal("fixture lacks c's GPU series")
	}
	next, err := parsePage(EngineVLLM, changed, &prev)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(next.Metrics.ActiveAdapters, []string{"a"}) || !slices.Equal(prev.ActiveAdapters, []string{"a", "c"}) {
		t.Errorf("after c left: active %q, previous now %q", next.Metrics.ActiveAdapters, prev.ActiveAdapters)
	}
}

// BenchmarkParseLoRALoaded is the scraper's path on a vLLM page with
// vllm:lora_adapter_loaded, given the last scrape's metrics.
func BenchmarkParseLoRALoaded(b *testing.B) {
	page, err := os.ReadFile("testdata/vllm_lora_loaded_metrics.txt")
	if err != nil {
		b.Fatal(err)
	}
	first, err := parsePage(EngineVLLM, page, nil)
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(page)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := parsePage(EngineVLLM, page, &first.Metrics); err != nil {
			b.Fatal(err)
		}
	}
}

// TestDynamoActiveRequests: a Dynamo frontend exporting active_requests
// (the newer name for inflight_requests) and not the old name is read the
// same way: running is the active requests less the queued ones.
func TestDynamoActiveRequests(t *testing.T) {
	page := "dynamo_frontend_active_requests{model=\"m\"} 9\ndynamo_frontend_queued_requests{model=\"m\"} 4\n"
	for _, e := range []string{"", EngineDynamo} {
		s, err := Parse(e, strings.NewReader(page))
		if err != nil {
			t.Fatal(err)
		}
		if s.Engine != EngineDynamo || s.Metrics.Waiting != 4 || s.Metrics.Running != 5 || s.Have != InputWaiting|InputRunning {
			t.Errorf("engine %q: parsed as %s %v %+v, want dynamo waiting 4 running 5", e, s.Engine, s.Have, s.Metrics)
		}
		sameAsReference(t, e, []byte(page))
	}
}
