package scrape

import (
	"errors"
	"math"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/infergate/infergate/tier1/picker"
)

// Exposition samples shaped like the engines' real /metrics output.
const vllmText = `# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 7.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 3.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.4375
# HELP vllm:lora_requests_info Running stats on lora requests.
# TYPE vllm:lora_requests_info gauge
vllm:lora_requests_info{max_lora="4",running_lora_adapters="sql-lora",waiting_lora_adapters=""} 1.7325e+09
vllm:lora_requests_info{max_lora="4",running_lora_adapters="sql-lora,chat-lora",waiting_lora_adapters="tone-lora"} 1.7325000042e+09
vllm:lora_requests_info{max_lora="4",running_lora_adapters="",waiting_lora_adapters=""} 1.7324999e+09
# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",cache_dtype="auto",enable_prefix_caching="True",gpu_memory_utilization="0.9",num_cpu_blocks="None",num_gpu_blocks="27648"} 1.0
# HELP vllm:prefix_cache_queries_total Prefix cache queries, in terms of number of queried tokens.
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 123456.0
# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.001",model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.1",model_name="meta-llama/Llama-3.1-8B-Instruct"} 40.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf",model_name="meta-llama/Llama-3.1-8B-Instruct"} 52.0
vllm:time_to_first_token_seconds_count{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 52.0
vllm:time_to_first_token_seconds_sum{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 3.21
`

const vllmLegacyText = `# HELP vllm:num_requests_running Number of requests currently running on GPU.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="llama"} 2.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model_name="llama"} 0.0
# HELP vllm:gpu_cache_usage_perc GPU KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:gpu_cache_usage_perc gauge
vllm:gpu_cache_usage_perc{model_name="llama"} 0.9
`

// SGLang with data-parallel attention reports one series per rank.
const sglangText = `# HELP sglang:num_running_reqs The number of running requests.
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{dp_rank="0",model_name="Qwen/Qwen3-32B",tp_rank="0"} 5.0
sglang:num_running_reqs{dp_rank="1",model_name="Qwen/Qwen3-32B",tp_rank="0"} 6.0
# HELP sglang:num_queue_reqs The number of requests in the waiting queue.
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{dp_rank="0",model_name="Qwen/Qwen3-32B",tp_rank="0"} 1.0
sglang:num_queue_reqs{dp_rank="1",model_name="Qwen/Qwen3-32B",tp_rank="0"} 2.0
# HELP sglang:token_usage The token usage.
# TYPE sglang:token_usage gauge
sglang:token_usage{dp_rank="0",model_name="Qwen/Qwen3-32B",tp_rank="0"} 0.2
sglang:token_usage{dp_rank="1",model_name="Qwen/Qwen3-32B",tp_rank="0"} 0.4
# HELP sglang:cache_hit_rate The prefix cache hit rate.
# TYPE sglang:cache_hit_rate gauge
sglang:cache_hit_rate{model_name="Qwen/Qwen3-32B"} 0.0075
`

const tgiText = `# TYPE tgi_request_generated_tokens histogram
tgi_request_generated_tokens_bucket{le="1"} 0
tgi_request_generated_tokens_bucket{le="+Inf"} 44
tgi_request_generated_tokens_sum 8123
tgi_request_generated_tokens_count 44
# TYPE tgi_batch_current_size gauge
tgi_batch_current_size 4
# TYPE tgi_queue_size gauge
tgi_queue_size 7
# TYPE tgi_batch_current_max_tokens gauge
tgi_batch_current_max_tokens 2048
`

