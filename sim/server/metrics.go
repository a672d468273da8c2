package server

import (
	"fmt"
	"math"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/infergate/infergate/sim/engine"
)

// Flavor names the model server whose /metrics a pod imitates.
type Flavor string

// The supported flavors. Each exports its own metric names only; see
// docs/simulator-api.md for where each name was verified.
const (
	FlavorVLLM       Flavor = "vllm"
	FlavorVLLMLegacy Flavor = "vllm-legacy" // before 0.9: gpu_cache_usage_perc
	FlavorSGLang     Flavor = "sglang"
	FlavorTGI        Flavor = "tgi"    // archived upstream on 2026-03-21
	FlavorTRTLLM     Flavor = "trtllm" // trtllm-serve: Prometheus text on /prometheus/metrics
	FlavorDynamo     Flavor = "dynamo" // an NVIDIA Dynamo frontend's own page
)

// Flavors lists the valid --engine values.
func Flavors() []Flavor {
	return []Flavor{FlavorVLLM, FlavorVLLMLegacy, FlavorSGLang, FlavorTGI, FlavorTRTLLM, FlavorDynamo}
}

// MetricsPath is where the flavor serves its Prometheus text: trtllm-serve
// mounts it on /prometheus/metrics and answers /metrics with JSON
// iteration stats.
func (f Flavor) MetricsPath() string {
	if f == FlavorTRTLLM {
		return "/prometheus/metrics"
	}
	return "/metrics"
}

// ParseFlavor validates an --engine value.
func ParseFlavor(s string) (Flavor, error) {
	for _, f := range Flavors() {
		if string(f) == s {
			return f, nil
		}
	}
	names := make([]string, 0, len(Flavors()))
	for _, f := range Flavors() {
		names = append(names, string(f))
	}
	return "", fmt.Errorf("unknown engine %q (valid: %s)", s, strings.Join(names, ", "))
}

// Histogram buckets, copied from each server's source.
var (
	// vllm/v1/metrics/loggers.py, histogram_time_to_first_token.
	vllmTTFTBuckets = []float64{0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0}
	// vllm/v1/metrics/loggers.py, inter_token_latency / time_per_output_token.
	vllmITLBuckets = []float64{0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0}
	// vllm/v1/metrics/loggers.py, request_latency_buckets.
	vllmE2EBuckets = []float64{0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0}
	// python/sglang/srt/metrics/collector.py, TokenizerMetricsCollector defaults.
	sglangTTFTBuckets = []float64{0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400}
	sglangITLBuckets  = []float64{0.002, 0.004, 0.006, 0.008, 0.010, 0.015, 0.020, 0.025, 0.030, 0.035, 0.040, 0.060, 0.080, 0.100, 0.200, 0.400, 0.600, 0.800, 1.000, 2.000, 4.000, 6.000, 8.000}
	sglangE2EBuckets  = []float64{0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400, 600, 1200, 1800, 2400}
	// ai-dynamo/dynamo's frontend histograms, as its /metrics shows them
	// (docs/observability/metrics_examples/fe.log).
	dynamoTTFTBuckets     = []float64{0, 0.0022, 0.0047, 0.01, 0.022, 0.047, 0.1, 0.22, 0.47, 1, 2.2, 4.7, 10, 22, 48, 100, 220, 480}
	dynamoITLBuckets      = []float64{0, 0.0019, 0.0035, 0.0067, 0.013, 0.024, 0.045, 0.084, 0.16, 0.3, 0.56, 1.1, 2}
	dynamoRequestDuration = []float64{0, 1.9, 3.4, 6.3, 12, 22, 40, 75, 140, 260}
	// router/src/server.rs: 35 geometric buckets from 0.0001 × 1.5.
	tgiDurationBuckets = func() []float64 {
		b := make([]float64, 35)
		v := 0.0001
		for i := range b {
			v *= 1.5
			b[i] = v
		}
		return b
	}()
)

// tgiLengthBuckets is TGI's (max/100)·(x+1) for x in [0,100).
func tgiLengthBuckets(max int) []float64 {
	b := make([]float64, 100)
	for i := range b {
		b[i] = float64(max) / 100 * float64(i+1)
	}
	return b
}

