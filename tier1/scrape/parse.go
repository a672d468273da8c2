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
	EngineTGI        = "tgi"
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
		engine: EngineSGLang, prefix: "sglang:",
		families: map[picker.MetricSet][]string{
			picker.MetricWaiting: {"sglang:num_queue_reqs"},
			picker.MetricRunning: {"sglang:num_running_reqs"},
			picker.MetricKVUsage: {"sglang:token_usage"},
		},
		cacheConfig: "sglang:cache_config_info", blockSizeLabel: "page_size", numBlocksLabel: "num_pages",
	},
	{
		// TGI exports no KV-cache usage and no LoRA slot state.
		engine: EngineTGI, prefix: "tgi_",
		families: map[picker.MetricSet][]string{
			picker.MetricWaiting: {"tgi_queue_size"},
			picker.MetricRunning: {"tgi_batch_current_size"},
		},
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
		if d.cacheConfig != "" {
			w[d.cacheConfig] = true
		}
	}
	return w
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
