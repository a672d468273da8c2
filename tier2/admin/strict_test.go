package admin

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/infergate/infergate/tier2/ratelimit"
	"github.com/infergate/infergate/tier2/tenant"
)

func errCode(m map[string]any) string {
	e, _ := m["error"].(map[string]any)
	c, _ := e["code"].(string)
	return c
}

// Admin bodies are read with exact keys: what encoding/json would accept
// case-insensitively, let the last duplicate win, or read null as zero
// (unlimited) is a 400 naming the field, and nothing is stored.
func TestExactKeys(t *testing.T) {
	store := memStore(t)
	c := newServer(t, store, nil, nil)
	limited := map[string]any{"limits": map[string]any{"rpm": 10, "tpm": 1000}}
	if code, body := c.do("POST", "/admin/v1/tenants", token, map[string]any{"id": "acme", "limits": limited["limits"]}); code != 201 {
		t.Fatalf("create: %d %v", code, body)
	}
	tests := []struct {
		name, method, path, body string
		code                     int
		param, errCode           string
	}{
		{"unknown key", "POST", "/admin/v1/tenants", `{"id":"x","limitz":{}}`, 400, "limitz", "unknown_field"},
		{"case variant of id", "POST", "/admin/v1/tenants", `{"ID":"x"}`, 400, "ID", "unknown_field"},
		{"case variant of limits", "PUT", "/admin/v1/tenants/acme", `{"Limits":{"rpm":0}}`, 400, "Limits", "unknown_field"},
		{"case variant nested", "PUT", "/admin/v1/tenants/acme/limits", `{"limits":{"RPM":0}}`, 400, "limits.RPM", "unknown_field"},
		{"unicode fold of rpm", "PUT", "/admin/v1/tenants/acme/limits", `{"limits":{"ſpm":1,"rpm":5}}`, 400, "limits.ſpm", "unknown_field"},
		{"duplicate limits, last null", "PUT", "/admin/v1/tenants/acme", `{"limits":{"rpm":10},"limits":null}`, 400, "limits", "duplicate_key"},
		{"duplicate rpm", "PUT", "/admin/v1/tenants/acme/limits", `{"limits":{"rpm":10,"rpm":0}}`, 400, "limits.rpm", "duplicate_key"},
		{"duplicate across case", "POST", "/admin/v1/tenants", `{"id":"x","Id":"y"}`, 400, "Id", "unknown_field"},
		{"duplicate model", "PUT", "/admin/v1/tenants/acme/limits", `{"limits":{},"model_limits":{"m":{"rpm":1},"m":{}}}`, 400, "model_limits.m", "duplicate_key"},
		{"null limits", "PUT", "/admin/v1/tenants/acme", `{"limits":null}`, 400, "limits", "invalid_field"},
		{"null limits on limits path", "PUT", "/admin/v1/tenants/acme/limits", `{"limits":null}`, 400, "limits", "invalid_field"},
		{"null rpm", "PUT", "/admin/v1/tenants/acme/limits", `{"limits":{"rpm":null}}`, 400, "limits.rpm", "invalid_field"},
		{"null model_limits", "PUT", "/admin/v1/tenants/acme/limits", `{"limits":{},"model_limits":null}`, 400, "model_limits", "invalid_field"},
		{"null model entry", "PUT", "/admin/v1/tenants/acme/limits", `{"limits":{},"model_limits":{"m":null}}`, 400, "model_limits.m", "invalid_field"},
		{"null drain", "PUT", "/admin/v1/clusters/c1/override", `{"drain":null}`, 400, "drain", "invalid_field"},
		{"null name", "PUT", "/admin/v1/tenants/acme", `{"name":null}`, 400, "name", "invalid_field"},
		{"null key name", "POST", "/admin/v1/tenants/acme/keys", `{"name":null}`, 400, "name", "invalid_field"},
		{"unknown key in key body", "POST", "/admin/v1/tenants/acme/keys", `{"nmae":"ci"}`, 400, "nmae", "unknown_field"},
		{"body null", "PUT", "/admin/v1/tenants/acme", `null`, 400, "", "invalid_json"},
		{"body array", "PUT", "/admin/v1/tenants/acme", `[]`, 400, "", "invalid_json"},
		{"invalid UTF-8", "PUT", "/admin/v1/tenants/acme", "{\"name\":\"\xff\"}", 400, "", "invalid_json"},
		{"wrong type", "PUT", "/admin/v1/tenants/acme/limits", `{"limits":{"rpm":"ten"}}`, 400, "limits.rpm", "invalid_field"},
		// null means "unset" only for the override's weight and cost:
		// the discovered value applies, as when the key is absent.
		{"null weight is unset", "PUT", "/admin/v1/clusters/c1/override?force=true", `{"drain":true,"weight":null,"cost":null}`, 200, "", ""},
		{"exact keys accepted", "PUT", "/admin/v1/tenants/acme/limits", `{"limits":{"rpm":10,"tpm":1000},"model_limits":{"M":{"rpm":1},"m":{"rpm":2}}}`, 200, "", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, body := c.do(tt.method, tt.path, token, tt.body)
			if code != tt.code {
				t.Fatalf("status %d, want %d: %v", code, tt.code, body)
			}
			if tt.errCode == "" {
				return
			}
			if errParam(body) != tt.param || errCode(body) != tt.errCode {
				t.Fatalf("param %q code %q, want %q %q: %v", errParam(body), errCode(body), tt.param, tt.errCode, body)
			}
		})
	}
	// Every refused body left the tenant as it was: limited.
	got, _ := store.Tenant("acme")
	if got.Limits.RPM != 10 || got.Limits.TPM != 1000 || got.Name != "" {
		t.Fatalf("tenant after refused bodies: %+v", got)
	}
	if _, ok := store.Tenant("x"); ok {
		t.Fatal("a tenant from a refused body was stored")
	}
}

