package gateway_test

import (
	"context"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/infergate/infergate/tier2/gateway"
	"github.com/infergate/infergate/tier2/tenant"
)

// Tier 2 builds the request to Tier 1 afresh: whichever header the client
// authenticated with (Authorization, api-key, x-api-key), Tier 1 sees
// Tier 2's own token and none of the client's credentials, cookies,
// forwarding claims or routing headers. The authenticator is the real
// one over an in-memory tenant store.
func TestClientCredentialsNotForwardedToTier1(t *testing.T) {
	store, err := tenant.New(context.Background(), tenant.Options{Seed: []tenant.Tenant{{ID: "acme"}},
		SeedKeys: []tenant.SeedKey{{TenantID: "acme", Key: "sk-client-secret"}}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = store.Close() })
	auth, err := tenant.NewAuthenticator(context.Background(), store, nil)
	if err != nil {
		t.Fatal(err)
	}
	a := newTier1(t, "a", "east", "m")
	s := newStack(t, stackOpts{src: static(t, a.cluster(1, 10)), gateway: func(o *gateway.Options) { o.Auth = auth }})
	extra := []string{"Cookie", "session=secret", "Proxy-Authorization", "Basic secret", "Forwarded", "for=6.6.6.6",
		"X-Forwarded-For", "6.6.6.6", "X-Forwarded-Host", "admin.internal", "X-Real-Ip", "6.6.6.6",
		"X-Infergate-Priority", "100", "X-Gateway-Destination-Endpoint", "10.0.0.9:8000"}
	for _, tc := range []struct{ name, header string }{
		{"Authorization", "Authorization"},
		{"api-key", "Api-Key"},
		{"x-api-key", "X-Api-Key"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			val := "sk-client-secret"
			if tc.header == "Authorization" {
				val = "Bearer " + val
			}
			r := s.do(t, "", "/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"hi"}]}`,
				append([]string{tc.header, val}, extra...)...)
			if r.code != http.StatusOK {
				t.Fatalf("status %d %s", r.code, r.body)
			}
			up, _ := a.lastRequest()
			if got := up.Header.Get("Authorization"); got != "Bearer "+tier1Token {
				t.Errorf("Tier 1 saw Authorization %q, want Tier 2's token", got)
			}
			for k, v := range up.Header {
				joined := strings.Join(v, ",")
				if (k != "Authorization" && strings.Contains(joined, "secret")) || strings.Contains(joined, "6.6.6.6") ||
					strings.Contains(joined, "10.0.0.9") || strings.EqualFold(k, "X-Infergate-Priority") {
					t.Errorf("Tier 1 received %s: %q", k, v)
				}
			}
		})
	}
}

// The body-timeout 400 says what happened without the listener's or the
// client's socket address (the read error behind it names both).
func TestBodyTimeoutNamesNoAddress(t *testing.T) {
	a := newTier1(t, "a", "east", "m")
	s := newStack(t, stackOpts{src: static(t, a.cluster(1, 10)), gateway: func(o *gateway.Options) {
		o.BodyReadTimeout = 200 * time.Millisecond
	}})
	conn, br := stalledPost(t, s, "key-cost", 1000)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("no answer: %v", err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	body := string(b)
	if resp.StatusCode != http.StatusBadRequest || !strings.Contains(body, "body_timeout") || !strings.Contains(body, "200ms") {
		t.Fatalf("%d %s", resp.StatusCode, body)
	}
	_, srvPort, _ := net.SplitHostPort(conn.RemoteAddr().String())
	_, cliPort, _ := net.SplitHostPort(conn.LocalAddr().String())
	for _, leak := range []string{"127.0.0.1", ":" + srvPort, ":" + cliPort, "tcp", "i/o timeout"} {
		if strings.Contains(body, leak) {
			t.Errorf("error body names %q: %s", leak, body)
		}
	}
}
