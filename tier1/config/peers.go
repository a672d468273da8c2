package config

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"time"

	"github.com/infergate/infergate/shared/tlsfiles"
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
	// TLS is the mesh's mutual TLS, required unless InsecurePlaintext:
	// every replica serves and dials with a certificate from the mesh CA
	// and accepts only peers holding one.
	TLS PeersTLS `yaml:"tls"`
	// InsecurePlaintext runs the mesh without TLS, so with no
	// authentication at all. Only for a single-host development stack:
	// it is rejected unless listen and every static peer are loopback
	// addresses and nothing is discovered (dns, consul).
	InsecurePlaintext bool `yaml:"insecure_plaintext"`
	// HashKeyFile or HashKeyEnv holds a per-deployment secret (at least
	// 16 bytes, the same on every replica) that keys the prefix block
	// hashes replicas record and stream, so they cannot be matched
	// against guessed prompts without it. Optional; without it the hashes
	// are the plain chained hashes.
	HashKeyFile string `yaml:"hash_key_file"`
	HashKeyEnv  string `yaml:"hash_key_env"`
	// Removed: TokenEnv, TokenFile and DisableAuth, the shared token of
	// the old hand-made handshake. Set, they are rejected with a pointer
	// to tls.
	TokenEnv    string `yaml:"token_env"`
	TokenFile   string `yaml:"token_file"`
	DisableAuth bool   `yaml:"disable_auth"`
	// Timing and buffering of the shared state.
	TTL       time.Duration `yaml:"ttl"`       // a silent replica's in-flight counts stop counting after it; default 2s
	Flush     time.Duration `yaml:"flush"`     // batching interval; default 5ms
	Heartbeat time.Duration `yaml:"heartbeat"` // full re-announcement; default 250ms
	Refresh   time.Duration `yaml:"refresh"`   // discovery interval; default 10s
	QueueLen  int           `yaml:"queue_len"` // changes waiting to be sent; default 1024
}

// PeersTLS is `peers.tls`: one certificate per replica, used both to
// serve and to dial, and the mesh CA that peers' certificates must chain
// to. The files are re-read as they rotate.
type PeersTLS struct {
	CertFile string `yaml:"cert_file"` // PEM chain, leaf first; server and client auth usages
	KeyFile  string `yaml:"key_file"`  // PEM private key of cert_file
	CAFile   string `yaml:"ca_file"`   // the mesh CA: a CA of its own, every certificate it issues is a member
	// ServerName is the name verified in a dialled peer's certificate;
	// default the host dialled when it is a DNS name. Required with DNS
	// or Consul discovery: those dial pod IPs, which certificates do not
	// name, so every replica's certificate carries this name instead.
	ServerName string `yaml:"server_name"`
	MinVersion string `yaml:"min_version"` // "1.3" (default) or "1.2"
}

// Enabled reports whether any key of the block is set.
func (t PeersTLS) Enabled() bool { return t != PeersTLS{} }

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

// ResolveHashKey returns the prefix hash key's secret, nil when none is
// configured. Errors name where it was expected, never its value.
func (p PeersConfig) ResolveHashKey() ([]byte, error) {
	var key []byte
	switch {
	case p.HashKeyEnv != "":
		key = bytes.TrimSpace([]byte(os.Getenv(p.HashKeyEnv)))
		if len(key) == 0 {
			return nil, fmt.Errorf("peers.hash_key_env: $%s is unset or empty", p.HashKeyEnv)
		}
		if len(key) < minHashKey {
			return nil, fmt.Errorf("peers.hash_key_env: $%s holds %d bytes, want at least %d", p.HashKeyEnv, len(key), minHashKey)
		}
	case p.HashKeyFile != "":
		b, err := os.ReadFile(p.HashKeyFile)
		if err != nil {
			return nil, fmt.Errorf("peers.hash_key_file: %w", err)
		}
		if key = bytes.TrimSpace(b); len(key) < minHashKey {
			return nil, fmt.Errorf("peers.hash_key_file: %s holds %d bytes, want at least %d", p.HashKeyFile, len(key), minHashKey)
		}
	}
	return key, nil
}

// minHashKey is prefix.MinKeyBytes (not imported: the gateway's config
// does not depend on the index's package for one constant).
const minHashKey = 16

// isLoopback reports whether host (an address's host part) can only be
// reached from this machine.
func isLoopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

func (p PeersConfig) validate(haveConsul bool) []error {
	var errs []error
	add := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	for _, k := range []struct {
		name string
		set  bool
	}{{"token_env", p.TokenEnv != ""}, {"token_file", p.TokenFile != ""}, {"disable_auth", p.DisableAuth}} {
		if k.set {
			add("peers.%s: removed; replicas now authenticate each other with mutual TLS: set peers.tls (cert_file, key_file, ca_file), see docs/tier1-replicas.md", k.name)
		}
	}
	if !p.Enabled() {
		return errs
	}
	host, _, err := net.SplitHostPort(p.Listen)
	if err != nil {
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
	switch {
	case p.InsecurePlaintext && p.TLS.Enabled():
		add("peers.insecure_plaintext and peers.tls are exclusive")
	case p.InsecurePlaintext:
		// Plaintext has no authentication: anything that can reach the
		// port could feed this replica's routing. Only one machine may.
		if err == nil && !isLoopback(host) {
			add("peers.insecure_plaintext: peers.listen %q is not a loopback address (want e.g. 127.0.0.1:7946); the plaintext mesh is for a single-host development stack only", p.Listen)
		}
		for _, a := range p.Static {
			if h, _, err := net.SplitHostPort(a); err == nil && !isLoopback(h) {
				add("peers.insecure_plaintext: peers.static %q is not a loopback address", a)
			}
		}
		if p.DNS != "" || p.Consul {
			add("peers.insecure_plaintext: discovery by peers.dns or peers.consul reaches other hosts; use peers.tls")
		}
	default:
		t := p.TLS
		if t.CertFile == "" || t.KeyFile == "" || t.CAFile == "" {
			errs = append(errs, errors.New("peers.tls: cert_file, key_file and ca_file are required (replicas authenticate each other with mutual TLS; a single-host development stack may set peers.insecure_plaintext: true instead)"))
		}
		if t.ServerName == "" && (p.DNS != "" || p.Consul) {
			errs = append(errs, errors.New("peers.tls.server_name: required with peers.dns or peers.consul (peers are dialled by IP address; set the DNS name every replica's certificate carries)"))
		}
		if err := (tlsfiles.Client{MinVersion: t.MinVersion}).Validate("peers.tls"); err != nil {
			errs = append(errs, err)
		}
	}
	if p.HashKeyEnv != "" && p.HashKeyFile != "" {
		add("peers: set one of hash_key_env and hash_key_file")
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
