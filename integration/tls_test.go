package integration

// TLS end to end: both tiers serving TLS on real sockets, mutual TLS from
// Tier 2 to Tier 1, Tier 1 reaching pods over https, ext_proc over TLS,
// certificate rotation under an open stream, and bad files at startup.
// The tiers run in process (tier1/server, tier2/server, as devstack runs
// them) so a test can shorten the TLS reload interval; the simulated GPU
// pods (sim/server) stand in for vLLM and serve TLS on their listener as
// vLLM does with --ssl-certfile. There is no Envoy here: a Go gRPC client
// stands in for Envoy's ext_proc filter. Startup errors run the real
// binary.

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/hashicorp/consul/api"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/infergate/infergate/internal/testpki"
	"github.com/infergate/infergate/internal/testservice"
	"github.com/infergate/infergate/shared/config"
	"github.com/infergate/infergate/shared/tlsfiles"
	simserver "github.com/infergate/infergate/sim/server"
	"github.com/infergate/infergate/tier1/extproc"
	t1server "github.com/infergate/infergate/tier1/server"
	"github.com/infergate/infergate/tier2/discovery"
	t2server "github.com/infergate/infergate/tier2/server"
	"github.com/infergate/infergate/tier2/tenant"
)

const (
	tlsModel      = simserver.DefaultModel
	tlsTier1Token = "it-tls-tier1"
	tlsKey        = "sk-it-tls"
	// tlsReload is the reload interval the in-process tiers get, so a
	// rotation shows within a test's patience.
	tlsReload = 50 * time.Millisecond
)

// needTLSStack skips under -short, as the rest of the suite does.
func needTLSStack(t *testing.T) {
	t.Helper()
	if testing.Short() {
		t.Skip("integration suite: skipped under -short")
	}
}

// tlsPKI is a test's certificate authorities and files: mesh signs Tier 1's
// server certificate and Tier 2's client certificate; front signs Tier 2's
// front door; pods signs the model servers and Tier 1's client
// certificate towards them.
type tlsPKI struct {
	dir              string
	mesh, front, pod *testpki.CA
	tier1            testpki.Files // Tier 1 server; CA = mesh
	tier2Client      testpki.Files // Tier 2 → Tier 1; CA = mesh
	tier2            testpki.Files // Tier 2 front door; CA = front
	podServer        testpki.Files // model server; CA = pod
	tier1Client      testpki.Files // Tier 1 → pods; CA = pod
}

func newTLSPKI(t *testing.T) *tlsPKI {
	t.Helper()
	p := &tlsPKI{dir: t.TempDir(), mesh: testpki.NewCA(t, "mesh CA"), front: testpki.NewCA(t, "front door CA"), pod: testpki.NewCA(t, "pods CA")}
	p.tier1 = testpki.Write(t, p.dir, "tier1", p.mesh.Issue(t, testpki.LeafOptions{CommonName: "tier1"}), p.mesh)
	p.tier2Client = testpki.Write(t, p.dir, "tier2-client", p.mesh.Issue(t, testpki.LeafOptions{CommonName: "tier2"}), p.mesh)
	p.tier2 = testpki.Write(t, p.dir, "tier2", p.front.Issue(t, testpki.LeafOptions{CommonName: "tier2-front"}), p.front)
	p.podServer = testpki.Write(t, p.dir, "pod", p.pod.Issue(t, testpki.LeafOptions{CommonName: "pod"}), p.pod)
	p.tier1Client = testpki.Write(t, p.dir, "tier1-client", p.pod.Issue(t, testpki.LeafOptions{CommonName: "tier1-upstream"}), p.pod)
	return p
}

func poolOf(cas ...*testpki.CA) *x509.CertPool {
	pool := x509.NewCertPool()
	for _, ca := range cas {
		pool.AddCert(ca.Cert)
	}
	return pool
}

// httpsClient trusts ca and presents no certificate.
func httpsClient(ca *testpki.CA) *http.Client {
	return &http.Client{Timeout: 60 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: poolOf(ca)}}}
}

