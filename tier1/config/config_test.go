package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	loader "github.com/infergate/infergate/shared/config"
	"github.com/infergate/infergate/tier1/picker"
)

const base = `
auth: {tokens: [t1]}
pools:
  - {name: llama, model: llama-3.1-8b, adapters: [sql-lora]}
pods:
  - {name: p0, address: "127.0.0.1:8101", pool: llama, engine: vllm}
`

func TestDefaults(t *testing.T) {
	var c Config
	if err := loader.Decode("t.yaml", []byte(base), &c); err != nil {
		t.Fatal(err)
	}
	if c.Listen != DefaultListen || c.PodHeader != DefaultPodHeader || c.Scrape.Interval != 50*time.Millisecond ||
		c.Retry.MaxAttempts != 3 || c.Queue.MaxWait != 2*time.Second || c.MaxBodyBytes != DefaultMaxBodyBytes {
		t.Errorf("defaults not applied: %+v", c)
	}
	if c.Scrape.IdleInterval != time.Second {
		t.Errorf("scrape.idle_interval default = %v, want 1s", c.Scrape.IdleInterval)
	}
	if c.Scheduler.Weight(picker.ScorerPrefix) != picker.DefaultProfile().Weight(picker.ScorerPrefix) {
		t.Errorf("scheduler default not applied: %+v", c.Scheduler)
	}
}

func TestSchedulerOverride(t *testing.T) {
	var c Config
	data := base + "scheduler:\n  scorers:\n    - {name: queue, weight: 7}\n"
	if err := loader.Decode("t.yaml", []byte(data), &c); err != nil {
		t.Fatal(err)
	}
	if w := c.Scheduler.Weight(picker.ScorerQueue); w != 7 {
		t.Errorf("queue weight = %v, want 7", w)
	}
	if w := c.Scheduler.Weight(picker.ScorerKVCache); w == 0 {
		t.Error("kv-cache scorer lost by a one-weight override")
	}
}

