package server

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/infergate/infergate/internal/testpki"
	"github.com/infergate/infergate/shared/cluster"
	"github.com/infergate/infergate/shared/config"
	"github.com/infergate/infergate/shared/tlsfiles"
)

func TestValidateTLSKeys(t *testing.T) {
	const base = "region: east\nclusters: [{name: a, region: east, address: \"https://127.0.0.1:1\", models: [m]}]\n"
	tests := []struct {
		name, yaml string
		want       []string
	}{
		{"none", "", nil},
		{"all listeners and tier1", "tls: {cert_file: a.crt, key_file: a.key}\n" +
			"admin: {listen: \"127.0.0.1:0\", token: x, tls: {cert_file: a.crt, key_file: a.key, client_ca_file: ca.crt}}\n" +
			"metrics: {tls: {cert_file: a.crt, key_file: a.key, min_version: \"1.2\"}}\n" +
			"tier1: {tls: {ca_file: ca.crt, cert_file: c.crt, key_file: c.key}}\n", nil},
		{"front door key missing", "tls: {cert_file: a.crt}\n", []string{"tls: cert_file and key_file must both be set"}},
		{"admin bad client_auth", "admin: {listen: \"127.0.0.1:0\", token: x, tls: {cert_file: a.crt, key_file: a.key, client_ca_file: ca.crt, client_auth: maybe}}\n",
			[]string{"admin.tls.client_auth"}},
		{"admin tls without listener", "admin: {tls: {cert_file: a.crt, key_file: a.key}}\n", []string{"admin.tls is set but admin.listen is empty"}},
		{"metrics bad version", "metrics: {tls: {cert_file: a.crt, key_file: a.key, min_version: \"1.0\"}}\n", []string{"metrics.tls.min_version"}},
		{"tier1 half a client certificate", "tier1: {tls: {key_file: c.key}}\n", []string{"tier1.tls: cert_file and key_file"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var c Config
			err := config.Decode("t.yaml", []byte(base+tt.yaml), &c)
			if len(tt.want) == 0 {
				if err != nil {
					t.Fatalf("unexpected error: %v", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("no error, want %q", tt.want)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
		})
	}
}

// TestNewTLSFileErrors: a bad TLS file stops New (so `infergate tier2`
// exits before listening) with an error naming the key and the file.
func TestNewTLSFileErrors(t *testing.T) {
	dir := t.TempDir()
	ca := testpki.NewCA(t, "tier2 test CA")
	good := testpki.Write(t, dir, "good", ca.Issue(t, testpki.LeafOptions{}), ca)
	other := testpki.Write(t, dir, "other", ca.Issue(t, testpki.LeafOptions{}), nil)
	expired := testpki.Write(t, dir, "expired", ca.Issue(t, testpki.LeafOptions{
		NotBefore: time.Now().Add(-48 * time.Hour), NotAfter: time.Now().Add(-time.Hour)}), nil)
	noPEM := filepath.Join(dir, "empty-ca.crt")
	testpki.WriteFile(t, noPEM, []byte("# no certificate here\n"))
	keyDir := filepath.Join(dir, "key.d")
	if err := os.Mkdir(keyDir, 0o700); err != nil {
		t.Fatal(err)
	}
	srv := func(cert, key, clientCA string) tlsfiles.Server {
		return tlsfiles.Server{CertFile: cert, KeyFile: key, ClientCAFile: clientCA}
	}
	tests := []struct {
		name                string
		set                 func(*Config)
		key, file, contains string
	}{
		{"expired front door certificate", func(c *Config) { c.TLS = srv(expired.Cert, expired.Key, "") }, "tls:", expired.Cert, "expired"},
		{"mismatched admin key", func(c *Config) {
			c.Admin.Listen = "127.0.0.1:0"
			c.Admin.TLS = srv(good.Cert, other.Key, "")
		}, "admin.tls:", other.Key, "private key does not match"},
		{"unreadable metrics key", func(c *Config) { c.Metrics.TLS = srv(good.Cert, keyDir, "") }, "metrics.tls:", keyDir, "private key"},
		{"front door client CA without PEM", func(c *Config) { c.TLS = srv(good.Cert, good.Key, noPEM) }, "tls:", noPEM, "no PEM certificate"},
		{"tier1 CA without PEM", func(c *Config) { c.Tier1.TLS = tlsfiles.Client{CAFile: noPEM} }, "tier1.tls:", noPEM, "no PEM certificate"},
		{"tier1 expired client certificate", func(c *Config) {
			c.Tier1.TLS = tlsfiles.Client{CAFile: good.CA, CertFile: expired.Cert, KeyFile: expired.Key}
		}, "tier1.tls:", expired.Cert, "expired"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := staticConfig("https://127.0.0.1:1")
			tt.set(&cfg)
			s, err := New(context.Background(), cfg, Options{Logger: slog.New(slog.DiscardHandler)})
			if err == nil {
				_ = s.Close()
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

// TestServeTLS runs Tier 2 with TLS on its three listeners in front of a
// stand-in Tier 1 (a real TLS server on loopback) that requires a client
// certificate: requests and load polls reach it over mutual TLS, plain
// HTTP on the front door is refused, and /metrics names every TLS
// configuration.
func TestServeTLS(t *testing.T) {
	dir := t.TempDir()
	ca := testpki.NewCA(t, "tier2 test CA")
	files := testpki.Write(t, dir, "tier2", ca.Issue(t, testpki.LeafOptions{}), ca)

	// The stand-in Tier 1: mutual TLS with the same CA.
	pool := x509.NewCertPool()
	pool.AddCert(ca.Cert)
	leaf := ca.Issue(t, testpki.LeafOptions{CommonName: "tier1"})
	pair, err := tls.X509KeyPair(leaf.CertPEM, leaf.KeyPEM)
	if err != nil {
		t.Fatal(err)
	}
	var polls, clientCerts atomic.Int32
	tier1 := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.TLS != nil && len(r.TLS.PeerCertificates) > 0 {
			clientCerts.Add(1)
		}
		if r.URL.Path == cluster.LoadPath {
			polls.Add(1)
			_ = json.NewEncoder(w).Encode(cluster.LoadSummary{Models: map[string]cluster.ModelLoad{"m": {ReadyPods: 1, KVHeadroom: 1}}})
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"choices":[{"message":{"content":"hi"}}],"usage":{"total_tokens":3}}`)
	}))
	tier1.TLS = &tls.Config{Certificates: []tls.Certificate{pair}, ClientCAs: pool, ClientAuth: tls.RequireAndVerifyClientCert}
	tier1.StartTLS()
	t.Cleanup(tier1.Close)

	cfg := staticConfig(tier1.URL)
	on := tlsfiles.Server{CertFile: files.Cert, KeyFile: files.Key}
	cfg.TLS, cfg.Admin.TLS, cfg.Metrics.TLS = on, on, on
	cfg.Admin.Listen = "127.0.0.1:0"
	cfg.Tier1.TLS = tlsfiles.Client{CAFile: files.CA, CertFile: files.Cert, KeyFile: files.Key}
	srv, err := New(context.Background(), cfg, Options{Logger: slog.New(slog.DiscardHandler), ShutdownTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Close() })
	lns := make([]net.Listener, 3)
	for i := range lns {
		if lns[i], err = net.Listen("tcp", "127.0.0.1:0"); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.ServeListeners(ctx, Listeners{API: lns[0], Admin: lns[1], Metrics: lns[2]}) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("ServeListeners: %v", err)
		}
	})
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	base := "https://" + lns[0].Addr().String()

	deadline := time.Now().Add(10 * time.Second)
	var last string
	for {
		req, _ := http.NewRequest(http.MethodPost, base+"/v1/chat/completions", strings.NewReader(`{"model":"m","messages":[],"max_tokens":4}`))
		req.Header.Set("Authorization", "Bearer sk-test")
		resp, err := client.Do(req)
		if err == nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK && strings.Contains(string(b), `"hi"`) {
				break
			}
			last = resp.Status + " " + string(b)
		} else {
			last = err.Error()
		}
		if time.Now().After(deadline) {
			t.Fatalf("no chat completion through Tier 2 over TLS: %s", last)
		}
		time.Sleep(50 * time.Millisecond)
	}
	// The router polls beside the first requests, not before them: a
	// chat completion can come back before the first poll has.
	for polls.Load() == 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if polls.Load() == 0 {
		t.Error("no load poll reached Tier 1 over mutual TLS")
	}
	if clientCerts.Load() == 0 {
		t.Error("Tier 1 saw no client certificate")
	}

	// Plain HTTP on the TLS front door: Go's server answers 400, never
	// the API.
	resp, err := http.Get("http://" + lns[0].Addr().String() + "/ready")
	if err == nil {
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(b), "HTTPS server") {
			t.Errorf("plain HTTP on the TLS port: %s %q", resp.Status, b)
		}
	}

	// Admin and metrics over TLS too.
	req, _ := http.NewRequest(http.MethodGet, "https://"+lns[1].Addr().String()+"/admin/v1/breakers", nil)
	req.Header.Set("Authorization", "Bearer admintoken")
	if resp, err := client.Do(req); err != nil || resp.StatusCode != http.StatusOK {
		t.Errorf("admin over TLS: %v %v", resp, err)
	} else {
		resp.Body.Close()
	}
	resp, err = client.Get("https://" + lns[2].Addr().String() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, name := range []string{"tier2-api", "tier2-admin", "tier2-metrics", "tier2-tier1"} {
		if !strings.Contains(string(b), `infergate_tls_certificate_expiry_timestamp_seconds{name="`+name+`"}`) {
			t.Errorf("/metrics has no certificate expiry for %s", name)
		}
	}
}
