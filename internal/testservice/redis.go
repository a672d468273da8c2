package testservice

import (
	"bufio"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// Redis is a real redis-server process owned by a test.
type Redis struct {
	t        testing.TB
	bin      string
	dir      string
	port     int
	args     []string
	password string
	tls      *tls.Config // client side, when the server speaks TLS only

	mu  sync.Mutex
	cmd *exec.Cmd
}

// StartRedis starts redis-server on a free 127.0.0.1 port with persistence
// off, waits until it answers PING, and stops it at cleanup. It skips (or
// fails under CI) when redis-server is not installed.
func StartRedis(t testing.TB) *Redis {
	t.Helper()
	return StartRedisOpts(t, RedisOpts{})
}

// startFresh starts the server, on a fresh port (from port) again if its
// port was taken.
func (r *Redis) startFresh(t testing.TB, port func(testing.TB) int) {
	t.Helper()
	start := func() error {
		r.mu.Lock()
		defer r.mu.Unlock()
		return r.startLocked()
	}
	startOnFreePorts(t, start, func() { r.port = port(t) })
}

// RedisOpts select optional server features for StartRedisOpts.
type RedisOpts struct {
	// Password turns on AUTH (requirepass).
	Password string
	// TLS serves TLS only, with a certificate for 127.0.0.1 signed by a
	// throwaway CA; ClientTLS returns a config that trusts it.
	TLS bool
}

// StartRedisOpts is StartRedis with AUTH and/or TLS.
func StartRedisOpts(t testing.TB, o RedisOpts) *Redis {
	t.Helper()
	bin := Binary(t, "INFERGATE_REDIS_SERVER", "redis-server")
	r := &Redis{t: t, bin: bin, dir: t.TempDir(), port: FreePort(t), password: o.Password}
	if o.Password != "" {
		r.args = append(r.args, "--requirepass", o.Password)
	}
	if o.TLS {
		cfg, args, err := makeTLS(r.dir)
		if err != nil {
			t.Fatalf("testservice: redis tls: %v", err)
		}
		r.tls = cfg
		r.args = append(r.args, args...)
	}
	t.Cleanup(r.Stop)
	r.startFresh(t, FreePort)
	return r
}

// ClientTLS is the client TLS config for a TLS server (nil otherwise).
func (r *Redis) ClientTLS() *tls.Config {
	if r.tls == nil {
		return nil
	}
	return r.tls.Clone()
}

// CAFile is the PEM file of the CA that signed a TLS server's certificate.
func (r *Redis) CAFile() string { return filepath.Join(r.dir, "ca.pem") }

// Addr is host:port of the server.
func (r *Redis) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(r.port)) }

// Start (re)starts the server on the same port; a no-op while it runs.
func (r *Redis) Start() {
	r.t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := r.startLocked(); err != nil {
		r.t.Fatalf("testservice: %v", err)
	}
}

// startLocked starts the server unless it runs; r.mu is held.
func (r *Redis) startLocked() error {
	if r.cmd != nil {
		return nil
	}
	portArgs := []string{"--port", strconv.Itoa(r.port)}
	if r.tls != nil {
		portArgs = []string{"--port", "0", "--tls-port", strconv.Itoa(r.port)}
	}
	args := append(append(portArgs,
		"--bind", "127.0.0.1",
		"--save", "",
		"--appendonly", "no",
		"--dir", r.dir,
		"--daemonize", "no",
		"--protected-mode", "no",
	), r.args...)
	cmd := exec.Command(r.bin, args...)
	cmd.Dir = r.dir
	logf := filepath.Join(r.dir, fmt.Sprintf("redis-%d.log", r.port))
	cmd.Args = append(cmd.Args, "--logfile", logf)
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start redis-server: %w", err)
	}
	r.cmd = cmd
	if err := r.waitPing(10 * time.Second); err != nil {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		r.cmd = nil
		logTail, _ := os.ReadFile(logf)
		if len(logTail) > 2048 {
			logTail = logTail[len(logTail)-2048:]
		}
		return fmt.Errorf("redis-server on %s: %w\nits log:\n%s", r.Addr(), markPortTaken(logTail, err), logTail)
	}
	return nil
}