// startSimPod serves a simulated pod on loopback, over TLS when tlsCfg is
// set, and returns its host:port.
func startSimPod(t *testing.T, name string, timeScale float64, tlsCfg *tls.Config) string {
	t.Helper()
	s, err := simserver.New(simserver.Config{Name: name, TimeScale: timeScale, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	if tlsCfg != nil {
		ln = tls.NewListener(ln, tlsCfg)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = s.Serve(ctx, ln) }()
	t.Cleanup(func() { cancel(); <-done })
	return addr
}

// tier1Run is a Tier 1 served in process.
type tier1Run struct {
	addr, extProc string
	srv           *t1server.Server
}

// startTier1TLS decodes yml (as `infergate tier1` would read the file),
// builds Tier 1 and serves it on loopback, with an ext_proc listener when
// extProc is set.
func startTier1TLS(t *testing.T, yml string, extProc bool) *tier1Run {
	t.Helper()
	var cfg t1server.Config
	if err := config.Decode("tier1.yaml", []byte(yml), &cfg); err != nil {
		t.Fatalf("tier1 config: %v\n%s", err, yml)
	}
	ctx, cancel := context.WithCancel(context.Background())
	srv, err := t1server.New(ctx, &cfg, t1server.Options{Logger: slog.New(slog.DiscardHandler), ShutdownTimeout: 2 * time.Second,
		TLSReloadInterval: tlsReload})
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &tier1Run{addr: ln.Addr().String(), srv: srv}
	var eln net.Listener
	if extProc {
		if eln, err = net.Listen("tcp", "127.0.0.1:0"); err != nil {
			t.Fatal(err)
		}
		r.extProc = eln.Addr().String()
	}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx, ln, eln) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("tier1 Serve: %v", err)
		}
		srv.Close()
	})
	return r
}

// tier1YAML is a Tier 1 config with one pool of the simulated model over
// pods, plus extra keys.
func tier1YAML(extra string, pods ...string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "metrics_listen: \"-\"\nauth: {tokens: [%s]}\nscrape: {interval: 50ms, models_interval: 100ms}\n%s", tlsTier1Token, extra)
	fmt.Fprintf(&b, "pools: [{name: llama, model: %s}]\npods:\n", tlsModel)
	for i, p := range pods {
		fmt.Fprintf(&b, "  - {name: pod-%d, address: %q, pool: llama, engine: vllm, gpu: h100}\n", i, p)
	}
	return b.String()
}

// startTier2TLS serves Tier 2 in process on loopback with cfg (its front
// door's TLS included) and returns the front door's address.
func startTier2TLS(t *testing.T, cfg t2server.Config, reg *prometheus.Registry) string {
	t.Helper()
	cfg.Region = "local"
	cfg.Tenants = []tenant.Tenant{{ID: "tls", Name: "TLS test"}}
	cfg.Keys = []tenant.SeedKey{{TenantID: "tls", Name: "it", Key: tlsKey}}
	cfg.Tier1.Token = tlsTier1Token
	cfg.Tier1.PollInterval = 200 * time.Millisecond
	ctx, cancel := context.WithCancel(context.Background())
	srv, err := t2server.New(ctx, cfg, t2server.Options{Logger: slog.New(slog.DiscardHandler), ShutdownTimeout: 2 * time.Second,
		Registry: reg, TLSReloadInterval: tlsReload})
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx, ln, nil) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("tier2 Serve: %v", err)
		}
		_ = srv.Close()
	})
	return ln.Addr().String()
}

