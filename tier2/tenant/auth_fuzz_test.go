package tenant

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"math/big"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
)

// fuzzKeys are real keys for seeds and for tokens the fuzzed key material
// must (or must not) verify.
type fuzzKeys struct {
	rsa     *rsa.PrivateKey
	ec      *ecdsa.PrivateKey
	ed      ed25519.PrivateKey
	rsaPEM  []byte
	ecPEM   []byte
	edPEM   []byte
	certPEM []byte
	pkcs1   []byte
	jwks    []byte
}

func newFuzzKeys(f *testing.F) fuzzKeys {
	var k fuzzKeys
	var err error
	if k.rsa, err = rsa.GenerateKey(rand.Reader, 2048); err != nil {
		f.Fatal(err)
	}
	if k.ec, err = ecdsa.GenerateKey(elliptic.P256(), rand.Reader); err != nil {
		f.Fatal(err)
	}
	_, k.ed, _ = ed25519.GenerateKey(rand.Reader)
	enc := func(typ string, b []byte) []byte { return pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: b}) }
	der, _ := x509.MarshalPKIXPublicKey(&k.rsa.PublicKey)
	k.rsaPEM = enc("PUBLIC KEY", der)
	der, _ = x509.MarshalPKIXPublicKey(&k.ec.PublicKey)
	k.ecPEM = enc("PUBLIC KEY", der)
	der, _ = x509.MarshalPKIXPublicKey(k.ed.Public())
	k.edPEM = enc("PUBLIC KEY", der)
	k.pkcs1 = enc("RSA PUBLIC KEY", x509.MarshalPKCS1PublicKey(&k.rsa.PublicKey))
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), NotBefore: time.Unix(0, 0), NotAfter: time.Unix(1<<32, 0)}
	der, err = x509.CreateCertificate(rand.Reader, tmpl, tmpl, &k.ec.PublicKey, k.ec)
	if err != nil {
		f.Fatal(err)
	}
	k.certPEM = enc("CERTIFICATE", der)
	pt, _ := k.ec.PublicKey.Bytes()
	b64 := base64.RawURLEncoding.EncodeToString
	k.jwks, _ = json.Marshal(map[string]any{"keys": []map[string]string{
		{"kty": "EC", "kid": "ec1", "crv": "P-256", "use": "sig", "x": b64(pt[1:33]), "y": b64(pt[33:])},
		{"kty": "RSA", "kid": "rsa1", "n": b64(k.rsa.N.Bytes()), "e": b64(big.NewInt(int64(k.rsa.E)).Bytes())},
		{"kty": "RSA", "use": "enc", "n": "AQAB", "e": "AQAB"},
	}})
	return k
}

func signed(t *testing.T, m jwt.SigningMethod, key any, kid string) string {
	tok := jwt.NewWithClaims(m, jwt.MapClaims{"sub": "acme", "exp": time.Now().Add(time.Hour).Unix()})
	if kid != "" {
		tok.Header["kid"] = kid
	}
	s, err := tok.SignedString(key)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// usableKey reports whether k is a key type the authenticator verifies
// signatures with.
func usableKey(k any) bool {
	switch k := k.(type) {
	case *rsa.PublicKey:
		return k.N != nil && k.N.BitLen() >= 1024 && k.E > 2
	case *ecdsa.PublicKey, ed25519.PublicKey:
		return true
	}
	return false
}

// FuzzPEMPublicKey: configured PEM keys either load as a key the
// authenticator can verify with, or fail with an error; never a panic, never
// a silently useless key.
func FuzzPEMPublicKey(f *testing.F) {
	k := newFuzzKeys(f)
	for _, s := range [][]byte{k.rsaPEM, k.ecPEM, k.edPEM, k.certPEM, k.pkcs1,
		[]byte("-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----\n"),
		[]byte("-----BEGIN CERTIFICATE-----\n-----END CERTIFICATE-----\n"), nil} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		key, err := parsePEMPublicKey(data)
		if err != nil {
			if key != nil {
				t.Fatalf("key %T with error %v", key, err)
			}
			return
		}
		if !usableKey(key) {
			t.Fatalf("accepted a key the authenticator cannot verify with: %T", key)
		}
		if _, err := NewAuthenticator(context.Background(), nil, &JWTOptions{PublicKeysPEM: []string{string(data)}}); err != nil {
			t.Fatalf("key parsed but authenticator refused it: %v", err)
		}
	})
}