func TestParse(t *testing.T) {
	tests := []struct {
		name       string
		engine     string
		text       string
		wantEngine string
		want       picker.Metrics
		have       Input
		// missing, with every input needed
		missing []string
	}{
		{
			name: "vllm configured", engine: EngineVLLM, text: vllmText, wantEngine: EngineVLLM,
			want: picker.Metrics{Waiting: 3, Running: 7, KVUsage: 0.4375, HasKV: true,
				ActiveAdapters: []string{"sql-lora", "chat-lora"}, WaitingAdapters: []string{"tone-lora"},
				MaxLoras: 4, HasLoRA: true, BlockSize: 16, NumBlocks: 27648},
			have: AllInputs,
		},
		{
			name: "vllm detected", text: vllmText, wantEngine: EngineVLLM,
			want: picker.Metrics{Waiting: 3, Running: 7, KVUsage: 0.4375, HasKV: true,
				ActiveAdapters: []string{"sql-lora", "chat-lora"}, WaitingAdapters: []string{"tone-lora"},
				MaxLoras: 4, HasLoRA: true, BlockSize: 16, NumBlocks: 27648},
			have: AllInputs,
		},
		{
			// Configured as current vLLM but the server is older: the legacy
			// KV name is read instead of being silently ignored.
			name: "vllm configured, legacy server", engine: EngineVLLM, text: vllmLegacyText, wantEngine: EngineVLLM,
			want:    picker.Metrics{Waiting: 0, Running: 2, KVUsage: 0.9, HasKV: true},
			have:    InputWaiting | InputRunning | InputKV,
			missing: []string{"vllm:lora_requests_info"},
		},
		{
			name: "vllm legacy detected", text: vllmLegacyText, wantEngine: EngineVLLMLegacy,
			want:    picker.Metrics{Running: 2, KVUsage: 0.9, HasKV: true},
			have:    InputWaiting | InputRunning | InputKV,
			missing: []string{"vllm:lora_requests_info"},
		},
		{
			name: "sglang dp ranks", text: sglangText, wantEngine: EngineSGLang,
			want:    picker.Metrics{Waiting: 3, Running: 11, KVUsage: 0.30000000000000004, HasKV: true},
			have:    InputWaiting | InputRunning | InputKV,
			missing: []string{"lora"},
		},
		{
			name: "tgi", engine: EngineTGI, text: tgiText, wantEngine: EngineTGI,
			want:    picker.Metrics{Waiting: 7, Running: 4},
			have:    InputWaiting | InputRunning,
			missing: []string{"kv_cache_usage", "lora"},
		},
		{
			name: "tgi detected", text: tgiText, wantEngine: EngineTGI,
			want:    picker.Metrics{Waiting: 7, Running: 4},
			have:    InputWaiting | InputRunning,
			missing: []string{"kv_cache_usage", "lora"},
		},
		{
			// The engine is configured as SGLang but the pod serves vLLM
			// metrics: nothing maps, so everything is reported missing.
			name: "wrong engine configured", engine: EngineSGLang, text: vllmText, wantEngine: EngineSGLang,
			want:    picker.Metrics{},
			have:    0,
			missing: []string{"sglang:num_queue_reqs", "sglang:num_running_reqs", "sglang:token_usage", "lora"},
		},
		{
			name: "kv usage above 1 is clamped", engine: EngineVLLM, wantEngine: EngineVLLM,
			text:    "vllm:kv_cache_usage_perc 1.5\nvllm:num_requests_waiting 0\nvllm:num_requests_running 0\n",
			want:    picker.Metrics{KVUsage: 1, HasKV: true},
			have:    InputWaiting | InputRunning | InputKV,
			missing: []string{"vllm:lora_requests_info"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := Parse(tt.engine, strings.NewReader(tt.text))
			if err != nil {
				t.Fatalf("Parse: %v", err)
			}
			if s.Engine != tt.wantEngine {
				t.Errorf("engine = %q, want %q", s.Engine, tt.wantEngine)
			}
			if !reflect.DeepEqual(s.Metrics, tt.want) {
				t.Errorf("metrics = %+v\nwant      %+v", s.Metrics, tt.want)
			}
			if s.Have != tt.have {
				t.Errorf("have = %v, want %v", s.Have, tt.have)
			}
			if got := s.Missing(AllInputs); !reflect.DeepEqual(got, tt.missing) {
				t.Errorf("missing = %q, want %q", got, tt.missing)
			}
			if got := s.Missing(InputWaiting | InputRunning); tt.have&(InputWaiting|InputRunning) == InputWaiting|InputRunning && got != nil {
				t.Errorf("missing(waiting|running) = %q, want none", got)
			}
		})
	}
}

func TestParseErrors(t *testing.T) {
	tests := []struct {
		name, engine, text string
		wantUnknown        bool
	}{
		{name: "no known metrics", text: "process_cpu_seconds_total 12\n", wantUnknown: true},
		{name: "empty", text: "", wantUnknown: true},
		{name: "malformed wanted line", engine: EngineVLLM, text: "vllm:num_requests_waiting{model_name=\"x\" 3\n"},
		{name: "bad value", engine: EngineVLLM, text: "vllm:num_requests_waiting abc\n"},
		{name: "unknown engine", engine: "triton", text: "vllm:num_requests_waiting 1\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse(tt.engine, strings.NewReader(tt.text))
			if err == nil {
				t.Fatal("Parse succeeded, want error")
			}
			if got := errors.Is(err, ErrUnknownEngine); got != tt.wantUnknown {
				t.Errorf("errors.Is(err, ErrUnknownEngine) = %v, want %v (err %v)", got, tt.wantUnknown, err)
			}
		})
	}
}

// Lines of metrics the router does not read are dropped before parsing, so a
// malformed line there does not cost the pod its scrape.
func TestParseIgnoresUnreadFamilies(t *testing.T) {
	text := "some_other_metric{a=\"b\" broken\n" + vllmText + "no_newline_at_end 1"
	s, err := Parse("", strings.NewReader(text))
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	if s.Metrics.Waiting != 3 || s.Metrics.Running != 7 {
		t.Errorf("metrics = %+v", s.Metrics)
	}
}