// chatOver posts a chat completion to base with key and returns the
// status and body.
func chatOver(t *testing.T, c *http.Client, base, key string, maxTokens int) (int, []byte) {
	t.Helper()
	body := fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":"hello over TLS"}],"max_tokens":%d}`, tlsModel, maxTokens)
	req, _ := http.NewRequest(http.MethodPost, base+"/v1/chat/completions", strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("chat over %s: %v", base, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

// chatContent is the first choice's message content of a completion.
func chatContent(b []byte) string {
	var r struct {
		Choices []struct {
			Message struct {
				Content string `json:"content"`
			} `json:"message"`
		} `json:"choices"`
	}
	if json.Unmarshal(b, &r) != nil || len(r.Choices) == 0 {
		return ""
	}
	return r.Choices[0].Message.Content
}

// openAIError decodes an OpenAI error envelope; ok is false when b is not
// one.
func openAIError(b []byte) (msg string, ok bool) {
	var e struct {
		Error *struct {
			Message string `json:"message"`
			Type    string `json:"type"`
		} `json:"error"`
	}
	if json.Unmarshal(b, &e) != nil || e.Error == nil || e.Error.Message == "" || e.Error.Type == "" {
		return "", false
	}
	return e.Error.Message, true
}

// waitChatOK sends chats until one returns 200 with content.
func waitChatOK(t *testing.T, c *http.Client, base, key string) []byte {
	t.Helper()
	var out []byte
	waitFor(t, "a chat completion through "+base, 30*time.Second, func() error {
		code, b := chatOver(t, c, base, key, 8)
		if code != http.StatusOK || chatContent(b) == "" {
			return fmt.Errorf("%d %s", code, b)
		}
		out = b
		return nil
	})
	return out
}

// TestTLSMutualTiers runs client → Tier 2 (https) → Tier 1 (mutual TLS,
// found through a real Consul agent) → simulated pod. Tier 1 requires a
// client certificate from the mesh CA: a Tier 2 presenting one is served
// a real completion; a Tier 2 that trusts Tier 1 but has no certificate
// gets a prompt OpenAI error, not a hang. Tier 2's front door serves
// https only: plain HTTP on its port gets Go's 400.
func TestTLSMutualTiers(t *testing.T) {
	needTLSStack(t)
	p := newTLSPKI(t)
	consul := testservice.StartConsul(t)
	pod := startSimPod(t, "pod-0", 0.05, nil)
	t1 := startTier1TLS(t, tier1YAML(fmt.Sprintf(`cluster: mtls-a
region: local
tls: {cert_file: %q, key_file: %q, client_ca_file: %q}
consul: {address: %q, check_interval: 1s}
`, p.tier1.Cert, p.tier1.Key, p.tier1.CA, consul.Addr()), pod), false)

	// Registered with scheme https and a TCP check (Consul's HTTP check
	// cannot present a client certificate), which passes.
	cc, err := api.NewClient(&api.Config{Address: consul.Addr()})
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "tier1's consul check to pass", 20*time.Second, func() error {
		entries, _, err := cc.Health().Service("infergate-tier1", "", true, nil)
		if err != nil {
			return err
		}
		if len(entries) != 1 {
			return fmt.Errorf("%d passing instances", len(entries))
		}
		if s := entries[0].Service.Meta["scheme"]; s != "https" {
			t.Fatalf("registered scheme %q, want https", s)
		}
		for _, c := range entries[0].Checks {
			if c.ServiceID != "" && c.Type != "tcp" {
				t.Fatalf("check type %q, want tcp", c.Type)
			}
		}
		return nil
	})

	consulCfg := &t2server.ConsulConfig{Address: consul.Addr(), WaitTime: 5 * time.Second, MinInterval: 50 * time.Millisecond}
	front := tlsfiles.Server{CertFile: p.tier2.Cert, KeyFile: p.tier2.Key}
	withCert := startTier2TLS(t, t2server.Config{Consul: consulCfg, TLS: front,
		Tier1: t2server.Tier1Config{TLS: tlsfiles.Client{CAFile: p.tier1.CA, CertFile: p.tier2Client.Cert, KeyFile: p.tier2Client.Key}}}, nil)
	client := httpsClient(p.front)
	b := waitChatOK(t, client, "https://"+withCert, tlsKey)
	t.Logf("served over mutual TLS: %.120s", b)

	// Plain HTTP on the front door's port.
	resp, err := http.Get("http://" + withCert + "/ready")
	if err == nil {
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK || !strings.Contains(string(body), "HTTPS server") {
			t.Errorf("plain HTTP on the TLS front door: %s %q", resp.Status, body)
		}
	}
	// A client that does not trust the front door's CA is refused.
	if _, err := httpsClient(p.mesh).Get("https://" + withCert + "/ready"); err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Errorf("client with the wrong CA: %v", err)
	}

	// The same Tier 1, from a Tier 2 with no client certificate.
	without := startTier2TLS(t, t2server.Config{Consul: consulCfg, TLS: front,
		Tier1: t2server.Tier1Config{TLS: tlsfiles.Client{CAFile: p.tier1.CA}}}, nil)
	waitFor(t, "tier2 without a client certificate to know the model", 20*time.Second, func() error {
		start := time.Now()
		code, b := chatOver(t, client, "https://"+without, tlsKey, 8)
		if took := time.Since(start); took > 20*time.Second {
			t.Fatalf("refused request took %s", took)
		}
		if code == http.StatusOK {
			t.Fatalf("Tier 1 served a Tier 2 without a client certificate: %s", b)
		}
		msg, ok := openAIError(b)
		if !ok {
			t.Fatalf("status %d without an OpenAI error body: %q", code, b)
		}
		if code == http.StatusNotFound || code == http.StatusServiceUnavailable && strings.Contains(msg, "no cluster") {
			return fmt.Errorf("not routed yet: %d %s", code, msg)
		}
		t.Logf("without a client certificate: %d %s", code, msg)
		return nil
	})
	// Tier 1 still serves the Tier 2 that has one.
	if code, b := chatOver(t, client, "https://"+withCert, tlsKey, 8); code != http.StatusOK {
		t.Errorf("after the refused Tier 2: %d %s", code, b)
	}
	_ = t1
}

// TestTLSCertRotationUnderStream rotates Tier 2's front door and Tier 1's
// certificates while a streamed completion runs through both: the stream
// ends with [DONE] and every token, new connections get the new
// certificates, and nothing restarts.
func TestTLSCertRotationUnderStream(t *testing.T) {
	needTLSStack(t)
	p := newTLSPKI(t)
	pod := startSimPod(t, "pod-0", 1, nil) // real-time GPU: the stream lasts seconds
	t1 := startTier1TLS(t, tier1YAML(fmt.Sprintf("tls: {cert_file: %q, key_file: %q, client_ca_file: %q}\n",
		p.tier1.Cert, p.tier1.Key, p.tier1.CA), pod), false)
	reg := prometheus.NewRegistry()
	t2 := startTier2TLS(t, t2server.Config{
		TLS:      tlsfiles.Server{CertFile: p.tier2.Cert, KeyFile: p.tier2.Key},
		Tier1:    t2server.Tier1Config{TLS: tlsfiles.Client{CAFile: p.tier1.CA, CertFile: p.tier2Client.Cert, KeyFile: p.tier2Client.Key}},
		Clusters: []discovery.Cluster{{Name: "a", Region: "local", Address: "https://" + t1.addr, Models: []string{tlsModel}}},
	}, reg)
	client := httpsClient(p.front)
	waitChatOK(t, client, "https://"+t2, tlsKey)

	serial := func(addr string, ca *testpki.CA, cert *testpki.Files) *big.Int {
		t.Helper()
		cfg := &tls.Config{RootCAs: poolOf(ca)}
		if cert != nil {
			pair, err := tls.LoadX509KeyPair(cert.Cert, cert.Key)
			if err != nil {
				t.Fatal(err)
			}
			cfg.Certificates = []tls.Certificate{pair}
		}
		c, err := tls.Dial("tcp", addr, cfg)
		if err != nil {
			t.Fatalf("dial %s: %v", addr, err)
		}
		defer c.Close()
		return c.ConnectionState().PeerCertificates[0].SerialNumber
	}
	oldT2 := serial(t2, p.front, nil)

	// A long stream through the front door.
	body := fmt.Sprintf(`{"model":%q,"stream":true,"max_tokens":1000,"messages":[{"role":"user","content":"write at length"}]}`, tlsModel)
	req, _ := http.NewRequest(http.MethodPost, "https://"+t2+"/v1/chat/completions", strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+tlsKey)
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("stream: %s %s", resp.Status, b)
	}
	if got := resp.TLS.PeerCertificates[0].SerialNumber; got.Cmp(oldT2) != 0 {
		t.Fatalf("stream's connection has serial %v, want %v", got, oldT2)
	}
	started := make(chan struct{})
	type result struct {
		evs []sseEvent
		err error
		at  time.Time
	}
	ended := make(chan result, 1)
	go func() {
		evs, err := readEvents(resp.Body, 3, started)
		ended <- result{evs, err, time.Now()}
	}()
	select {
	case <-started:
	case r := <-ended:
		t.Fatalf("stream ended before its third token: %v %v", r.evs, r.err)
	case <-time.After(30 * time.Second):
		t.Fatal("no token within 30s")
	}

	// Rotate both certificates as cert-manager would: new key pairs
	// written over the files (each file replaced atomically).
	newT2 := p.front.Issue(t, testpki.LeafOptions{CommonName: "tier2-front-rotated"})
	testpki.WriteFile(t, p.tier2.Cert, newT2.CertPEM)
	testpki.WriteFile(t, p.tier2.Key, newT2.KeyPEM)
	newT1 := p.mesh.Issue(t, testpki.LeafOptions{CommonName: "tier1-rotated"})
	testpki.WriteFile(t, p.tier1.Cert, newT1.CertPEM)
	testpki.WriteFile(t, p.tier1.Key, newT1.KeyPEM)
	waitFor(t, "new connections to get the rotated certificates", 10*time.Second, func() error {
		if s := serial(t2, p.front, nil); s.Cmp(newT2.Cert.SerialNumber) != 0 {
			return fmt.Errorf("tier2 serves serial %v", s)
		}
		if s := serial(t1.addr, p.mesh, &p.tier2Client); s.Cmp(newT1.Cert.SerialNumber) != 0 {
			return fmt.Errorf("tier1 serves serial %v", s)
		}
		return nil
	})
	rotated := time.Now()

	r := <-ended
	if r.err != nil {
		t.Fatalf("stream broke: %v", r.err)
	}
	if !r.at.After(rotated) {
		t.Fatalf("the stream ended (%s) before the rotation was seen (%s): nothing was proven", r.at, rotated)
	}
	if n := len(r.evs); n == 0 || r.evs[n-1].data != "[DONE]" {
		t.Fatalf("stream did not end with [DONE]: %v", r.evs[max(0, n-3):])
	}
	tokens := 0
	for _, ev := range r.evs {
		if strings.Contains(ev.data, `"error"`) {
			t.Errorf("error event in the stream: %s", ev.data)
		}
		if strings.Contains(ev.data, `"content"`) {
			tokens++
		}
	}
	if tokens < 900 {
		t.Errorf("%d content events, want about 1000", tokens)
	}
	// The same process serves new requests with the new certificates.
	c2 := httpsClient(p.front)
	if code, b := chatOver(t, c2, "https://"+t2, tlsKey, 8); code != http.StatusOK {
		t.Errorf("after rotation: %d %s", code, b)
	}
	m, err := tlsfiles.NewMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	if n := testutil.ToFloat64(m.Reloads("tier2-api", "ok")); n < 1 {
		t.Errorf("infergate_tls_reloads_total{name=tier2-api,result=ok} = %v", n)
	}
}

