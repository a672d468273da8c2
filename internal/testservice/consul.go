package testservice

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"
)

// Consul is a real single-node Consul agent in dev mode (in-memory state,
// server and client in one process) listening only on 127.0.0.1. Its ports
// stay the same across Stop and Start, so clients built from Addr keep
// working after a restart; dev mode keeps no state across restarts.
type Consul struct {
	t       testing.TB
	bin     string
	logPath string
	cfgPath string // extra HCL config file, "" for none
	token   string // management token when ACLs are on
	ports   consulPorts

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{}
}

type consulPorts struct {
	http, dns, serfLAN, serfWAN, server, grpc int
}

// ConsulOpts configures StartConsulOpts.
type ConsulOpts struct {
	// ACLToken, when set, starts the agent with ACLs enabled, default policy
	// deny, and ACLToken as the initial management token (also used as the
	// agent's own token). Clients then need a token for everything; use
	// Token to create policies and tokens.
	ACLToken string
}

// StartConsul starts a Consul agent (`consul agent -dev`) on free loopback
// ports and waits until it has elected itself leader. The binary comes from
// INFERGATE_CONSUL, the tools cache or PATH (see Binary); the agent is
// stopped at test cleanup.
func StartConsul(t testing.TB) *Consul {
	t.Helper()
	return StartConsulOpts(t, ConsulOpts{})
}

// StartConsulOpts is StartConsul with options.
func StartConsulOpts(t testing.TB, o ConsulOpts) *Consul {
	t.Helper()
	dir := t.TempDir()
	c := &Consul{
		t:       t,
		bin:     Binary(t, "INFERGATE_CONSUL", "consul"),
		logPath: filepath.Join(dir, "consul.log"),
		token:   o.ACLToken,
		ports:   freeConsulPorts(t),
	}
	if o.ACLToken != "" {
		// Consul 1.11+ spells the bootstrap token initial_management (it
		// was master before). The agent token lets the agent register its
		// own node under default deny.
		hcl := fmt.Sprintf(`acl {
  enabled        = true
  default_policy = "deny"
  down_policy    = "extend-cache"
  tokens {
    initial_management = %q
    agent              = %q
  }
}
`, o.ACLToken, o.ACLToken)
		c.cfgPath = filepath.Join(dir, "acl.hcl")
		if err := os.WriteFile(c.cfgPath, []byte(hcl), 0o600); err != nil {
			t.Fatalf("testservice: consul config: %v", err)
		}
	}
	t.Cleanup(c.Stop)
	c.startFresh(t)
	return c
}

// startFresh starts the agent, on fresh ports again if one was taken.
func (c *Consul) startFresh(t testing.TB) {
	t.Helper()
	start := func() error {
		c.mu.Lock()
		defer c.mu.Unlock()
		return c.startLocked()
	}
	startOnFreePorts(t, start, func() { c.ports = freeConsulPorts(t) })
}

func freeConsulPorts(t testing.TB) consulPorts {
	return consulPorts{
		http: FreePort(t), dns: FreePort(t), serfLAN: FreePort(t),
		serfWAN: FreePort(t), server: FreePort(t), grpc: FreePort(t),
	}
}

// Addr is the agent's HTTP API address, host:port (what api.Config.Address
// takes).
func (c *Consul) Addr() string {
	return "127.0.0.1:" + strconv.Itoa(c.ports.http)
}

// Token is the management token the agent was started with ("" when ACLs
// are off). It survives Stop and Start: dev mode recreates it at every start
// from the same configuration, though tokens created through the API are
// lost.
func (c *Consul) Token() string { return c.token }

// Start starts the agent on the same ports as before and waits for a leader.
// It is a no-op when the agent is running.
func (c *Consul) Start() {
	c.t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.startLocked(); err != nil {
		c.t.Fatalf("testservice: %v", err)
	}
}

// startLocked starts the agent unless it runs; c.mu is held.
func (c *Consul) startLocked() error {
	if c.cmd != nil {
		return nil
	}
	p := c.ports
	args := []string{
		"agent", "-dev",
		"-node", "infergate-test",
		"-bind", "127.0.0.1", "-client", "127.0.0.1",
		"-http-port", strconv.Itoa(p.http),
		"-dns-port", strconv.Itoa(p.dns),
		"-serf-lan-port", strconv.Itoa(p.serfLAN),
		"-serf-wan-port", strconv.Itoa(p.serfWAN),
		"-server-port", strconv.Itoa(p.server),
		"-grpc-port", strconv.Itoa(p.grpc),
		"-log-level", "warn",
		// No outbound traffic and no gRPC TLS listener on a fixed port.
		"-hcl", "disable_update_check = true",
		"-hcl", "ports { grpc_tls = -1 }",
	}
	if c.cfgPath != "" {
		args = append(args, "-config-file", c.cfgPath)
	}
	var logStart int64 // the log is appended across starts: read this one's
	if fi, err := os.Stat(c.logPath); err == nil {
		logStart = fi.Size()
	}
	cmd, done, err := startLogged(c.bin, args, c.logPath)
	if err != nil {
		return fmt.Errorf("consul: %w", err)
	}
	c.cmd, c.done = cmd, done
	if err := c.waitLeader(done, 30*time.Second); err != nil {
		c.stopLocked()
		log, _ := os.ReadFile(c.logPath)
		log = log[min(int(logStart), len(log)):]
		return fmt.Errorf("consul did not become ready: %w\n%s", markPortTaken(log, err), tail(log, 4000))
	}
	return nil
}

// Stop stops the agent and waits for it to exit. It is a no-op when the
// agent is not running.
func (c *Consul) Stop() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.stopLocked()
}

func (c *Consul) stopLocked() {
	if c.cmd == nil {
		return
	}
	terminate(c.cmd, c.done, 10*time.Second)
	c.cmd, c.done = nil, nil
}

// waitLeader polls /v1/status/leader until it names a leader and the local
// node is in the catalog (before that, registrations can fail).
func (c *Consul) waitLeader(exited <-chan struct{}, limit time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	base := "http://" + c.Addr()
	for {
		if ok := get(ctx, base+"/v1/status/leader", c.token, func(b []byte) bool {
			return len(bytes.Trim(bytes.TrimSpace(b), `"`)) > 0
		}); ok {
			if get(ctx, base+"/v1/catalog/node/infergate-test", c.token, func(b []byte) bool {
				return bytes.Contains(b, []byte(`"Node"`))
			}) {
				return nil
			}
		}
		select {
		case <-exited:
			return fmt.Errorf("consul exited")
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func get(ctx context.Context, url, token string, ok func([]byte) bool) bool {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return false
	}
	if token != "" {
		req.Header.Set("X-Consul-Token", token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return false
	}
	defer resp.Body.Close()
	var buf bytes.Buffer
	_, _ = buf.ReadFrom(resp.Body)
	return resp.StatusCode == http.StatusOK && ok(buf.Bytes())
}

func tail(b []byte, n int) []byte {
	if len(b) > n {
		return b[len(b)-n:]
	}
	return b
}
