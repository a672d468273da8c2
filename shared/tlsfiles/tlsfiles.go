// Package tlsfiles builds the crypto/tls configuration of every infergate
// listener and client from PEM files, and reloads it when the files change
// (cert-manager rotating a Secret, say) without a restart and without
// touching connections already open: a handshake reads the material current
// at that moment, an established connection keeps what it was given.
//
// A reload that fails (a half-written file, a key that does not match its
// certificate, an expired certificate) keeps the previous material, logs
// once per distinct bad content and counts in
// infergate_tls_reloads_total{result="error"}; infergate_tls_reload_failing
// stays 1 until the files load again.
package tlsfiles

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/infergate/infergate/shared/clock"
	"github.com/infergate/infergate/shared/metric"
)

// Server is a listener's TLS block in a config file. It is off while
// CertFile and KeyFile are empty.
type Server struct {
	CertFile string `yaml:"cert_file"` // PEM certificate chain, leaf first
	KeyFile  string `yaml:"key_file"`  // PEM private key
	// ClientCAFile, when set, is the PEM bundle client certificates are
	// verified against (mutual TLS).
	ClientCAFile string `yaml:"client_ca_file"`
	// ClientAuth is "require" (the default when ClientCAFile is set: a
	// client without a certificate from that CA cannot connect) or
	// "verify_if_given" (a certificate, when sent, must verify).
	ClientAuth string `yaml:"client_auth"`
	// MinVersion is "1.3" (default) or "1.2".
	MinVersion string `yaml:"min_version"`
}

// Enabled reports whether the block turns TLS on.
func (s Server) Enabled() bool { return s.CertFile != "" || s.KeyFile != "" }

// Validate checks the block without reading files; path names it in errors
// (for example "tls" or "admin.tls").
func (s Server) Validate(path string) error {
	var errs []error
	if !s.Enabled() {
		if s.ClientCAFile != "" || s.ClientAuth != "" || s.MinVersion != "" {
			errs = append(errs, fmt.Errorf("%s: cert_file and key_file are required when any other TLS key is set", path))
		}
		return errors.Join(errs...)
	}
	if s.CertFile == "" || s.KeyFile == "" {
		errs = append(errs, fmt.Errorf("%s: cert_file and key_file must both be set", path))
	}
	switch s.ClientAuth {
	case "", "require", "verify_if_given":
		if s.ClientAuth != "" && s.ClientCAFile == "" {
			errs = append(errs, fmt.Errorf("%s.client_auth %q needs client_ca_file", path, s.ClientAuth))
		}
	default:
		errs = append(errs, fmt.Errorf("%s.client_auth %q: want require or verify_if_given", path, s.ClientAuth))
	}
	if _, err := minVersion(s.MinVersion); err != nil {
		errs = append(errs, fmt.Errorf("%s.min_version: %w", path, err))
	}
	return errors.Join(errs...)
}

// RequiresClientCert reports whether a client must present a verified
// certificate to connect.
func (s Server) RequiresClientCert() bool {
	return s.ClientCAFile != "" && (s.ClientAuth == "" || s.ClientAuth == "require")
}

// Client is an outbound connection's TLS block: whom to trust and, for
// mutual TLS, the certificate to present.
type Client struct {
	// CAFile is the PEM bundle server certificates are verified against;
	// empty: the system roots.
	CAFile string `yaml:"ca_file"`
	// CertFile and KeyFile are the client certificate for mutual TLS.
	CertFile string `yaml:"cert_file"`
	KeyFile  string `yaml:"key_file"`
	// ServerName overrides the name verified in the server's certificate
	// (default: the host dialled).
	ServerName string `yaml:"server_name"`
	// MinVersion is "1.3" (default) or "1.2".
	MinVersion string `yaml:"min_version"`
}

// Enabled reports whether anything in the block is set.
func (c Client) Enabled() bool { return c != Client{} }

// Validate checks the block without reading files.
func (c Client) Validate(path string) error {
	var errs []error
	if (c.CertFile == "") != (c.KeyFile == "") {
		errs = append(errs, fmt.Errorf("%s: cert_file and key_file must both be set for a client certificate", path))
	}
	if _, err := minVersion(c.MinVersion); err != nil {
		errs = append(errs, fmt.Errorf("%s.min_version: %w", path, err))
	}
	return errors.Join(errs...)
}

func minVersion(v string) (uint16, error) {
	switch v {
	case "", "1.3":
		return tls.VersionTLS13, nil
	case "1.2":
		return tls.VersionTLS12, nil
	}
	return 0, fmt.Errorf("%q: want 1.3 (default) or 1.2", v)
}