// TestTLSPodsOverHTTPS: Tier 1 reaches pods served over TLS (requiring
// Tier 1's client certificate, as vLLM --ssl-cert-reqs 2 does), scraping
// /metrics and /v1/models and proxying over https. With the wrong CA the
// pod is not ready, its scrape error says why, and a request gets an
// OpenAI error; once the right bundle is written over the CA file, the
// pod is reached without a restart.
func TestTLSPodsOverHTTPS(t *testing.T) {
	needTLSStack(t)
	p := newTLSPKI(t)
	pair, err := tls.LoadX509KeyPair(p.podServer.Cert, p.podServer.Key)
	if err != nil {
		t.Fatal(err)
	}
	pod := startSimPod(t, "pod-0", 0.05, &tls.Config{Certificates: []tls.Certificate{pair},
		ClientCAs: poolOf(p.pod), ClientAuth: tls.RequireAndVerifyClientCert})

	good := startTier1TLS(t, tier1YAML(fmt.Sprintf("upstream: {scheme: https, tls: {ca_file: %q, cert_file: %q, key_file: %q}}\n",
		p.podServer.CA, p.tier1Client.Cert, p.tier1Client.Key), pod), false)
	waitPod(t, good.addr, func(d tlsPodDebug) error {
		if !d.Ready || len(d.Models) == 0 {
			return fmt.Errorf("ready %v, models %v, scrape error %q", d.Ready, d.Models, d.ScrapeError)
		}
		return nil
	})
	plain := &http.Client{Timeout: 30 * time.Second}
	code, b := chatOver(t, plain, "http://"+good.addr, tlsTier1Token, 8)
	if code != http.StatusOK || chatContent(b) == "" {
		t.Fatalf("chat through Tier 1 to the https pod: %d %s", code, b)
	}

	// Trusting another CA: the pod's certificate does not verify.
	wrongCA := filepath.Join(p.dir, "wrong-ca.crt")
	testpki.WriteFile(t, wrongCA, p.mesh.CertPEM)
	wrong := startTier1TLS(t, tier1YAML(fmt.Sprintf("upstream: {scheme: https, tls: {ca_file: %q, cert_file: %q, key_file: %q}}\n",
		wrongCA, p.tier1Client.Cert, p.tier1Client.Key), pod), false)
	waitPod(t, wrong.addr, func(d tlsPodDebug) error {
		if d.Ready {
			t.Fatal("pod ready through a CA that did not sign its certificate")
		}
		if !strings.Contains(d.ScrapeError, "certificate signed by unknown authority") {
			return fmt.Errorf("scrape error %q", d.ScrapeError)
		}
		return nil
	})
	code, b = chatOver(t, plain, "http://"+wrong.addr, tlsTier1Token, 8)
	if msg, ok := openAIError(b); code == http.StatusOK || !ok {
		t.Errorf("chat with the wrong pod CA: %d %s", code, b)
	} else {
		t.Logf("with the wrong pod CA: %d %s", code, msg)
	}
	// The right CA bundle written over the file: the next connections
	// verify against it, without a restart.
	testpki.WriteFile(t, wrongCA, p.pod.CertPEM)
	waitPod(t, wrong.addr, func(d tlsPodDebug) error {
		if !d.Ready {
			return fmt.Errorf("not ready after the CA bundle was fixed: %q", d.ScrapeError)
		}
		return nil
	})
	if code, b := chatOver(t, plain, "http://"+wrong.addr, tlsTier1Token, 8); code != http.StatusOK {
		t.Errorf("chat after the CA bundle was fixed: %d %s", code, b)
	}

	// Without a client certificate the pod refuses the handshake.
	nocert := startTier1TLS(t, tier1YAML(fmt.Sprintf("upstream: {scheme: https, tls: {ca_file: %q}}\n", p.podServer.CA), pod), false)
	waitPod(t, nocert.addr, func(d tlsPodDebug) error {
		if d.Ready {
			t.Fatal("pod ready without the client certificate it requires")
		}
		if !strings.Contains(d.ScrapeError, "certificate required") {
			return fmt.Errorf("scrape error %q", d.ScrapeError)
		}
		return nil
	})
}

