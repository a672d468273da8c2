// Package profile holds the public hardware and model figures the simulator's
// cost model is built from. Every number is derived in docs/simulator.md.
package profile

import (
	"fmt"
	"sort"
	"strings"
)

// GPUSpec describes one accelerator. Rates are per GPU.
type GPUSpec struct {
	Name string
	// MemoryBytes is the device memory as the driver reports it (what
	// vLLM's gpu_memory_utilization is a fraction of).
	MemoryBytes int64
	// BF16FLOPS is the dense (no sparsity) bf16 tensor-core peak, FLOP/s.
	BF16FLOPS float64
	// MemBandwidth is the peak device-memory bandwidth, bytes/s.
	MemBandwidth float64
	// LinkBandwidth is the GPU-to-GPU bandwidth per direction used by
	// tensor-parallel all-reduce (NVLink where present, else PCIe), bytes/s.
	LinkBandwidth float64
	// LinkLatencySeconds is the fixed cost of one small all-reduce.
	LinkLatencySeconds float64
	// PrefillMFU is the fraction of BF16FLOPS a large prefill reaches on
	// this GPU under vLLM, and DecodeBWEfficiency the fraction of
	// MemBandwidth a decode step reaches; zero means the engine's default
	// (0.5 and 0.85). Calibrated values cite a measurement in
	// docs/simulator.md; TestGPUCalibration and TestH200Calibration pin
	// them.
	PrefillMFU, DecodeBWEfficiency float64
	// PrefillHalfTokens makes the compute efficiency a function of the
	// tokens n in an engine step: PrefillMFU × n/(n + PrefillHalfTokens),
	// half the plateau at n = PrefillHalfTokens. Zero is a flat
	// PrefillMFU (GPUs without a step-size measurement).
	PrefillHalfTokens float64
}

// PrefillEfficiency is the fraction of BF16FLOPS a step of tokens tokens
// reaches (see PrefillHalfTokens); 0 when the profile has no PrefillMFU.
func (g GPUSpec) PrefillEfficiency(tokens int) float64 {
	if tokens < 1 || g.PrefillHalfTokens <= 0 {
		return g.PrefillMFU
	}
	n := float64(tokens)
	return g.PrefillMFU * n / (n + g.PrefillHalfTokens)
}

// ModelSpec describes a model as its Hugging Face config.json does, plus
// parameter counts.
type ModelSpec struct {
	Name string
	// Params is the total parameter count; ActiveParams the count used per
	// token (equal for dense models).
	Params, ActiveParams float64
	// ExpertParams is the part of Params that sits in routed experts (0 for
	// dense models); NumExperts and ExpertsPerToken describe the routing.
	ExpertParams                float64
	NumExperts, ExpertsPerToken int
	Layers, Hidden              int
	Heads, KVHeads, HeadDim     int
	// MaxContext is max_position_embeddings.
	MaxContext int
	// BytesPerParam is 2 for bf16 weights.
	BytesPerParam float64
}

// WeightBytes is the size of all weights.
func (m ModelSpec) WeightBytes() float64 { return m.Params * m.BytesPerParam }

// KVBytesPerToken is the KV-cache footprint of one token over all layers and
// all GPUs: K and V, each kv_heads × head_dim values of 2 bytes, per layer.
func (m ModelSpec) KVBytesPerToken() int64 {
	return int64(2 * m.Layers * m.KVHeads * m.HeadDim * 2)
}

// IsMoE reports whether the model routes tokens to experts.
func (m ModelSpec) IsMoE() bool { return m.NumExperts > 0 }

const (
	mib = 1 << 20
	gb  = 1e9
	tf  = 1e12
)

// hopperPrefillMFU, hopperPrefillHalfTokens and hopperDecodeBW are fitted
// to prefill and decode timings measured on a real H200 (PyTorch SDPA,
// random bf16 weights in Llama-3.1-8B's and Qwen3-32B's shapes; tables in
// ../shared/reference.md, section "Prefill speed measured on a real H200",
// and docs/simulator.md#h200-calibration). The measured forward passes
// are reproduced within ±5% once the eager runtime's launch floor (about
// 1 ms per layer, which vLLM's CUDA graphs do not pay) is added back, and
// the decode steps within ±9%. The H100 is the same GH100 die at the same
// 989 TFLOPS: the peak ratio is 1, so it gets the same curve and the same
// bandwidth fraction, only its 3.35 TB/s HBM3 differs.
const (
	hopperPrefillMFU        = 0.61
	hopperPrefillHalfTokens = 100
	hopperDecodeBW          = 0.72
)