// collector exports one pod's metrics under its flavor's names. Gauges and
// engine counters are read from engine Stats on each scrape; per-request
// histograms are fed by the HTTP handlers (observe*), which run outside the
// engine lock.
type collector struct {
	flavor     Flavor
	model      string
	stats      func() engine.Stats
	loraOn     func() bool
	maxLen     int
	gpuMemUtil float64

	ttft, itl, e2e     prometheus.Histogram
	inputLen, genLen   prometheus.Histogram // TGI only
	success            *prometheus.CounterVec
	arrivals           prometheus.Counter // TGI only
	mu                 sync.Mutex
	loraSeries         map[[2]string]float64 // (running, waiting) → last timestamp
	lastQ, lastH       int64                 // SGLang cache_hit_rate is per-interval
	lastHitRate        float64
	gauges             []gaugeSpec
	infoDesc, loraDesc *prometheus.Desc
	// loadedDesc is vllm:lora_adapter_loaded (vllm-project/vllm#54830),
	// one series per adapter resident in a GPU slot.
	loadedDesc *prometheus.Desc
	// loraGauges are exported only with LoRA enabled, as vLLM's.
	loraGauges  []gaugeSpec
	constLabels []string // label values of the series gauge() adds
}

// gaugeSpec is one series computed from Stats at scrape time.
type gaugeSpec struct {
	desc   *prometheus.Desc
	typ    prometheus.ValueType
	val    func(s engine.Stats) float64
	values []string // variable label values
}

type collectorConfig struct {
	flavor     Flavor
	model      string
	maxLen     int
	gpuMemUtil float64
	stats      func() engine.Stats
	loraOn     func() bool
}

func newCollector(cfg collectorConfig) *collector {
	c := &collector{
		flavor:     cfg.flavor,
		model:      cfg.model,
		stats:      cfg.stats,
		loraOn:     cfg.loraOn,
		maxLen:     cfg.maxLen,
		gpuMemUtil: cfg.gpuMemUtil,
		loraSeries: make(map[[2]string]float64),
	}
	switch cfg.flavor {
	case FlavorVLLM, FlavorVLLMLegacy:
		c.initVLLM(cfg.flavor == FlavorVLLMLegacy)
	case FlavorSGLang:
		c.initSGLang()
	case FlavorTGI:
		c.initTGI()
	case FlavorTRTLLM:
		c.initTRTLLM()
	case FlavorDynamo:
		c.initDynamo()
	}
	return c
}

func (c *collector) gauge(name, help string, labels []string, typ prometheus.ValueType, val func(engine.Stats) float64) {
	c.gauges = append(c.gauges, gaugeSpec{desc: prometheus.NewDesc(name, help, labels, nil), typ: typ, val: val, values: c.constLabels})
}

