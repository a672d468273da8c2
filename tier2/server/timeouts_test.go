package server

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// dialStalled sends head (and nothing more) and returns a reader for the
// answer; reads give up after a generous 10s (the listeners' timeouts under
// test are a fraction of a second; before them there were none).
func dialStalled(t *testing.T, base, head string) *bufio.Reader {
	t.Helper()
	conn, err := net.Dial("tcp", strings.TrimPrefix(base, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(conn, head); err != nil {
		t.Fatal(err)
	}
	return bufio.NewReader(conn)
}

// readToClose reads what the server sends until it closes the connection.
func readToClose(t *testing.T, br *bufio.Reader) string {
	t.Helper()
	b, err := io.ReadAll(br)
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		t.Fatalf("the server held the connection open (got %q)", b)
	}
	return string(b)
}

func fastTimeouts(cfg Config) Config {
	cfg.Server = ServerConfig{ReadHeaderTimeout: 300 * time.Millisecond, BodyReadTimeout: 300 * time.Millisecond}
	return cfg
}

// Every listener drops a client that stalls: headers on all three, the
// body on the API (authenticated or not) and the admin API.
func TestListenerTimeouts(t *testing.T) {
	tier1 := startTier1(t)
	r := serve(t, fastTimeouts(staticConfig(tier1.URL)))
	stalledBody := func(auth string) string {
		return fmt.Sprintf("POST %%s HTTP/1.1\r\nHost: x\r\n%sContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{\"model\":", auth)
	}
	for _, tc := range []struct {
		name, base, head, want string
	}{
		{"api headers", r.base, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n", ""},
		{"admin headers", r.admin, "GET /admin/v1/tenants HTTP/1.1\r\nHost: x\r\n", ""},
		{"metrics headers", r.metrics, "GET /metrics HTTP/1.1\r\nHost: x\r\n", ""},
		{"api body, no credential", r.base, fmt.Sprintf(stalledBody(""), "/v1/chat/completions"), "401"},
		{"api body, authenticated", r.base, fmt.Sprintf(stalledBody("Authorization: Bearer sk-test\r\n"), "/v1/chat/completions"), "body_timeout"},
		{"admin body", r.admin, fmt.Sprintf(stalledBody("Authorization: Bearer admintoken\r\n"), "/admin/v1/tenants"), ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := readToClose(t, dialStalled(t, tc.base, tc.head))
			if !strings.Contains(got, tc.want) {
				t.Fatalf("answer %q lacks %q", got, tc.want)
			}
		})
	}
	if resp := r.post(t, "sk-test"); resp.StatusCode != http.StatusOK {
		t.Errorf("a normal request after the attacks: %d", resp.StatusCode)
	}
}

func TestServerConfigDefaults(t *testing.T) {
	var c Config
	c.SetDefaults()
	s := c.Server
	if s.ReadHeaderTimeout <= 0 || s.BodyReadTimeout <= 0 || s.IdleTimeout <= 0 || s.StreamWriteTimeout <= 0 || s.MaxStreamDuration <= 0 || s.MaxEventBytes <= 0 {
		t.Fatalf("server defaults missing: %+v", s)
	}
	if host, _, _ := net.SplitHostPort(c.Metrics.Listen); host != "127.0.0.1" {
		t.Fatalf("metrics listen %q is not loopback by default", c.Metrics.Listen)
	}
}
