package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	loader "github.com/infergate/infergate/shared/config"
)

func TestPeersConfig(t *testing.T) {
	const tls = `tls: {cert_file: /c.crt, key_file: /c.key, ca_file: /ca.crt}`
	tests := []struct {
		name, yaml, want string
		port             int
	}{
		{"off", base, "", 0},
		{"static", base + "peers: {listen: \":7946\", static: [\"10.0.0.2:7946\"], " + tls + "}\n", "", 7946},
		{"dns with port and server name", base + "peers: {listen: \":7946\", dns: tier1-peers.ns.svc, port: 7000, tls: {cert_file: /c, key_file: /k, ca_file: /ca, server_name: tier1-peers, min_version: \"1.2\"}}\n", "", 7000},
		{"no tls", base + "peers: {listen: \":7946\", static: [\"10.0.0.2:7946\"]}\n", "peers.tls: cert_file, key_file and ca_file are required", 0},
		{"tls without a CA", base + "peers: {listen: \":7946\", static: [\"10.0.0.2:7946\"], tls: {cert_file: /c, key_file: /k}}\n", "peers.tls: cert_file, key_file and ca_file", 0},
		{"bad min version", base + "peers: {listen: \":7946\", static: [\"10.0.0.2:7946\"], tls: {cert_file: /c, key_file: /k, ca_file: /ca, min_version: \"1.0\"}}\n", "peers.tls.min_version", 0},
		{"old token", base + "peers: {listen: \":7946\", static: [\"10.0.0.2:7946\"], token_env: T, " + tls + "}\n", "peers.token_env: removed", 0},
		{"old token file", base + "peers: {listen: \":7946\", static: [\"10.0.0.2:7946\"], token_file: /t}\n", "peers.token_file: removed", 0},
		{"old opt-out", base + "peers: {listen: \":7946\", static: [\"10.0.0.2:7946\"], disable_auth: true}\n", "peers.disable_auth: removed", 0},
		{"plaintext on loopback", base + "peers: {listen: \"127.0.0.1:7946\", static: [\"127.0.0.1:7947\", \"localhost:7948\"], insecure_plaintext: true}\n", "", 7946},
		{"plaintext on every interface", base + "peers: {listen: \":7946\", static: [\"127.0.0.1:7947\"], insecure_plaintext: true}\n", "peers.insecure_plaintext: peers.listen \":7946\" is not a loopback address", 0},
		{"plaintext to another host", base + "peers: {listen: \"127.0.0.1:7946\", static: [\"10.0.0.2:7946\"], insecure_plaintext: true}\n", "peers.static \"10.0.0.2:7946\" is not a loopback", 0},
		{"plaintext with dns", base + "peers: {listen: \"127.0.0.1:7946\", dns: x.svc, insecure_plaintext: true}\n", "discovery by peers.dns", 0},
		{"plaintext and tls", base + "peers: {listen: \"127.0.0.1:7946\", static: [\"127.0.0.1:1\"], insecure_plaintext: true, " + tls + "}\n", "exclusive", 0},
		{"two hash keys", base + "peers: {listen: \":1\", static: [\"a:1\"], hash_key_env: K, hash_key_file: /k, " + tls + "}\n", "one of hash_key_env and hash_key_file", 0},
		{"dns without a server name", base + "peers: {listen: \":7946\", dns: x.svc, " + tls + "}\n", "peers.tls.server_name: required", 0},
		{"no discovery", base + "peers: {listen: \":7946\", " + tls + "}\n", "no discovery", 0},
		{"bad listen", base + "peers: {listen: nope, static: [\"a:1\"], " + tls + "}\n", "peers.listen", 0},
		{"bad static", base + "peers: {listen: \":1\", static: [nope], " + tls + "}\n", "peers.static", 0},
		{"consul without agent", base + "peers: {listen: \":1\", consul: true, tls: {cert_file: /c, key_file: /k, ca_file: /ca, server_name: s}}\n", "consul.address", 0},
		{"negative ttl", base + "peers: {listen: \":1\", static: [\"a:1\"], ttl: -1s, " + tls + "}\n", "peers.ttl", 0},
		{"unknown tls key", base + "peers: {listen: \":1\", static: [\"a:1\"], tls: {cert_file: /c, key_file: /k, ca_file: /ca, client_ca_file: /x}}\n", "client_ca_file", 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var c Config
			err := loader.Decode("t.yaml", []byte(tt.yaml), &c)
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
}

func TestPeersHashKey(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "key")
	if err := os.WriteFile(file, []byte("  a-secret-of-enough-bytes\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	short := filepath.Join(dir, "short")
	if err := os.WriteFile(short, []byte("s3cret-short\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("TEST_PEERS_HASH_KEY", " another-secret-long-enough ")
	t.Setenv("TEST_PEERS_HASH_SHORT", "s3cret-short")
	for _, tt := range []struct {
		name    string
		p       PeersConfig
		want    string
		wantErr string
	}{
		{"none", PeersConfig{}, "", ""},
		{"file", PeersConfig{HashKeyFile: file}, "a-secret-of-enough-bytes", ""},
		{"env", PeersConfig{HashKeyEnv: "TEST_PEERS_HASH_KEY"}, "another-secret-long-enough", ""},
		{"unset env", PeersConfig{HashKeyEnv: "TEST_PEERS_HASH_UNSET"}, "", "peers.hash_key_env: $TEST_PEERS_HASH_UNSET is unset"},
		{"short env", PeersConfig{HashKeyEnv: "TEST_PEERS_HASH_SHORT"}, "", "want at least 16"},
		{"short file", PeersConfig{HashKeyFile: short}, "", short},
		{"missing file", PeersConfig{HashKeyFile: filepath.Join(dir, "nope")}, "", "peers.hash_key_file"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got, err := tt.p.ResolveHashKey()
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) || strings.Contains(err.Error(), "s3cret") {
					t.Fatalf("err = %v, want it to contain %q and never the value", err, tt.wantErr)
				}
				return
			}
			if err != nil || string(got) != tt.want {
				t.Fatalf("key = %q, %v; want %q", got, err, tt.want)
			}
		})
	}
}
