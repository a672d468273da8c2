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

// Engines lists the engines Parse understands.
var Engines = []string{EngineVLLM, EngineVLLMLegacy, EngineSGLang, EngineTGI}

// Input is one kind of scheduling input a scorer may need from a pod.
type Input uint8

// Inputs a pod's metrics can provide.
const (
	InputWaiting Input = 1 << iota // requests queued on the server
	InputRunning                   // requests in the running batch
	InputKV                        // KV-cache utilization
	InputLoRA                      // LoRA adapter slots
)

// AllInputs is every Input.
const AllInputs = InputWaiting | InputRunning | InputKV | InputLoRA

var inputNames = []struct {
	in   Input
	name string
}{
	{InputWaiting, "waiting"},
	{InputRunning, "running"},
	{InputKV, "kv_cache_usage"},
	{InputLoRA, "lora"},
}

// String lists the inputs in the set, e.g. "waiting|kv_cache_usage".
func (in Input) String() string {
	var parts []string
	for _, n := range inputNames {
		if in&n.in != 0 {
			parts = append(parts, n.name)
		}
	}
	return strings.Join(parts, "|")
}

// engineMetrics names the metrics one engine exports for each input. An
// empty name means the engine has no such metric.
type engineMetrics struct {
	waiting, running string
	kv               []string // first present wins
	lora             string
	cacheConfig      string
	blockSizeLabel   string
	numBlocksLabel   string
}

var mappings = map[string]engineMetrics{
	EngineVLLM: {
		waiting: "vllm:num_requests_waiting",
		running: "vllm:num_requests_running",
		// Older vLLM exports only the legacy name; read it rather than
		// silently dropping KV usage as GIE does.
		kv:             []string{"vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"},
		lora:           "vllm:lora_requests_info",
		cacheConfig:    "vllm:cache_config_info",
		blockSizeLabel: "block_size",
		numBlocksLabel: "num_gpu_blocks",
	},
	EngineVLLMLegacy: {
		waiting:        "vllm:num_requests_waiting",
		running:        "vllm:num_requests_running",
		kv:             []string{"vllm:gpu_cache_usage_perc", "vllm:kv_cache_usage_perc"},
		lora:           "vllm:lora_requests_info",
		cacheConfig:    "vllm:cache_config_info",
		blockSizeLabel: "block_size",
		numBlocksLabel: "num_gpu_blocks",
	},
	EngineSGLang: {
		waiting:        "sglang:num_queue_reqs",
		running:        "sglang:num_running_reqs",
		kv:             []string{"sglang:token_usage"},
		cacheConfig:    "sglang:cache_config_info",
		blockSizeLabel: "page_size",
		numBlocksLabel: "num_pages",
	},
	EngineTGI: {
		waiting: "tgi_queue_size",
		running: "tgi_batch_current_size",
		// TGI exports no KV-cache usage and no LoRA slot state.
	},
}

// wanted is the set of metric families any engine mapping reads; Parse drops
// every other line before the text parser sees it, because vLLM's exposition
// is dominated by histograms the router never reads.
var wanted = func() map[string]bool {
	w := map[string]bool{}
	for _, m := range mappings {
		for _, n := range append([]string{m.waiting, m.running, m.lora, m.cacheConfig}, m.kv...) {
			if n != "" {
				w[n] = true
			}
		}
	}
	return w
}()

// MetricName returns the metric an engine would export for in (the first
// one for an input with several names), or "<input>" when the engine has no
// such metric at all.
func MetricName(engine string, in Input) string {
	m := mappings[engine]
	var n string
	switch in {
	case InputWaiting:
		n = m.waiting
	case InputRunning:
		n = m.running
	case InputKV:
		if len(m.kv) > 0 {
			n = m.kv[0]
		}
	case InputLoRA:
		n = m.lora
	}
	if n == "" {
		return in.String()
	}
	return n
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
	for _, n := range inputNames {
		if need&n.in != 0 && s.Have&n.in == 0 {
			out = append(out, MetricName(s.Engine, n.in))
		}
	}
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