var gpus = map[string]GPUSpec{
	// H100 SXM5 80GB: 989 TFLOPS bf16 dense, 3.35 TB/s HBM3, NVLink 4 900 GB/s
	// total (450 GB/s per direction). Efficiencies: the H200's (same die).
	"h100": {Name: "h100", MemoryBytes: 81559 * mib, BF16FLOPS: 989 * tf, MemBandwidth: 3.35e12, LinkBandwidth: 450 * gb, LinkLatencySeconds: 8e-6,
		PrefillMFU: hopperPrefillMFU, PrefillHalfTokens: hopperPrefillHalfTokens, DecodeBWEfficiency: hopperDecodeBW},
	// H200 SXM 141GB: same compute as H100, 4.8 TB/s HBM3e. Calibrated on a
	// real H200 (see hopperPrefillMFU).
	"h200": {Name: "h200", MemoryBytes: 143771 * mib, BF16FLOPS: 989 * tf, MemBandwidth: 4.8e12, LinkBandwidth: 450 * gb, LinkLatencySeconds: 8e-6,
		PrefillMFU: hopperPrefillMFU, PrefillHalfTokens: hopperPrefillHalfTokens, DecodeBWEfficiency: hopperDecodeBW},
	// A100 SXM4 80GB: 312 TFLOPS bf16 dense, 2.039 TB/s HBM2e, NVLink 3 600 GB/s total.
	// PrefillMFU 0.55 fits NVIDIA's NIM figure of 48.3 ms TTFT for a
	// 500-token Llama-3.1-8B prompt at concurrency 1, BF16.
	"a100": {Name: "a100", MemoryBytes: 81920 * mib, BF16FLOPS: 312 * tf, MemBandwidth: 2.039e12, LinkBandwidth: 300 * gb, LinkLatencySeconds: 10e-6, PrefillMFU: 0.55},
	// A10G (AWS g5): 24 GB GDDR6, 600 GB/s like the A10, but a lower tensor
	// peak than the A10's 125 TFLOPS: 70 TFLOPS bf16 dense (unverified, see
	// docs); PCIe Gen4 x16, no NVLink. No published prefill figure was
	// found: PrefillMFU is the A100's (same Ampere generation).
	"a10g": {Name: "a10g", MemoryBytes: 23028 * mib, BF16FLOPS: 70 * tf, MemBandwidth: 600 * gb, LinkBandwidth: 25 * gb, LinkLatencySeconds: 25e-6, PrefillMFU: 0.55},
	// L40S: 48 GB GDDR6 (about 45 GiB usable), 864 GB/s, 362 TFLOPS bf16
	// dense (733 with sparsity); PCIe Gen4 x16, no NVLink. PrefillMFU 0.42
	// fits MLPerf v5.1's H100/L40S ratio (3.52×) against the H100 as
	// calibrated on the H200 (it was 0.31 against the H100's former 0.40).
	"l40s": {Name: "l40s", MemoryBytes: 46068 * mib, BF16FLOPS: 362 * tf, MemBandwidth: 864 * gb, LinkBandwidth: 25 * gb, LinkLatencySeconds: 25e-6, PrefillMFU: 0.42},
	// L4: 24 GB GDDR6, 300 GB/s, 121 TFLOPS bf16 dense; PCIe Gen4 x16. No
	// published prefill figure was found: PrefillMFU is the L40S's (Ada).
	"l4": {Name: "l4", MemoryBytes: 23034 * mib, BF16FLOPS: 121 * tf, MemBandwidth: 300 * gb, LinkBandwidth: 25 * gb, LinkLatencySeconds: 25e-6, PrefillMFU: 0.42},
}

var models = map[string]ModelSpec{
	// meta-llama/Llama-3.1-8B config.json.
	"llama-3.1-8b": {Name: "llama-3.1-8b", Params: 8.03e9, ActiveParams: 8.03e9, Layers: 32, Hidden: 4096, Heads: 32, KVHeads: 8, HeadDim: 128, MaxContext: 131072, BytesPerParam: 2},
	// Qwen/Qwen3-32B config.json.
	"qwen3-32b": {Name: "qwen3-32b", Params: 32.8e9, ActiveParams: 32.8e9, Layers: 64, Hidden: 5120, Heads: 64, KVHeads: 8, HeadDim: 128, MaxContext: 40960, BytesPerParam: 2},
	// meta-llama/Llama-3.1-70B config.json.
	"llama-3.1-70b": {Name: "llama-3.1-70b", Params: 70.6e9, ActiveParams: 70.6e9, Layers: 80, Hidden: 8192, Heads: 64, KVHeads: 8, HeadDim: 128, MaxContext: 131072, BytesPerParam: 2},
	// Qwen/Qwen3-235B-A22B config.json: 128 experts, 8 per token,
	// moe_intermediate_size 1536, so 94 × 128 × 3 × 4096 × 1536 ≈ 227B
	// parameters sit in experts.
	"qwen3-235b-a22b": {Name: "qwen3-235b-a22b", Params: 235e9, ActiveParams: 22e9, ExpertParams: 227e9, NumExperts: 128, ExpertsPerToken: 8, Layers: 94, Hidden: 4096, Heads: 64, KVHeads: 4, HeadDim: 128, MaxContext: 40960, BytesPerParam: 2},
}

// normalize maps a user-facing name ("meta-llama/Llama-3.1-8B-Instruct",
// "H100-SXM") onto a table key.
func normalize(name string) string {
	n := strings.ToLower(strings.TrimSpace(name))
	if i := strings.LastIndexByte(n, '/'); i >= 0 {
		n = n[i+1:]
	}
	n = strings.TrimSuffix(n, "-instruct")
	n = strings.TrimSuffix(n, "-sxm")
	n = strings.TrimSuffix(n, "-80gb")
	return n
}

// GPU returns the named GPU's spec. Names are case-insensitive.
func GPU(name string) (GPUSpec, error) {
	g, ok := gpus[normalize(name)]
	if !ok {
		return GPUSpec{}, fmt.Errorf("profile: unknown GPU %q (valid: %s)", name, strings.Join(GPUNames(), ", "))
	}
	return g, nil
}

// Model returns the named model's spec. Names are case-insensitive and may
// carry a Hugging Face organisation prefix and an "-Instruct" suffix.
func Model(name string) (ModelSpec, error) {
	m, ok := models[normalize(name)]
	if !ok {
		return ModelSpec{}, fmt.Errorf("profile: unknown model %q (valid: %s)", name, strings.Join(ModelNames(), ", "))
	}
	return m, nil
}

// GPUNames lists the valid GPU names, sorted.
func GPUNames() []string { return keys(gpus) }

// ModelNames lists the valid model names, sorted.
func ModelNames() []string { return keys(models) }

func keys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
