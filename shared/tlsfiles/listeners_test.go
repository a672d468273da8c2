package tlsfiles_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"net"
	"path/filepath"
	"strings"
	"testing"

	"github.com/infergate/infergate/internal/testpki"
	"github.com/infergate/infergate/shared/tlsfiles"
)

// NewListeners loads the enabled blocks only, each offering its own ALPN
// list, and names the key and the file of a bad block; Wrap serves TLS
// with a loaded block and plain text without one.
func TestNewListeners(t *testing.T) {
	dir := t.TempDir()
	ca := testpki.NewCA(t, "ca")
	f := testpki.Write(t, dir, "server", ca.Issue(t, testpki.LeafOptions{}), ca)
	roots := x509.NewCertPool()
	roots.AddCert(ca.Cert)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	good := tlsfiles.Server{CertFile: f.Cert, KeyFile: f.Key}
	scs, err := tlsfiles.NewListeners(ctx, []tlsfiles.Listener{
		{Key: "tls", Name: "api", Block: good, NextProtos: tlsfiles.HTTP1},
		{Key: "metrics.tls", Name: "metrics"},
		{Key: "grpc_tls", Name: "grpc", Block: good, NextProtos: []string{"h2"}},
	}, tlsfiles.Options{Interval: -1})
	if err != nil {
		t.Fatal(err)
	}
	if len(scs) != 3 || scs[0] == nil || scs[1] != nil || scs[2] == nil {
		t.Fatalf("configs %v: want loaded, nil, loaded", scs)
	}
	if scs[1].ConfigOrNil() != nil {
		t.Error("a nil ServerConfig has a configuration")
	}
	for i, want := range []string{"http/1.1", "h2"} {
		sc := scs[2*i]
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		tln := sc.Wrap(ln)
		go func() {
			c, err := tln.Accept()
			if err != nil {
				return
			}
			defer c.Close()
			if err := c.(*tls.Conn).Handshake(); err != nil {
				t.Errorf("server handshake: %v", err)
			}
		}()
		c, err := tls.Dial("tcp", ln.Addr().String(), &tls.Config{RootCAs: roots, ServerName: "localhost", NextProtos: []string{"h2", "http/1.1"}})
		if err != nil {
			t.Fatal(err)
		}
		if got := c.ConnectionState().NegotiatedProtocol; got != want {
			t.Errorf("listener %d negotiated %q, want %q", 2*i, got, want)
		}
		c.Close()
		tln.Close()
	}
	plain, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close()
	if scs[1].Wrap(plain) != plain {
		t.Error("Wrap without a configuration did not return the listener as is")
	}

	missing := filepath.Join(dir, "missing.key")
	_, err = tlsfiles.NewListeners(ctx, []tlsfiles.Listener{
		{Key: "tls", Name: "api", Block: good},
		{Key: "admin.tls", Name: "admin", Block: tlsfiles.Server{CertFile: f.Cert, KeyFile: missing}},
	}, tlsfiles.Options{Interval: -1})
	if err == nil || !strings.HasPrefix(err.Error(), "admin.tls: ") || !strings.Contains(err.Error(), missing) {
		t.Fatalf("error %v: want one naming admin.tls and %s", err, missing)
	}
}

// ValidateListeners names each failing block by its key, keeps the order
// of the list, and says nothing of blocks that are off or well formed.
func TestValidateListeners(t *testing.T) {
	for _, tc := range []struct {
		name string
		ls   []tlsfiles.Listener
		want []string
	}{
		{"all off", []tlsfiles.Listener{{Key: "tls"}, {Key: "admin.tls"}}, nil},
		{"well formed", []tlsfiles.Listener{{Key: "tls", Block: tlsfiles.Server{CertFile: "c.pem", KeyFile: "k.pem"}}}, nil},
		{"two bad", []tlsfiles.Listener{
			{Key: "tls", Block: tlsfiles.Server{CertFile: "c.pem"}},
			{Key: "admin.tls", Block: tlsfiles.Server{CertFile: "c.pem", KeyFile: "k.pem"}},
			{Key: "metrics.tls", Block: tlsfiles.Server{MinVersion: "1.2"}},
		}, []string{
			"tls: cert_file and key_file must both be set",
			"metrics.tls: cert_file and key_file are required when any other TLS key is set",
		}},
		{"client auth", []tlsfiles.Listener{{Key: "ext_proc_tls", Block: tlsfiles.Server{CertFile: "c.pem", KeyFile: "k.pem", ClientAuth: "always"}}},
			[]string{`ext_proc_tls.client_auth "always": want require or verify_if_given`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			errs := tlsfiles.ValidateListeners(tc.ls)
			var got []string
			for _, err := range errs {
				got = append(got, err.Error())
			}
			if strings.Join(got, "\n") != strings.Join(tc.want, "\n") || len(got) != len(tc.want) {
				t.Errorf("errors:\n%q\nwant:\n%q", got, tc.want)
			}
		})
	}
}
