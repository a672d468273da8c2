package picker

import (
	"strings"
	"testing"
	"time"

	"github.com/infergate/infergate/shared/config"
)

func TestParseProfile(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		wantErr string
		check   func(t *testing.T, c ProfileConfig)
	}{
		{name: "empty is default", in: "", check: func(t *testing.T, c ProfileConfig) {
			if c.Weight(ScorerPrefix) != 3 || c.Weight(ScorerQueue) != 2 || c.Weight(ScorerPredictedLatency) != 5 ||
				c.Weight(ScorerLoRAAffinity) != 4 || c.Weight(ScorerRunning) != 0.5 || c.Weight(ScorerSessionBalance) != 8 {
				t.Errorf("weights %+v", c.Scorers)
			}
			if len(c.Filters) != 4 || c.StaleAfter != DefaultStaleAfter || c.Picker != PickerMaxScore {
				t.Errorf("got %+v", c)
			}
		}},
		{name: "override one weight", in: "scorers:\n  - name: prefix\n    weight: 5\n", check: func(t *testing.T, c ProfileConfig) {
			if c.Weight(ScorerPrefix) != 5 || c.Weight(ScorerKVCache) != 2 || len(c.Scorers) != 7 {
				t.Errorf("scorers %+v", c.Scorers)
			}
		}},
		{name: "disable and params", in: `
scorers:
  - name: running
    enabled: false
  - name: prefix
    guard_abs: 16
    guard_discount: 0.5
stale_after: 250ms
max_ranked: 3
saturation: {queue_threshold: 8}
`, check: func(t *testing.T, c ProfileConfig) {
			if c.Weight(ScorerRunning) != 0 {
				t.Error("running still on")
			}
			for _, s := range c.Scorers {
				if s.Name == ScorerPrefix && (s.Params[ParamGuardAbs] != 16 || s.Params[ParamGuardDiscount] != 0.5 || s.Weight != 3) {
					t.Errorf("prefix %+v", s)
				}
			}
			if c.StaleAfter != 250*time.Millisecond || c.MaxRanked != 3 || c.Saturation.QueueThreshold != 8 || c.Saturation.KVThreshold != 0.8 {
				t.Errorf("got %+v", c)
			}
		}},
		{name: "gie base", in: "base: gie\n", check: func(t *testing.T, c ProfileConfig) {
			if len(c.Scorers) != 3 || c.Weight(ScorerPrefix) != 3 || c.StaleAfter != GIEStaleAfter {
				t.Errorf("got %+v", c)
			}
		}},
		{name: "empty base with round robin", in: "base: empty\nfilters: [model, ready]\npicker: round-robin\n", check: func(t *testing.T, c ProfileConfig) {
			if len(c.Scorers) != 0 || c.Picker != PickerRoundRobin || len(c.Filters) != 2 {
				t.Errorf("got %+v", c)
			}
		}},
		{name: "filters replace", in: "filters: [model]\n", check: func(t *testing.T, c ProfileConfig) {
			if len(c.Filters) != 1 {
				t.Errorf("filters %v", c.Filters)
			}
		}},
		{name: "unknown scorer", in: "scorers:\n  - name: prefix-cache\n    weight: 1\n", wantErr: `unknown scorer "prefix-cache"`},
		{name: "unknown filter", in: "filters: [model, healthy]\n", wantErr: `unknown filter "healthy"`},
		{name: "unknown picker", in: "picker: best\n", wantErr: `unknown picker "best"`},
		{name: "unknown param", in: "scorers:\n  - name: queue\n    guard_abs: 1\n", wantErr: `scorer "queue": unknown parameter "guard_abs"`},
		{name: "unknown key", in: "scorer: []\n", wantErr: "field scorer not found"},
		{name: "unknown base", in: "base: sglang\n", wantErr: `unknown base "sglang"`},
		{name: "negative weight", in: "scorers:\n  - name: queue\n    weight: -1\n", wantErr: "negative"},
		{name: "speed pooling by default", in: "", check: func(t *testing.T, c ProfileConfig) {
			if c.SpeedPooling != DefaultSpeedPooling {
				t.Errorf("speed_pooling %v", c.SpeedPooling)
			}
		}},
		{name: "speed pooling off", in: "speed_pooling: 0\n", check: func(t *testing.T, c ProfileConfig) {
			if c.SpeedPooling != 0 {
				t.Errorf("speed_pooling %v", c.SpeedPooling)
			}
		}},
		{name: "gie base does not pool", in: "base: gie\n", check: func(t *testing.T, c ProfileConfig) {
			if c.SpeedPooling != 0 {
				t.Errorf("speed_pooling %v", c.SpeedPooling)
			}
		}},
		{name: "speed pooling above 1", in: "speed_pooling: 1.5\n", wantErr: "speed_pooling 1.5 must be in [0, 1]"},
		{name: "kv_full above 1", in: "scorers:\n  - name: predicted-latency\n    weight: 5\n    kv_full: 95\n", wantErr: "kv_full 95 must be in [0, 1]"},
		{name: "kv_full_wait_ms negative", in: "scorers:\n  - name: predicted-latency\n    weight: 5\n    kv_full_wait_ms: -1\n", wantErr: "kv_full_wait_ms -1 must not be negative"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := ParseProfile("p.yaml", []byte(tt.in))
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			tt.check(t, c)
			if _, err := NewScheduler(c, Options{}); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestProfileEmbedded checks a profile nested in another config file,
// decoded by shared/config (as the gateway does).
func TestProfileEmbedded(t *testing.T) {
	var cfg struct {
		Listen     string        `yaml:"listen"`
		Scheduling ProfileConfig `yaml:"scheduling"`
	}
	in := "listen: :8080\nscheduling:\n  scorers:\n    - name: kv-cache\n      weight: 4\n"
	if err := config.Decode("gw.yaml", []byte(in), &cfg); err != nil {
		t.Fatal(err)
	}
	if cfg.Scheduling.Weight(ScorerKVCache) != 4 || cfg.Scheduling.Weight(ScorerPrefix) != 3 {
		t.Fatalf("got %+v", cfg.Scheduling.Scorers)
	}
	bad := "scheduling:\n  scorers:\n    - name: kv\n"
	if err := config.Decode("gw.yaml", []byte(bad), &cfg); err != nil {
		t.Fatalf("decode should defer plugin names to Validate: %v", err)
	}
	if err := cfg.Scheduling.Validate(); err == nil || !strings.Contains(err.Error(), `"kv"`) {
		t.Fatalf("Validate = %v", err)
	}
	strict := "scheduling:\n  filterz: []\n"
	if err := config.Decode("gw.yaml", []byte(strict), &cfg); err == nil || !strings.Contains(err.Error(), "filterz") {
		t.Fatalf("unknown key not rejected: %v", err)
	}
}

func TestProfileHelpers(t *testing.T) {
	d := DefaultProfile()
	c := d.WithWeight(ScorerPrefix, 7).WithWeight(ScorerRunning, 0).WithParam(ScorerPrefix, ParamGuardAbs, 3)
	if c.Weight(ScorerPrefix) != 7 || c.Weight(ScorerRunning) != 0 {
		t.Fatalf("got %+v", c.Scorers)
	}
	if d.Weight(ScorerPrefix) != 3 || d.Scorers[2].Params != nil {
		t.Fatal("WithWeight/WithParam modified the receiver")
	}
	g := GIEDefaultProfile()
	if g.Weight(ScorerQueue) != 2 || g.Weight(ScorerKVCache) != 2 || g.Weight(ScorerPrefix) != 3 || len(g.Scorers) != 3 {
		t.Fatalf("GIE profile %+v", g.Scorers)
	}
	if _, err := NewScheduler(d.WithWeight("nope", 1), Options{}); err == nil || !strings.Contains(err.Error(), `"nope"`) {
		t.Fatalf("unknown scorer accepted: %v", err)
	}
	for _, p := range []ProfileConfig{d, g, RoundRobinProfile(), {}} {
		if _, err := NewScheduler(p, Options{}); err != nil {
			t.Fatal(err)
		}
	}
}
