package tlsfiles_test

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/infergate/infergate/internal/testpki"
	"github.com/infergate/infergate/shared/tlsfiles"
)

// echoServer accepts TLS connections on a real socket and echoes lines.
func echoServer(t *testing.T, cfg *tls.Config) string {
	t.Helper()
	ln, err := tls.Listen("tcp", "127.0.0.1:0", cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				r := bufio.NewReader(c)
				for {
					line, err := r.ReadString('\n')
					if err != nil {
						return
					}
					if _, err := io.WriteString(c, line); err != nil {
						return
					}
				}
			}()
		}
	}()
	return ln.Addr().String()
}

func roundTrip(t *testing.T, c *tls.Conn, msg string) {
	t.Helper()
	if _, err := io.WriteString(c, msg+"\n"); err != nil {
		t.Fatal(err)
	}
	got, err := bufio.NewReader(c).ReadString('\n')
	if err != nil || got != msg+"\n" {
		t.Fatalf("echo: %q, %v", got, err)
	}
}

func TestServerRotationKeepsOpenConnections(t *testing.T) {
	dir := t.TempDir()
	ca := testpki.NewCA(t, "ca")
	first := ca.Issue(t, testpki.LeafOptions{CommonName: "first"})
	f := testpki.Write(t, dir, "server", first, ca)
	reg := prometheus.NewRegistry()
	m, err := tlsfiles.NewMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	sc, err := tlsfiles.NewServer(ctx, tlsfiles.Server{CertFile: f.Cert, KeyFile: f.Key},
		tlsfiles.Options{Name: "test", Metrics: m, Interval: -1})
	if err != nil {
		t.Fatal(err)
	}
	addr := echoServer(t, sc.Config())
	cc, err := tlsfiles.NewClient(ctx, tlsfiles.Client{CAFile: f.CA}, tlsfiles.Options{Interval: -1})
	if err != nil {
		t.Fatal(err)
	}
	dial := func() *tls.Conn {
		c, err := tls.Dial("tcp", addr, cc.Config())
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	open := dial()
	defer open.Close()
	roundTrip(t, open, "before")
	if cn := open.ConnectionState().PeerCertificates[0].Subject.CommonName; cn != "first" {
		t.Fatalf("served %q", cn)
	}

	// A bad rotation (key of another certificate) keeps the old one.
	other := ca.Issue(t, testpki.LeafOptions{CommonName: "other"})
	testpki.WriteFile(t, f.Key, other.KeyPEM)
	sc.Reload()
	sc.Reload() // logged and counted once per bad content
	if got := testutil.ToFloat64(m.Failing("test")); got != 1 {
		t.Fatalf("reload_failing = %v, want 1", got)
	}
	if got := testutil.ToFloat64(m.Reloads("test", "error")); got != 1 {
		t.Fatalf("reload errors = %v, want 1", got)
	}
	c := dial()
	if cn := c.ConnectionState().PeerCertificates[0].Subject.CommonName; cn != "first" {
		t.Fatalf("after a bad rotation served %q, want the previous certificate", cn)
	}
	c.Close()

	// A good rotation: new connections see it, the open one carries on.
	second := ca.Issue(t, testpki.LeafOptions{CommonName: "second"})
	testpki.WriteFile(t, f.Cert, second.CertPEM)
	testpki.WriteFile(t, f.Key, second.KeyPEM)
	sc.Reload()
	if got := testutil.ToFloat64(m.Failing("test")); got != 0 {
		t.Fatalf("reload_failing = %v after a good rotation", got)
	}
	c = dial()
	defer c.Close()
	if cn := c.ConnectionState().PeerCertificates[0].Subject.CommonName; cn != "second" {
		t.Fatalf("after rotation served %q, want second", cn)
	}
	roundTrip(t, open, "after")
}

func TestServerWatchPicksUpChanges(t *testing.T) {
	dir := t.TempDir()
	ca := testpki.NewCA(t, "ca")
	f := testpki.Write(t, dir, "server", ca.Issue(t, testpki.LeafOptions{CommonName: "a"}), ca)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	sc, err := tlsfiles.NewServer(ctx, tlsfiles.Server{CertFile: f.Cert, KeyFile: f.Key},
		tlsfiles.Options{Interval: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	b := ca.Issue(t, testpki.LeafOptions{CommonName: "b"})
	testpki.WriteFile(t, f.Key, b.KeyPEM)
	testpki.WriteFile(t, f.Cert, b.CertPEM)
	deadline := time.Now().Add(10 * time.Second)
	for sc.Certificate().Subject.CommonName != "b" {
		if time.Now().After(deadline) {
			t.Fatal("rotated files never loaded")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestMutualTLS(t *testing.T) {
	dir := t.TempDir()
	ca := testpki.NewCA(t, "mesh")
	rogue := testpki.NewCA(t, "rogue")
	srv := testpki.Write(t, dir, "server", ca.Issue(t, testpki.LeafOptions{}), ca)
	good := testpki.Write(t, dir, "client", ca.Issue(t, testpki.LeafOptions{CommonName: "client"}), ca)
	bad := testpki.Write(t, dir, "rogue", rogue.Issue(t, testpki.LeafOptions{CommonName: "rogue"}), rogue)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	sc, err := tlsfiles.NewServer(ctx, tlsfiles.Server{CertFile: srv.Cert, KeyFile: srv.Key, ClientCAFile: srv.CA}, tlsfiles.Options{Interval: -1})
	if err != nil {
		t.Fatal(err)
	}
	addr := echoServer(t, sc.Config())
	try := func(c tlsfiles.Client) error {
		cc, err := tlsfiles.NewClient(ctx, c, tlsfiles.Options{Interval: -1})
		if err != nil {
			t.Fatal(err)
		}
		conn, err := tls.Dial("tcp", addr, cc.Config())
		if err != nil {
			return err
		}
		defer conn.Close()
		// TLS 1.3: the server checks the client certificate after the
		// client's handshake returns; the refusal arrives on first read.
		_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
		if _, err := io.WriteString(conn, "hi\n"); err != nil {
			return err
		}
		_, err = bufio.NewReader(conn).ReadString('\n')
		return err
	}
	if err := try(tlsfiles.Client{CAFile: srv.CA, CertFile: good.Cert, KeyFile: good.Key}); err != nil {
		t.Fatalf("client with a certificate from the CA: %v", err)
	}
	if err := try(tlsfiles.Client{CAFile: srv.CA}); err == nil {
		t.Fatal("client without a certificate was served")
	}
	if err := try(tlsfiles.Client{CAFile: srv.CA, CertFile: bad.Cert, KeyFile: bad.Key}); err == nil {
		t.Fatal("client with a certificate from another CA was served")
	}
	// The client refuses a server its CA did not issue.
	if err := try(tlsfiles.Client{CAFile: bad.CA, CertFile: good.Cert, KeyFile: good.Key}); err == nil {
		t.Fatal("client accepted a server from another CA")
	}
	if err := tlsfiles.VerifyLeaf(bad.Cert, srv.CA, x509.ExtKeyUsageClientAuth); err == nil || !strings.Contains(err.Error(), bad.Cert) {
		t.Fatalf("VerifyLeaf of a rogue certificate: %v", err)
	}
	if err := tlsfiles.VerifyLeaf(good.Cert, srv.CA, x509.ExtKeyUsageClientAuth); err != nil {
		t.Fatal(err)
	}
}

func TestLoadErrorsNameTheFile(t *testing.T) {
	dir := t.TempDir()
	ca := testpki.NewCA(t, "ca")
	ok := testpki.Write(t, dir, "ok", ca.Issue(t, testpki.LeafOptions{}), ca)
	expired := testpki.Write(t, dir, "expired", ca.Issue(t, testpki.LeafOptions{
		NotBefore: time.Now().Add(-48 * time.Hour), NotAfter: time.Now().Add(-time.Hour)}), nil)
	other := testpki.Write(t, dir, "other", ca.Issue(t, testpki.LeafOptions{}), nil)
	garbage := filepath.Join(dir, "garbage.pem")
	if err := os.WriteFile(garbage, []byte("not pem"), 0o600); err != nil {
		t.Fatal(err)
	}
	unreadable := filepath.Join(dir, "missing.key")
	for _, tc := range []struct {
		name string
		s    tlsfiles.Server
		want string
	}{
		{"expired", tlsfiles.Server{CertFile: expired.Cert, KeyFile: expired.Key}, expired.Cert},
		{"mismatched key", tlsfiles.Server{CertFile: ok.Cert, KeyFile: other.Key}, other.Key},
		{"unreadable key", tlsfiles.Server{CertFile: ok.Cert, KeyFile: unreadable}, unreadable},
		{"CA not PEM", tlsfiles.Server{CertFile: ok.Cert, KeyFile: ok.Key, ClientCAFile: garbage}, garbage},
		{"cert not PEM", tlsfiles.Server{CertFile: garbage, KeyFile: ok.Key}, garbage},
		{"key without cert", tlsfiles.Server{KeyFile: ok.Key}, "cert_file"},
		{"bad client_auth", tlsfiles.Server{CertFile: ok.Cert, KeyFile: ok.Key, ClientCAFile: ok.CA, ClientAuth: "maybe"}, "client_auth"},
		{"bad min_version", tlsfiles.Server{CertFile: ok.Cert, KeyFile: ok.Key, MinVersion: "1.0"}, "min_version"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := tlsfiles.NewServer(context.Background(), tc.s, tlsfiles.Options{Interval: -1})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want one naming %q", err, tc.want)
			}
		})
	}
	_, err := tlsfiles.NewClient(context.Background(), tlsfiles.Client{CAFile: unreadable}, tlsfiles.Options{Interval: -1})
	if err == nil || !strings.Contains(err.Error(), unreadable) || !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("client with a missing CA: %v", err)
	}
}

func TestMinVersion(t *testing.T) {
	dir := t.TempDir()
	ca := testpki.NewCA(t, "ca")
	f := testpki.Write(t, dir, "s", ca.Issue(t, testpki.LeafOptions{}), ca)
	for _, tc := range []struct {
		server, client string
		ok             bool
	}{
		{"", "", true},
		{"", "1.2", true}, // negotiates 1.3
		{"1.2", "1.2", true},
	} {
		sc, err := tlsfiles.NewServer(context.Background(), tlsfiles.Server{CertFile: f.Cert, KeyFile: f.Key, MinVersion: tc.server}, tlsfiles.Options{Interval: -1})
		if err != nil {
			t.Fatal(err)
		}
		addr := echoServer(t, sc.Config())
		cc, err := tlsfiles.NewClient(context.Background(), tlsfiles.Client{CAFile: f.CA, MinVersion: tc.client}, tlsfiles.Options{Interval: -1})
		if err != nil {
			t.Fatal(err)
		}
		conn, err := tls.Dial("tcp", addr, cc.Config())
		if err != nil {
			t.Fatalf("%+v: %v", tc, err)
		}
		conn.Close()
	}
	// A TLS 1.2-only client cannot reach a default (1.3) server.
	sc, err := tlsfiles.NewServer(context.Background(), tlsfiles.Server{CertFile: f.Cert, KeyFile: f.Key}, tlsfiles.Options{Interval: -1})
	if err != nil {
		t.Fatal(err)
	}
	addr := echoServer(t, sc.Config())
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(ca.CertPEM)
	conn, err := tls.Dial("tcp", addr, &tls.Config{RootCAs: pool, MaxVersion: tls.VersionTLS12})
	if err == nil {
		conn.Close()
		t.Fatal("a TLS 1.2 client reached a server whose minimum is 1.3")
	}
}

// A client dialling an IP address must check that the certificate names
// that address: a certificate from the same CA for another host is refused.
func TestClientChecksTheNameDialled(t *testing.T) {
	dir := t.TempDir()
	ca := testpki.NewCA(t, "ca")
	other := testpki.Write(t, dir, "other", ca.Issue(t, testpki.LeafOptions{
		DNSNames: []string{"elsewhere.example"}, IPs: []net.IP{net.IPv4(10, 9, 9, 9)}}), ca)
	ctx := context.Background()
	sc, err := tlsfiles.NewServer(ctx, tlsfiles.Server{CertFile: other.Cert, KeyFile: other.Key}, tlsfiles.Options{Interval: -1})
	if err != nil {
		t.Fatal(err)
	}
	addr := echoServer(t, sc.Config())
	cc, err := tlsfiles.NewClient(ctx, tlsfiles.Client{CAFile: other.CA}, tlsfiles.Options{Interval: -1})
	if err != nil {
		t.Fatal(err)
	}
	if c, err := tls.Dial("tcp", addr, cc.Config()); err == nil {
		c.Close()
		t.Fatal("Config accepted a certificate that does not name 127.0.0.1")
	}
	var d net.Dialer
	if c, err := cc.DialTLSContext(d.DialContext)(ctx, "tcp", addr); err == nil {
		c.Close()
		t.Fatal("DialTLSContext accepted a certificate that does not name 127.0.0.1")
	}
	// With server_name set to a name the certificate carries, it is served.
	named, err := tlsfiles.NewClient(ctx, tlsfiles.Client{CAFile: other.CA, ServerName: "elsewhere.example"}, tlsfiles.Options{Interval: -1})
	if err != nil {
		t.Fatal(err)
	}
	c, err := named.DialTLSContext(d.DialContext)(ctx, "tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
}

// A rotated CA bundle reaches the next connection dialled through
// DialTLSContext, without a new ClientConfig.
func TestClientCARotation(t *testing.T) {
	dir := t.TempDir()
	oldCA, newCA := testpki.NewCA(t, "old"), testpki.NewCA(t, "new")
	srv := testpki.Write(t, dir, "srv", oldCA.Issue(t, testpki.LeafOptions{}), oldCA)
	ctx := context.Background()
	sc, err := tlsfiles.NewServer(ctx, tlsfiles.Server{CertFile: srv.Cert, KeyFile: srv.Key}, tlsfiles.Options{Interval: -1})
	if err != nil {
		t.Fatal(err)
	}
	addr := echoServer(t, sc.Config())
	caFile := filepath.Join(dir, "trust.crt")
	testpki.WriteFile(t, caFile, oldCA.CertPEM)
	cc, err := tlsfiles.NewClient(ctx, tlsfiles.Client{CAFile: caFile}, tlsfiles.Options{Interval: -1})
	if err != nil {
		t.Fatal(err)
	}
	var d net.Dialer
	dial := cc.DialTLSContext(d.DialContext)
	c, err := dial(ctx, "tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
	// The server moves to the new CA; the client trusts only the old one.
	next := newCA.Issue(t, testpki.LeafOptions{})
	testpki.WriteFile(t, srv.Cert, next.CertPEM)
	testpki.WriteFile(t, srv.Key, next.KeyPEM)
	sc.Reload()
	if c, err := dial(ctx, "tcp", addr); err == nil {
		c.Close()
		t.Fatal("served by a CA the client does not trust yet")
	}
	testpki.WriteFile(t, caFile, append(append([]byte{}, oldCA.CertPEM...), newCA.CertPEM...))
	cc.Reload()
	c, err = dial(ctx, "tcp", addr)
	if err != nil {
		t.Fatalf("after the bundle rotated: %v", err)
	}
	c.Close()
}
