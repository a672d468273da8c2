package tenant

import (
	"context"
	"crypto/ecdsa"
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

func TestAuthenticate(t *testing.T) {
	ctx := context.Background()
	s := newMemStore(t, Options{Seed: []Tenant{{ID: "acme"}, {ID: "off", Disabled: true}}})
	raw, _, err := s.CreateKey(ctx, "acme", "")
	if err != nil {
		t.Fatal(err)
	}
	secret := []byte("0123456789abcdef0123456789abcdef")
	rsaKey, _ := rsa.GenerateKey(rand.Reader, 2048)
	der, _ := x509.MarshalPKIXPublicKey(&rsaKey.PublicKey)
	rsaPEM := string(pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der}))
	ecKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	ecPub, _ := ecKey.PublicKey.Bytes() // uncompressed point
	jwks := map[string]any{"keys": []map[string]string{{
		"kty": "EC", "kid": "ec1", "crv": "P-256", "use": "sig",
		"x": base64.RawURLEncoding.EncodeToString(ecPub[1:33]),
		"y": base64.RawURLEncoding.EncodeToString(ecPub[33:]),
	}, {
		"kty": "RSA", "kid": "rsa1",
		"n": base64.RawURLEncoding.EncodeToString(rsaKey.N.Bytes()),
		"e": base64.RawURLEncoding.EncodeToString(big.NewInt(int64(rsaKey.E)).Bytes()),
	}}}
	jwksFile := filepath.Join(t.TempDir(), "jwks.json")
	js, _ := json.Marshal(jwks)
	if err := os.WriteFile(jwksFile, js, 0o600); err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	a, err := NewAuthenticator(ctx, s, &JWTOptions{HMACSecret: secret, PublicKeysPEM: []string{rsaPEM}, JWKSFile: jwksFile, Issuer: "https://idp", Audience: []string{"infergate"}})
	if err != nil {
		t.Fatal(err)
	}
	claims := func(m jwt.MapClaims) jwt.MapClaims {
		base := jwt.MapClaims{"sub": "acme", "iss": "https://idp", "aud": "infergate", "exp": now.Add(time.Hour).Unix()}
		for k, v := range m {
			if v == nil {
				delete(base, k)
			} else {
				base[k] = v
			}
		}
		return base
	}
	sign := func(m jwt.SigningMethod, key any, c jwt.MapClaims, kid string) string {
		tok := jwt.NewWithClaims(m, c)
		if kid != "" {
			tok.Header["kid"] = kid
		}
		s, err := tok.SignedString(key)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	otherSecret := []byte("another-secret-another-secret-xx")
	none := sign(jwt.SigningMethodNone, jwt.UnsafeAllowNoneSignatureType, claims(nil), "")
	// HS256 "signed" with the RSA public key: the classic alg confusion.
	confused := sign(jwt.SigningMethodHS256, []byte(rsaPEM), claims(nil), "")
	tests := []struct {
		name   string
		header string
		want   string // tenant ID, or "" for an error
		err    error
	}{
		{"api key", "Bearer " + raw, "acme", nil},
		{"api key lowercase scheme", "bearer " + raw, "acme", nil},
		{"no header", "", "", ErrUnauthenticated},
		{"wrong key", "Bearer ig-000000000000-nope", "", ErrUnauthenticated},
		{"hs256", "Bearer " + sign(jwt.SigningMethodHS256, secret, claims(nil), ""), "acme", nil},
		{"rs256 pem", "Bearer " + sign(jwt.SigningMethodRS256, rsaKey, claims(nil), ""), "acme", nil},
		{"rs256 jwks kid", "Bearer " + sign(jwt.SigningMethodRS256, rsaKey, claims(nil), "rsa1"), "acme", nil},
		{"es256 jwks kid", "Bearer " + sign(jwt.SigningMethodES256, ecKey, claims(nil), "ec1"), "acme", nil},
		{"wrong secret", "Bearer " + sign(jwt.SigningMethodHS256, otherSecret, claims(nil), ""), "", ErrUnauthenticated},
		{"expired", "Bearer " + sign(jwt.SigningMethodHS256, secret, claims(jwt.MapClaims{"exp": now.Add(-time.Minute).Unix()}), ""), "", ErrUnauthenticated},
		{"not yet valid", "Bearer " + sign(jwt.SigningMethodHS256, secret, claims(jwt.MapClaims{"nbf": now.Add(time.Hour).Unix()}), ""), "", ErrUnauthenticated},
		{"wrong issuer", "Bearer " + sign(jwt.SigningMethodHS256, secret, claims(jwt.MapClaims{"iss": "evil"}), ""), "", ErrUnauthenticated},
		{"wrong audience", "Bearer " + sign(jwt.SigningMethodHS256, secret, claims(jwt.MapClaims{"aud": "other"}), ""), "", ErrUnauthenticated},
		{"unknown tenant", "Bearer " + sign(jwt.SigningMethodHS256, secret, claims(jwt.MapClaims{"sub": "ghost"}), ""), "", ErrUnauthenticated},
		{"no sub", "Bearer " + sign(jwt.SigningMethodHS256, secret, claims(jwt.MapClaims{"sub": nil}), ""), "", ErrUnauthenticated},
		{"disabled tenant", "Bearer " + sign(jwt.SigningMethodHS256, secret, claims(jwt.MapClaims{"sub": "off"}), ""), "", ErrDisabled},
		{"alg none", "Bearer " + none, "", ErrUnauthenticated},
		{"alg confusion", "Bearer " + confused, "", ErrUnauthenticated},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := httptest.NewRequest("POST", "/v1/chat/completions", nil)
			if tt.header != "" {
				r.Header.Set("Authorization", tt.header)
			}
			got, err := a.Authenticate(ctx, r)
			if tt.err != nil {
				if !errors.Is(err, tt.err) {
					t.Fatalf("err = %v, want %v", err, tt.err)
				}
				return
			}
			if err != nil || got.ID != tt.want {
				t.Fatalf("got %v %v, want %s", got, err, tt.want)
			}
		})
	}

	// A custom tenant claim, and exp required.
	a2, err := NewAuthenticator(ctx, s, &JWTOptions{HMACSecret: secret, TenantClaim: "org", RequireExp: true})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		claims jwt.MapClaims
		ok     bool
	}{
		{jwt.MapClaims{"org": "acme", "sub": "user-1", "exp": now.Add(time.Hour).Unix()}, true},
		{jwt.MapClaims{"org": "acme"}, false}, // no exp
		{jwt.MapClaims{"sub": "acme", "exp": now.Add(time.Hour).Unix()}, false},
	} {
		r := httptest.NewRequest("GET", "/", nil)
		r.Header.Set("Authorization", "Bearer "+sign(jwt.SigningMethodHS256, secret, c.claims, ""))
		_, err := a2.Authenticate(ctx, r)
		if (err == nil) != c.ok {
			t.Fatalf("claims %v: err %v, want ok=%v", c.claims, err, c.ok)
		}
	}
	secretFile := filepath.Join(t.TempDir(), "hmac")
	if err := os.WriteFile(secretFile, append(secret, '\n'), 0o600); err != nil {
		t.Fatal(err)
	}
	a3, err := NewAuthenticator(ctx, s, &JWTOptions{HMACSecretFile: secretFile})
	if err != nil {
		t.Fatal(err)
	}
	r := httptest.NewRequest("GET", "/", nil)
	r.Header.Set("Authorization", "Bearer "+sign(jwt.SigningMethodHS256, secret, claims(nil), ""))
	if tn, err := a3.Authenticate(ctx, r); err != nil || tn.ID != "acme" {
		t.Fatalf("secret from file: %v %v", tn, err)
	}
	if _, err := NewAuthenticator(ctx, s, &JWTOptions{}); err == nil {
		t.Fatal("JWT options without keys accepted")
	}
}