func TestValidate(t *testing.T) {
	tests := []struct {
		name, yaml, want string
	}{
		{"no auth source", "pools: [{name: a, model: m}]\n", "no token source"},
		{"auth disabled ok", "auth: {disabled: true}\n", ""},
		{"unknown field", base + "bogus: 1\n", "bogus"},
		{"unknown pool", base + "  - {name: p1, address: \"127.0.0.1:1\", pool: nope}\n", `unknown pool "nope"`},
		{"bad address", base + "  - {name: p1, address: localhost, pool: llama}\n", "not host:port"},
		{"bad engine", base + "  - {name: p1, address: \"127.0.0.1:1\", pool: llama, engine: triton}\n", `unknown engine "triton"`},
		{"negative gpus", base + "  - {name: p1, address: \"127.0.0.1:1\", pool: llama, gpus: -1}\n", `pods[1].gpus: -1 is negative`},
		{"duplicate pod", base + "  - {name: p0, address: \"127.0.0.1:1\", pool: llama}\n", `duplicate pod "p0"`},
		{"adapter base unknown", base + "models: [{name: x-lora, base: nope}]\n", `models[0].base: "nope"`},
		{"bad scorer", base + "scheduler: {scorers: [{name: magic, weight: 1}]}\n", `unknown scorer "magic"`},
		{"negative timeout", base + "timeouts: {connect: -1s}\n", "timeouts.connect"},
		{"zero attempts", base + "retry: {max_attempts: -1}\n", "max_attempts"},
		{"idle interval below interval", base + "scrape: {interval: 100ms, idle_interval: 50ms}\n", "scrape.idle_interval 50ms is shorter than scrape.interval 100ms"},
		{"negative idle interval", base + "scrape: {idle_interval: -1s}\n", "scrape.idle_interval -1s is negative"},
		{"idle interval equal to interval", base + "scrape: {interval: 100ms, idle_interval: 100ms}\n", ""},
		{"tracing otlp ok", base + "tracing: {exporter: otlp, endpoint: 'http://collector:4318', sample_ratio: 0.1}\n", ""},
		{"tracing bad exporter", base + "tracing: {exporter: zipkin}\n", `tracing.exporter "zipkin"`},
		{"tracing unknown key", base + "tracing: {exporter: console, ratio: 1}\n", "ratio"},
		{"adapter clashes with model", "auth: {disabled: true}\npools: [{name: a, model: m}, {name: b, model: n, adapters: [m]}]\n", `adapter "m"`},
		// Each at its key, with file:line:column.
		{"duplicate pod address", base + "  - {name: p1, address: \"127.0.0.1:8101\", pool: llama}\n", `t.yaml:7:16: pods[1].address: "127.0.0.1:8101" is also pods[0]'s address (p0)`},
		{"explicit zero attempts", base + "retry: {max_attempts: 0}\n", "t.yaml:7:23: retry.max_attempts: want a whole number ≥ 1, got 0"},
		{"explicit zero unready_after", base + "scrape: {unready_after: 0}\n", "scrape.unready_after: want a whole number ≥ 1, got 0"},
		{"scorer at its entry in the file", base + "scheduler:\n  scorers:\n    - {name: queue, weight: 1}\n    - {name: magic, weight: 1}\n", `t.yaml:10:7: scheduler.scorers[1]: unknown scorer "magic"`},
		{"negative weight at its scorer", base + "scheduler: {scorers: [{name: queue, weight: -2}]}\n", `t.yaml:7:23: scheduler.scorers[0]: scorer "queue": weight -2 is negative`},
		{"listen clash", base + "listen: 127.0.0.1:9000\nmetrics_listen: 127.0.0.1:9000\n", `t.yaml:8:1: metrics_listen: "127.0.0.1:9000" clashes with listen ("127.0.0.1:9000")`},
		{"wildcard listen clash", base + "listen: :9000\npeers: {listen: 127.0.0.1:9000, static: [127.0.0.1:9000], insecure_plaintext: true}\n", `peers.listen: "127.0.0.1:9000" clashes with listen`},
		{"pod in unknown pool", base + "  - {name: p1, address: \"127.0.0.1:1\", pool: lama}\n", `t.yaml:7:40: pods[1].pool: unknown pool "lama" (pools: llama)`},
		{"did you mean", base + "scrape: {intervall: 1s}\n", `t.yaml:7:10: scrape.intervall: unknown key "intervall"; did you mean "interval"?`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var c Config
			err := loader.Decode("t.yaml", []byte(tt.yaml), &c)
			if tt.want == "" {
				if err != nil {
					t.Fatalf("unexpected error: %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error = %v, want it to contain %q", err, tt.want)
			}
		})
	}
}

func TestResolveTokens(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "tokens")
	if err := os.WriteFile(file, []byte("# comment\nfile-token\n\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("TEST_TIER1_TOKENS", "env-a, env-b")
	got, err := AuthConfig{Tokens: []string{"inline"}, TokenEnv: "TEST_TIER1_TOKENS", TokenFile: file}.ResolveTokens()
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(got, ",") != "inline,env-a,env-b,file-token" {
		t.Errorf("tokens = %q", got)
	}
	_, err = AuthConfig{TokenEnv: "TEST_TIER1_UNSET_VAR"}.ResolveTokens()
	if err == nil {
		t.Error("no tokens resolved but no error")
	}
	if got, err := (AuthConfig{Disabled: true}).ResolveTokens(); err != nil || got != nil {
		t.Errorf("disabled: %q, %v", got, err)
	}
}

// The shipped example must stay loadable.
func TestExampleConfig(t *testing.T) {
	t.Setenv("INFERGATE_TIER1_TOKEN", "example")
	var c Config
	if err := loader.Load("../../examples/tier1.yaml", &c); err != nil {
		t.Fatal(err)
	}
	if len(c.Pods) != 8 || len(c.Pools) != 2 || c.Listen != "127.0.0.1:9001" {
		t.Errorf("example: %d pods, %d pools, listen %s", len(c.Pods), len(c.Pools), c.Listen)
	}
	if _, err := c.Auth.ResolveTokens(); err != nil {
		t.Error(err)
	}
}
