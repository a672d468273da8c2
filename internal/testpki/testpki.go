// Package testpki makes certificate authorities and certificates for tests
// (real X.509, real keys: the handshakes they drive are real TLS).
package testpki

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// CA is a certificate authority that issues leaf certificates.
type CA struct {
	Cert    *x509.Certificate
	key     *ecdsa.PrivateKey
	CertPEM []byte
}

// NewCA makes a self-signed CA named name.
func NewCA(t testing.TB, name string) *CA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tpl := &x509.Certificate{
		SerialNumber:          serial(t),
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tpl, tpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return &CA{Cert: cert, key: key, CertPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
}

func serial(t testing.TB) *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// Leaf is an issued certificate and its key, PEM encoded.
type Leaf struct {
	CertPEM, KeyPEM []byte
	Cert            *x509.Certificate
}

// LeafOptions shape an issued certificate; the zero value is a server and
// client certificate for localhost and 127.0.0.1, valid for a day.
type LeafOptions struct {
	CommonName string
	DNSNames   []string
	IPs        []net.IP
	NotBefore  time.Time
	NotAfter   time.Time
}

// Issue signs a certificate valid for both server and client use.
func (ca *CA) Issue(t testing.TB, o LeafOptions) Leaf {
	t.Helper()
	if o.CommonName == "" {
		o.CommonName = "localhost"
	}
	if o.DNSNames == nil {
		o.DNSNames = []string{"localhost"}
	}
	if o.IPs == nil {
		o.IPs = []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback}
	}
	if o.NotBefore.IsZero() {
		o.NotBefore = time.Now().Add(-time.Hour)
	}
	if o.NotAfter.IsZero() {
		o.NotAfter = time.Now().Add(24 * time.Hour)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tpl := &x509.Certificate{
		SerialNumber: serial(t),
		Subject:      pkix.Name{CommonName: o.CommonName},
		DNSNames:     o.DNSNames,
		IPAddresses:  o.IPs,
		NotBefore:    o.NotBefore,
		NotAfter:     o.NotAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tpl, ca.Cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return Leaf{
		CertPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		KeyPEM:  pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kder}),
		Cert:    cert,
	}
}

// Files are PEM files written for a test.
type Files struct {
	Cert, Key, CA string
}

// Write writes leaf and ca's certificate into dir under prefix (prefix.crt,
// prefix.key, prefix-ca.crt) and returns the paths. ca may be nil.
func Write(t testing.TB, dir, prefix string, leaf Leaf, ca *CA) Files {
	t.Helper()
	f := Files{Cert: filepath.Join(dir, prefix+".crt"), Key: filepath.Join(dir, prefix+".key")}
	WriteFile(t, f.Cert, leaf.CertPEM)
	WriteFile(t, f.Key, leaf.KeyPEM)
	if ca != nil {
		f.CA = filepath.Join(dir, prefix+"-ca.crt")
		WriteFile(t, f.CA, ca.CertPEM)
	}
	return f
}

// WriteFile replaces path's content atomically (a rename, as a Kubernetes
// Secret volume update does), so a reader never sees half a file.
func WriteFile(t testing.TB, path string, b []byte) {
	t.Helper()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}
