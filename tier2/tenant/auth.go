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
	"log/slog"
	"math/big"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/infergate/infergate/shared/config"
	"github.com/infergate/infergate/shared/tlsfiles"
)

// JWTOptions enable JWT bearer tokens. Set HMACSecret, PublicKeysPEM,
// JWKSFile, JWKSURL or OIDCDiscovery (any combination).
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
	// JWKSURL is an https:// JSON Web Key Set, fetched at start, refreshed
	// every RefreshInterval and when a token names a kid the set lacks.
	JWKSURL string `yaml:"jwks_url"`
	// OIDCDiscovery takes the JWKS URL from the jwks_uri of Issuer's
	// OpenID Connect discovery document; that document must name Issuer.
	OIDCDiscovery bool `yaml:"oidc_discovery"`
	// RefreshInterval is how often the remote set is re-fetched (default
	// DefaultJWKSRefreshInterval); MinRefreshInterval is the least time
	// between two refreshes forced by unknown kids (default
	// DefaultJWKSMinRefreshInterval); FetchTimeout bounds one fetch
	// (default DefaultJWKSFetchTimeout).
	RefreshInterval    time.Duration `yaml:"refresh_interval"`
	MinRefreshInterval time.Duration `yaml:"min_refresh_interval"`
	FetchTimeout       time.Duration `yaml:"fetch_timeout"`
	// TLS is how the JWKS and discovery URLs are fetched: ca_file for an
	// identity provider behind a private CA (default: system roots).
	TLS tlsfiles.Client `yaml:"tls"`
	// Issuer is required to match the iss claim when set. Audience, when
	// set, requires the aud claim to name at least one of its entries;
	// it is required with JWKSURL or OIDCDiscovery, whose identity
	// provider also issues tokens for other applications.
	Issuer   string   `yaml:"issuer"`
	Audience []string `yaml:"audience"`
	// TenantClaim names the claim holding the tenant ID. Default "sub".
	TenantClaim string `yaml:"tenant_claim"`
	// RequireExp rejects tokens without an expiry. exp and nbf are always
	// checked when present, with Leeway of clock skew allowed.
	RequireExp bool          `yaml:"require_exp"`
	Leeway     time.Duration `yaml:"leeway"`
	// Now is the clock (tests); default time.Now.
	Now func() time.Time `yaml:"-"`
	// Logger receives key loading and refresh failures; default discard.
	Logger *slog.Logger `yaml:"-"`
}

// MaxJWTLeeway bounds JWTOptions.Leeway: more is not clock skew but a
// longer token lifetime.
const MaxJWTLeeway = 5 * time.Minute

func (o *JWTOptions) setDefaults() {
	config.Default(&o.TenantClaim, "sub")
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	config.Default(&o.RefreshInterval, DefaultJWKSRefreshInterval)
	config.Default(&o.MinRefreshInterval, DefaultJWKSMinRefreshInterval)
	config.Default(&o.FetchTimeout, DefaultJWKSFetchTimeout)
}

func (o *JWTOptions) remote() bool { return o.JWKSURL != "" || o.OIDCDiscovery }

