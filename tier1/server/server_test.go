package server

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/infergate/infergate/shared/config"
	tier1config "github.com/infergate/infergate/tier1/config"
)

func TestRegistration(t *testing.T) {
	cfg := &tier1config.Config{
		Cluster: "east-a",
		Region:  "us-east",
		Pools:   []tier1config.PoolConfig{{Name: "llama", Model: "llama-8b", Adapters: []string{"sql-lora"}}},
		Models:  []tier1config.ModelConfig{{Name: "chat-lora", Base: "llama-8b"}, {Name: "llama-8b"}},
		Consul:  tier1config.ConsulConfig{Address: "http://127.0.0.1:8500", Cost: 2.5, CostUnit: "mtok", Capacity: 64},
	}
	tests := []struct {
		name     string
		listen   *net.TCPAddr
		svcAddr  string
		wantHost func(string) bool
		wantPort int
	}{
		{"loopback listen", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 9001}, "", func(h string) bool { return h == "127.0.0.1" }, 9001},
		{"all interfaces announce a dialable address", &net.TCPAddr{IP: net.IPv4zero, Port: 8080}, "", func(h string) bool { return h != "0.0.0.0" && net.ParseIP(h) != nil }, 8080},
		{"configured service address wins", &net.TCPAddr{IP: net.IPv4zero, Port: 8080}, "tier1.east.example", func(h string) bool { return h == "tier1.east.example" }, 8080},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := *cfg
			c.Consul.ServiceAddress = tt.svcAddr
			reg, client, err := Registration(&c, tt.listen)
			if err != nil || client == nil {
				t.Fatalf("Registration: %v", err)
			}
			if !tt.wantHost(reg.Address) || reg.Port != tt.wantPort {
				t.Errorf("address = %s:%d", reg.Address, reg.Port)
			}
			if want := []string{"llama-8b", "sql-lora", "chat-lora"}; !slices.Equal(reg.Models, want) {
				t.Errorf("models = %v, want %v", reg.Models, want)
			}
			if !strings.HasPrefix(reg.ID, "infergate-tier1-east-a") {
				t.Errorf("id = %q", reg.ID)
			}
			if hn, _ := os.Hostname(); hn != "" && !strings.HasSuffix(reg.ID, fmt.Sprintf("-%s-%d", hn, tt.wantPort)) {
				t.Errorf("id %q does not name the replica's host %q", reg.ID, hn)
			}
			if !strings.HasSuffix(reg.CheckHTTP, "/ready") || reg.Cost != 2.5 || reg.CostUnit != "mtok" || reg.Capacity != 64 {
				t.Errorf("registration = %+v", reg)
			}
		})
	}
}

// /metrics is served on its own listener and no longer on the API port.
func TestMetricsOnOwnListener(t *testing.T) {
	var cfg Config
	yml := "auth: {disabled: true}\npools: [{name: p, model: m}]\npods: [{name: p0, address: \"127.0.0.1:1\", pool: p, engine: vllm}]\n"
	if err := config.Decode("t.yaml", []byte(yml), &cfg); err != nil {
		t.Fatal(err)
	}
	if cfg.MetricsListen != DefaultMetricsListen || !strings.HasPrefix(DefaultMetricsListen, "127.0.0.1:") {
		t.Fatalf("metrics_listen default %q is not loopback", cfg.MetricsListen)
	}
	api, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	mln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	srv, err := New(ctx, &cfg, Options{MetricsListener: mln, ShutdownTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx, api, nil) }()
	defer func() { cancel(); <-done }()

	get := func(addr string) (int, string) {
		t.Helper()
		for i := 0; ; i++ {
			resp, err := http.Get("http://" + addr + "/metrics")
			if err != nil {
				if i > 200 {
					t.Fatal(err)
				}
				time.Sleep(10 * time.Millisecond)
				continue
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			return resp.StatusCode, string(b)
		}
	}
	if code, body := get(mln.Addr().String()); code != 200 || !strings.Contains(body, "infergate_") {
		t.Errorf("metrics listener: %d %.200s", code, body)
	}
	if code, _ := get(api.Addr().String()); code != http.StatusNotFound {
		t.Errorf("API port /metrics: %d, want 404", code)
	}
}
