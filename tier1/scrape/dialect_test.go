package scrape

import (
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
		if d.cacheConfig != "" {
			all = append(all, d.cacheConfig)
		}
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
		{"triton", InputRunning, "running"},
	} {
		if got := MetricName(tt.engine, tt.in); got != tt.want {
			t.Errorf("MetricName(%s, %v) = %q, want %q", tt.engine, tt.in, got, tt.want)
		}
	}
}
