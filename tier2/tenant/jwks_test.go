package tenant

import (
	"bytes"
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"encoding/base64"
	"encoding/json"
	"errors"
	"log/slog"
	"math/big"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/infergate/infergate/internal/testpki"
	"github.com/infergate/infergate/shared/tlsfiles"
)

// idp is a real HTTPS identity provider on loopback, with a certificate
// from a private test CA: it serves a JWKS that a test can rotate and an
// OpenID Connect discovery document.
type idp struct {
	*httptest.Server
	caFile string

	mu        sync.Mutex
	keys      []map[string]string // the JWKS "keys"
	docIssuer string              // the discovery document's issuer; default the server's URL
	status    int                 // non-zero: every answer has this status
	body      []byte              // non-nil: /jwks answers this instead

	jwksFetches atomic.Int64
}

func startIDP(t *testing.T) *idp {
	t.Helper()
	ca := testpki.NewCA(t, "idp test CA")
	leaf := ca.Issue(t, testpki.LeafOptions{})
	files := testpki.Write(t, t.TempDir(), "idp", leaf, ca)
	cert, err := tls.X509KeyPair(leaf.CertPEM, leaf.KeyPEM)
	if err != nil {
		t.Fatal(err)
	}
	p := &idp{caFile: files.CA}
	p.Server = httptest.NewUnstartedServer(http.HandlerFunc(p.serve))
	p.TLS = &tls.Config{Certificates: []tls.Certificate{cert}}
	p.StartTLS()
	t.Cleanup(p.Close)
	return p
}

func (p *idp) serve(w http.ResponseWriter, r *http.Request) {
	p.mu.Lock()
	status, keys, body, iss := p.status, p.keys, p.body, p.docIssuer
	p.mu.Unlock()
	if status != 0 {
		w.WriteHeader(status)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	switch r.URL.Path {
	case "/jwks":
		p.jwksFetches.Add(1)
		if body != nil {
			_, _ = w.Write(body)
			return
		}
		_ = json.NewEncoder(w).Encode(map[string]any{"keys": keys})
	case "/.well-known/openid-configuration":
		if iss == "" {
			iss = p.URL
		}
		_ = json.NewEncoder(w).Encode(map[string]any{"issuer": iss, "jwks_uri": p.URL + "/jwks",
			"authorization_endpoint": p.URL + "/authorize", "id_token_signing_alg_values_supported": []string{"RS256", "ES256"}})
	default:
		http.NotFound(w, r)
	}
}

func (p *idp) set(f func(p *idp)) {
	p.mu.Lock()
	defer p.mu.Unlock()
	f(p)
}

// signer is a private key with its kid.
type signer struct {
	kid    string
	key    crypto.Signer
	method jwt.SigningMethod
}

func newRSASigner(t *testing.T, kid string) signer {
	k, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	return signer{kid: kid, key: k, method: jwt.SigningMethodRS256}
}

func newECSigner(t *testing.T, kid string) signer {
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return signer{kid: kid, key: k, method: jwt.SigningMethodES256}
}

// jwk is the public half as a JWKS entry.
func (s signer) jwk() map[string]string {
	b64 := base64.RawURLEncoding.EncodeToString
	switch k := s.key.(type) {
	case *rsa.PrivateKey:
		return map[string]string{"kty": "RSA", "kid": s.kid, "use": "sig", "alg": "RS256",
			"n": b64(k.N.Bytes()), "e": b64(big.NewInt(int64(k.E)).Bytes())}
	case *ecdsa.PrivateKey:
		pt, _ := k.PublicKey.Bytes()
		return map[string]string{"kty": "EC", "kid": s.kid, "use": "sig", "crv": "P-256",
			"x": b64(pt[1:33]), "y": b64(pt[33:])}
	}
	panic("unknown key type")
}

// token signs claims (sub acme, aud infergate, an hour to live, unless
// overridden; a nil value removes the claim). withKid puts the kid in the
// header.
func (s signer) token(t *testing.T, withKid bool, over jwt.MapClaims) string {
	t.Helper()
	c := jwt.MapClaims{"sub": "acme", "aud": "infergate", "exp": time.Now().Add(time.Hour).Unix()}
	for k, v := range over {
		if v == nil {
			delete(c, k)
		} else {
			c[k] = v
		}
	}
	tok := jwt.NewWithClaims(s.method, c)
	if withKid {
		tok.Header["kid"] = s.kid
	}
	raw, err := tok.SignedString(s.key)
	if err != nil {
		t.Fatal(err)
	}
	return raw
}

// logBuffer collects log output for assertions on what an operator sees.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

func newJWTAuth(t *testing.T, o JWTOptions) (*Authenticator, *logBuffer) {
	t.Helper()
	s := newMemStore(t, Options{Seed: []Tenant{{ID: "acme"}}})
	logs := &logBuffer{}
	o.Logger = slog.New(slog.NewTextHandler(logs, nil))
	a, err := NewAuthenticator(context.Background(), s, &o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = a.Close() })
	return a, logs
}