// Options are what a loaded configuration reports to.
type Options struct {
	// Name labels the configuration in logs and metrics, for example
	// "tier2-api" or "tier1-mesh".
	Name    string
	Logger  *slog.Logger // default: discard
	Metrics *Metrics     // nil: none
	// Interval is how often the files are re-read; default 10s, negative
	// disables reloading.
	Interval time.Duration
	// NextProtos are the ALPN protocols a server offers; default h2 and
	// http/1.1 (gRPC needs h2).
	NextProtos []string
	// Now is the clock expiry is checked against; default time.Now.
	Now func() time.Time
}

func (o *Options) defaults() {
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.Interval == 0 {
		o.Interval = 10 * time.Second
	}
	if o.NextProtos == nil {
		o.NextProtos = []string{"h2", "http/1.1"}
	}
	if o.Now == nil {
		o.Now = time.Now
	}
}

// Metrics are the reload series, shared by every configuration of a
// process registered on one registry.
type Metrics struct {
	reloads  *prometheus.CounterVec
	failing  *prometheus.GaugeVec
	notAfter *prometheus.GaugeVec
}

// NewMetrics registers the TLS series on reg.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		reloads: metric.Counter("infergate_tls_reloads_total",
			"TLS certificate reloads after the files changed, by configuration and result (ok, error).", "name", "result"),
		failing: metric.Gauge("infergate_tls_reload_failing",
			"1 while the TLS files on disk cannot be loaded and the previous certificate is still served.", "name"),
		notAfter: metric.Gauge("infergate_tls_certificate_expiry_timestamp_seconds", "Unix time the certificate in use expires.", "name"),
	}
	for _, c := range []prometheus.Collector{m.reloads, m.failing, m.notAfter} {
		if err := reg.Register(c); err != nil {
			var are prometheus.AlreadyRegisteredError
			if errors.As(err, &are) {
				switch c {
				case m.reloads:
					m.reloads = are.ExistingCollector.(*prometheus.CounterVec)
				case m.failing:
					m.failing = are.ExistingCollector.(*prometheus.GaugeVec)
				default:
					m.notAfter = are.ExistingCollector.(*prometheus.GaugeVec)
				}
				continue
			}
			return nil, err
		}
	}
	return m, nil
}

// material is one consistent load of the files.
type material struct {
	cert *tls.Certificate // nil: none configured
	pool *x509.CertPool   // nil: none configured (client: system roots)
	sum  [32]byte
}

// files loads and re-loads a key pair and a CA bundle.
type files struct {
	certFile, keyFile, caFile string
	opts                      Options
	cur                       atomic.Pointer[material]
	mu                        sync.Mutex // serialises Reload
	badSum                    [32]byte   // the content last logged as bad
	onSwap                    func(*material)
}

func (f *files) read() (sum [32]byte, cert, key, ca []byte, err error) {
	h := sha256.New()
	readOne := func(name, what string) []byte {
		if name == "" || err != nil {
			return nil
		}
		var b []byte
		if b, err = os.ReadFile(name); err != nil {
			err = fmt.Errorf("%s: %w", what, err)
			return nil
		}
		h.Write([]byte(name))
		h.Write(b)
		return b
	}
	cert = readOne(f.certFile, "certificate")
	key = readOne(f.keyFile, "private key")
	ca = readOne(f.caFile, "CA bundle")
	copy(sum[:], h.Sum(nil))
	return sum, cert, key, ca, err
}

// load reads and checks every file; the error names the file at fault.
func (f *files) load() (*material, error) {
	sum, certPEM, keyPEM, caPEM, err := f.read()
	if err != nil {
		return nil, err
	}
	m := &material{sum: sum}
	if f.certFile != "" {
		pair, err := tls.X509KeyPair(certPEM, keyPEM)
		if err != nil {
			return nil, fmt.Errorf("key pair %s, %s: %w", f.certFile, f.keyFile, err)
		}
		leaf := pair.Leaf
		if leaf == nil {
			if leaf, err = x509.ParseCertificate(pair.Certificate[0]); err != nil {
				return nil, fmt.Errorf("certificate %s: %w", f.certFile, err)
			}
			pair.Leaf = leaf
		}
		now := f.opts.Now()
		switch {
		case now.After(leaf.NotAfter):
			return nil, fmt.Errorf("certificate %s expired at %s", f.certFile, leaf.NotAfter.UTC().Format(time.RFC3339))
		case now.Before(leaf.NotBefore):
			return nil, fmt.Errorf("certificate %s is not valid before %s", f.certFile, leaf.NotBefore.UTC().Format(time.RFC3339))
		}
		m.cert = &pair
	}
	if f.caFile != "" {
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(caPEM) {
			return nil, fmt.Errorf("CA bundle %s: no PEM certificate in it", f.caFile)
		}
		m.pool = pool
	}
	return m, nil
}

