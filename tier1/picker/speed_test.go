package picker

import (
	"math"
	"testing"
)

func TestGPUPeak(t *testing.T) {
	tests := []struct {
		gpu  string
		want float64
	}{
		{"h100", 989},
		{"NVIDIA-H100-80GB-HBM3", 989},
		{"NVIDIA-H100-PCIe", 756},
		{"a100", 312},
		{"NVIDIA-A100-SXM4-80GB", 312},
		{"a10g", 125},
		{"NVIDIA-A10G", 125},
		{"NVIDIA-L40S", 362},
		{"l4", 121},
		{"NVIDIA-L4", 121},
		{"Tesla-T4", 65},
		{"", 0},
		{"tpu-v5e", 0},
	}
	for _, tt := range tests {
		if got := gpuPeak(tt.gpu); got != tt.want {
			t.Errorf("gpuPeak(%q) = %v, want %v", tt.gpu, got, tt.want)
		}
	}
}

func gpu(name string) func(*Pod) { return func(p *Pod) { p.GPU = name } }

func TestSpeedPrior(t *testing.T) {
	tests := []struct {
		name string
		pods []*Pod
		def  float64
		want []float64
	}{
		{"learned speeds are kept", []*Pod{mkPod("a", prefill(5000)), mkPod("b", prefill(7000))}, 8000, []float64{5000, 7000}},
		{"no GPU: the learned mean", []*Pod{mkPod("a", prefill(5000)), mkPod("b", prefill(7000)), mkPod("c")}, 8000, []float64{5000, 7000, 6000}},
		{"no GPU, nothing learned: the default", []*Pod{mkPod("a"), mkPod("b")}, 8000, []float64{8000, 8000}},
		{"unlearned A10G scaled from a learned H100", []*Pod{mkPod("h", gpu("h100"), prefill(20000)), mkPod("a", gpu("a10g"))}, 8000,
			[]float64{20000, 20000 * 125.0 / 989}},
		{"nothing learned: the default scaled by peak over the fastest", []*Pod{mkPod("h", gpu("h100")), mkPod("a", gpu("a10g"))}, 8000,
			[]float64{8000, 8000 * 125.0 / 989}},
		{"unknown GPU among known: the learned mean", []*Pod{mkPod("h", gpu("h100"), prefill(20000)), mkPod("x", gpu("tpu"))}, 8000, []float64{20000, 20000}},
		{"no default, nothing learned: 0 (busy check off)", []*Pod{mkPod("h", gpu("h100")), mkPod("a", gpu("a10g"))}, 0, []float64{0, 0}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := newSpeedPrior(tt.pods, tt.def, 0)
			for i, p := range tt.pods {
				if got := s.of(p); math.Abs(got-tt.want[i]) > 1e-6 {
					t.Errorf("pod %s: %v, want %v", p.Name, got, tt.want[i])
				}
			}
		})
	}
}

func gpus(n int) func(*Pod) { return func(p *Pod) { p.GPUs = n } }

func TestSpeedPooling(t *testing.T) {
	h1 := func(name string, mods ...func(*Pod)) *Pod {
		return mkPod(name, append([]func(*Pod){gpu("h100"), gpus(1)}, mods...)...)
	}
	tests := []struct {
		name string
		pods []*Pod
		pool float64
		want []float64
	}{
		{"off: own speeds", []*Pod{h1("a", prefill(10000)), h1("b", prefill(30000))}, 0, []float64{10000, 30000}},
		{"half way to the class mean", []*Pod{h1("a", prefill(10000)), h1("b", prefill(30000))}, 0.5, []float64{15000, 25000}},
		{"one speed per class", []*Pod{h1("a", prefill(10000)), h1("b", prefill(30000))}, 1, []float64{20000, 20000}},
		{"another GPU count is another class", []*Pod{h1("a", prefill(10000)), mkPod("b", gpu("h100"), gpus(2), prefill(30000))}, 1, []float64{10000, 30000}},
		{"unknown GPU count: own speed", []*Pod{mkPod("a", gpu("h100"), prefill(10000)), mkPod("b", gpu("h100"), prefill(30000))}, 1, []float64{10000, 30000}},
		{"a class of one learned pod keeps it", []*Pod{h1("a", prefill(10000)), h1("b"), mkPod("c", gpu("a10g"), gpus(1), prefill(3000))}, 1,
			[]float64{10000, (10000.0/989 + 3000.0/125) / 2 * 989, 3000}}, // b: the GPU prior, as without pooling
		{"classes pool apart", []*Pod{h1("a", prefill(10000)), h1("b", prefill(30000)), mkPod("c", gpu("a10g"), gpus(1), prefill(2000)), mkPod("d", gpu("a10g"), gpus(1), prefill(4000))}, 0.5,
			[]float64{15000, 25000, 2500, 3500}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := newSpeedPrior(tt.pods, 8000, tt.pool)
			for i, p := range tt.pods {
				if got := s.of(p); math.Abs(got-tt.want[i]) > 1e-6 {
					t.Errorf("pod %s: %v, want %v", p.Name, got, tt.want[i])
				}
			}
		})
	}
}

