package scrape

import (
	"bytes"
	"math"
	"slices"
	"strings"
	"testing"
)

// FuzzParse feeds arbitrary expositions to Parse under every engine (and
// detection). Whatever a pod serves, Parse must not panic, and what it
// accepts must be usable by the picker: counts non-negative, KV usage a
// finite fraction, LoRA fields only with HasLoRA, and Have consistent.
func FuzzParse(f *testing.F) {
	for _, s := range []string{vllmText, vllmLegacyText, sglangText, tgiText,
		"vllm:num_requests_waiting 1e308\nvllm:num_requests_waiting{a=\"1\"} 1e308\n",
		"vllm:kv_cache_usage_perc{e=\"0\"} 1e308\nvllm:kv_cache_usage_perc{e=\"1\"} 1e308\nvllm:kv_cache_usage_perc{e=\"2\"} -1e308\n",
		"vllm:num_requests_running -5\nvllm:num_requests_running{x=\"y\"} NaN\n",
		"sglang:num_queue_reqs +Inf\nsglang:token_usage -Inf\n",
		"# TYPE tgi_queue_size gauge\ntgi_queue_size 9.3e18\n",
		"vllm:lora_requests_info{max_lora=\"99999999999999999999\",running_lora_adapters=\",,a,,\",waiting_lora_adapters=\" \"} 1\n",
		"vllm:cache_config_info{block_size=\"-1\",num_gpu_blocks=\"x\"} 1\n",
		"# HELP vllm:num_requests_waiting\n# TYPE vllm:num_requests_waiting counter\nvllm:num_requests_waiting 1 1700000000000\n",
		"",
		"\x00{\n",
	} {
		for _, e := range append([]string{""}, Engines...) {
			f.Add(e, []byte(s))
		}
	}
	f.Fuzz(func(t *testing.T, engine string, data []byte) {
		s, err := Parse(engine, bytes.NewReader(data))
		if err != nil {
			if err.Error() == "" {
				t.Fatal("error with empty message")
			}
			return
		}
		if engine != "" && s.Engine != engine {
			t.Fatalf("engine %q configured, sample says %q", engine, s.Engine)
		}
		if !slices.Contains(Engines, s.Engine) {
			t.Fatalf("unknown engine %q accepted", s.Engine)
		}
		m := s.Metrics
		if m.Waiting < 0 || m.Running < 0 {
			t.Fatalf("negative counts: waiting %d running %d", m.Waiting, m.Running)
		}
		if math.IsNaN(m.KVUsage) || m.KVUsage < 0 || m.KVUsage > 1 {
			t.Fatalf("KV usage %v outside [0,1]", m.KVUsage)
		}
		if m.HasKV != (s.Have&InputKV != 0) || m.HasLoRA != (s.Have&InputLoRA != 0) {
			t.Fatalf("Has flags %v/%v disagree with Have %v", m.HasKV, m.HasLoRA, s.Have)
		}
		if !m.HasKV && m.KVUsage != 0 {
			t.Fatalf("KV usage %v without HasKV", m.KVUsage)
		}
		if !m.HasLoRA && (m.ActiveAdapters != nil || m.WaitingAdapters != nil || m.MaxLoras != 0) {
			t.Fatalf("LoRA state without HasLoRA: %+v", m)
		}
		if m.MaxLoras < 0 || m.BlockSize < 0 || m.NumBlocks < 0 {
			t.Fatalf("negative sizes: %+v", m)
		}
		for _, a := range append(slices.Clone(m.ActiveAdapters), m.WaitingAdapters...) {
			if a == "" || a != strings.TrimSpace(a) || strings.Contains(a, ",") {
				t.Fatalf("bad adapter name %q", a)
			}
		}
		// Parsing is a pure function of its input.
		again, err := Parse(engine, bytes.NewReader(data))
		if err != nil || !slices.Equal(again.Metrics.ActiveAdapters, m.ActiveAdapters) || again.Metrics.Waiting != m.Waiting {
			t.Fatalf("second parse differs: %+v, %v", again, err)
		}
	})
}