func (c *collector) initVLLM(legacy bool) {
	// vLLM labels every engine series with model_name (the served name)
	// and engine (the engine-core index).
	labels := []string{"model_name", "engine"}
	c.constLabels = []string{c.model, "0"}
	constL := prometheus.Labels{"model_name": c.model, "engine": "0"}
	g, cnt := prometheus.GaugeValue, prometheus.CounterValue

	c.gauge("vllm:num_requests_running", "Number of requests in model execution batches.", labels, g,
		func(s engine.Stats) float64 { return float64(s.Running) })
	c.gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.", labels, g,
		func(s engine.Stats) float64 { return float64(s.Waiting) })
	kvName, pqName, phName := "vllm:kv_cache_usage_perc", "vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total"
	if legacy {
		kvName, pqName, phName = "vllm:gpu_cache_usage_perc", "vllm:gpu_prefix_cache_queries_total", "vllm:gpu_prefix_cache_hits_total"
	}
	c.gauge(kvName, "KV-cache usage. 1 means 100 percent usage.", labels, g,
		func(s engine.Stats) float64 { return s.KVUsage })
	c.gauge(pqName, "Prefix cache queries, in terms of number of queried tokens.", labels, cnt,
		func(s engine.Stats) float64 { return float64(s.PrefixCacheQueries) })
	c.gauge(phName, "Prefix cache hits, in terms of number of cached tokens.", labels, cnt,
		func(s engine.Stats) float64 { return float64(s.PrefixCacheHits) })
	c.gauge("vllm:num_preemptions_total", "Cumulative number of preemption from the engine.", labels, cnt,
		func(s engine.Stats) float64 { return float64(s.Preemptions) })
	c.gauge("vllm:prompt_tokens_total", "Number of prefill tokens processed.", labels, cnt,
		func(s engine.Stats) float64 { return float64(s.PromptTokens) })
	c.gauge("vllm:generation_tokens_total", "Number of generation tokens processed.", labels, cnt,
		func(s engine.Stats) float64 { return float64(s.GenerationTokens) })

	infoLabels := []string{"block_size", "cache_dtype", "enable_prefix_caching", "gpu_memory_utilization", "num_gpu_blocks"}
	if !legacy {
		// Newer releases add the engine index to the info gauge.
		infoLabels = append(infoLabels, "engine")
	}
	c.infoDesc = prometheus.NewDesc("vllm:cache_config_info", "Information of the LLMEngine CacheConfig", infoLabels, nil)
	c.loraDesc = prometheus.NewDesc("vllm:lora_requests_info", "Running stats on lora requests.",
		[]string{"max_lora", "waiting_lora_adapters", "running_lora_adapters"}, nil)
	if !legacy {
		// A vLLM with vllm-project/vllm#54830 exports the adapters it holds
		// beside the (deprecated) info gauge: one series per loaded
		// adapter, level "gpu" or "cpu", present while loaded. The
		// simulator has GPU slots only.
		c.loadedDesc = prometheus.NewDesc("vllm:lora_adapter_loaded", "LoRA adapter loaded in the engine (1 while loaded).",
			[]string{"engine", "adapter_name", "level", "pinned"}, nil)
		for _, l := range []struct {
			name, help string
			val        func(engine.Stats) float64
		}{
			{"vllm:num_gpu_loaded_lora_adapters", "Number of LoRA adapters loaded in GPU memory.", func(s engine.Stats) float64 { return float64(len(s.LoadedAdapters)) }},
			{"vllm:num_cpu_loaded_lora_adapters", "Number of LoRA adapters cached in CPU memory.", func(engine.Stats) float64 { return 0 }},
		} {
			c.loraGauges = append(c.loraGauges, gaugeSpec{desc: prometheus.NewDesc(l.name, l.help, []string{"engine"}, nil),
				typ: prometheus.GaugeValue, val: l.val, values: []string{"0"}})
		}
	}

	itlName := "vllm:inter_token_latency_seconds"
	itlHelp := "Histogram of inter-token latency in seconds."
	if legacy {
		itlName, itlHelp = "vllm:time_per_output_token_seconds", "Histogram of time per output token in seconds."
	}
	c.ttft = prometheus.NewHistogram(prometheus.HistogramOpts{Name: "vllm:time_to_first_token_seconds",
		Help: "Histogram of time to first token in seconds.", Buckets: vllmTTFTBuckets, ConstLabels: constL})
	c.itl = prometheus.NewHistogram(prometheus.HistogramOpts{Name: itlName, Help: itlHelp, Buckets: vllmITLBuckets, ConstLabels: constL})
	c.e2e = prometheus.NewHistogram(prometheus.HistogramOpts{Name: "vllm:e2e_request_latency_seconds",
		Help: "Histogram of e2e request latency in seconds.", Buckets: vllmE2EBuckets, ConstLabels: constL})
	c.success = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "vllm:request_success_total",
		Help: "Count of successfully processed requests.", ConstLabels: constL}, []string{"finished_reason"})
}

