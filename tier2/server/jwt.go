package server

import (
	"fmt"
	"os"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/infergate/infergate/shared/tlsfiles"
	"github.com/infergate/infergate/tier2/tenant"
)

// JWTConfig turns on JWT authentication next to API keys (docs/security.md,
// "JWT and OIDC"). Keys come from any combination of an HMAC secret, PEM
// public keys, a JWKS file, and one remote JWKS: jwks_url, or the jwks_uri
// of the issuer's OpenID Connect discovery document (oidc_discovery).
type JWTConfig struct {
	HMACSecretEnv string   `yaml:"hmac_secret_env"`           // environment variable holding an HMAC secret (HS256/384/512)
	PublicKeys    []string `yaml:"public_keys" config:"file"` // PEM files: RSA, ECDSA or Ed25519 public keys or certificates
	JWKSFile      string   `yaml:"jwks_file"`                 // a JWKS on disk; a token's kid picks the key; read at start
	// JWKSURL is an https:// JSON Web Key Set, refreshed in the background.
	JWKSURL string `yaml:"jwks_url"`
	// OIDCDiscovery fetches <issuer>/.well-known/openid-configuration and
	// uses its jwks_uri; the document must name exactly Issuer.
	OIDCDiscovery      bool          `yaml:"oidc_discovery"`
	RefreshInterval    time.Duration `yaml:"refresh_interval"`     // how often a remote JWKS is fetched again; default 15m
	MinRefreshInterval time.Duration `yaml:"min_refresh_interval"` // least time between the refreshes an unknown kid triggers; default 1m
	FetchTimeout       time.Duration `yaml:"fetch_timeout"`        // one JWKS or discovery fetch; default 10s
	// TLS for the JWKS and discovery fetches: ca_file for a private CA.
	TLS         tlsfiles.Client `yaml:"tls"`
	Issuer      string          `yaml:"issuer"`       // the iss every token must carry; required (https) with oidc_discovery
	Audience    StringList      `yaml:"audience"`     // one or a list; any one must be in aud
	TenantClaim string          `yaml:"tenant_claim"` // the claim holding the tenant ID; default sub
	RequireExp  bool            `yaml:"require_exp"`  // refuse tokens without exp (exp and nbf are checked when present)
	Leeway      time.Duration   `yaml:"leeway"`       // clock skew allowed on exp and nbf; default 0
}

// StringList is a YAML string or list of strings.
type StringList []string

// UnmarshalYAML accepts `audience: a` as well as `audience: [a, b]`.
func (l *StringList) UnmarshalYAML(n *yaml.Node) error {
	switch n.Kind {
	case yaml.ScalarNode:
		var s string
		if err := n.Decode(&s); err != nil {
			return err
		}
		*l = StringList{s}
		return nil
	case yaml.SequenceNode:
		var s []string
		if err := n.Decode(&s); err != nil {
			return err
		}
		*l = s
		return nil
	}
	return fmt.Errorf("line %d: want a string or a list of strings", n.Line)
}

// jwtOptions turns the config block into tenant.JWTOptions, reading the
// secret and the PEM files it names.
func jwtOptions(j *JWTConfig) (*tenant.JWTOptions, error) {
	if j == nil {
		return nil, nil
	}
	o := &tenant.JWTOptions{JWKSFile: j.JWKSFile, JWKSURL: j.JWKSURL, OIDCDiscovery: j.OIDCDiscovery,
		RefreshInterval: j.RefreshInterval, MinRefreshInterval: j.MinRefreshInterval, FetchTimeout: j.FetchTimeout,
		TLS: j.TLS, Issuer: j.Issuer, Audience: j.Audience, TenantClaim: j.TenantClaim, RequireExp: j.RequireExp, Leeway: j.Leeway}
	if j.HMACSecretEnv != "" {
		sec, err := secret("", j.HMACSecretEnv, "jwt.hmac_secret_env")
		if err != nil {
			return nil, err
		}
		o.HMACSecret = []byte(sec)
	}
	for _, f := range j.PublicKeys {
		b, err := os.ReadFile(f)
		if err != nil {
			return nil, fmt.Errorf("jwt.public_keys: %w", err)
		}
		o.PublicKeysPEM = append(o.PublicKeysPEM, string(b))
	}
	return o, nil
}

// Validate checks the block without reading files or the network; errors
// name the key.
func (j *JWTConfig) Validate() error {
	if j.HMACSecretEnv == "" && len(j.PublicKeys) == 0 && j.JWKSFile == "" && j.JWKSURL == "" && !j.OIDCDiscovery {
		return fmt.Errorf("jwt: set at least one of hmac_secret_env, public_keys, jwks_file, jwks_url or oidc_discovery")
	}
	for _, d := range []struct {
		key string
		v   time.Duration
		min time.Duration
	}{
		{"jwt.refresh_interval", j.RefreshInterval, time.Second},
		{"jwt.min_refresh_interval", j.MinRefreshInterval, time.Second},
		{"jwt.fetch_timeout", j.FetchTimeout, 100 * time.Millisecond},
	} {
		if d.v != 0 && d.v < d.min {
			return fmt.Errorf("%s %v: want at least %v (or unset for the default)", d.key, d.v, d.min)
		}
	}
	o := tenant.JWTOptions{JWKSURL: j.JWKSURL, OIDCDiscovery: j.OIDCDiscovery, TLS: j.TLS,
		Issuer: j.Issuer, Audience: j.Audience, Leeway: j.Leeway}
	return o.Validate()
}
