package profile

import (
	"strings"
	"testing"
)

func TestLookups(t *testing.T) {
	tests := []struct {
		name, want string
		gpu        bool
		wantErr    bool
	}{
		{"h100", "h100", true, false},
		{"NVIDIA/H100-SXM", "h100", true, false},
		{"A100-80GB", "a100", true, false},
		{"a10g", "a10g", true, false},
		{"NVIDIA/L40S", "l40s", true, false},
		{"v100", "", true, true},
		{"meta-llama/Llama-3.1-8B-Instruct", "llama-3.1-8b", false, false},
		{"Qwen/Qwen3-235B-A22B", "qwen3-235b-a22b", false, false},
		{"llama-2-7b", "", false, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var got string
			var err error
			if tt.gpu {
				var g GPUSpec
				g, err = GPU(tt.name)
				got = g.Name
			} else {
				var m ModelSpec
				m, err = Model(tt.name)
				got = m.Name
			}
			if tt.wantErr {
				if err == nil || !strings.Contains(err.Error(), "valid:") {
					t.Fatalf("err = %v, want one listing the valid names", err)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Fatalf("got %q, %v; want %q", got, err, tt.want)
			}
		})
	}
}

func TestModelDerivedFigures(t *testing.T) {
	tests := []struct {
		model      string
		kvPerToken int64 // 2 × layers × kv_heads × head_dim × 2 bytes
		weightsGB  float64
	}{
		{"llama-3.1-8b", 2 * 32 * 8 * 128 * 2, 16.06},
		{"qwen3-32b", 2 * 64 * 8 * 128 * 2, 65.6},
		{"llama-3.1-70b", 2 * 80 * 8 * 128 * 2, 141.2},
		{"qwen3-235b-a22b", 2 * 94 * 4 * 128 * 2, 470},
	}
	for _, tt := range tests {
		t.Run(tt.model, func(t *testing.T) {
			m, err := Model(tt.model)
			if err != nil {
				t.Fatal(err)
			}
			if got := m.KVBytesPerToken(); got != tt.kvPerToken {
				t.Errorf("KV bytes/token %d, want %d", got, tt.kvPerToken)
			}
			if got := m.WeightBytes() / 1e9; got < tt.weightsGB*0.99 || got > tt.weightsGB*1.01 {
				t.Errorf("weights %.1f GB, want %.1f", got, tt.weightsGB)
			}
			if m.ActiveParams > m.Params || (m.IsMoE() && m.ExpertParams >= m.Params) {
				t.Errorf("inconsistent parameter counts %+v", m)
			}
		})
	}
}

// TestPrefillEfficiencyCurve: the H100 and H200 share one curve (same die,
// same peak), it rises with the step's tokens towards PrefillMFU and is
// half of it at PrefillHalfTokens; GPUs without a step-size measurement
// keep a flat PrefillMFU.
func TestPrefillEfficiencyCurve(t *testing.T) {
	h100, _ := GPU("h100")
	h200, _ := GPU("h200")
	if h100.PrefillMFU != h200.PrefillMFU || h100.PrefillHalfTokens != h200.PrefillHalfTokens ||
		h100.DecodeBWEfficiency != h200.DecodeBWEfficiency || h100.BF16FLOPS != h200.BF16FLOPS {
		t.Fatalf("h100 %+v and h200 %+v efficiencies differ", h100, h200)
	}
	if h200.PrefillHalfTokens <= 0 {
		t.Fatal("h200 has no step-size curve")
	}
	prev := 0.0
	for _, n := range []int{1, 16, 64, 256, 512, 1024, 2048, 4096, 8192, 1 << 20} {
		e := h200.PrefillEfficiency(n)
		if e <= prev || e >= h200.PrefillMFU {
			t.Errorf("PrefillEfficiency(%d) = %.4f, want in (%.4f, %.2f)", n, e, prev, h200.PrefillMFU)
		}
		prev = e
	}
	if got := h200.PrefillEfficiency(int(h200.PrefillHalfTokens)); got != h200.PrefillMFU/2 {
		t.Errorf("efficiency at PrefillHalfTokens = %.4f, want %.4f", got, h200.PrefillMFU/2)
	}
	if got := h200.PrefillEfficiency(0); got != h200.PrefillMFU {
		t.Errorf("PrefillEfficiency(0) = %.4f, want the plateau", got)
	}
	for _, name := range []string{"a100", "a10g", "l40s", "l4"} {
		g, _ := GPU(name)
		if g.PrefillHalfTokens != 0 || g.PrefillEfficiency(64) != g.PrefillMFU || g.PrefillMFU == 0 {
			t.Errorf("%s: want a flat, set PrefillMFU, got %+v", name, g)
		}
	}
}
