package server

import (
	"net"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/infergate/infergate/tier1/gateway"
)

func TestRegistration(t *testing.T) {
	cfg := &gateway.Config{
		Cluster: "east-a",
		Region:  "us-east",
		Pools:   []gateway.PoolConfig{{Name: "llama", Model: "llama-8b", Adapters: []string{"sql-lora"}}},
		Models:  []gateway.ModelConfig{{Name: "chat-lora", Base: "llama-8b"}, {Name: "llama-8b"}},
		Consul:  gateway.ConsulConfig{Address: "http://127.0.0.1:8500", Cost: 2.5, CostUnit: "mtok", Capacity: 64},
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
			if hn, _ := os.Hostname(); hn != "" && !strings.HasSuffix(reg.ID, "-"+hn) {
				t.Errorf("id %q does not name the replica's host %q", reg.ID, hn)
			}
			if !strings.HasSuffix(reg.CheckHTTP, "/ready") || reg.Cost != 2.5 || reg.CostUnit != "mtok" || reg.Capacity != 64 {
				t.Errorf("registration = %+v", reg)
			}
		})
	}
}
