package gateway

import (
	"strings"
	"testing"

	"github.com/infergate/infergate/shared/config"
)

func TestPeersConfig(t *testing.T) {
	tests := []struct {
		name, yaml, want string
		port             int
	}{
		{"off", base, "", 0},
		{"static", base + "peers: {listen: \":7946\", static: [\"10.0.0.2:7946\"], token_env: T}\n", "", 7946},
		{"dns with port", base + "peers: {listen: \":7946\", dns: tier1-peers.ns.svc, port: 7000, token_file: /t}\n", "", 7000},
		{"no token", base + "peers: {listen: \":7946\", static: [\"10.0.0.2:7946\"]}\n", "peers: no token source", 0},
		{"auth off explicitly", base + "peers: {listen: \":7946\", static: [\"10.0.0.2:7946\"], disable_auth: true}\n", "", 7946},
		{"no discovery", base + "peers: {listen: \":7946\", token_env: T}\n", "no discovery", 0},
		{"bad listen", base + "peers: {listen: nope, static: [\"a:1\"], token_env: T}\n", "peers.listen", 0},
		{"bad static", base + "peers: {listen: \":1\", static: [nope], token_env: T}\n", "peers.static", 0},
		{"consul without agent", base + "peers: {listen: \":1\", consul: true, token_env: T}\n", "consul.address", 0},
		{"negative ttl", base + "peers: {listen: \":1\", static: [\"a:1\"], token_env: T, ttl: -1s}\n", "peers.ttl", 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var c Config
			err := config.Decode("t.yaml", []byte(tt.yaml), &c)
			if tt.want != "" {
				if err == nil || !strings.Contains(err.Error(), tt.want) {
					t.Fatalf("error = %v, want it to contain %q", err, tt.want)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if tt.port != 0 && c.Peers.PeerPort() != tt.port {
				t.Errorf("peer port = %d, want %d", c.Peers.PeerPort(), tt.port)
			}
		})
	}
	t.Setenv("TEST_PEERS_TOKEN", " s3cret ")
	if tok, err := (PeersConfig{TokenEnv: "TEST_PEERS_TOKEN"}).ResolveToken(); err != nil || tok != "s3cret" {
		t.Errorf("token = %q, %v", tok, err)
	}
	_, err := PeersConfig{TokenEnv: "TEST_PEERS_UNSET"}.ResolveToken()
	if err == nil || strings.Contains(err.Error(), "s3cret") {
		t.Errorf("missing token: err = %v", err)
	}
}