func TestSchedulerPrefillSpeeds(t *testing.T) {
	pods := []*Pod{
		mkPod("a", gpu("h100"), gpus(1), prefill(10000)),
		mkPod("b", gpu("h100"), gpus(1), prefill(30000)),
		mkPod("new", gpu("h100"), gpus(1)),
	}
	s := mustScheduler(t, DefaultProfile(), Options{})
	got := s.PrefillSpeeds(pods, nil)
	// The unlearned pod gets the GPU prior: the learned speeds per TFLOPS
	// (unpooled) times its peak, i.e. their mean here.
	want := []float64{15000, 25000, 20000}
	for i := range want {
		if math.Abs(got[i]-want[i]) > 1e-6 {
			t.Errorf("pod %s: %v, want %v", pods[i].Name, got[i], want[i])
		}
	}
}

// TestSpeedPoolingSpreadsIdenticalPods: of two identical pods, the one whose
// noisy estimate says it is three times as fast no longer takes a request
// behind three times the queue. Without pooling it does.
func TestSpeedPoolingSpreadsIdenticalPods(t *testing.T) {
	mk := func() []*Pod {
		return []*Pod{
			mkPod("looks-fast", gpu("h100"), gpus(1), prefill(60000), queued(9000)),
			mkPod("looks-slow", gpu("h100"), gpus(1), prefill(20000), queued(3000)),
		}
	}
	req := &Request{Model: "llama", PromptTokens: 1000}
	for _, tt := range []struct {
		pool float64
		want string
	}{{0, "looks-fast"}, {DefaultSpeedPooling, "looks-slow"}} {
		cfg := DefaultProfile()
		cfg.SpeedPooling = tt.pool
		s := mustScheduler(t, cfg, Options{Tracker: NewTracker(TrackerOptions{}), Rand: seeded(1)})
		res, err := s.Schedule(req, mk())
		if err != nil {
			t.Fatal(err)
		}
		if got := res.Ranked[0].Name; got != tt.want {
			t.Errorf("speed_pooling %v: picked %s, want %s (scores %v)", tt.pool, got, tt.want, res.Total)
		}
	}
}

// TestPredictedLatencyUsesGPUPrior: a long prompt goes to the idle H100
// the router has learned, not to an idle A10G it has not, which the mean
// of the learned speeds would have made look as fast.
func TestPredictedLatencyUsesGPUPrior(t *testing.T) {
	pods := []*Pod{
		mkPod("h100-busy", gpu("h100"), prefill(20000), func(p *Pod) { p.InFlightUncachedTokens = 4000 }),
		mkPod("a10g-new", gpu("a10g")),
	}
	got := scoreOnly(t, ScorerPredictedLatency, nil, NewTracker(TrackerOptions{}), &Request{PromptTokens: 16000}, pods)
	if !(got[0] == 1 && got[1] < 0.5) {
		t.Fatalf("scores %v: want the learned H100 first by far", got)
	}
}

// BenchmarkSpeedPrior is the prior (pooled by class) over 100 candidates named as NVIDIA's
// GPU feature discovery names them, half learned.
func BenchmarkSpeedPrior(b *testing.B) {
	pods := make([]*Pod, 100)
	for i := range pods {
		name := "NVIDIA-H100-80GB-HBM3"
		if i%2 == 1 {
			name = "NVIDIA-A10G"
		}
		pods[i] = mkPod("p", gpu(name), gpus(1))
		if i%4 < 2 {
			pods[i].PrefillTokensPerSec = 10000
		}
	}
	b.ReportAllocs()
	var sum float64
	for b.Loop() {
		s := newSpeedPrior(pods, 8000, DefaultSpeedPooling)
		for _, p := range pods {
			sum += s.of(p)
		}
	}
	_ = sum
}