// watch re-reads the files every interval until ctx ends.
func (f *files) watch(ctx context.Context) {
	if f.opts.Interval < 0 {
		return
	}
	for range clock.Ticks(ctx, f.opts.Interval) {
		f.Reload()
	}
}

// Reload re-reads the files now; a change is loaded, a bad one is kept out.
func (f *files) Reload() {
	f.mu.Lock()
	defer f.mu.Unlock()
	sum, _, _, _, err := f.read()
	if err == nil && sum == f.cur.Load().sum {
		f.setFailing(false)
		return
	}
	var m *material
	if err == nil {
		m, err = f.load()
	}
	if err != nil {
		if sum != f.badSum {
			f.badSum = sum
			f.opts.Logger.Error("TLS files changed but cannot be loaded; still serving the previous certificate",
				"tls", f.opts.Name, "err", err)
			if mt := f.opts.Metrics; mt != nil {
				mt.reloads.WithLabelValues(f.opts.Name, "error").Inc()
			}
		}
		f.setFailing(true)
		return
	}
	f.badSum = [32]byte{}
	f.swap(m)
	f.setFailing(false)
	f.opts.Logger.Info("TLS files reloaded", "tls", f.opts.Name)
	if mt := f.opts.Metrics; mt != nil {
		mt.reloads.WithLabelValues(f.opts.Name, "ok").Inc()
	}
}

func (f *files) setFailing(b bool) {
	if mt := f.opts.Metrics; mt != nil {
		v := 0.0
		if b {
			v = 1
		}
		mt.failing.WithLabelValues(f.opts.Name).Set(v)
	}
}

func (f *files) swap(m *material) {
	if f.onSwap != nil {
		f.onSwap(m)
	}
	f.cur.Store(m)
	if mt := f.opts.Metrics; mt != nil && m.cert != nil {
		mt.notAfter.WithLabelValues(f.opts.Name).Set(float64(m.cert.Leaf.NotAfter.Unix()))
	}
}

// ServerConfig is a listener's reloading TLS configuration.
type ServerConfig struct {
	f   *files
	cfg atomic.Pointer[tls.Config]
	tpl *tls.Config
}

// NewServer loads s's files (an error names the file at fault: unreadable,
// not PEM, key not matching the certificate, certificate expired) and
// re-reads them every Options.Interval until ctx ends.
func NewServer(ctx context.Context, s Server, opts Options) (*ServerConfig, error) {
	if err := s.Validate("tls"); err != nil {
		return nil, err
	}
	if !s.Enabled() {
		return nil, errors.New("tls: no cert_file and key_file")
	}
	mv, _ := minVersion(s.MinVersion)
	opts.defaults()
	sc := &ServerConfig{tpl: &tls.Config{MinVersion: mv, NextProtos: opts.NextProtos}}
	if s.ClientCAFile != "" {
		sc.tpl.ClientAuth = tls.RequireAndVerifyClientCert
		if s.ClientAuth == "verify_if_given" {
			sc.tpl.ClientAuth = tls.VerifyClientCertIfGiven
		}
	}
	var err error
	sc.f, err = newFiles(s.CertFile, s.KeyFile, s.ClientCAFile, opts, func(m *material) {
		c := sc.tpl.Clone()
		c.Certificates = []tls.Certificate{*m.cert}
		c.ClientCAs = m.pool
		sc.cfg.Store(c)
	})
	if err != nil {
		return nil, err
	}
	go sc.f.watch(ctx)
	return sc, nil
}

func newFiles(certFile, keyFile, caFile string, opts Options, onSwap func(*material)) (*files, error) {
	opts.defaults()
	f := &files{certFile: certFile, keyFile: keyFile, caFile: caFile, opts: opts, onSwap: onSwap}
	m, err := f.load()
	if err != nil {
		return nil, fmt.Errorf("tls %s: %w", opts.Name, err)
	}
	f.swap(m)
	f.setFailing(false)
	return f, nil
}

// Config is the configuration to serve with (tls.NewListener, a gRPC
// server's credentials): each handshake takes the material current then.
func (s *ServerConfig) Config() *tls.Config {
	return &tls.Config{
		MinVersion: s.tpl.MinVersion,
		NextProtos: s.tpl.NextProtos,
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
			return s.cfg.Load(), nil
		},
	}
}

// Reload re-reads the files now instead of at the next interval.
func (s *ServerConfig) Reload() { s.f.Reload() }

