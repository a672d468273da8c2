package tenant

import (
	"bytes"
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rsa"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/golang-jwt/jwt/v5"
)

// JWTOptions enable JWT bearer tokens. Set HMACSecret, PublicKeysPEM or
// JWKSFile (any combination).
type JWTOptions struct {
	HMACSecret []byte `yaml:"-"`
	// HMACSecretFile holds the HMAC secret (trailing newline trimmed); it
	// keeps the secret out of the config file.
	HMACSecretFile string `yaml:"hmac_secret_file"`
	// PublicKeysPEM holds PEM-encoded RSA, ECDSA or Ed25519 public keys
	// (PKIX "PUBLIC KEY" or certificates).
	PublicKeysPEM []string `yaml:"public_keys_pem"`
	// JWKSFile is a JSON Web Key Set on disk (RSA and EC keys); keys with a
	// "kid" are matched against the token header's kid.
	JWKSFile string `yaml:"jwks_file"`
	// Issuer and Audience are required to match when set.
	Issuer   string `yaml:"issuer"`
	Audience string `yaml:"audience"`
	// TenantClaim names the claim holding the tenant ID. Default "sub".
	TenantClaim string `yaml:"tenant_claim"`
	// RequireExp rejects tokens without an expiry. exp and nbf are always
	// checked when present.
	RequireExp bool          `yaml:"require_exp"`
	Leeway     time.Duration `yaml:"leeway"`
	// Now is the clock (tests); default time.Now.
	Now func() time.Time `yaml:"-"`
}

// KeyLookup finds a tenant by raw API key; *Store implements it.
type KeyLookup interface {
	LookupKey(raw string) (*Tenant, error)
	Tenant(id string) (*Tenant, bool)
}

// Authenticator resolves a request's credentials to a tenant without
// touching Redis: API keys and tenants come from the store's local cache.
type Authenticator struct {
	keys    KeyLookup
	jwt     *JWTOptions
	parser  *jwt.Parser
	hmac    []byte
	byKid   map[string]crypto.PublicKey
	anyKeys []crypto.PublicKey
}