// tlsPodDebug is the part of Tier 1's /debug/pods these tests read.
type tlsPodDebug struct {
	Ready       bool     `json:"ready"`
	Models      []string `json:"models"`
	ScrapeError string   `json:"scrape_error"`
}

// waitPod polls Tier 1's /debug/pods until cond accepts its only pod.
func waitPod(t *testing.T, addr string, cond func(tlsPodDebug) error) {
	t.Helper()
	waitFor(t, "pod state on "+addr, 20*time.Second, func() error {
		req, _ := http.NewRequest(http.MethodGet, "http://"+addr+"/debug/pods", nil)
		req.Header.Set("Authorization", "Bearer "+tlsTier1Token)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		var d struct {
			Pods []tlsPodDebug `json:"pods"`
		}
		if err := json.NewDecoder(resp.Body).Decode(&d); err != nil {
			return err
		}
		if len(d.Pods) != 1 {
			return fmt.Errorf("%d pods", len(d.Pods))
		}
		return cond(d.Pods[0])
	})
}

// TestTLSExtProc serves ext_proc over mutual TLS; a Go gRPC client stands
// in for Envoy (there is no Envoy binary here). With the client
// certificate, one request's headers and body are answered with the
// simulated pod as destination; without it, or in plain text, the stream
// fails promptly.
func TestTLSExtProc(t *testing.T) {
	needTLSStack(t)
	p := newTLSPKI(t)
	pod := startSimPod(t, "pod-0", 0.05, nil)
	t1 := startTier1TLS(t, tier1YAML(fmt.Sprintf("ext_proc_tls: {cert_file: %q, key_file: %q, client_ca_file: %q}\n",
		p.tier1.Cert, p.tier1.Key, p.tier1.CA), pod), true)
	waitPod(t, t1.addr, func(d tlsPodDebug) error {
		if !d.Ready {
			return fmt.Errorf("not ready: %q", d.ScrapeError)
		}
		return nil
	})
	pair, err := tls.LoadX509KeyPair(p.tier2Client.Cert, p.tier2Client.Key)
	if err != nil {
		t.Fatal(err)
	}
	dial := func(creds credentials.TransportCredentials) (extprocv3.ExternalProcessor_ProcessClient, error) {
		t.Helper()
		conn, err := grpc.NewClient(t1.extProc, grpc.WithTransportCredentials(creds))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = conn.Close() })
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		t.Cleanup(cancel)
		return extprocv3.NewExternalProcessorClient(conn).Process(ctx)
	}
	headers := &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{
		Headers: &corev3.HeaderMap{Headers: []*corev3.HeaderValue{
			{Key: ":method", RawValue: []byte("POST")}, {Key: ":path", RawValue: []byte("/v1/chat/completions")},
			{Key: "content-type", RawValue: []byte("application/json")},
			{Key: "authorization", RawValue: []byte("Bearer " + tlsTier1Token)},
		}}}}}
	body := &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{
		Body:        []byte(fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":"hi"}],"max_tokens":4}`, tlsModel)),
		EndOfStream: true}}}

	stream, err := dial(credentials.NewTLS(&tls.Config{RootCAs: poolOf(p.mesh), Certificates: []tls.Certificate{pair}}))
	if err != nil {
		t.Fatalf("open stream: %v", err)
	}
	if err := stream.Send(headers); err != nil {
		t.Fatal(err)
	}
	if r, err := stream.Recv(); err != nil || r.GetRequestHeaders() == nil {
		t.Fatalf("answer to headers: %v %v", r, err)
	}
	if err := stream.Send(body); err != nil {
		t.Fatal(err)
	}
	r, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	dest := ""
	for _, h := range r.GetRequestBody().GetResponse().GetHeaderMutation().GetSetHeaders() {
		if h.GetHeader().GetKey() == extproc.HeaderDestination {
			dest = string(h.GetHeader().GetRawValue())
		}
	}
	if dest != pod {
		t.Fatalf("destination %q, want the pod %s (answer %v)", dest, pod, r)
	}
	_ = stream.CloseSend()

	for name, creds := range map[string]credentials.TransportCredentials{
		"no client certificate": credentials.NewTLS(&tls.Config{RootCAs: poolOf(p.mesh)}),
		"wrong CA":              credentials.NewTLS(&tls.Config{RootCAs: poolOf(p.front), Certificates: []tls.Certificate{pair}}),
		"plain text":            insecure.NewCredentials(),
	} {
		start := time.Now()
		err := func() error {
			s, err := dial(creds)
			if err != nil {
				return err
			}
			if err := s.Send(headers); err != nil {
				return err
			}
			_, err = s.Recv()
			return err
		}()
		if err == nil {
			t.Errorf("%s: the ext_proc stream was served", name)
			continue
		}
		if c := status.Code(err); c != codes.Unavailable || time.Since(start) > 10*time.Second {
			t.Errorf("%s: %v after %s, want Unavailable promptly", name, err, time.Since(start))
		}
		t.Logf("%s: %v", name, err)
	}
}