// Certificate is the certificate served now.
func (s *ServerConfig) Certificate() *x509.Certificate { return s.f.cur.Load().cert.Leaf }

// ClientConfig is an outbound connection's reloading TLS configuration.
type ClientConfig struct {
	f  *files
	c  Client
	mv uint16
}

// NewClient loads c's files and re-reads them every Options.Interval until
// ctx ends. A zero Client gives the system roots and no client
// certificate.
func NewClient(ctx context.Context, c Client, opts Options) (*ClientConfig, error) {
	if err := c.Validate("tls"); err != nil {
		return nil, err
	}
	mv, _ := minVersion(c.MinVersion)
	cc := &ClientConfig{c: c, mv: mv}
	var err error
	if cc.f, err = newFiles(c.CertFile, c.KeyFile, c.CAFile, opts, nil); err != nil {
		return nil, err
	}
	go cc.f.watch(ctx)
	return cc, nil
}

// Config is a configuration to dial with: crypto/tls verifies the server
// against the CA bundle loaded now (the system roots without one) and the
// name dialled (or ServerName), and the client certificate is read at each
// handshake, so its rotation applies to the next connection. A rotated CA
// bundle reaches only configurations made after it: dial through
// DialTLSContext to pick it up without a restart.
func (c *ClientConfig) Config() *tls.Config {
	cfg := &tls.Config{MinVersion: c.mv, ServerName: c.c.ServerName, RootCAs: c.f.cur.Load().pool}
	if c.c.CertFile != "" {
		cfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			return c.f.cur.Load().cert, nil
		}
	}
	return cfg
}

// DialTLSContext returns a dial function (for http.Transport's
// DialTLSContext) that connects with dial and completes a TLS handshake
// with the configuration current at that moment, so a rotated CA bundle
// applies to the next connection. The server is verified against the name
// dialled unless ServerName is set.
func (c *ClientConfig) DialTLSContext(dial func(ctx context.Context, network, addr string) (net.Conn, error)) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		cfg := c.Config()
		if cfg.ServerName == "" {
			host, _, err := net.SplitHostPort(addr)
			if err != nil {
				return nil, err
			}
			cfg.ServerName = host
		}
		raw, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		conn := tls.Client(raw, cfg)
		if err := conn.HandshakeContext(ctx); err != nil {
			raw.Close()
			return nil, err
		}
		return conn, nil
	}
}

// Reload re-reads the files now instead of at the next interval.
func (c *ClientConfig) Reload() { c.f.Reload() }

// VerifyLeaf checks that the certificate in certFile chains to a root in
// caFile: a replica whose own certificate is not from the mesh CA would be
// refused by every peer, so it is better refused at startup.
func VerifyLeaf(certFile, caFile string, usage x509.ExtKeyUsage) error {
	certPEM, err := os.ReadFile(certFile)
	if err != nil {
		return fmt.Errorf("certificate: %w", err)
	}
	caPEM, err := os.ReadFile(caFile)
	if err != nil {
		return fmt.Errorf("CA bundle: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		return fmt.Errorf("CA bundle %s: no PEM certificate in it", caFile)
	}
	chain, err := parseChain(certPEM)
	if err != nil {
		return fmt.Errorf("certificate %s: %w", certFile, err)
	}
	inter := x509.NewCertPool()
	for _, c := range chain[1:] {
		inter.AddCert(c)
	}
	if _, err := chain[0].Verify(x509.VerifyOptions{Roots: pool, Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{usage}}); err != nil {
		return fmt.Errorf("certificate %s is not issued by the CA in %s: %w", certFile, caFile, err)
	}
	return nil
}

// parseChain parses every CERTIFICATE block of a PEM file, leaf first.
func parseChain(b []byte) ([]*x509.Certificate, error) {
	var chain []*x509.Certificate
	for {
		var blk *pem.Block
		blk, b = pem.Decode(b)
		if blk == nil {
			break
		}
		if blk.Type != "CERTIFICATE" {
			continue
		}
		c, err := x509.ParseCertificate(blk.Bytes)
		if err != nil {
			return nil, err
		}
		chain = append(chain, c)
	}
	if len(chain) == 0 {
		return nil, errors.New("no PEM certificate in it")
	}
	return chain, nil
}

// Failing is the reload_failing gauge of the configuration named name.
func (m *Metrics) Failing(name string) prometheus.Gauge { return m.failing.WithLabelValues(name) }

// Reloads is the reload counter of the configuration named name.
func (m *Metrics) Reloads(name, result string) prometheus.Counter {
	return m.reloads.WithLabelValues(name, result)
}
