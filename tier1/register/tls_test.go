package register_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/infergate/infergate/internal/testpki"
	"github.com/infergate/infergate/internal/testservice"
	"github.com/infergate/infergate/tier1/register"
)

// TestRegisterTLSChecks registers three routers serving TLS with a
// certificate from a CA the Consul agent does not trust, and reads the
// checks' outcome from a real agent: an https check that skips
// verification passes, one that verifies fails (which is why Tier 1 skips
// it for its own certificate), and a TCP check passes against a listener
// that requires client certificates, where no HTTP check could.
func TestRegisterTLSChecks(t *testing.T) {
	consul := testservice.StartConsul(t)
	client, err := api.NewClient(&api.Config{Address: consul.Addr()})
	if err != nil {
		t.Fatal(err)
	}
	ca := testpki.NewCA(t, "private CA")
	leaf := ca.Issue(t, testpki.LeafOptions{})
	pair, err := tls.X509KeyPair(leaf.CertPEM, leaf.KeyPEM)
	if err != nil {
		t.Fatal(err)
	}
	ready := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {})
	quiet := log.New(io.Discard, "", 0) // refused handshakes are the point
	httpsSrv := httptest.NewUnstartedServer(ready)
	httpsSrv.Config.ErrorLog = quiet
	httpsSrv.TLS = &tls.Config{Certificates: []tls.Certificate{pair}}
	httpsSrv.StartTLS()
	defer httpsSrv.Close()
	pool := x509.NewCertPool()
	pool.AddCert(ca.Cert)
	mtlsSrv := httptest.NewUnstartedServer(ready)
	mtlsSrv.Config.ErrorLog = quiet
	mtlsSrv.TLS = &tls.Config{Certificates: []tls.Certificate{pair}, ClientCAs: pool, ClientAuth: tls.RequireAndVerifyClientCert}
	mtlsSrv.StartTLS()
	defer mtlsSrv.Close()

	hostPort := func(s *httptest.Server) (string, int) {
		u, _ := url.Parse(s.URL)
		p, _ := strconv.Atoi(u.Port())
		return u.Hostname(), p
	}
	reg := func(cluster string, s *httptest.Server, mod func(*register.Registration)) string {
		host, port := hostPort(s)
		r := register.Registration{Address: host, Port: port, Scheme: "https", Region: "r", Cluster: cluster,
			Models: []string{"m"}, CheckInterval: time.Second, InitialStatus: api.HealthCritical}
		mod(&r)
		if _, err := register.Register(context.Background(), client, r); err != nil {
			t.Fatal(err)
		}
		return register.ServiceName + "-" + cluster
	}
	skip := reg("skip", httpsSrv, func(r *register.Registration) {
		r.CheckHTTP, r.CheckTLSSkipVerify = httpsSrv.URL+"/ready", true
	})
	verify := reg("verify", httpsSrv, func(r *register.Registration) { r.CheckHTTP = httpsSrv.URL + "/ready" })
	host, port := hostPort(mtlsSrv)
	tcp := reg("tcp", mtlsSrv, func(r *register.Registration) { r.CheckTCP = net.JoinHostPort(host, strconv.Itoa(port)) })

	status := func(id string) (string, string) {
		checks, err := client.Agent().Checks()
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range checks {
			if c.ServiceID == id {
				return c.Status, c.Output
			}
		}
		t.Fatalf("no check for %s", id)
		return "", ""
	}
	deadline := time.Now().Add(15 * time.Second)
	for {
		s1, _ := status(skip)
		s2, out2 := status(verify)
		s3, _ := status(tcp)
		// The verifying check has run once it has output.
		if s1 == api.HealthPassing && s3 == api.HealthPassing && out2 != "" {
			if s2 != api.HealthCritical || !strings.Contains(out2, "certificate") {
				t.Errorf("verifying check: %s %q; want critical on the unknown CA", s2, out2)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("checks: skip-verify %s, verify %s (%q), tcp %s", s1, s2, out2, s3)
		}
		time.Sleep(100 * time.Millisecond)
	}

	if _, err := register.Register(context.Background(), client, register.Registration{
		Address: "127.0.0.1", Port: 1, Region: "r", Cluster: "both", Models: []string{"m"},
		CheckHTTP: "https://127.0.0.1:1/ready", CheckTCP: "127.0.0.1:1",
	}); err == nil || !strings.Contains(err.Error(), "exactly one") {
		t.Errorf("both checks: %v", err)
	}
}
