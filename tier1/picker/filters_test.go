package picker

import (
	"slices"
	"testing"
	"time"
)

func TestFilters(t *testing.T) {
	sat := SaturationDetector{StaleAfter: 200 * time.Millisecond}
	stale := func(p *Pod) { p.MetricsAge = time.Second }
	lora := func(active, waiting []string, maxLoras int) func(*Pod) {
		return func(p *Pod) {
			p.Metrics.HasLoRA = true
			p.Metrics.ActiveAdapters, p.Metrics.WaitingAdapters, p.Metrics.MaxLoras = active, waiting, maxLoras
		}
	}
	tests := []struct {
		name   string
		filter filter
		req    Request
		pods   []*Pod
		want   []string
	}{
		{"model match", modelFilter{}, Request{Model: "llama"},
			[]*Pod{mkPod("a"), mkPod("b", func(p *Pod) { p.BaseModel = "qwen" }), mkPod("c", func(p *Pod) { p.BaseModel = "" })},
			[]string{"a", "c"}},
		{"base model wins over adapter name", modelFilter{}, Request{Model: "my-adapter", BaseModel: "llama"},
			[]*Pod{mkPod("a"), mkPod("b", func(p *Pod) { p.BaseModel = "qwen" })}, []string{"a"}},
		{"pool", modelFilter{}, Request{Model: "llama", Pool: "east"},
			[]*Pod{mkPod("a"), mkPod("b", func(p *Pod) { p.Pool = "east" })}, []string{"b"}},
		{"no model match", modelFilter{}, Request{Model: "mistral"}, []*Pod{mkPod("a")}, []string{}},
		{"ready", readyFilter{}, Request{},
			[]*Pod{mkPod("a"), mkPod("b", func(p *Pod) { p.Ready = false })}, []string{"a"}},
		{"fresh drops stale", freshFilter{sat: sat}, Request{},
			[]*Pod{mkPod("a", stale), mkPod("b"), mkPod("c", stale)}, []string{"b"}},
		{"all stale kept", freshFilter{sat: sat}, Request{},
			[]*Pod{mkPod("a", stale), mkPod("b", stale)}, []string{"a", "b"}},
		{"lora: no adapter passes all", loraFilter{}, Request{},
			[]*Pod{mkPod("a", lora([]string{"x"}, nil, 1))}, []string{"a"}},
		{"lora: loaded, loading, free slot, unknown; not full", loraFilter{}, Request{Adapter: "x"},
			[]*Pod{
				mkPod("loaded", lora([]string{"x", "y"}, nil, 2)),
				mkPod("loading", lora([]string{"y"}, []string{"x"}, 2)),
				mkPod("free", lora([]string{"y"}, nil, 2)),
				mkPod("full", lora([]string{"y", "z"}, nil, 2)),
				mkPod("full-waiting", lora([]string{"y"}, []string{"z"}, 2)),
				mkPod("unknown"),
			},
			[]string{"loaded", "loading", "free", "unknown"}},
		{"lora: all full keeps all", loraFilter{}, Request{Adapter: "x"},
			[]*Pod{mkPod("a", lora([]string{"y"}, nil, 1)), mkPod("b", lora([]string{"z"}, nil, 1))},
			[]string{"a", "b"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			in := slices.Clone(tt.pods)
			got := names(tt.filter.Filter(&cycleState{}, &tt.req, in))
			if !slices.Equal(got, tt.want) {
				t.Fatalf("got %v, want %v", got, tt.want)
			}
		})
	}
}

func TestSaturation(t *testing.T) {
	d := SaturationDetector{}
	tests := []struct {
		name string
		pod  *Pod
		want bool
	}{
		{"idle", mkPod("a"), false},
		{"queue at threshold", mkPod("a", waiting(5)), true},
		{"router in-flight beyond running", mkPod("a", running(2), inflight(7)), true},
		{"kv full", mkPod("a", kv(0.85)), true},
		{"kv unknown ignored", mkPod("a", kv(0.95), func(p *Pod) { p.Metrics.HasKV = false }), false},
		{"stale is saturated", mkPod("a", func(p *Pod) { p.MetricsAge = time.Second }), true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := d.Saturated(tt.pod); got != tt.want {
				t.Fatalf("Saturated = %v, want %v", got, tt.want)
			}
			if got := Saturated(tt.pod); got != tt.want {
				t.Fatalf("package Saturated = %v, want %v", got, tt.want)
			}
		})
	}
	pool := []*Pod{mkPod("a", waiting(5)), mkPod("b", kv(0.4))}
	if got := d.PoolSaturation(pool); got != 0.75 {
		t.Fatalf("PoolSaturation = %v, want 0.75", got)
	}
}
