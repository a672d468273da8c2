// Package scrape polls model-server pods for the state the endpoint picker
// routes on: each pod's Prometheus /metrics (queue, running batch, KV-cache
// usage, LoRA slots) on a short interval, and its /v1/models (served adapters
// and their base models) on a longer one.
package scrape

import (
	"errors"
	"math"
	"strings"

	"github.com/infergate/infergate/tier1/picker"
)

// Engine names, as used in configuration and picker.Pod.Engine.
const (
	EngineVLLM       = "vllm"
	EngineVLLMLegacy = "vllm-legacy" // vLLM before kv_cache_usage_perc was introduced
	EngineSGLang     = "sglang"
	EngineTGI        = "tgi"    // archived upstream on 2026-03-21; still read
	EngineTRTLLM     = "trtllm" // trtllm-serve
	EngineDynamo     = "dynamo" // an NVIDIA Dynamo frontend
)

// Engines lists the engines Parse understands, in detection order.
var Engines = func() []string {
	out := make([]string, len(dialects))
	for i, d := range dialects {
		out[i] = d.engine
	}
	return out
}()

// Input is a set of the scheduler's pod metrics (picker.MetricSet): what a
// target's scorers need, or what a page provided.
type Input = picker.MetricSet

// The scheduler's metrics, as the scraper calls them.
const (
	InputWaiting = picker.MetricWaiting
	InputRunning = picker.MetricRunning
	InputKV      = picker.MetricKVUsage
	InputLoRA    = picker.MetricLoRA
	AllInputs    = picker.AllMetrics
)

// dialect is how one engine names the metrics the scheduler reads.
type dialect struct {
	engine string
	// families maps each scheduler metric to the engine's metric families
	// for it, the first present on a page winning; a metric absent from
	// the map is one the engine does not export.
	families map[picker.MetricSet][]string
	// prefix starts the engine's metric names: a page is detected as the
	// engine of its first wanted family, the first dialect with that
	// prefix.
	prefix string
	// marker, when on the page, settles detection before prefixes do
	// (vLLM's current and legacy KV-usage names tell the two apart).
	marker string
	// cacheConfig is an info family whose labels give the KV block size
	// and the number of blocks (Metrics.BlockSize, NumBlocks).
	cacheConfig, blockSizeLabel, numBlocksLabel string
	// blockSizeFamily and numBlocksFamily are gauges whose values give the
	// same (the mean over their series, one per rank), read where
	// cacheConfig is absent from the page.
	blockSizeFamily, numBlocksFamily string
	// loraLoaded is a family with one series per adapter resident in the
	// engine, labelled adapter_name and level ("gpu" or "cpu"): vLLM's
	// vllm:lora_adapter_loaded (vllm-project/vllm#54830). GPU-resident
	// adapters join ActiveAdapters: serving them needs no load, whether
	// or not a request is running on them.
	loraLoaded string
	// breakdownLabel names a label whose non-empty values mark series that
	// break another series down (SGLang's per-priority queue counts beside
	// the total under priority=""): they are not summed.
	breakdownLabel string
	// runningIncludesWaiting: the running family counts the waiting
	// requests too (Dynamo's inflight_requests includes queued_requests);
	// Running is the difference.
	runningIncludesWaiting bool
	// path is the exposition's HTTP path, "/metrics" when empty.
	path string
}

