package testservice_test

import (
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/infergate/infergate/internal/testservice"
)

func TestConsulStopStart(t *testing.T) {
	c := testservice.StartConsul(t)
	leader := func() (string, error) {
		resp, err := http.Get("http://" + c.Addr() + "/v1/status/leader")
		if err != nil {
			return "", err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		return string(b), err
	}
	if l, err := leader(); err != nil || !strings.Contains(l, "127.0.0.1:") {
		t.Fatalf("leader = %q, %v", l, err)
	}
	if !strings.HasPrefix(c.Addr(), "127.0.0.1:") {
		t.Fatalf("Addr = %s, want loopback", c.Addr())
	}
	c.Stop()
	if _, err := leader(); err == nil {
		t.Fatal("agent still answers after Stop")
	}
	c.Start() // same ports
	if l, err := leader(); err != nil || !strings.Contains(l, "127.0.0.1:") {
		t.Fatalf("after restart: leader = %q, %v", l, err)
	}
}

// TestConsulACL starts an agent with ACLs on (default deny) and checks that
// the management token can do what an anonymous request cannot, also after
// a restart.
func TestConsulACL(t *testing.T) {
	const token = "11111111-2222-3333-4444-555555555555"
	c := testservice.StartConsulOpts(t, testservice.ConsulOpts{ACLToken: token})
	if c.Token() != token {
		t.Fatalf("Token = %q", c.Token())
	}
	self := func(tok string) int {
		t.Helper()
		req, err := http.NewRequest(http.MethodGet, "http://"+c.Addr()+"/v1/acl/token/self", nil)
		if err != nil {
			t.Fatal(err)
		}
		if tok != "" {
			req.Header.Set("X-Consul-Token", tok)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		_, _ = io.Copy(io.Discard, resp.Body)
		return resp.StatusCode
	}
	for _, tc := range []struct {
		name  string
		token string
		want  int
	}{
		{"management", token, http.StatusOK},
		{"anonymous", "", http.StatusForbidden},
		{"unknown", "00000000-0000-0000-0000-000000000000", http.StatusForbidden},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := self(tc.token); got != tc.want {
				t.Fatalf("GET /v1/acl/token/self = %d, want %d", got, tc.want)
			}
		})
	}
	c.Stop()
	c.Start()
	if got := self(token); got != http.StatusOK {
		t.Fatalf("after restart: GET /v1/acl/token/self = %d, want 200", got)
	}
}
