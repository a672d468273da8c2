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
