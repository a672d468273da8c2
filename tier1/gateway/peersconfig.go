package gateway

import (
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"time"
)

// PeersConfig is the `peers:` section: how this replica shares routing
// state with the cluster's other Tier 1 replicas (tier1/peers,
// docs/tier1-replicas.md). It is read at start; changing it needs a
// restart.
type PeersConfig struct {
	// Listen is the peer listener, e.g. ":7946"; empty turns sharing off.
	Listen string `yaml:"listen"`
	// Peers are found by any of: a static list of host:port, a DNS name
	// (a Kubernetes headless Service) whose addresses are paired with
	// Port, or Consul's healthy infergate-tier1 instances of this cluster
	// (needs consul.address), also paired with Port. The list may include
	// this replica itself.
	Static []string `yaml:"static"`
	DNS    string   `yaml:"dns"`
	Consul bool     `yaml:"consul"`
	// Port is the peer port of discovered replicas; default Listen's.
	Port int `yaml:"port"`
	// The shared secret: required unless disable_auth is true.
	TokenEnv    string `yaml:"token_env"`
	TokenFile   string `yaml:"token_file"`
	DisableAuth bool   `yaml:"disable_auth"`
	// TTL: a silent replica's in-flight counts stop counting after it
	// (default 2s). Flush is the batching interval (default 5ms),
	// Heartbeat the full re-announcement (default 250ms), Refresh the
	// discovery interval (default 10s).
	TTL       time.Duration `yaml:"ttl"`
	Flush     time.Duration `yaml:"flush"`
	Heartbeat time.Duration `yaml:"heartbeat"`
	Refresh   time.Duration `yaml:"refresh"`
	// QueueLen bounds changes waiting to be sent (default 1024).
	QueueLen int `yaml:"queue_len"`
}

// Enabled reports whether sharing is configured.
func (p PeersConfig) Enabled() bool { return p.Listen != "" }

// PeerPort is the port discovered replicas listen on for peers.
func (p PeersConfig) PeerPort() int {
	if p.Port > 0 {
		return p.Port
	}
	_, port, _ := net.SplitHostPort(p.Listen)
	n, _ := strconv.Atoi(port)
	return n
}

// ResolveToken returns the shared peer token ("" when auth is disabled).
func (p PeersConfig) ResolveToken() (string, error) {
	if p.DisableAuth {
		return "", nil
	}
	if p.TokenEnv != "" {
		if v := strings.TrimSpace(os.Getenv(p.TokenEnv)); v != "" {
			return v, nil
		}
	}
	if p.TokenFile != "" {
		ts, err := readTokenFile(p.TokenFile)
		if err != nil {
			return "", fmt.Errorf("peers.token_file: %w", err)
		}
		if len(ts) > 0 {
			return ts[0], nil
		}
	}
	// Never name the value; only where it was expected.
	return "", fmt.Errorf("peers: no token found (token_env %q, token_file %q); set one or peers.disable_auth: true", p.TokenEnv, p.TokenFile)
}

func (p PeersConfig) validate(haveConsul bool) []error {
	if !p.Enabled() {
		return nil
	}
	var errs []error
	add := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if _, _, err := net.SplitHostPort(p.Listen); err != nil {
		add("peers.listen %q: %v", p.Listen, err)
	}
	if len(p.Static) == 0 && p.DNS == "" && !p.Consul {
		add("peers: no discovery; set peers.static, peers.dns or peers.consul")
	}
	for _, a := range p.Static {
		if _, _, err := net.SplitHostPort(a); err != nil {
			add("peers.static %q: %v", a, err)
		}
	}
	if p.Consul && !haveConsul {
		add("peers.consul needs consul.address")
	}
	if (p.DNS != "" || p.Consul) && (p.PeerPort() <= 0 || p.PeerPort() > 65535) {
		add("peers.port: discovered peers need a port (set peers.port or a port in peers.listen)")
	}
	if !p.DisableAuth && p.TokenEnv == "" && p.TokenFile == "" {
		errs = append(errs, errors.New("peers: no token source; set peers.token_env or peers.token_file, or peers.disable_auth: true"))
	}
	for name, d := range map[string]time.Duration{"peers.ttl": p.TTL, "peers.flush": p.Flush, "peers.heartbeat": p.Heartbeat, "peers.refresh": p.Refresh} {
		if d < 0 {
			add("%s %v is negative", name, d)
		}
	}
	if p.QueueLen < 0 {
		add("peers.queue_len %d is negative", p.QueueLen)
	}
	return errs
}
