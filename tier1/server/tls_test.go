package server

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/infergate/infergate/internal/testpki"
	"github.com/infergate/infergate/shared/tlsfiles"
	"github.com/infergate/infergate/tier1/config"
)

func TestRegistrationTLS(t *testing.T) {
	srv := tlsfiles.Server{CertFile: "a.crt", KeyFile: "a.key"}
	mutual := srv
	mutual.ClientCAFile = "ca.crt"
	ifGiven := mutual
	ifGiven.ClientAuth = "verify_if_given"
	addr := &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 9443}
	tests := []struct {
		name       string
		tls        tlsfiles.Server
		scheme     string // consul.scheme
		wantScheme string
		wantHTTP   string // CheckHTTP
		wantTCP    string // CheckTCP
		skipVerify bool
	}{
		{"plain", tlsfiles.Server{}, "", "http", "http://127.0.0.1:9443/ready", "", false},
		{"tls registers https", srv, "", "https", "https://127.0.0.1:9443/ready", "", true},
		{"explicit https agrees", srv, "https", "https", "https://127.0.0.1:9443/ready", "", true},
		// TLS terminated in front of the router: its certificate is not
		// ours, so the agent verifies it as before.
		{"https without our tls", tlsfiles.Server{}, "https", "https", "https://127.0.0.1:9443/ready", "", false},
		{"client certs required: TCP check", mutual, "", "https", "", "127.0.0.1:9443", false},
		{"client cert optional: HTTP check", ifGiven, "", "https", "https://127.0.0.1:9443/ready", "", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := &config.Config{
				Cluster: "c", Region: "r", TLS: tt.tls,
				Pools:  []config.PoolConfig{{Name: "p", Model: "m"}},
				Consul: config.ConsulConfig{Address: "127.0.0.1:8500", Scheme: tt.scheme},
			}
			reg, _, err := Registration(cfg, addr)
			if err != nil {
				t.Fatal(err)
			}
			if reg.Scheme != tt.wantScheme || reg.CheckHTTP != tt.wantHTTP || reg.CheckTCP != tt.wantTCP || reg.CheckTLSSkipVerify != tt.skipVerify {
				t.Errorf("scheme %q check http %q tcp %q skip verify %v; want %q %q %q %v",
					reg.Scheme, reg.CheckHTTP, reg.CheckTCP, reg.CheckTLSSkipVerify, tt.wantScheme, tt.wantHTTP, tt.wantTCP, tt.skipVerify)
			}
		})
	}
}

// pki is a CA and files issued by it for one test.
type pki struct {
	dir  string
	ca   *testpki.CA
	good testpki.Files // leaf, key and CA bundle
}

func newPKI(t *testing.T) *pki {
	t.Helper()
	p := &pki{dir: t.TempDir(), ca: testpki.NewCA(t, "tier1 test CA")}
	p.good = testpki.Write(t, p.dir, "good", p.ca.Issue(t, testpki.LeafOptions{}), p.ca)
	return p
}

