package server

import (
	"strings"
	"testing"
	"time"

	"github.com/infergate/infergate/shared/config"
)

func TestExampleConfigLoads(t *testing.T) {
	var cfg Config
	if err := config.Load("../../examples/tier2.yaml", &cfg); err != nil {
		t.Fatal(err)
	}
	if cfg.Region != "us-east" || len(cfg.Clusters) != 1 || cfg.Clusters[0].CostUnit != "gpu-hour" || cfg.Routing.Breaker.OpenTimeout != 10*time.Second {
		t.Fatalf("decoded %+v", cfg)
	}
	if cfg.Admin.Listen != "127.0.0.1:8081" || cfg.Admin.TokenEnv != "INFERGATE_ADMIN_TOKEN" || len(cfg.Keys) != 1 || cfg.Keys[0].TenantID != "acme" {
		t.Fatalf("decoded admin %+v, keys %+v", cfg.Admin, cfg.Keys)
	}
}

func TestConfigErrors(t *testing.T) {
	for _, tc := range []struct{ name, yaml, want string }{
		{"no region", "clusters: [{name: a, region: r, address: 'http://x:1'}]", "region is required"},
		{"no clusters", "region: r", "either consul or clusters"},
		{"bad policy", "region: r\nconsul: {}\nrouting: {default_policy: cheap}", "unknown routing policy"},
		{"bad cluster", "region: r\nclusters: [{name: a, region: r, address: 'x:1'}]", "address"},
		{"unknown field", "region: r\nconsul: {}\nbogus: 1", "bogus"},
		{"unknown nested field", "region: r\nconsul: {adress: x}", "adress"},
		{"duplicate cluster", "region: r\nclusters: [{name: a, region: r, address: 'http://x:1'}, {name: a, region: r, address: 'http://x:2'}]", "duplicate"},
		{"admin without token", "region: r\nconsul: {}\nadmin: {listen: '127.0.0.1:0'}", "admin.token"},
		{"redis without address", "region: r\nconsul: {}\nredis: {db: 1}", "redis.addresses"},
		{"spill threshold", "region: r\nconsul: {}\nrouting: {spill_threshold: 2}", "spill_threshold"},
		{"tracing exporter", "region: r\nconsul: {}\ntracing: {exporter: stdout}", `tracing.exporter "stdout"`},
		{"tracing ratio", "region: r\nconsul: {}\ntracing: {exporter: otlp, sample_ratio: 2}", "tracing.sample_ratio"},
		{"tracing unknown key", "region: r\nconsul: {}\ntracing: {exporter: otlp, insecure: true}", "insecure"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var cfg Config
			err := config.Decode("test.yaml", []byte(tc.yaml), &cfg)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want it to mention %q", err, tc.want)
			}
		})
	}
}

func TestConfigDefaults(t *testing.T) {
	var cfg Config
	if err := config.Decode("test.yaml", []byte("region: r\nconsul: {}"), &cfg); err != nil {
		t.Fatal(err)
	}
	if cfg.Listen != "127.0.0.1:8080" || cfg.Consul.Address != "127.0.0.1:8500" {
		t.Fatalf("defaults: listen %q, consul %q", cfg.Listen, cfg.Consul.Address)
	}
}