// Validate checks the options without reading files or the network;
// errors name the config keys (jwt.*) of tier2/server.
func (o *JWTOptions) Validate() error {
	var errs []error
	if o.JWKSURL != "" && o.OIDCDiscovery {
		errs = append(errs, errors.New("jwt: jwks_url and oidc_discovery are exclusive"))
	}
	if o.JWKSURL != "" {
		if err := checkHTTPSURL(o.JWKSURL); err != nil {
			errs = append(errs, fmt.Errorf("jwt.jwks_url: %w", err))
		}
	}
	if o.OIDCDiscovery {
		if o.Issuer == "" {
			errs = append(errs, errors.New("jwt.oidc_discovery needs jwt.issuer"))
		} else if err := checkHTTPSURL(o.Issuer); err != nil {
			errs = append(errs, fmt.Errorf("jwt.issuer (with oidc_discovery): %w", err))
		}
	}
	if o.remote() && len(o.Audience) == 0 {
		errs = append(errs, errors.New("jwt.audience is required with jwks_url or oidc_discovery: the identity provider issues tokens for other applications too"))
	}
	for i, a := range o.Audience {
		if a == "" {
			errs = append(errs, fmt.Errorf("jwt.audience[%d] is empty", i))
		}
	}
	if o.Leeway < 0 || o.Leeway > MaxJWTLeeway {
		errs = append(errs, fmt.Errorf("jwt.leeway %v: want 0 to %v", o.Leeway, MaxJWTLeeway))
	}
	if !o.remote() && o.TLS.Enabled() {
		errs = append(errs, errors.New("jwt.tls is only used with jwks_url or oidc_discovery"))
	}
	if err := o.TLS.Validate("jwt.tls"); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// KeyLookup finds a tenant by raw API key; *Store implements it.
type KeyLookup interface {
	LookupKey(raw string) (*Tenant, error)
	Tenant(id string) (*Tenant, bool)
}

// Authenticator resolves a request's credentials to a tenant without
// touching Redis: API keys and tenants come from the store's local cache,
// JWT keys from configuration or a JWKS kept fresh in the background.
// Close stops that refresh.
type Authenticator struct {
	keys    KeyLookup
	jwt     *JWTOptions
	parser  *jwt.Parser
	hmac    []byte
	byKid   map[string]crypto.PublicKey
	anyKeys []crypto.PublicKey
	remote  *remoteKeys // nil without JWKSURL or OIDCDiscovery
}

// asymmetricMethods are the algorithms a remote key set may verify: its
// key types are unknown until fetched, and never HMAC or "none".
var asymmetricMethods = []string{"RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA"}

// NewAuthenticator builds an Authenticator. jwtOpts may be nil (API keys
// only). With a remote key set (JWKSURL or OIDCDiscovery) it tries the
// first fetch now, within ctx and FetchTimeout; if that fails it logs,
// keeps retrying in the background and refuses JWTs until keys arrive
// (start-and-retry: an identity provider outage must not keep Tier 2, and
// its API-key tenants, down). Call Close to stop the refresh.
func NewAuthenticator(ctx context.Context, keys KeyLookup, jwtOpts *JWTOptions) (*Authenticator, error) {
	a := &Authenticator{keys: keys, byKid: map[string]crypto.PublicKey{}}
	if jwtOpts == nil {
		return a, nil
	}
	o := *jwtOpts
	o.Audience = append([]string(nil), o.Audience...)
	o.setDefaults()
	if err := o.Validate(); err != nil {
		return nil, err
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
	switch {
	case o.remote():
		methods = append(methods, asymmetricMethods...)
	default:
		if hasRSA {
			methods = append(methods, "RS256", "RS384", "RS512", "PS256", "PS384", "PS512")
		}
		if hasEC {
			methods = append(methods, "ES256", "ES384", "ES512")
		}
		if hasEd {
			methods = append(methods, "EdDSA")
		}
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
	if len(o.Audience) > 0 {
		// Any one of the configured audiences; the claim is then required.
		popts = append(popts, jwt.WithAudience(o.Audience...))
	}
	if o.RequireExp {
		popts = append(popts, jwt.WithExpirationRequired())
	}
	a.parser = jwt.NewParser(popts...)
	if o.remote() {
		var err error
		if a.remote, err = newRemoteKeys(ctx, a.jwt, o.Logger); err != nil {
			return nil, err
		}
	}
	return a, nil
}

// Close stops refreshing the remote key set. Safe on any Authenticator,
// and more than once.
func (a *Authenticator) Close() error {
	if a != nil && a.remote != nil {
		a.remote.close()
	}
	return nil
}

// JWKSLoaded reports whether the remote key set has been fetched (true
// when there is none to fetch).
func (a *Authenticator) JWKSLoaded() bool {
	return a.remote == nil || a.remote.keyfunc() != nil
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
func (a *Authenticator) Authenticate(ctx context.Context, r *http.Request) (*Tenant, error) {
	cred := bearer(r)
	if cred == "" {
		return nil, fmt.Errorf("%w: no credential", ErrUnauthenticated)
	}
	if a.jwt != nil && strings.Count(cred, ".") == 2 {
		return a.authJWT(ctx, cred)
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

func (a *Authenticator) authJWT(ctx context.Context, raw string) (*Tenant, error) {
	claims := jwt.MapClaims{}
	tok, err := a.parser.ParseWithClaims(raw, claims, a.keyfunc(ctx))
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

// keyfunc finds the key for a token: the HMAC secret for HS*, else the
// configured key with the token's kid, else the remote set's (which
// refreshes on an unknown kid), else every key without a kid match.
func (a *Authenticator) keyfunc(ctx context.Context) jwt.Keyfunc {
	return func(t *jwt.Token) (any, error) {
		if _, ok := t.Method.(*jwt.SigningMethodHMAC); ok {
			if len(a.hmac) == 0 {
				return nil, errors.New("hmac not configured")
			}
			return a.hmac, nil
		}
		kid, _ := t.Header["kid"].(string)
		if kid != "" {
			if k, ok := a.byKid[kid]; ok {
				return k, nil
			}
		}
		var set jwt.VerificationKeySet
		for _, k := range a.allPublic() {
			set.Keys = append(set.Keys, k)
		}
		var remoteErr error
		if a.remote != nil {
			kf := a.remote.keyfunc()
			switch {
			case kf == nil:
				remoteErr = a.remote.notLoaded()
			case kid != "":
				k, err := kf.KeyfuncCtx(ctx)(t)
				if err == nil {
					return k, nil
				}
				remoteErr = err
			default:
				// No kid: keyfunc gives every key whose alg fits.
				k, err := kf.KeyfuncCtx(ctx)(t)
				if rs, ok := k.(jwt.VerificationKeySet); ok && err == nil {
					set.Keys = append(set.Keys, rs.Keys...)
				} else if err != nil {
					remoteErr = err
				}
			}
		}
		if len(set.Keys) == 0 {
			if remoteErr != nil {
				return nil, remoteErr
			}
			return nil, errors.New("no public keys")
		}
		return set, nil
	}
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
