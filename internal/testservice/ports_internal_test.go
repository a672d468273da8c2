package testservice

import (
	"net"
	"net/http"
	"path/filepath"
	"strconv"
	"testing"
)

// A port taken between FreePort and the agent's bind (here the DNS port,
// held by a listener) makes the start retry on fresh ports instead of
// failing the test.
func TestConsulRetriesOnTakenPort(t *testing.T) {
	taken := holdPort(t)
	c := &Consul{
		t:       t,
		bin:     Binary(t, "INFERGATE_CONSUL", "consul"),
		logPath: filepath.Join(t.TempDir(), "consul.log"),
		ports:   freeConsulPorts(t),
	}
	c.ports.dns = taken
	t.Cleanup(c.Stop)
	c.startFresh(t)
	if c.ports.dns == taken {
		t.Fatalf("agent runs with the taken DNS port %d", taken)
	}
	resp, err := http.Get("http://" + c.Addr() + "/v1/status/leader")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("leader: status %d on port %s", resp.StatusCode, strconv.Itoa(c.ports.http))
	}
}

// The same for Redis: its port taken by a listener.
func TestRedisRetriesOnTakenPort(t *testing.T) {
	taken := holdPort(t)
	r := &Redis{t: t, bin: Binary(t, "INFERGATE_REDIS_SERVER", "redis-server"), dir: t.TempDir(), port: taken}
	t.Cleanup(r.Stop)
	r.startFresh(t, FreePort)
	if r.port == taken {
		t.Fatalf("server runs on the taken port %d", taken)
	}
	if err := r.ping(); err != nil {
		t.Fatal(err)
	}
}

// holdPort returns a loopback port a listener holds until the test ends.
func holdPort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l.Addr().(*net.TCPAddr).Port
}