func authBearer(a *Authenticator, tok string) error {
	r := httptest.NewRequest("POST", "/v1/chat/completions", nil)
	r.Header.Set("Authorization", "Bearer "+tok)
	tn, err := a.Authenticate(context.Background(), r)
	if err == nil && tn.ID != "acme" {
		return errors.New("wrong tenant " + tn.ID)
	}
	return err
}

// eventually polls cond until it holds or 10s pass (a generous bound for
// background refreshes of a fraction of a second).
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 10s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// A JWKS from an HTTPS URL behind a private CA: a token signed by its key
// is accepted; after the endpoint rotates to another key, tokens signed by
// the new key are accepted without a restart (the unknown kid forces a
// refresh), the old key's are refused, and so are an unknown key's.
func TestJWKSURLRotation(t *testing.T) {
	p := startIDP(t)
	keyA, keyB, keyC := newRSASigner(t, "a"), newECSigner(t, "b"), newRSASigner(t, "c")
	p.set(func(p *idp) { p.keys = []map[string]string{keyA.jwk()} })
	a, _ := newJWTAuth(t, JWTOptions{JWKSURL: p.URL + "/jwks", TLS: tlsfiles.Client{CAFile: p.caFile},
		Audience: []string{"infergate", "infergate-batch"}, MinRefreshInterval: time.Millisecond})
	if !a.JWKSLoaded() {
		t.Fatal("keys not loaded at start with the endpoint up")
	}
	if err := authBearer(a, keyA.token(t, true, nil)); err != nil {
		t.Fatalf("token signed by A: %v", err)
	}
	if err := authBearer(a, keyA.token(t, false, nil)); err != nil {
		t.Fatalf("token signed by A, no kid: %v", err)
	}

	p.set(func(p *idp) { p.keys = []map[string]string{keyB.jwk()} })
	before := p.jwksFetches.Load()
	tests := []struct {
		name string
		tok  string
		ok   bool
	}{
		{"new key B", keyB.token(t, true, nil), true},
		{"B, second audience", keyB.token(t, true, jwt.MapClaims{"aud": []string{"x", "infergate-batch"}}), true},
		{"B, wrong audience", keyB.token(t, true, jwt.MapClaims{"aud": "someone-else"}), false},
		{"B, no audience", keyB.token(t, true, jwt.MapClaims{"aud": nil}), false},
		{"B, expired", keyB.token(t, true, jwt.MapClaims{"exp": time.Now().Add(-time.Minute).Unix()}), false},
		{"rotated-out key A", keyA.token(t, true, nil), false},
		{"rotated-out key A, no kid", keyA.token(t, false, nil), false},
		{"unknown key C", keyC.token(t, true, nil), false},
		{"unknown key C posing as B", signer{kid: "b", key: keyC.key, method: jwt.SigningMethodRS256}.token(t, true, nil), false},
		{"unknown key C, no kid", keyC.token(t, false, nil), false},
		{"HS256 with no secret configured", hmacToken(t, []byte("guess"), "b"), false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := authBearer(a, tt.tok)
			if tt.ok && err != nil {
				t.Fatalf("refused: %v", err)
			}
			if !tt.ok && !errors.Is(err, ErrUnauthenticated) {
				t.Fatalf("err = %v, want ErrUnauthenticated", err)
			}
		})
	}
	if p.jwksFetches.Load() == before {
		t.Fatal("the rotation was picked up without a fetch")
	}
}