// FuzzJWKS: a JWKS file either loads keys the authenticator can use, or is
// refused with an error. A loaded set must never verify a token signed by a
// key it does not hold.
func FuzzJWKS(f *testing.F) {
	k := newFuzzKeys(f)
	f.Add(k.jwks)
	f.Add([]byte(`{"keys":[]}`))
	f.Add([]byte(`{"keys":[{"kty":"RSA","n":"","e":""}]}`))
	f.Add([]byte(`{"keys":[{"kty":"RSA","n":"AQAB","e":"AAAAAAAAAAAAAAAAAAAAAQ"}]}`))
	f.Add([]byte(`{"keys":[{"kty":"EC","crv":"P-521","x":"AA","y":"AA"}]}`))
	f.Add([]byte(`{"keys":[{"kty":"oct","k":"c2VjcmV0"}]}`))
	f.Add([]byte(`[]`))
	stranger, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	dir := f.TempDir()
	f.Fuzz(func(t *testing.T, data []byte) {
		a := &Authenticator{byKid: map[string]crypto.PublicKey{}}
		if err := a.addJWKS(data); err != nil {
			return
		}
		for kid, key := range a.byKid {
			if !usableKey(key) {
				t.Fatalf("kid %q: unusable key %T", kid, key)
			}
		}
		for _, key := range a.anyKeys {
			if !usableKey(key) {
				t.Fatalf("unusable key %T", key)
			}
		}
		if len(a.byKid)+len(a.anyKeys) == 0 {
			return
		}
		path := filepath.Join(dir, "jwks.json")
		if err := os.WriteFile(path, data, 0o600); err != nil {
			t.Fatal(err)
		}
		s, err := New(context.Background(), Options{Seed: []Tenant{{ID: "acme"}}})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		full, err := NewAuthenticator(context.Background(), s, &JWTOptions{JWKSFile: path})
		if err != nil {
			t.Fatalf("addJWKS accepted the set, NewAuthenticator refused it: %v", err)
		}
		for _, kid := range []string{"", "ec1"} {
			r := httptest.NewRequest("POST", "/v1/chat/completions", nil)
			r.Header.Set("Authorization", "Bearer "+signed(t, jwt.SigningMethodES256, stranger, kid))
			if tn, err := full.Authenticate(context.Background(), r); err == nil {
				t.Fatalf("token signed by a foreign key accepted for %q", tn.ID)
			} else if !errors.Is(err, ErrUnauthenticated) {
				t.Fatalf("error does not wrap ErrUnauthenticated: %v", err)
			}
		}
	})
}

// FuzzAuthenticate: whatever credential headers a client sends, the only
// ways in are the real API key and a token signed with the configured
// secret; every refusal wraps ErrUnauthenticated.
func FuzzAuthenticate(f *testing.F) {
	ctx := context.Background()
	s, err := New(ctx, Options{Seed: []Tenant{{ID: "acme"}, {ID: "off", Disabled: true}}})
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { s.Close() })
	raw, _, err := s.CreateKey(ctx, "acme", "fuzz")
	if err != nil {
		f.Fatal(err)
	}
	secret := []byte("0123456789abcdef0123456789abcdef")
	a, err := NewAuthenticator(context.Background(), s, &JWTOptions{HMACSecret: secret, Issuer: "https://idp"})
	if err != nil {
		f.Fatal(err)
	}
	// A fixed expiry (2100-01-01) keeps the token the same in the
	// coordinator and in every fuzz worker process.
	tok := jwt.NewWithClaims(jwt.SigningMethodHS256, jwt.MapClaims{"sub": "acme", "iss": "https://idp", "exp": int64(4102444800)})
	good, _ := tok.SignedString(secret)
	for _, h := range []string{"Bearer " + raw, "bearer " + raw, "BEARER  " + good, "Bearer " + good + ".x", "Basic " + raw,
		"Bearer eyJhbGciOiJub25lIn0.eyJzdWIiOiJhY21lIn0.", "Bearer ig-000000000000-x", "Bearer", ""} {
		f.Add(h, "")
		f.Add("", h)
	}
	f.Fuzz(func(t *testing.T, authz, apiKey string) {
		r := httptest.NewRequest("POST", "/v1/chat/completions", nil)
		r.Header.Set("Authorization", authz)
		r.Header.Set("api-key", apiKey)
		tn, err := a.Authenticate(ctx, r)
		if err != nil {
			if tn != nil {
				t.Fatal("tenant returned with an error")
			}
			if !errors.Is(err, ErrUnauthenticated) {
				t.Fatalf("error does not wrap ErrUnauthenticated: %v", err)
			}
			return
		}
		cred := bearer(r)
		if cred != raw && cred != good {
			t.Fatalf("credential %q accepted as tenant %q", cred, tn.ID)
		}
		if tn.ID != "acme" {
			t.Fatalf("authenticated as %q", tn.ID)
		}
	})
}