// TestTLSStartupErrors runs `infergate tier1` and `infergate tier2` with
// bad TLS files: each exits at once, with an error naming the key and the
// file at fault, before listening.
func TestTLSStartupErrors(t *testing.T) {
	needBinary(t)
	dir := t.TempDir()
	ca := testpki.NewCA(t, "startup CA")
	good := testpki.Write(t, dir, "good", ca.Issue(t, testpki.LeafOptions{}), ca)
	other := testpki.Write(t, dir, "other", ca.Issue(t, testpki.LeafOptions{}), nil)
	expired := testpki.Write(t, dir, "expired", ca.Issue(t, testpki.LeafOptions{
		NotBefore: time.Now().Add(-48 * time.Hour), NotAfter: time.Now().Add(-time.Hour)}), nil)
	noPEM := filepath.Join(dir, "no-pem-ca.crt")
	testpki.WriteFile(t, noPEM, []byte("not a certificate\n"))
	keyDir := filepath.Join(dir, "unreadable.key")
	if err := os.Mkdir(keyDir, 0o700); err != nil {
		t.Fatal(err)
	}
	tier1 := "listen: \"127.0.0.1:0\"\nmetrics_listen: \"-\"\nauth: {disabled: true}\npools: [{name: p, model: m}]\n"
	tier2 := "listen: \"127.0.0.1:0\"\nregion: r\nclusters: [{name: a, region: r, address: \"https://127.0.0.1:1\", models: [m]}]\nmetrics: {listen: \"127.0.0.1:0\"}\n"
	tests := []struct {
		name, cmd, yaml, key, file string
	}{
		{"tier1 expired certificate", "tier1", tier1 + fmt.Sprintf("tls: {cert_file: %q, key_file: %q}\n", expired.Cert, expired.Key), "tls:", expired.Cert},
		{"tier1 mismatched key", "tier1", tier1 + fmt.Sprintf("metrics_tls: {cert_file: %q, key_file: %q}\n", good.Cert, other.Key), "metrics_tls:", other.Key},
		{"tier1 unknown client CA", "tier1", tier1 + fmt.Sprintf("tls: {cert_file: %q, key_file: %q, client_ca_file: %q}\n", good.Cert, good.Key, noPEM), "tls:", noPEM},
		{"tier1 unreadable key", "tier1", tier1 + fmt.Sprintf("ext_proc_tls: {cert_file: %q, key_file: %q}\n", good.Cert, keyDir), "ext_proc_tls:", keyDir},
		{"tier1 unknown pod CA", "tier1", tier1 + fmt.Sprintf("upstream: {scheme: https, tls: {ca_file: %q}}\n", noPEM), "upstream.tls:", noPEM},
		{"tier2 expired certificate", "tier2", tier2 + fmt.Sprintf("tls: {cert_file: %q, key_file: %q}\n", expired.Cert, expired.Key), "tls:", expired.Cert},
		{"tier2 mismatched key", "tier2", tier2 + fmt.Sprintf("metrics: {listen: \"127.0.0.1:0\", tls: {cert_file: %q, key_file: %q}}\n", good.Cert, other.Key), "metrics.tls:", other.Key},
		{"tier2 unknown tier1 CA", "tier2", tier2 + fmt.Sprintf("tier1: {tls: {ca_file: %q}}\n", noPEM), "tier1.tls:", noPEM},
		{"tier2 unreadable key", "tier2", tier2 + fmt.Sprintf("tls: {cert_file: %q, key_file: %q}\n", good.Cert, keyDir), "tls:", keyDir},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// tier2's metrics key appears twice in one case: keep the last.
			yml := tt.yaml
			if strings.Count(yml, "metrics:") > 1 {
				yml = strings.Replace(yml, "metrics: {listen: \"127.0.0.1:0\"}\n", "", 1)
			}
			path := filepath.Join(dir, fmt.Sprintf("case%d.yaml", i))
			if err := os.WriteFile(path, []byte(yml), 0o600); err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			cmd := exec.CommandContext(ctx, binary, tt.cmd, "--config", path)
			var stdout, stderr bytes.Buffer
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			err := cmd.Run()
			if ctx.Err() != nil {
				t.Fatalf("still running after 30s:\n%s", stderr.String())
			}
			if err == nil {
				t.Fatalf("exited 0:\n%s", stderr.String())
			}
			if strings.Contains(stdout.String(), "listening") {
				t.Errorf("listened before failing: %s", stdout.String())
			}
			for _, want := range []string{tt.key, tt.file} {
				if !strings.Contains(stderr.String(), want) {
					t.Errorf("stderr does not name %q:\n%s", want, stderr.String())
				}
			}
		})
	}
}
