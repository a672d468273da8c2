package server

import (
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"math/big"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/infergate/infergate/internal/testpki"
	"github.com/infergate/infergate/shared/config"
)

// jwksIDP is a real HTTPS identity provider on loopback behind a private
// test CA: an OpenID Connect discovery document and a JWKS that the test
// rotates.
type jwksIDP struct {
	*httptest.Server
	caFile string
	mu     sync.Mutex
	keys   []*rsa.PrivateKey // published, kid = index name
	kids   []string
}

func startJWKSIDP(t *testing.T) *jwksIDP {
	t.Helper()
	ca := testpki.NewCA(t, "idp CA")
	leaf := ca.Issue(t, testpki.LeafOptions{})
	f := testpki.Write(t, t.TempDir(), "idp", leaf, ca)
	cert, err := tls.X509KeyPair(leaf.CertPEM, leaf.KeyPEM)
	if err != nil {
		t.Fatal(err)
	}
	p := &jwksIDP{caFile: f.CA}
	p.Server = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		switch r.URL.Path {
		case "/.well-known/openid-configuration":
			_ = json.NewEncoder(w).Encode(map[string]string{"issuer": p.URL, "jwks_uri": p.URL + "/keys"})
		case "/keys":
			p.mu.Lock()
			defer p.mu.Unlock()
			var keys []map[string]string
			for i, k := range p.keys {
				keys = append(keys, map[string]string{"kty": "RSA", "kid": p.kids[i], "use": "sig", "alg": "RS256",
					"n": base64.RawURLEncoding.EncodeToString(k.N.Bytes()),
					"e": base64.RawURLEncoding.EncodeToString(big.NewInt(int64(k.E)).Bytes())})
			}
			_ = json.NewEncoder(w).Encode(map[string]any{"keys": keys})
		default:
			http.NotFound(w, r)
		}
	}))
	p.TLS = &tls.Config{Certificates: []tls.Certificate{cert}}
	p.StartTLS()
	t.Cleanup(p.Close)
	return p
}

func (p *jwksIDP) publish(kid string, k *rsa.PrivateKey) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.keys, p.kids = []*rsa.PrivateKey{k}, []string{kid}
}

