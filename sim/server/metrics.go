package server

import (
	"fmt"
	"math"
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
	FlavorTGI        Flavor = "tgi"
)

// Flavors lists the valid --engine values.
func Flavors() []Flavor { return []Flavor{FlavorVLLM, FlavorVLLMLegacy, FlavorSGLang, FlavorTGI} }

// ParseFlavor validates an --engine value.
func ParseFlavor(s string) (Flavor, error) {
	for _, f := range Flavors() {
		if string(f) == s {
			return f, nil
		}
	}
	names := make([]string, 0, 4)
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
	constLabels        []string // label values of the series gauge() adds
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
	// The scheduler's gauges carry these labels; tokenizer-side counters
	// and histograms only model_name and engine_type.
	schedLabels := []string{"model_name", "engine_type", "tp_rank", "pp_rank"}
	c.constLabels = []string{c.model, "unified", "0", "0"}
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
	c.infoDesc = prometheus.NewDesc("sglang:cache_config_info", "Cache configuration", []string{"page_size", "num_pages"}, nil)

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
	case FlavorSGLang:
		ch <- prometheus.MustNewConstMetric(c.infoDesc, prometheus.GaugeValue, 1,
			strconv.Itoa(s.BlockSize), strconv.Itoa(s.NumBlocks))
	}
	if c.loraDesc != nil && c.loraOn() {
		c.collectLoRA(ch, s)
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