func (c *collector) initSGLang() {
	// The scheduler's gauges carry these labels (python/sglang/srt/
	// observability/metrics_collector.py, SchedulerMetricsCollector);
	// tokenizer-side counters and histograms only model_name and
	// engine_type.
	schedLabels := []string{"model_name", "engine_type", "tp_rank", "pp_rank", "moe_ep_rank"}
	c.constLabels = []string{c.model, "unified", "0", "0", "0"}
	tokL := prometheus.Labels{"model_name": c.model, "engine_type": "unified"}
	g := prometheus.GaugeValue
	c.gauge("sglang:num_running_reqs", "The number of running requests.", schedLabels, g,
		func(s engine.Stats) float64 { return float64(s.Running) })
	c.gauge("sglang:num_queue_reqs", "The number of requests in the waiting queue.", schedLabels, g,
		func(s engine.Stats) float64 { return float64(s.Waiting) })
	c.gauge("sglang:token_usage", "The token usage.", schedLabels, g,
		func(s engine.Stats) float64 { return s.KVUsage })
	c.gauge("sglang:num_used_tokens", "The number of used tokens.", schedLabels, g,
		func(s engine.Stats) float64 { return float64(s.UsedBlocks * s.BlockSize) })
	c.gauge("sglang:max_total_num_tokens", "Maximum total number of tokens in the KV cache pool.", schedLabels, g,
		func(s engine.Stats) float64 { return float64(s.NumBlocks * s.BlockSize) })
	c.gauge("sglang:cache_hit_rate", "The prefix cache hit rate.", schedLabels, g, c.sglangHitRate)
	// Current SGLang exports the KV page size and count as gauges
	// (metrics_collector.py, emit_constants); the releases before, from
	// sgl-project/sglang#17273, as sglang:cache_config_info labels.
	c.gauge("sglang:page_size", "KV cache page size in tokens.", schedLabels, g,
		func(s engine.Stats) float64 { return float64(s.BlockSize) })
	c.gauge("sglang:num_pages", "Number of KV cache pages.", schedLabels, g,
		func(s engine.Stats) float64 { return float64(s.NumBlocks) })
	c.gauge("sglang:context_len", "Maximum context length.", schedLabels, g,
		func(engine.Stats) float64 { return float64(c.maxLen) })

	// Tokenizer-side counters: a separate label set, so const labels.
	for _, ctr := range []struct {
		name, help string
		val        func(engine.Stats) float64
	}{
		{"sglang:prompt_tokens_total", "Number of prefill tokens processed.", func(s engine.Stats) float64 { return float64(s.PromptTokens) }},
		{"sglang:generation_tokens_total", "Number of generation tokens processed.", func(s engine.Stats) float64 { return float64(s.GenerationTokens) }},
		{"sglang:cached_tokens_total", "Number of cached prompt tokens.", func(s engine.Stats) float64 { return float64(s.PrefixCacheHits) }},
		{"sglang:num_requests_total", "Number of requests processed.", func(s engine.Stats) float64 { return float64(s.FinishedRequests) }},
	} {
		c.gauges = append(c.gauges, gaugeSpec{desc: prometheus.NewDesc(ctr.name, ctr.help, nil, tokL), typ: prometheus.CounterValue, val: ctr.val})
	}
	c.ttft = prometheus.NewHistogram(prometheus.HistogramOpts{Name: "sglang:time_to_first_token_seconds",
		Help: "Histogram of time to first token in seconds.", Buckets: sglangTTFTBuckets, ConstLabels: tokL})
	c.itl = prometheus.NewHistogram(prometheus.HistogramOpts{Name: "sglang:inter_token_latency_seconds",
		Help: "Histogram of inter-token latency in seconds.", Buckets: sglangITLBuckets, ConstLabels: tokL})
	c.e2e = prometheus.NewHistogram(prometheus.HistogramOpts{Name: "sglang:e2e_request_latency_seconds",
		Help: "Histogram of End-to-end request latency in seconds", Buckets: sglangE2EBuckets, ConstLabels: tokL})
}

// sglangHitRate is the hit rate of the prefill tokens since the previous
// scrape (SGLang reports it per prefill batch), holding the last value when
// nothing was prefilled.
func (c *collector) sglangHitRate(s engine.Stats) float64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	dq, dh := s.PrefixCacheQueries-c.lastQ, s.PrefixCacheHits-c.lastH
	if dq > 0 {
		c.lastHitRate = float64(dh) / float64(dq)
	}
	c.lastQ, c.lastH = s.PrefixCacheQueries, s.PrefixCacheHits
	return c.lastHitRate
}