func signRS256(t *testing.T, k *rsa.PrivateKey, kid string, c jwt.MapClaims) string {
	t.Helper()
	tok := jwt.NewWithClaims(jwt.SigningMethodRS256, c)
	tok.Header["kid"] = kid
	s, err := tok.SignedString(k)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// Through Tier 2's real API listener, configured from YAML: OIDC discovery
// over TLS with a private CA, then a key rotation at the identity
// provider picked up without a restart; wrong audience, an unknown key and
// an expired token (beyond the leeway) get 401.
func TestJWTThroughFrontDoor(t *testing.T) {
	tier1 := startTier1(t)
	p := startJWKSIDP(t)
	keyA, _ := rsa.GenerateKey(rand.Reader, 2048)
	keyB, _ := rsa.GenerateKey(rand.Reader, 2048)
	stranger, _ := rsa.GenerateKey(rand.Reader, 2048)
	p.publish("key-a", keyA)
	yml := fmt.Sprintf(`
region: east
clusters: [{name: a, region: east, address: %q, models: [m], cost: 1}]
tier1: {token: t1secret, poll_interval: 100ms}
tenants: [{id: acme}]
jwt:
  oidc_discovery: true
  issuer: %q
  audience: [infergate, infergate-batch]
  leeway: 30s
  min_refresh_interval: 1s
  tls: {ca_file: %q}
`, tier1.URL, p.URL, p.caFile)
	var cfg Config
	if err := config.Decode("tier2.yaml", []byte(yml), &cfg); err != nil {
		t.Fatal(err)
	}
	r := serve(t, cfg)
	claims := func(over jwt.MapClaims) jwt.MapClaims {
		c := jwt.MapClaims{"sub": "acme", "iss": p.URL, "aud": "infergate", "exp": time.Now().Add(time.Hour).Unix()}
		for k, v := range over {
			c[k] = v
		}
		return c
	}
	if code := r.post(t, signRS256(t, keyA, "key-a", claims(nil))).StatusCode; code != http.StatusOK {
		t.Fatalf("token signed by the published key: %d", code)
	}
	p.publish("key-b", keyB)
	for _, tt := range []struct {
		name string
		tok  string
		want int
	}{
		{"rotated key B", signRS256(t, keyB, "key-b", claims(nil)), http.StatusOK},
		{"second audience", signRS256(t, keyB, "key-b", claims(jwt.MapClaims{"aud": "infergate-batch"})), http.StatusOK},
		{"expired within leeway", signRS256(t, keyB, "key-b", claims(jwt.MapClaims{"exp": time.Now().Add(-10 * time.Second).Unix()})), http.StatusOK},
		{"expired beyond leeway", signRS256(t, keyB, "key-b", claims(jwt.MapClaims{"exp": time.Now().Add(-time.Minute).Unix()})), http.StatusUnauthorized},
		{"wrong audience", signRS256(t, keyB, "key-b", claims(jwt.MapClaims{"aud": "billing"})), http.StatusUnauthorized},
		{"wrong issuer", signRS256(t, keyB, "key-b", claims(jwt.MapClaims{"iss": "https://elsewhere"})), http.StatusUnauthorized},
		{"unknown key", signRS256(t, stranger, "key-x", claims(nil)), http.StatusUnauthorized},
		{"unknown key with B's kid", signRS256(t, stranger, "key-b", claims(nil)), http.StatusUnauthorized},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if code := r.post(t, tt.tok).StatusCode; code != tt.want {
				t.Fatalf("status %d, want %d", code, tt.want)
			}
		})
	}
}

func TestJWTConfig(t *testing.T) {
	const base = "region: r\nconsul: {}\n"
	var cfg Config
	if err := config.Decode("t.yaml", []byte(base+"jwt: {jwks_url: 'https://idp/keys', audience: api, leeway: 45s, refresh_interval: 5m}"), &cfg); err != nil {
		t.Fatal(err)
	}
	if j := cfg.JWT; len(j.Audience) != 1 || j.Audience[0] != "api" || j.Leeway != 45*time.Second || j.RefreshInterval != 5*time.Minute {
		t.Fatalf("decoded %+v", j)
	}
	for _, tc := range []struct{ name, yaml, want string }{
		{"no key source", "jwt: {issuer: x}", "jwt: set at least one"},
		{"http jwks", "jwt: {jwks_url: 'http://idp/keys', audience: a}", "jwt.jwks_url"},
		{"remote without audience", "jwt: {jwks_url: 'https://idp/keys'}", "jwt.audience is required"},
		{"discovery without issuer", "jwt: {oidc_discovery: true, audience: a}", "jwt.issuer"},
		{"leeway too large", "jwt: {hmac_secret_env: S, leeway: 1h}", "jwt.leeway"},
		{"leeway not a duration", "jwt: {hmac_secret_env: S, leeway: lots}", "want a duration"},
		{"audience map", "jwt: {hmac_secret_env: S, audience: {a: b}}", "string or a list"},
		{"tiny refresh", "jwt: {jwks_url: 'https://idp/keys', audience: a, refresh_interval: 1ms}", "jwt.refresh_interval"},
		{"tls key typo", "jwt: {jwks_url: 'https://idp/keys', audience: a, tls: {ca: x}}", "ca"},
		{"ca_file at the wrong level", "jwt: {jwks_url: 'https://idp/keys', audience: a, ca_file: x}", "ca_file"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var cfg Config
			err := config.Decode("t.yaml", []byte(base+tc.yaml), &cfg)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want it to mention %q", err, tc.want)
			}
		})
	}
}