// dialects is the one table of engine metric names: Parse, detection,
// the wanted families and Missing's names all read it.
var dialects = []dialect{
	{
		engine: EngineVLLM, prefix: "vllm:", marker: "vllm:kv_cache_usage_perc",
		families: map[picker.MetricSet][]string{
			picker.MetricWaiting: {"vllm:num_requests_waiting"},
			picker.MetricRunning: {"vllm:num_requests_running"},
			// Older vLLM exports only the legacy name; read it rather
			// than silently dropping KV usage as GIE does.
			picker.MetricKVUsage: {"vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"},
			picker.MetricLoRA:    {"vllm:lora_requests_info"},
		},
		loraLoaded:  "vllm:lora_adapter_loaded",
		cacheConfig: "vllm:cache_config_info", blockSizeLabel: "block_size", numBlocksLabel: "num_gpu_blocks",
	},
	{
		engine: EngineVLLMLegacy, prefix: "vllm:", marker: "vllm:gpu_cache_usage_perc",
		families: map[picker.MetricSet][]string{
			picker.MetricWaiting: {"vllm:num_requests_waiting"},
			picker.MetricRunning: {"vllm:num_requests_running"},
			picker.MetricKVUsage: {"vllm:gpu_cache_usage_perc", "vllm:kv_cache_usage_perc"},
			picker.MetricLoRA:    {"vllm:lora_requests_info"},
		},
		cacheConfig: "vllm:cache_config_info", blockSizeLabel: "block_size", numBlocksLabel: "num_gpu_blocks",
	},
	{
		// SGLang (python/sglang/srt/observability/metrics_collector.py,
		// SchedulerMetricsCollector): the three names are unchanged; with
		// priority scheduling the queue and running counts carry a
		// priority label, the total under priority="" and one series per
		// priority beside it. Current releases export the KV page size and
		// count as gauges (sglang:page_size, sglang:num_pages, set once in
		// emit_constants); releases between sgl-project/sglang#17273
		// (January 2026) and those gauges, as cache_config_info labels.
		// Both are read.
		// SGLang's LoRA gauges (lora_pool_slots_used/total) name no
		// adapter, so LoRA state is not read.
		engine: EngineSGLang, prefix: "sglang:", breakdownLabel: "priority",
		families: map[picker.MetricSet][]string{
			picker.MetricWaiting: {"sglang:num_queue_reqs"},
			picker.MetricRunning: {"sglang:num_running_reqs"},
			picker.MetricKVUsage: {"sglang:token_usage"},
		},
		cacheConfig: "sglang:cache_config_info", blockSizeLabel: "page_size", numBlocksLabel: "num_pages",
		blockSizeFamily: "sglang:page_size", numBlocksFamily: "sglang:num_pages",
	},
	{
		// TGI (router/src/server.rs) exports no KV-cache usage and no LoRA
		// slot state. Its repository was archived on 2026-03-21; pods
		// still running it are read as before.
		engine: EngineTGI, prefix: "tgi_",
		families: map[picker.MetricSet][]string{
			picker.MetricWaiting: {"tgi_queue_size"},
			picker.MetricRunning: {"tgi_batch_current_size"},
		},
	},
	{
		// trtllm-serve (NVIDIA/TensorRT-LLM tensorrt_llm/metrics/collector.py,
		// MetricsCollector): Prometheus text on /prometheus/metrics, mounted
		// with return_perf_metrics; its /metrics is JSON iteration stats. The
		// iteration gauges need enable_iter_perf_stats on the PyTorch
		// backend. kv_cache_utilization is used/max blocks, in [0,1].
		engine: EngineTRTLLM, prefix: "trtllm_", path: "/prometheus/metrics",
		families: map[picker.MetricSet][]string{
			picker.MetricWaiting: {"trtllm_num_requests_waiting"},
			picker.MetricRunning: {"trtllm_num_requests_running"},
			picker.MetricKVUsage: {"trtllm_kv_cache_utilization"},
		},
		blockSizeFamily: "trtllm_kv_cache_tokens_per_block", numBlocksFamily: "trtllm_kv_cache_max_blocks",
	},
	{
		// An NVIDIA Dynamo frontend's /metrics on its HTTP port
		// (ai-dynamo/dynamo lib/runtime/src/metrics/prometheus_names.rs,
		// frontend_service and kvstats; docs/observability/metrics.md).
		// inflight_requests runs from the request's arrival to its last
		// token and includes queued_requests (arrival to first token);
		// newer releases also export it as active_requests ("clearer name
		// for what inflight_requests measures"), read when it is alone.
		// KV usage is a worker's kvstats gauge: read when the scraped page
		// carries it, reported missing on a frontend's own page.
		engine: EngineDynamo, prefix: "dynamo_", runningIncludesWaiting: true,
		families: map[picker.MetricSet][]string{
			picker.MetricWaiting: {"dynamo_frontend_queued_requests"},
			picker.MetricRunning: {"dynamo_frontend_inflight_requests", "dynamo_frontend_active_requests"},
			picker.MetricKVUsage: {"dynamo_component_kvstats_gpu_cache_usage_percent"},
		},
		blockSizeFamily: "dynamo_frontend_model_kv_cache_block_size", numBlocksFamily: "dynamo_frontend_model_total_kv_blocks",
	},
}

