package peers

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"

	"google.golang.org/grpc/credentials"

	"github.com/infergate/infergate/shared/tlsfiles"
)

// TLS is the mesh's mutual TLS: every replica serves and dials with one
// certificate from the mesh CA and accepts only peers holding one.
type TLS struct {
	// Server must require and verify client certificates against the
	// mesh CA.
	Server *tls.Config
	// Client presents this replica's certificate and verifies the peer's
	// against the mesh CA.
	Client *tls.Config
	// ClientFunc, when set, is called for each connection a replica dials
	// and its configuration used instead of Client, so a rotated mesh CA
	// bundle applies to the next connection (LoadTLS sets it; a
	// tls.Config's RootCAs is fixed once made).
	ClientFunc func() *tls.Config
}

// TLSFiles are the mesh's PEM files (config peers.tls).
type TLSFiles struct {
	// CertFile and KeyFile are this replica's certificate chain (leaf
	// first) and key; the certificate serves both ends of a stream, so it
	// needs the server and client auth usages.
	CertFile, KeyFile string
	// CAFile is the mesh CA: peers' certificates, client and server, must
	// chain to it. Every certificate it issues is a full member of the
	// mesh, so it should be a CA of its own.
	CAFile string
	// ServerName is the name verified in a dialled peer's certificate
	// (default: the address dialled).
	ServerName string
	// MinVersion is "1.3" (default) or "1.2".
	MinVersion string
}

// LoadTLS checks that f's certificate chains to its CA for both usages
// (a replica the mesh would refuse fails at start, naming the file), and
// returns configurations that re-read the files as they rotate.
func LoadTLS(ctx context.Context, f TLSFiles, opts tlsfiles.Options) (*TLS, error) {
	if f.CertFile == "" || f.KeyFile == "" || f.CAFile == "" {
		return nil, errors.New("cert_file, key_file and ca_file are all required")
	}
	for _, u := range []struct {
		usage x509.ExtKeyUsage
		name  string
	}{{x509.ExtKeyUsageServerAuth, "server auth"}, {x509.ExtKeyUsageClientAuth, "client auth"}} {
		if err := tlsfiles.VerifyLeaf(f.CertFile, f.CAFile, u.usage); err != nil {
			return nil, fmt.Errorf("%w (a replica's certificate must chain to the mesh CA with the %s usage)", err, u.name)
		}
	}
	if opts.Name == "" {
		opts.Name = "tier1-peers"
	}
	opts.NextProtos = []string{"h2"}
	srv, err := tlsfiles.NewServer(ctx, tlsfiles.Server{CertFile: f.CertFile, KeyFile: f.KeyFile, ClientCAFile: f.CAFile,
		ClientAuth: "require", MinVersion: f.MinVersion}, opts)
	if err != nil {
		return nil, err
	}
	cli, err := tlsfiles.NewClient(ctx, tlsfiles.Client{CAFile: f.CAFile, CertFile: f.CertFile, KeyFile: f.KeyFile,
		ServerName: f.ServerName, MinVersion: f.MinVersion}, opts)
	if err != nil {
		return nil, err
	}
	return &TLS{Server: srv.Config(), Client: cli.Config(), ClientFunc: cli.Config}, nil
}

// freshClientCreds makes gRPC's TLS credentials from a new configuration
// at each client handshake: gRPC's own are built on one tls.Config, whose
// CA pool would outlive a rotation of the mesh CA bundle.
type freshClientCreds struct {
	credentials.TransportCredentials // for Info and the server side (unused when dialling)
	config                           func() *tls.Config
}

func newFreshClientCreds(config func() *tls.Config) *freshClientCreds {
	return &freshClientCreds{TransportCredentials: credentials.NewTLS(config()), config: config}
}

func (c *freshClientCreds) ClientHandshake(ctx context.Context, authority string, conn net.Conn) (net.Conn, credentials.AuthInfo, error) {
	return credentials.NewTLS(c.config()).ClientHandshake(ctx, authority, conn)
}

func (c *freshClientCreds) Clone() credentials.TransportCredentials {
	return newFreshClientCreds(c.config)
}

// watchedCreds reports failed handshakes, which gRPC otherwise only logs
// at a level nobody sees.
type watchedCreds struct {
	credentials.TransportCredentials
	fail func(net.Addr, error)
}

func (c *watchedCreds) ServerHandshake(conn net.Conn) (net.Conn, credentials.AuthInfo, error) {
	out, ai, err := c.TransportCredentials.ServerHandshake(conn)
	// A connection closed before saying anything (a port probe) is not
	// a peer refused.
	if err != nil && !errors.Is(err, io.EOF) {
		c.fail(conn.RemoteAddr(), err)
	}
	return out, ai, err
}

func (c *watchedCreds) ClientHandshake(ctx context.Context, authority string, conn net.Conn) (net.Conn, credentials.AuthInfo, error) {
	out, ai, err := c.TransportCredentials.ClientHandshake(ctx, authority, conn)
	if err != nil && ctx.Err() == nil {
		c.fail(conn.RemoteAddr(), err)
	}
	return out, ai, err
}

func (c *watchedCreds) Clone() credentials.TransportCredentials {
	return &watchedCreds{TransportCredentials: c.TransportCredentials.Clone(), fail: c.fail}
}
