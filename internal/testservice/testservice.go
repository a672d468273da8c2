// Package testservice starts real services (Redis, Consul, etcd with
// kube-apiserver) for tests, each
// on free loopback ports in the test's temporary directory, and stops them
// at cleanup. When a service's binary is missing the test is skipped, unless
// the CI environment variable is set, in which case it fails: CI must run
// every test against the real thing.
package testservice

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
)

// FreePort returns a TCP port on 127.0.0.1 that was free a moment ago and
// that no earlier call in this test binary returned. The kernel may hand
// a just-closed ephemeral port out again, and two services given the same
// port fail to start (seen: two simulated fleets of one test).
func FreePort(t testing.TB) int {
	t.Helper()
	for range 100 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatalf("testservice: free port: %v", err)
		}
		p := l.Addr().(*net.TCPAddr).Port
		_ = l.Close()
		if handOut(p) {
			return p
		}
	}
	t.Fatal("testservice: no free port not handed out before")
	return 0
}

// handedOut is every port FreePort and FreeClusterPort returned in this
// test binary.
var handedOut = struct {
	sync.Mutex
	ports map[int]bool
}{ports: map[int]bool{}}

// handOut records p as handed out and reports whether it was new.
func handOut(p int) bool {
	handedOut.Lock()
	defer handedOut.Unlock()
	if handedOut.ports[p] {
		return false
	}
	handedOut.ports[p] = true
	return true
}

// Binary finds an executable by name: first in the environment variable env
// (a path), then in $HOME/.cache/infergate/bin (where scripts/tools.sh
// caches tools it builds), then on PATH. It skips the test when the binary is
// missing and CI is unset, and fails it when CI is set.
func Binary(t testing.TB, env, name string) string {
	t.Helper()
	if p := os.Getenv(env); p != "" {
		return p
	}
	if home, err := os.UserHomeDir(); err == nil {
		p := filepath.Join(home, ".cache", "infergate", "bin", name)
		if st, err := os.Stat(p); err == nil && !st.IsDir() {
			return p
		}
	}
	if p, err := exec.LookPath(name); err == nil {
		return p
	}
	msg := name + " not found (set " + env + ", or run `make tools` / install it)"
	if os.Getenv("CI") != "" {
		t.Fatal("testservice: " + msg)
	}
	t.Skip("testservice: " + msg)
	return ""
}

// FreeClusterPort is FreePort for a Redis Cluster node, which also listens
// on its port + 10,000 for the cluster bus: both must be free, and the
// port at most 55,535 (redis-server refuses to start otherwise).
func FreeClusterPort(t testing.TB) int {
	t.Helper()
	for range 200 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatalf("testservice: free port: %v", err)
		}
		p := l.Addr().(*net.TCPAddr).Port
		if p > 55535 {
			_ = l.Close()
			continue
		}
		bus, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p+10000)))
		_ = l.Close()
		if err != nil {
			continue
		}
		_ = bus.Close()
		if handOut(p) && handOut(p+10000) {
			return p
		}
	}
	t.Fatal("testservice: no free port whose cluster bus port is free too")
	return 0
}

// errPortTaken marks a start that failed because a port was in use.
var errPortTaken = errors.New("a port was taken")

// markPortTaken wraps err with errPortTaken when a server's log reports a
// failed bind (Consul writes "address already in use", Redis "Address").
func markPortTaken(log []byte, err error) error {
	if bytes.Contains(bytes.ToLower(log), []byte("address already in use")) {
		return fmt.Errorf("%w: %w", errPortTaken, err)
	}
	return err
}

// startOnFreePorts calls start, and again after repick has chosen fresh
// ports when it failed with errPortTaken (three tries in all). FreePort's
// ports are free when handed out, but another process (a test binary
// running alongside, an outgoing connection) can take one before the
// server binds it. Other errors fail the test.
func startOnFreePorts(t testing.TB, start func() error, repick func()) {
	t.Helper()
	for attempt := 1; ; attempt++ {
		err := start()
		if err == nil {
			return
		}
		if !errors.Is(err, errPortTaken) || attempt == 3 {
			t.Fatalf("testservice: %v", err)
		}
		t.Logf("testservice: %v; retrying on fresh ports", err)
		repick()
	}
}