// dialectOf returns engine's dialect, or nil.
func dialectOf(engine string) *dialect {
	for i := range dialects {
		if dialects[i].engine == engine {
			return &dialects[i]
		}
	}
	return nil
}

// wanted is the set of metric families any dialect reads; Parse drops
// every other line before the text parser sees it, because vLLM's exposition
// is dominated by histograms the router never reads.
var wanted = func() map[string]bool {
	w := map[string]bool{}
	for _, d := range dialects {
		for _, names := range d.families {
			for _, n := range names {
				w[n] = true
			}
		}
		for _, n := range d.extraFamilies() {
			w[n] = true
		}
	}
	return w
}()

// extraFamilies lists the families d reads beyond families.
func (d *dialect) extraFamilies() []string {
	var out []string
	for _, n := range []string{d.cacheConfig, d.blockSizeFamily, d.numBlocksFamily, d.loraLoaded} {
		if n != "" {
			out = append(out, n)
		}
	}
	return out
}

// MetricsPath returns the HTTP path of engine's Prometheus exposition:
// "/metrics" except where the engine serves it elsewhere (trtllm-serve's
// /prometheus/metrics), and for an engine left to detection.
func MetricsPath(engine string) string {
	if d := dialectOf(engine); d != nil && d.path != "" {
		return d.path
	}
	return "/metrics"
}

// breakdownOf maps a family to its dialect's breakdown label, if any.
var breakdownOf = func() map[string]string {
	m := map[string]string{}
	for _, d := range dialects {
		if d.breakdownLabel == "" {
			continue
		}
		for _, names := range d.families {
			for _, n := range names {
				m[n] = d.breakdownLabel
			}
		}
	}
	return m
}()

// MetricName returns the metric an engine would export for in, a single
// metric (the first name when it has several), or in's own name when the
// engine has no such metric at all.
func MetricName(engine string, in Input) string {
	if d := dialectOf(engine); d != nil && len(d.families[in]) > 0 {
		return d.families[in][0]
	}
	return in.String()
}

// Sample is one parsed scrape.
type Sample struct {
	Engine  string // the configured engine, or the detected one
	Metrics picker.Metrics
	Have    Input // inputs the exposition provided
}

// Missing returns the metric names for the inputs in need that s lacks,
// sorted in Input order.
func (s *Sample) Missing(need Input) []string {
	var out []string
	(need &^ s.Have).Each(func(in Input) {
		out = append(out, MetricName(s.Engine, in))
	})
	return out
}

// ErrUnknownEngine is returned by Parse when the engine is not configured and
// the exposition holds none of the metrics of a known engine.
var ErrUnknownEngine = errors.New("cannot detect model-server engine from metrics")

// maxCount bounds a request count read from a pod. float64 to int of an
// out-of-range value is implementation-defined in Go (on amd64 it gives
// math.MinInt), so a pod exporting 1e19 would look like a negative queue.
const maxCount = math.MaxInt32

// count converts a summed gauge to a request count in [0, maxCount].
func count(v float64) int {
	if !(v > 0) { // also NaN
		return 0
	}
	return int(math.Min(v, maxCount))
}

func clamp01(v float64) float64 {
	if math.IsNaN(v) {
		return 0
	}
	return math.Max(0, math.Min(1, v))
}

func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}