// Stop kills the server and waits for it to exit; a no-op when stopped.
func (r *Redis) Stop() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cmd == nil {
		return
	}
	_ = r.cmd.Process.Kill()
	_ = r.cmd.Wait()
	r.cmd = nil
}

// waitPing polls the server with a raw RESP PING so this package does not
// depend on a Redis client.
func (r *Redis) waitPing(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	var last error
	for time.Now().Before(deadline) {
		last = r.ping()
		if last == nil {
			return nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	return fmt.Errorf("no PONG after %v: %w", timeout, last)
}

func (r *Redis) ping() error {
	d := &net.Dialer{Timeout: 200 * time.Millisecond}
	var c net.Conn
	var err error
	if r.tls != nil {
		c, err = tls.DialWithDialer(d, "tcp", r.Addr(), r.tls)
	} else {
		c, err = d.Dial("tcp", r.Addr())
	}
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(500 * time.Millisecond))
	rd := bufio.NewReader(c)
	if r.password != "" {
		if _, err := fmt.Fprintf(c, "AUTH %s\r\n", r.password); err != nil {
			return err
		}
		if line, err := rd.ReadString('\n'); err != nil || !strings.HasPrefix(line, "+OK") {
			return fmt.Errorf("auth: %q %v", line, err)
		}
	}
	if _, err := c.Write([]byte("PING\r\n")); err != nil {
		return err
	}
	line, err := rd.ReadString('\n')
	if err != nil {
		return err
	}
	if !strings.HasPrefix(line, "+PONG") {
		return fmt.Errorf("unexpected reply %q", strings.TrimSpace(line))
	}
	return nil
}

// RedisCluster is a three-master Redis Cluster owned by a test.
type RedisCluster struct {
	Nodes []*Redis
}

// Addrs lists the masters' host:port, suitable for redis.ClusterOptions.
func (c *RedisCluster) Addrs() []string {
	out := make([]string, len(c.Nodes))
	for i, n := range c.Nodes {
		out[i] = n.Addr()
	}
	return out
}

// StartRedisCluster starts three cluster-enabled masters, splits the 16384
// slots between them with CLUSTER ADDSLOTSRANGE, joins them with CLUSTER
// MEET, and waits until every node reports cluster_state:ok.
func StartRedisCluster(t testing.TB) *RedisCluster {
	t.Helper()
	bin := Binary(t, "INFERGATE_REDIS_SERVER", "redis-server")
	c := &RedisCluster{}
	for i := 0; i < 3; i++ {
		dir := t.TempDir()
		r := &Redis{t: t, bin: bin, dir: dir, port: FreeClusterPort(t), args: []string{
			"--cluster-enabled", "yes",
			"--cluster-config-file", filepath.Join(dir, "nodes.conf"),
			"--cluster-node-timeout", "2000",
		}}
		t.Cleanup(r.Stop)
		r.startFresh(t, FreeClusterPort)
		c.Nodes = append(c.Nodes, r)
	}
	ranges := [][2]int{{0, 5460}, {5461, 10922}, {10923, 16383}}
	for i, n := range c.Nodes {
		if _, err := rawCommand(n.Addr(), "CLUSTER", "ADDSLOTSRANGE", strconv.Itoa(ranges[i][0]), strconv.Itoa(ranges[i][1])); err != nil {
			t.Fatalf("testservice: cluster addslots on %s: %v", n.Addr(), err)
		}
	}
	for _, n := range c.Nodes[1:] {
		if _, err := rawCommand(c.Nodes[0].Addr(), "CLUSTER", "MEET", "127.0.0.1", strconv.Itoa(n.port)); err != nil {
			t.Fatalf("testservice: cluster meet: %v", err)
		}
	}
	deadline := time.Now().Add(20 * time.Second)
	for _, n := range c.Nodes {
		for {
			info, err := rawCommand(n.Addr(), "CLUSTER", "INFO")
			if err == nil && strings.Contains(info, "cluster_state:ok") && strings.Contains(info, "cluster_known_nodes:3") {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("testservice: redis cluster not ok on %s: %v %s", n.Addr(), err, info)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	return c
}

// rawCommand sends one RESP command on a connection of its own and
// returns a simple or bulk reply.
func rawCommand(addr string, args ...string) (string, error) {
	out, err := rawCommands(addr, args)
	if err != nil {
		return "", err
	}
	return out[0], nil
}

// rawCommands sends the commands one after another on one connection and
// returns their replies; it stops at the first error reply. Commands whose
// meaning depends on the connection (WAIT counts replicas that acknowledged
// this connection's last write) must go through here together.
func rawCommands(addr string, cmds ...[]string) ([]string, error) {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(time.Duration(2*len(cmds)) * time.Second))
	rd := bufio.NewReader(c)
	var out []string
	for _, args := range cmds {
		var b strings.Builder
		fmt.Fprintf(&b, "*%d\r\n", len(args))
		for _, a := range args {
			fmt.Fprintf(&b, "$%d\r\n%s\r\n", len(a), a)
		}
		if _, err := c.Write([]byte(b.String())); err != nil {
			return out, err
		}
		reply, err := readReply(rd)
		if err != nil {
			return out, err
		}
		out = append(out, reply)
	}
	return out, nil
}

// readReply reads one simple, error, integer or bulk RESP reply.
func readReply(rd *bufio.Reader) (string, error) {
	line, err := rd.ReadString('\n')
	if err != nil {
		return "", err
	}
	line = strings.TrimRight(line, "\r\n")
	switch {
	case strings.HasPrefix(line, "+"):
		return line[1:], nil
	case strings.HasPrefix(line, "-"):
		return "", fmt.Errorf("redis: %s", line[1:])
	case strings.HasPrefix(line, "$"):
		n, err := strconv.Atoi(line[1:])
		if err != nil || n < 0 {
			return "", err
		}
		buf := make([]byte, n+2)
		if _, err := io.ReadFull(rd, buf); err != nil {
			return "", err
		}
		return string(buf[:n]), nil
	default:
		return line, nil
	}
}

// makeTLS writes a throwaway CA and a server certificate for 127.0.0.1
// into dir, and returns a client config trusting the CA plus the
// redis-server arguments that serve TLS with them.
func makeTLS(dir string) (*tls.Config, []string, error) {
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	now := time.Now()
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "infergate test CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, nil, err
	}
	ca, _ := x509.ParseCertificate(caDER)
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "127.0.0.1"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, DNSNames: []string{"localhost"},
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		return nil, nil, err
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, nil, err
	}
	files := map[string]*pem.Block{
		"ca.pem":     {Type: "CERTIFICATE", Bytes: caDER},
		"server.pem": {Type: "CERTIFICATE", Bytes: der},
		"server.key": {Type: "EC PRIVATE KEY", Bytes: keyDER},
	}
	for name, b := range files {
		if err := os.WriteFile(filepath.Join(dir, name), pem.EncodeToMemory(b), 0o600); err != nil {
			return nil, nil, err
		}
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca)
	args := []string{
		"--tls-cert-file", filepath.Join(dir, "server.pem"),
		"--tls-key-file", filepath.Join(dir, "server.key"),
		"--tls-ca-cert-file", filepath.Join(dir, "ca.pem"),
		"--tls-auth-clients", "no",
	}
	return &tls.Config{RootCAs: pool, ServerName: "127.0.0.1", MinVersion: tls.VersionTLS12}, args, nil
}