// NewAuthenticator builds an Authenticator. jwtOpts may be nil (API keys only).
func NewAuthenticator(keys KeyLookup, jwtOpts *JWTOptions) (*Authenticator, error) {
	a := &Authenticator{keys: keys, byKid: map[string]crypto.PublicKey{}}
	if jwtOpts == nil {
		return a, nil
	}
	o := *jwtOpts
	if o.TenantClaim == "" {
		o.TenantClaim = "sub"
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.HMACSecretFile != "" {
		b, err := os.ReadFile(o.HMACSecretFile)
		if err != nil {
			return nil, fmt.Errorf("jwt: hmac_secret_file: %w", err)
		}
		o.HMACSecret = []byte(strings.TrimRight(string(b), "\r\n"))
	}
	a.jwt = &o
	a.hmac = o.HMACSecret
	var methods []string
	if len(a.hmac) > 0 {
		methods = append(methods, "HS256", "HS384", "HS512")
	}
	for i, p := range o.PublicKeysPEM {
		k, err := parsePEMPublicKey([]byte(p))
		if err != nil {
			return nil, fmt.Errorf("jwt public key %d: %w", i, err)
		}
		a.anyKeys = append(a.anyKeys, k)
	}
	if o.JWKSFile != "" {
		data, err := os.ReadFile(o.JWKSFile)
		if err != nil {
			return nil, fmt.Errorf("jwks: %w", err)
		}
		if err := a.addJWKS(data); err != nil {
			return nil, fmt.Errorf("jwks %s: %w", o.JWKSFile, err)
		}
	}
	var hasRSA, hasEC, hasEd bool
	for _, k := range a.allPublic() {
		switch k.(type) {
		case *rsa.PublicKey:
			hasRSA = true
		case *ecdsa.PublicKey:
			hasEC = true
		case ed25519.PublicKey:
			hasEd = true
		}
	}
	if hasRSA {
		methods = append(methods, "RS256", "RS384", "RS512", "PS256", "PS384", "PS512")
	}
	if hasEC {
		methods = append(methods, "ES256", "ES384", "ES512")
	}
	if hasEd {
		methods = append(methods, "EdDSA")
	}
	if len(methods) == 0 {
		return nil, errors.New("jwt: no HMAC secret or public keys configured")
	}
	// Pinning the methods to the configured key types prevents the
	// alg-confusion attacks (e.g. "none", or HS256 signed with a public key).
	popts := []jwt.ParserOption{jwt.WithValidMethods(methods), jwt.WithLeeway(o.Leeway), jwt.WithTimeFunc(o.Now)}
	if o.Issuer != "" {
		popts = append(popts, jwt.WithIssuer(o.Issuer))
	}
	if o.Audience != "" {
		popts = append(popts, jwt.WithAudience(o.Audience))
	}
	if o.RequireExp {
		popts = append(popts, jwt.WithExpirationRequired())
	}
	a.parser = jwt.NewParser(popts...)
	return a, nil
}

func (a *Authenticator) allPublic() []crypto.PublicKey {
	out := append([]crypto.PublicKey(nil), a.anyKeys...)
	for _, k := range a.byKid {
		out = append(out, k)
	}
	return out
}

// Authenticate reads "Authorization: Bearer <credential>" (or "api-key" /
// "x-api-key" headers) and returns the tenant. Every failure wraps
// ErrUnauthenticated; a disabled tenant gives ErrDisabled.
func (a *Authenticator) Authenticate(_ context.Context, r *http.Request) (*Tenant, error) {
	cred := bearer(r)
	if cred == "" {
		return nil, fmt.Errorf("%w: no credential", ErrUnauthenticated)
	}
	if a.jwt != nil && strings.Count(cred, ".") == 2 {
		return a.authJWT(cred)
	}
	if a.keys == nil {
		return nil, ErrUnauthenticated
	}
	return a.keys.LookupKey(cred)
}

func bearer(r *http.Request) string {
	h := r.Header.Get("Authorization")
	if len(h) > 7 && strings.EqualFold(h[:7], "bearer ") {
		return strings.TrimSpace(h[7:])
	}
	if k := r.Header.Get("api-key"); k != "" {
		return k
	}
	return r.Header.Get("x-api-key")
}

func (a *Authenticator) authJWT(raw string) (*Tenant, error) {
	claims := jwt.MapClaims{}
	tok, err := a.parser.ParseWithClaims(raw, claims, a.keyfunc)
	if err != nil || !tok.Valid {
		// The parser's message is safe (no secrets) and helps operators.
		return nil, fmt.Errorf("%w: jwt: %v", ErrUnauthenticated, err)
	}
	id, _ := claims[a.jwt.TenantClaim].(string)
	if id == "" {
		return nil, fmt.Errorf("%w: jwt: claim %q missing", ErrUnauthenticated, a.jwt.TenantClaim)
	}
	if a.keys == nil {
		return nil, ErrUnauthenticated
	}
	t, ok := a.keys.Tenant(id)
	if !ok {
		return nil, fmt.Errorf("%w: unknown tenant", ErrUnauthenticated)
	}
	if t.Disabled {
		return nil, ErrDisabled
	}
	return t, nil
}

func (a *Authenticator) keyfunc(t *jwt.Token) (any, error) {
	switch t.Method.(type) {
	case *jwt.SigningMethodHMAC:
		if len(a.hmac) == 0 {
			return nil, errors.New("hmac not configured")
		}
		return a.hmac, nil
	}
	if kid, _ := t.Header["kid"].(string); kid != "" {
		if k, ok := a.byKid[kid]; ok {
			return k, nil
		}
	}
	set := jwt.VerificationKeySet{}
	for _, k := range a.allPublic() {
		set.Keys = append(set.Keys, k)
	}
	if len(set.Keys) == 0 {
		return nil, errors.New("no public keys")
	}
	return set, nil
}

func parsePEMPublicKey(data []byte) (crypto.PublicKey, error) {
	block, _ := pem.Decode(data)
	if block == nil {
		return nil, errors.New("no PEM block")
	}
	var key any
	var err error
	switch block.Type {
	case "CERTIFICATE":
		var c *x509.Certificate
		if c, err = x509.ParseCertificate(block.Bytes); err == nil {
			key = c.PublicKey
		}
	case "RSA PUBLIC KEY":
		key, err = x509.ParsePKCS1PublicKey(block.Bytes)
	default:
		key, err = x509.ParsePKIXPublicKey(block.Bytes)
	}
	if err != nil {
		// x509 returns typed nil keys with its errors; return a plain nil.
		return nil, err
	}
	return signingKey(key)
}

// signingKey accepts the key types JWTs are verified with, so a configured
// key that could never verify anything (an X25519 key, a toy RSA modulus)
// fails at startup instead of refusing every token later.
func signingKey(key any) (crypto.PublicKey, error) {
	switch k := key.(type) {
	case *rsa.PublicKey:
		// crypto/rsa refuses to verify with moduli under 1024 bits.
		if k.N == nil || k.N.BitLen() < 1024 || k.E < 3 || k.E%2 == 0 {
			return nil, errors.New("rsa key: modulus under 1024 bits or bad exponent")
		}
		return k, nil
	case *ecdsa.PublicKey, ed25519.PublicKey:
		return k, nil
	default:
		return nil, fmt.Errorf("unsupported key type %T (want RSA, ECDSA or Ed25519)", key)
	}
}

type jwk struct {
	Kty string `json:"kty"`
	Kid string `json:"kid"`
	Use string `json:"use"`
	N   string `json:"n"`
	E   string `json:"e"`
	Crv string `json:"crv"`
	X   string `json:"x"`
	Y   string `json:"y"`
}

func (a *Authenticator) addJWKS(data []byte) error {
	var set struct {
		Keys []jwk `json:"keys"`
	}
	if err := json.Unmarshal(data, &set); err != nil {
		return err
	}
	for i, k := range set.Keys {
		if k.Use != "" && k.Use != "sig" {
			continue
		}
		pub, err := k.publicKey()
		if err != nil {
			return fmt.Errorf("key %d (kid %q): %w", i, k.Kid, err)
		}
		if k.Kid != "" {
			a.byKid[k.Kid] = pub
		} else {
			a.anyKeys = append(a.anyKeys, pub)
		}
	}
	return nil
}

func (k jwk) publicKey() (crypto.PublicKey, error) {
	b64 := base64.RawURLEncoding
	switch k.Kty {
	case "RSA":
		n, err := b64.DecodeString(k.N)
		if err != nil {
			return nil, fmt.Errorf("n: %w", err)
		}
		e, err := b64.DecodeString(k.E)
		if err != nil {
			return nil, fmt.Errorf("e: %w", err)
		}
		// An exponent over 4 bytes would wrap in the int conversion.
		if len(bytes.TrimLeft(e, "\x00")) > 4 {
			return nil, errors.New("e: too large")
		}
		return signingKey(&rsa.PublicKey{N: new(big.Int).SetBytes(n), E: int(new(big.Int).SetBytes(e).Int64())})
	case "EC":
		var curve elliptic.Curve
		switch k.Crv {
		case "P-256":
			curve = elliptic.P256()
		case "P-384":
			curve = elliptic.P384()
		case "P-521":
			curve = elliptic.P521()
		default:
			return nil, fmt.Errorf("unsupported curve %q", k.Crv)
		}
		x, err := b64.DecodeString(k.X)
		if err != nil {
			return nil, fmt.Errorf("x: %w", err)
		}
		y, err := b64.DecodeString(k.Y)
		if err != nil {
			return nil, fmt.Errorf("y: %w", err)
		}
		// Round-trip through the uncompressed encoding so off-curve points
		// are rejected by the standard library.
		size := (curve.Params().BitSize + 7) / 8
		if len(x) > size || len(y) > size {
			return nil, errors.New("coordinate too long")
		}
		buf := make([]byte, 1+2*size)
		buf[0] = 4
		copy(buf[1+size-len(x):1+size], x)
		copy(buf[1+2*size-len(y):], y)
		pub, err := ecdsa.ParseUncompressedPublicKey(curve, buf)
		if err != nil {
			return nil, err
		}
		return pub, nil
	default:
		return nil, fmt.Errorf("unsupported kty %q", k.Kty)
	}
}