func hmacToken(t *testing.T, secret []byte, kid string) string {
	tok := jwt.NewWithClaims(jwt.SigningMethodHS256, jwt.MapClaims{"sub": "acme", "aud": "infergate", "exp": time.Now().Add(time.Hour).Unix()})
	tok.Header["kid"] = kid
	s, err := tok.SignedString(secret)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// Without an unknown kid to force it, the periodic refresh picks up a
// rotation.
func TestJWKSPeriodicRefresh(t *testing.T) {
	p := startIDP(t)
	keyA, keyB := newRSASigner(t, "a"), newRSASigner(t, "b")
	p.set(func(p *idp) { p.keys = []map[string]string{keyA.jwk()} })
	a, _ := newJWTAuth(t, JWTOptions{JWKSURL: p.URL + "/jwks", TLS: tlsfiles.Client{CAFile: p.caFile},
		Audience: []string{"infergate"}, RefreshInterval: 100 * time.Millisecond, MinRefreshInterval: time.Hour})
	tokB := keyB.token(t, false, nil)
	if err := authBearer(a, tokB); err == nil {
		t.Fatal("B accepted before it was published")
	}
	p.set(func(p *idp) { p.keys = []map[string]string{keyB.jwk()} })
	eventually(t, "B accepted after the periodic refresh", func() bool { return authBearer(a, tokB) == nil })
	if err := authBearer(a, keyA.token(t, false, nil)); err == nil {
		t.Fatal("A still accepted after it left the set")
	}
}

// OpenID Connect discovery: the JWKS URL comes from the issuer's
// discovery document, which must name the configured issuer. With a
// document naming another issuer, Tier 2 starts, refuses JWTs and logs
// why; once the document is right, keys load without a restart.
func TestOIDCDiscovery(t *testing.T) {
	p := startIDP(t)
	keyA, keyB := newRSASigner(t, "a"), newECSigner(t, "b")
	p.set(func(p *idp) {
		p.keys = []map[string]string{keyA.jwk()}
		p.docIssuer = "https://evil.example"
	})
	a, logs := newJWTAuth(t, JWTOptions{OIDCDiscovery: true, Issuer: p.URL, TLS: tlsfiles.Client{CAFile: p.caFile},
		Audience: []string{"infergate"}, MinRefreshInterval: time.Millisecond})
	tokA := keyA.token(t, true, jwt.MapClaims{"iss": p.URL})
	if a.JWKSLoaded() {
		t.Fatal("keys loaded from a discovery document naming another issuer")
	}
	if err := authBearer(a, tokA); !errors.Is(err, ErrUnauthenticated) || !strings.Contains(err.Error(), "not loaded yet") {
		t.Fatalf("before keys loaded: err = %v", err)
	}
	if !strings.Contains(logs.String(), `names issuer \"https://evil.example\"`) {
		t.Fatalf("the log does not say why: %s", logs)
	}
	p.set(func(p *idp) { p.docIssuer = "" })
	eventually(t, "keys loaded once discovery is right", a.JWKSLoaded)
	for _, tt := range []struct {
		name string
		tok  string
		ok   bool
	}{
		{"A", tokA, true},
		{"A, other issuer", keyA.token(t, true, jwt.MapClaims{"iss": "https://evil.example"}), false},
		{"A, no issuer", keyA.token(t, true, nil), false},
		{"B before rotation", keyB.token(t, true, jwt.MapClaims{"iss": p.URL}), false},
	} {
		if err := authBearer(a, tt.tok); (err == nil) != tt.ok {
			t.Errorf("%s: err = %v, want ok=%v", tt.name, err, tt.ok)
		}
	}
	p.set(func(p *idp) { p.keys = []map[string]string{keyA.jwk(), keyB.jwk()} })
	if err := authBearer(a, keyB.token(t, true, jwt.MapClaims{"iss": p.URL})); err != nil {
		t.Fatalf("B after rotation: %v", err)
	}
}

// Start-and-retry: an identity provider that is down at start does not
// stop Tier 2; JWTs are refused until the keys arrive, then accepted.
func TestJWKSUnreachableAtStart(t *testing.T) {
	p := startIDP(t)
	keyA := newRSASigner(t, "a")
	p.set(func(p *idp) {
		p.keys = []map[string]string{keyA.jwk()}
		p.status = http.StatusServiceUnavailable
	})
	a, logs := newJWTAuth(t, JWTOptions{JWKSURL: p.URL + "/jwks", TLS: tlsfiles.Client{CAFile: p.caFile}, Audience: []string{"infergate"}})
	tok := keyA.token(t, true, nil)
	if err := authBearer(a, tok); !errors.Is(err, ErrUnauthenticated) {
		t.Fatalf("with the JWKS down: err = %v", err)
	}
	if !strings.Contains(logs.String(), "level=ERROR") || !strings.Contains(logs.String(), "503") {
		t.Fatalf("no error logged naming the cause: %s", logs)
	}
	p.set(func(p *idp) { p.status = 0 })
	eventually(t, "token accepted once the JWKS answers", func() bool { return authBearer(a, tok) == nil })
}

// The fetch verifies the server certificate: without the private CA
// (system roots only), or with a JWKS over the size bound, no key loads.
func TestJWKSFetchRefused(t *testing.T) {
	p := startIDP(t)
	keyA := newRSASigner(t, "a")
	p.set(func(p *idp) { p.keys = []map[string]string{keyA.jwk()} })
	a, logs := newJWTAuth(t, JWTOptions{JWKSURL: p.URL + "/jwks", Audience: []string{"infergate"}})
	if a.JWKSLoaded() || authBearer(a, keyA.token(t, true, nil)) == nil {
		t.Fatal("keys loaded from a server whose CA is not trusted")
	}
	if !strings.Contains(logs.String(), "certificate") {
		t.Fatalf("the log does not name the certificate problem: %s", logs)
	}

	big := append([]byte(`{"keys":[],"pad":"`), bytes.Repeat([]byte("x"), MaxJWKSBytes)...)
	p.set(func(p *idp) { p.body = append(big, `"}`...) })
	b, logs := newJWTAuth(t, JWTOptions{JWKSURL: p.URL + "/jwks", TLS: tlsfiles.Client{CAFile: p.caFile}, Audience: []string{"infergate"}})
	if b.JWKSLoaded() {
		t.Fatal("a JWKS over the size bound was loaded")
	}
	if !strings.Contains(logs.String(), "over 1048576 bytes") {
		t.Fatalf("the log does not name the size bound: %s", logs)
	}
}

// leeway allows clock skew around exp and nbf, and no more.
func TestJWTLeeway(t *testing.T) {
	secret := []byte("0123456789abcdef0123456789abcdef")
	now := time.Unix(1_800_000_000, 0)
	tok := func(c jwt.MapClaims) string {
		s, err := jwt.NewWithClaims(jwt.SigningMethodHS256, c).SignedString(secret)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	at := func(d time.Duration) int64 { return now.Add(d).Unix() }
	tests := []struct {
		name   string
		leeway time.Duration
		claims jwt.MapClaims
		ok     bool
	}{
		{"expired 30s ago, no leeway", 0, jwt.MapClaims{"sub": "acme", "exp": at(-30 * time.Second)}, false},
		{"expired 30s ago, leeway 1m", time.Minute, jwt.MapClaims{"sub": "acme", "exp": at(-30 * time.Second)}, true},
		{"expired 2m ago, leeway 1m", time.Minute, jwt.MapClaims{"sub": "acme", "exp": at(-2 * time.Minute)}, false},
		{"valid in 30s, no leeway", 0, jwt.MapClaims{"sub": "acme", "nbf": at(30 * time.Second)}, false},
		{"valid in 30s, leeway 1m", time.Minute, jwt.MapClaims{"sub": "acme", "nbf": at(30 * time.Second)}, true},
		{"valid in 2m, leeway 1m", time.Minute, jwt.MapClaims{"sub": "acme", "nbf": at(2 * time.Minute)}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a, _ := newJWTAuth(t, JWTOptions{HMACSecret: secret, Leeway: tt.leeway, Now: func() time.Time { return now }})
			if err := authBearer(a, tok(tt.claims)); (err == nil) != tt.ok {
				t.Fatalf("err = %v, want ok=%v", err, tt.ok)
			}
		})
	}
}

func TestJWTOptionsRefused(t *testing.T) {
	s := newMemStore(t, Options{})
	aud := []string{"infergate"}
	for _, tt := range []struct {
		name string
		o    JWTOptions
		want string
	}{
		{"plain http JWKS", JWTOptions{JWKSURL: "http://idp/jwks", Audience: aud}, "jwt.jwks_url"},
		{"relative JWKS", JWTOptions{JWKSURL: "/jwks", Audience: aud}, "jwt.jwks_url"},
		{"both sources", JWTOptions{JWKSURL: "https://idp/jwks", OIDCDiscovery: true, Issuer: "https://idp", Audience: aud}, "exclusive"},
		{"discovery without issuer", JWTOptions{OIDCDiscovery: true, Audience: aud}, "jwt.issuer"},
		{"discovery, http issuer", JWTOptions{OIDCDiscovery: true, Issuer: "http://idp", Audience: aud}, "jwt.issuer"},
		{"remote without audience", JWTOptions{JWKSURL: "https://idp/jwks"}, "jwt.audience is required"},
		{"empty audience", JWTOptions{HMACSecret: []byte("x"), Audience: []string{""}}, "jwt.audience[0]"},
		{"negative leeway", JWTOptions{HMACSecret: []byte("x"), Leeway: -time.Second}, "jwt.leeway"},
		{"huge leeway", JWTOptions{HMACSecret: []byte("x"), Leeway: time.Hour}, "jwt.leeway"},
		{"tls without remote", JWTOptions{HMACSecret: []byte("x"), TLS: tlsfiles.Client{CAFile: "ca.pem"}}, "jwt.tls"},
		{"missing CA file", JWTOptions{JWKSURL: "https://127.0.0.1:1/jwks", Audience: aud, TLS: tlsfiles.Client{CAFile: "/nonexistent/ca.pem"}}, "/nonexistent/ca.pem"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			a, err := NewAuthenticator(context.Background(), s, &tt.o)
			if err == nil {
				_ = a.Close()
				t.Fatal("accepted")
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err = %v, want it to name %q", err, tt.want)
			}
		})
	}
}