// An unauthenticated admin request whose body never arrives gets its 401
// at once, not at the listener's body timeout, over a real socket and the
// http.Server settings Tier 2 serves the admin API with.
func TestUnauthenticatedStalledBody(t *testing.T) {
	s := New(Options{Store: memStore(t), Token: token})
	srv := httptest.NewUnstartedServer(s.Handler())
	srv.Config.ReadHeaderTimeout = 10 * time.Second
	srv.Config.ReadTimeout = 30 * time.Second // tier2/server's default body_read_timeout
	srv.Start()
	t.Cleanup(srv.Close)
	for _, tc := range []struct{ name, auth, path string }{
		{"no credential", "", "/admin/v1/tenants"},
		{"wrong token", "Authorization: Bearer nope\r\n", "/admin/v1/tenants"},
		{"wrong token, limits", "Authorization: Bearer nope\r\n", "/admin/v1/tenants/acme/limits"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			conn, err := net.Dial("tcp", srv.Listener.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			// Well under the 30s body timeout; the answer comes in
			// milliseconds when it comes before the body.
			_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
			head := "POST " + tc.path + " HTTP/1.1\r\nHost: x\r\n" + tc.auth + "Content-Type: application/json\r\nContent-Length: 100000\r\n\r\n{\"id\":"
			if _, err := io.WriteString(conn, head); err != nil {
				t.Fatal(err)
			}
			resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				t.Fatal("no answer before the body arrived: the server waited for it")
			}
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			if resp.StatusCode != http.StatusUnauthorized || !resp.Close {
				t.Fatalf("status %d, close %v; want 401 and the connection closed", resp.StatusCode, resp.Close)
			}
		})
	}
	// An authenticated request that is answered before its body is read
	// (unknown tenant) is not held either.
	conn, err := net.Dial("tcp", srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	_, _ = io.WriteString(conn, "PUT /admin/v1/tenants/ghost/limits HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "+token+"\r\nContent-Length: 1000\r\n\r\n{")
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("authenticated, tenant unknown: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound {
		t.Fatalf("authenticated, tenant unknown: %d", resp.StatusCode)
	}
}

type failingUsage struct{}

func (failingUsage) Usage(context.Context, *tenant.Tenant) (ratelimit.Usage, error) {
	return ratelimit.Usage{}, errors.New("dial tcp 10.0.0.5:6379: connect: connection refused")
}

// A usage query that fails says so without the store's address.
func TestUsageErrorNamesNoAddress(t *testing.T) {
	store := memStore(t)
	c := newServer(t, store, failingUsage{}, nil)
	if code, _ := c.do("POST", "/admin/v1/tenants", token, map[string]any{"id": "acme"}); code != 201 {
		t.Fatalf("create: %d", code)
	}
	code, body := c.do("GET", "/admin/v1/tenants/acme/usage", token, nil)
	if code != http.StatusServiceUnavailable || errCode(body) != "usage_unavailable" {
		t.Fatalf("%d %v", code, body)
	}
	if msg := fmt.Sprint(body); strings.Contains(msg, "10.0.0.5") || strings.Contains(msg, "6379") {
		t.Fatalf("error names the store's address: %s", msg)
	}
}