func (c *collector) initTGI() {
	// TGI's metrics carry no labels.
	g := prometheus.GaugeValue
	c.gauge("tgi_queue_size", "Current queue size", nil, g,
		func(s engine.Stats) float64 { return float64(s.Waiting) })
	c.gauge("tgi_batch_current_size", "Current batch size", nil, g,
		func(s engine.Stats) float64 { return float64(s.Running) })
	c.gauge("tgi_batch_current_max_tokens", "Maximum tokens for the current batch", nil, g,
		func(s engine.Stats) float64 { return float64(s.UsedBlocks * s.BlockSize) })
	c.arrivals = prometheus.NewCounter(prometheus.CounterOpts{Name: "tgi_request_count", Help: "Total number of requests"})
	c.success = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tgi_request_success", Help: "Number of successful requests"}, nil)
	c.e2e = prometheus.NewHistogram(prometheus.HistogramOpts{Name: "tgi_request_duration",
		Help: "Total time spent processing the request", Buckets: tgiDurationBuckets})
	c.itl = prometheus.NewHistogram(prometheus.HistogramOpts{Name: "tgi_request_mean_time_per_token_duration",
		Help: "Mean time per token per request", Buckets: tgiDurationBuckets})
	maxLen := max(c.maxLen, 100)
	c.inputLen = prometheus.NewHistogram(prometheus.HistogramOpts{Name: "tgi_request_input_length",
		Help: "Input token length per request", Buckets: tgiLengthBuckets(maxLen)})
	c.genLen = prometheus.NewHistogram(prometheus.HistogramOpts{Name: "tgi_request_generated_tokens",
		Help: "Generated tokens per request", Buckets: tgiLengthBuckets(maxLen)})
}

func (c *collector) initTRTLLM() {
	// trtllm-serve (NVIDIA/TensorRT-LLM tensorrt_llm/metrics/collector.py,
	// MetricsCollector) labels every series model_name and engine_type,
	// which its OpenAI server sets to "undefined".
	labels := []string{"model_name", "engine_type"}
	c.constLabels = []string{"undefined", "undefined"}
	constL := prometheus.Labels{"model_name": "undefined", "engine_type": "undefined"}
	g, cnt := prometheus.GaugeValue, prometheus.CounterValue
	c.gauge("trtllm_num_requests_running", "Number of active requests", labels, g,
		func(s engine.Stats) float64 { return float64(s.Running) })
	c.gauge("trtllm_num_requests_waiting", "Number of queued requests", labels, g,
		func(s engine.Stats) float64 { return float64(s.Waiting) })
	c.gauge("trtllm_kv_cache_utilization", "KV cache utilization", labels, g,
		func(s engine.Stats) float64 { return s.KVUsage })
	c.gauge("trtllm_kv_cache_max_blocks", "Maximum number of KV cache blocks", labels, g,
		func(s engine.Stats) float64 { return float64(s.NumBlocks) })
	c.gauge("trtllm_kv_cache_used_blocks", "Number of used KV cache blocks", labels, g,
		func(s engine.Stats) float64 { return float64(s.UsedBlocks) })
	c.gauge("trtllm_kv_cache_free_blocks", "Number of free KV cache blocks", labels, g,
		func(s engine.Stats) float64 { return float64(s.NumBlocks - s.UsedBlocks) })
	c.gauge("trtllm_kv_cache_tokens_per_block", "Number of tokens per KV cache block", labels, g,
		func(s engine.Stats) float64 { return float64(s.BlockSize) })
	c.gauge("trtllm_kv_cache_hit_rate", "KV cache hit rate", labels, g, c.sglangHitRate)
	c.gauge("trtllm_prompt_tokens_total", "Cumulative number of prompt (input) tokens processed.", labels, cnt,
		func(s engine.Stats) float64 { return float64(s.PromptTokens) })
	c.gauge("trtllm_generation_tokens_total", "Cumulative number of generation (output) tokens produced.", labels, cnt,
		func(s engine.Stats) float64 { return float64(s.GenerationTokens) })
	c.gauge("trtllm_num_requests_completed_total", "Total number of completed requests across iterations", labels, cnt,
		func(s engine.Stats) float64 { return float64(s.FinishedRequests) })
	// Its default buckets are vLLM's.
	c.ttft = prometheus.NewHistogram(prometheus.HistogramOpts{Name: "trtllm_time_to_first_token_seconds",
		Help: "Histogram of time to first token in seconds.", Buckets: vllmTTFTBuckets, ConstLabels: constL})
	c.itl = prometheus.NewHistogram(prometheus.HistogramOpts{Name: "trtllm_time_per_output_token_seconds",
		Help: "Histogram of time per output token in seconds.", Buckets: vllmITLBuckets, ConstLabels: constL})
	c.e2e = prometheus.NewHistogram(prometheus.HistogramOpts{Name: "trtllm_e2e_request_latency_seconds",
		Help: "Histogram of end to end request latency in seconds.", Buckets: vllmE2EBuckets, ConstLabels: constL})
	c.success = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "trtllm_request_success_total",
		Help: "Count of successfully processed requests.", ConstLabels: constL}, []string{"finished_reason"})
}