func TestParseLongLine(t *testing.T) {
	long := "vllm:lora_requests_info{max_lora=\"8\",running_lora_adapters=\"" + strings.Repeat("a", 70000) + "\",waiting_lora_adapters=\"\"} 5\n"
	s, err := Parse(EngineVLLM, strings.NewReader(long+"vllm:num_requests_waiting 2\n"))
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	if len(s.Metrics.ActiveAdapters) != 1 || len(s.Metrics.ActiveAdapters[0]) != 70000 || s.Metrics.Waiting != 2 {
		t.Errorf("long line not parsed: %d adapters, waiting %d", len(s.Metrics.ActiveAdapters), s.Metrics.Waiting)
	}
}

// vLLM stamps lora_requests_info with whole seconds, so the last busy state
// of a burst and the idle state after it can tie. Whatever order the series
// come in, the idle one must win: nothing refreshes either after traffic
// stops, and the busy one would show adapters running forever.
func TestParseLoRATimestampTie(t *testing.T) {
	busy := `vllm:lora_requests_info{max_lora="4",running_lora_adapters="sql-lora",waiting_lora_adapters="chat-lora"} 1.7325e+09` + "\n"
	busier := `vllm:lora_requests_info{running_lora_adapters="sql-lora,chat-lora",waiting_lora_adapters="",max_lora="4"} 1.7325e+09` + "\n"
	idle := `vllm:lora_requests_info{max_lora="4",running_lora_adapters="",waiting_lora_adapters=""} 1.7325e+09` + "\n"
	older := `vllm:lora_requests_info{max_lora="4",running_lora_adapters="",waiting_lora_adapters=""} 1.7324e+09` + "\n"
	newer := `vllm:lora_requests_info{max_lora="4",running_lora_adapters="tone-lora",waiting_lora_adapters=""} 1.7325001e+09` + "\n"
	head := "# TYPE vllm:lora_requests_info gauge\n"
	tests := []struct {
		name        string
		text        string
		wantRunning []string
		wantWaiting []string
	}{
		{"busy then idle", head + busy + idle, nil, nil},
		{"idle then busy", head + idle + busy, nil, nil},
		{"two busy, tie: fewer running wins", head + busier + busy, []string{"sql-lora"}, []string{"chat-lora"}},
		{"two busy, other order", head + busy + busier, []string{"sql-lora"}, []string{"chat-lora"}},
		{"newer busy beats idle", head + idle + newer + busy, []string{"tone-lora"}, nil},
		{"older idle loses", head + older + busy, []string{"sql-lora"}, []string{"chat-lora"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := Parse(EngineVLLM, strings.NewReader(tt.text))
			if err != nil {
				t.Fatal(err)
			}
			if !s.Metrics.HasLoRA || s.Metrics.MaxLoras != 4 {
				t.Fatalf("LoRA state not read: %+v", s.Metrics)
			}
			if !slices.Equal(s.Metrics.ActiveAdapters, tt.wantRunning) || !slices.Equal(s.Metrics.WaitingAdapters, tt.wantWaiting) {
				t.Fatalf("running %q waiting %q, want %q %q", s.Metrics.ActiveAdapters, s.Metrics.WaitingAdapters, tt.wantRunning, tt.wantWaiting)
			}
		})
	}
}

// A pod exporting absurd counts must not look like a negative queue.
func TestParseHugeCounts(t *testing.T) {
	text := "vllm:num_requests_waiting 1e19\nvllm:num_requests_running{a=\"0\"} 1e308\nvllm:num_requests_running{a=\"1\"} 1e308\n" +
		"vllm:kv_cache_usage_perc{a=\"0\"} 1e308\nvllm:kv_cache_usage_perc{a=\"1\"} 1e308\nvllm:kv_cache_usage_perc{a=\"2\"} -1e308\nvllm:kv_cache_usage_perc{a=\"3\"} -1e308\n"
	s, err := Parse(EngineVLLM, strings.NewReader(text))
	if err != nil {
		t.Fatal(err)
	}
	if s.Metrics.Waiting != math.MaxInt32 || s.Metrics.Running != math.MaxInt32 {
		t.Fatalf("waiting %d running %d, want both %d", s.Metrics.Waiting, s.Metrics.Running, math.MaxInt32)
	}
	if s.Metrics.KVUsage != 0 || !s.Metrics.HasKV {
		t.Fatalf("KV usage %v (HasKV %v), want 0 for +Inf + -Inf", s.Metrics.KVUsage, s.Metrics.HasKV)
	}
}