// TestNewTLSFileErrors: a bad TLS file stops New (so `infergate tier1`
// exits before listening) with an error naming the key and the file.
func TestNewTLSFileErrors(t *testing.T) {
	p := newPKI(t)
	expired := testpki.Write(t, p.dir, "expired", p.ca.Issue(t, testpki.LeafOptions{
		NotBefore: time.Now().Add(-48 * time.Hour), NotAfter: time.Now().Add(-time.Hour)}), nil)
	other := testpki.Write(t, p.dir, "other", p.ca.Issue(t, testpki.LeafOptions{}), nil)
	noPEM := filepath.Join(p.dir, "not-a-ca.crt")
	testpki.WriteFile(t, noPEM, []byte("this is not PEM\n"))
	keyDir := filepath.Join(p.dir, "key-is-a-directory")
	if err := os.Mkdir(keyDir, 0o700); err != nil {
		t.Fatal(err)
	}
	missing := filepath.Join(p.dir, "missing.key")

	server := func(cert, key, ca string) tlsfiles.Server {
		return tlsfiles.Server{CertFile: cert, KeyFile: key, ClientCAFile: ca}
	}
	tests := []struct {
		name     string
		set      func(*Config)
		key      string // the config key the error must name
		file     string // the file it must name
		contains string
	}{
		{"expired api certificate", func(c *Config) { c.TLS = server(expired.Cert, expired.Key, "") }, "tls:", expired.Cert, "expired"},
		{"mismatched metrics key", func(c *Config) { c.MetricsTLS = server(p.good.Cert, other.Key, "") }, "metrics_tls:", other.Key, "private key does not match"},
		{"client CA without PEM", func(c *Config) { c.ExtProcTLS = server(p.good.Cert, p.good.Key, noPEM) }, "ext_proc_tls:", noPEM, "no PEM certificate"},
		{"unreadable api key", func(c *Config) { c.TLS = server(p.good.Cert, keyDir, "") }, "tls:", keyDir, "private key"},
		{"missing api key", func(c *Config) { c.TLS = server(p.good.Cert, missing, "") }, "tls:", missing, "no such file"},
		{"upstream CA without PEM", func(c *Config) {
			c.Upstream.Scheme = "https"
			c.Upstream.TLS = tlsfiles.Client{CAFile: noPEM}
		}, "upstream.tls:", noPEM, "no PEM certificate"},
		{"upstream expired client certificate", func(c *Config) {
			c.Upstream.Scheme = "https"
			c.Upstream.TLS = tlsfiles.Client{CertFile: expired.Cert, KeyFile: expired.Key}
		}, "upstream.tls:", expired.Cert, "expired"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := &Config{Auth: config.AuthConfig{Disabled: true}, MetricsListen: "-",
				Pools: []config.PoolConfig{{Name: "p", Model: "m"}}}
			tt.set(cfg)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			srv, err := New(ctx, cfg, Options{})
			if err == nil {
				srv.Close()
				t.Fatal("New succeeded")
			}
			for _, want := range []string{tt.key, tt.file, tt.contains} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q does not contain %q", err, want)
				}
			}
		})
	}
}

// TestListenersServeTLS serves the API and the metrics listener over TLS
// (the API with mutual TLS) on real sockets: a client with the CA and a
// client certificate is served, plain HTTP and a client without a
// certificate are not, and /metrics reports each TLS configuration.
func TestListenersServeTLS(t *testing.T) {
	p := newPKI(t)
	cfg := &Config{Auth: config.AuthConfig{Disabled: true},
		TLS:        tlsfiles.Server{CertFile: p.good.Cert, KeyFile: p.good.Key, ClientCAFile: p.good.CA},
		MetricsTLS: tlsfiles.Server{CertFile: p.good.Cert, KeyFile: p.good.Key},
		Pools:      []config.PoolConfig{{Name: "p", Model: "m"}}}
	api, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	mln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	srv, err := New(ctx, cfg, Options{MetricsListener: mln, ShutdownTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx, api, nil) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	}()

	roots := x509.NewCertPool()
	roots.AddCert(p.ca.Cert)
	pair, err := tls.LoadX509KeyPair(p.good.Cert, p.good.Key)
	if err != nil {
		t.Fatal(err)
	}
	client := func(cert bool) *http.Client {
		c := &tls.Config{RootCAs: roots}
		if cert {
			c.Certificates = []tls.Certificate{pair}
		}
		return &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: c}}
	}
	get := func(c *http.Client, url string) (int, string, error) {
		resp, err := c.Get(url)
		if err != nil {
			return 0, "", err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b), err
	}

	apiURL := "https://" + api.Addr().String() + "/health"
	if code, body, err := get(client(true), apiURL); err != nil || code != http.StatusOK {
		t.Errorf("API with a client certificate: %d %q %v", code, body, err)
	}
	if _, _, err := get(client(false), apiURL); err == nil || !strings.Contains(err.Error(), "certificate required") {
		t.Errorf("API without a client certificate: err %v, want a handshake refusal", err)
	}
	if code, body, err := get(http.DefaultClient, "http://"+api.Addr().String()+"/health"); err == nil && code == http.StatusOK {
		t.Errorf("plain HTTP on the TLS port answered 200: %q", body)
	}
	code, body, err := get(client(false), "https://"+mln.Addr().String()+"/metrics")
	if err != nil || code != http.StatusOK {
		t.Fatalf("metrics over TLS: %d %v", code, err)
	}
	for _, name := range []string{"tier1-api", "tier1-metrics"} {
		if !strings.Contains(body, `infergate_tls_certificate_expiry_timestamp_seconds{name="`+name+`"}`) {
			t.Errorf("/metrics has no certificate expiry for %s", name)
		}
	}
}