func (c *collector) initDynamo() {
	// A Dynamo frontend's own page (ai-dynamo/dynamo lib/runtime/src/
	// metrics/prometheus_names.rs, frontend_service): request gauges and
	// histograms labelled with the model name lowercased, model
	// configuration gauges with it as served. inflight_requests counts a
	// request from arrival to its last token, queued_requests until its
	// first token; the simulator counts the engine's waiting requests as
	// queued (a request in its prefill step counts as running only).
	lower := strings.ToLower(c.model)
	labels := []string{"model"}
	g, cnt := prometheus.GaugeValue, prometheus.CounterValue
	c.constLabels = []string{lower}
	c.gauge("dynamo_frontend_inflight_requests", "Number of inflight requests", labels, g,
		func(s engine.Stats) float64 { return float64(s.Running + s.Waiting) })
	c.gauge("dynamo_frontend_queued_requests", "Number of requests in HTTP processing queue", labels, g,
		func(s engine.Stats) float64 { return float64(s.Waiting) })
	c.gauge("dynamo_frontend_output_tokens_total", "Total number of output tokens generated (updates in real-time)", labels, cnt,
		func(s engine.Stats) float64 { return float64(s.GenerationTokens) })
	c.constLabels = []string{c.model}
	c.gauge("dynamo_frontend_model_kv_cache_block_size", "KV cache block size in tokens for a worker serving the model", labels, g,
		func(s engine.Stats) float64 { return float64(s.BlockSize) })
	c.gauge("dynamo_frontend_model_total_kv_blocks", "Total KV cache blocks available for a worker serving the model", labels, g,
		func(s engine.Stats) float64 { return float64(s.NumBlocks) })
	c.gauge("dynamo_frontend_model_context_length", "Maximum context length in tokens for a worker serving the model", labels, g,
		func(engine.Stats) float64 { return float64(c.maxLen) })
	constL := prometheus.Labels{"model": lower}
	c.ttft = prometheus.NewHistogram(prometheus.HistogramOpts{Name: "dynamo_frontend_time_to_first_token_seconds",
		Help: "Time to first token in seconds", Buckets: dynamoTTFTBuckets, ConstLabels: constL})
	c.itl = prometheus.NewHistogram(prometheus.HistogramOpts{Name: "dynamo_frontend_inter_token_latency_seconds",
		Help: "Inter-token latency in seconds", Buckets: dynamoITLBuckets, ConstLabels: constL})
	c.e2e = prometheus.NewHistogram(prometheus.HistogramOpts{Name: "dynamo_frontend_request_duration_seconds",
		Help: "Duration of LLM requests", Buckets: dynamoRequestDuration, ConstLabels: constL})
}

func (c *collector) histograms() []prometheus.Collector {
	var out []prometheus.Collector
	for _, h := range []prometheus.Collector{c.ttft, c.itl, c.e2e, c.inputLen, c.genLen, c.arrivals} {
		if h != nil {
			out = append(out, h)
		}
	}
	if c.success != nil {
		out = append(out, c.success)
	}
	return out
}

// Describe implements prometheus.Collector.
func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	for _, g := range c.gauges {
		ch <- g.desc
	}
	if c.infoDesc != nil {
		ch <- c.infoDesc
	}
	if c.loraDesc != nil {
		ch <- c.loraDesc
	}
	if c.loadedDesc != nil {
		ch <- c.loadedDesc
	}
	for _, g := range c.loraGauges {
		ch <- g.desc
	}
	for _, h := range c.histograms() {
		h.Describe(ch)
	}
}

// Collect implements prometheus.Collector: it reads Stats once per scrape.
func (c *collector) Collect(ch chan<- prometheus.Metric) {
	s := c.stats()
	for _, g := range c.gauges {
		ch <- prometheus.MustNewConstMetric(g.desc, g.typ, g.val(s), g.values...)
	}
	switch c.flavor {
	case FlavorVLLM:
		ch <- prometheus.MustNewConstMetric(c.infoDesc, prometheus.GaugeValue, 1,
			strconv.Itoa(s.BlockSize), "auto", "True", formatFloat(c.gpuMemUtil), strconv.Itoa(s.NumBlocks), "0")
	case FlavorVLLMLegacy:
		ch <- prometheus.MustNewConstMetric(c.infoDesc, prometheus.GaugeValue, 1,
			strconv.Itoa(s.BlockSize), "auto", "True", formatFloat(c.gpuMemUtil), strconv.Itoa(s.NumBlocks))
	}
	if c.loraDesc != nil && c.loraOn() {
		c.collectLoRA(ch, s)
		for _, g := range c.loraGauges {
			ch <- prometheus.MustNewConstMetric(g.desc, g.typ, g.val(s), g.values...)
		}
		if c.loadedDesc != nil {
			for _, a := range s.LoadedAdapters {
				ch <- prometheus.MustNewConstMetric(c.loadedDesc, prometheus.GaugeValue, 1, "0", a, "gpu", "false")
			}
		}
	}
	for _, h := range c.histograms() {
		h.Collect(ch)
	}
}

// collectLoRA emits vllm:lora_requests_info as vLLM does: a gauge per
// distinct label set whose value is the time it was last current, so the
// newest series is the current state. Old sets are kept, bounded.
func (c *collector) collectLoRA(ch chan<- prometheus.Metric, s engine.Stats) {
	const keep = 32
	now := float64(time.Now().UnixNano()) / 1e9
	key := [2]string{strings.Join(s.RunningAdapters, ","), strings.Join(s.WaitingAdapters, ",")}
	c.mu.Lock()
	c.loraSeries[key] = now
	if len(c.loraSeries) > keep {
		var oldest [2]string
		ts := math.Inf(1)
		for k, v := range c.loraSeries {
			if v < ts {
				oldest, ts = k, v
			}
		}
		delete(c.loraSeries, oldest)
	}
	keys := make([][2]string, 0, len(c.loraSeries))
	for k := range c.loraSeries {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool { return keys[i][0]+"\x00"+keys[i][1] < keys[j][0]+"\x00"+keys[j][1] })
	vals := make([]float64, len(keys))
	for i, k := range keys {
		vals[i] = c.loraSeries[k]
	}
	c.mu.Unlock()
	maxLora := strconv.Itoa(s.MaxLoras)
	for i, k := range keys {
		ch <- prometheus.MustNewConstMetric(c.loraDesc, prometheus.GaugeValue, vals[i], maxLora, k[1], k[0])
	}
}

func formatFloat(f float64) string { return strconv.FormatFloat(f, 'f', -1, 64) }

// observeArrival counts an accepted request (TGI's tgi_request_count).
func (c *collector) observeArrival() {
	if c.arrivals != nil {
		c.arrivals.Inc()
	}
}

// observeDone records a finished request's latencies, in simulated seconds.
func (c *collector) observeDone(res engine.Result, ttft, e2e time.Duration) {
	if res.Err != nil {
		return
	}
	if c.ttft != nil {
		c.ttft.Observe(ttft.Seconds())
	}
	if c.e2e != nil {
		c.e2e.Observe(e2e.Seconds())
	}
	if c.itl != nil && res.CompletionTokens > 1 {
		c.itl.Observe((e2e - ttft).Seconds() / float64(res.CompletionTokens-1))
	}
	if c.inputLen != nil {
		c.inputLen.Observe(float64(res.PromptTokens))
	}
	if c.genLen != nil {
		c.genLen.Observe(float64(res.CompletionTokens))
	}
	if c.success != nil {
		if c.flavor == FlavorTGI {
			c.success.WithLabelValues().Inc()
		} else {
			c.success.WithLabelValues(res.FinishReason).Inc()
		}
	}
}

// handleIterationStats answers trtllm-serve's /metrics: a JSON list of
// recent iteration stats (tensorrt_llm/serve/openai_server.py,
// get_iteration_stats), here one built from the engine's state.
func (s *Server) handleIterationStats(w http.ResponseWriter, _ *http.Request) {
	st := s.stats()
	writeJSON(w, http.StatusOK, []map[string]any{{
		"numActiveRequests": st.Running,
		"numQueuedRequests": st.Waiting,
		"kvCacheStats": map[string]int{
			"maxNumBlocks": st.NumBlocks, "usedNumBlocks": st.UsedBlocks,
			"freeNumBlocks": st.NumBlocks - st.UsedBlocks, "tokensPerBlock": st.BlockSize,
		},
	}})
}
