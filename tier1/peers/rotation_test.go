package peers

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/infergate/infergate/internal/testpki"
	"github.com/infergate/infergate/shared/tlsfiles"
)

// TestDiallerFollowsRotatedMeshCA: a replica whose mesh CA bundle is
// replaced on disk (cert-manager moving the mesh to a new CA, the new CA
// added to the bundle first) trusts the new CA on its next connection,
// without a restart. Before the rotation it refuses the peer's
// certificate from the new CA; after it, it streams to that peer.
func TestDiallerFollowsRotatedMeshCA(t *testing.T) {
	oldCA, newCA := testpki.NewCA(t, "mesh-old"), testpki.NewCA(t, "mesh-new")
	dir := t.TempDir()
	bundle := append(append([]byte{}, oldCA.CertPEM...), newCA.CertPEM...)

	// The peer already moved: a certificate from the new CA, both CAs
	// trusted.
	pf := testpki.Write(t, dir, "peer", newCA.Issue(t, testpki.LeafOptions{}), nil)
	pf.CA = filepath.Join(dir, "peer-ca.crt")
	testpki.WriteFile(t, pf.CA, bundle)
	peer := start(t, listen(t), fastOpts(loadTLS(t, TLSFiles{CertFile: pf.Cert, KeyFile: pf.Key, CAFile: pf.CA})), nil)

	// The dialler still trusts only the old CA, its files re-read every
	// 20 ms.
	df := testpki.Write(t, dir, "dialler", oldCA.Issue(t, testpki.LeafOptions{}), oldCA)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	m, err := LoadTLS(ctx, TLSFiles{CertFile: df.Cert, KeyFile: df.Key, CAFile: df.CA}, tlsfiles.Options{Interval: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	dialler := start(t, listen(t), fastOpts(m), &Static{peer.addr})
	eventually(t, "the dialler refusing the new CA's certificate (the peer sees its handshakes fail)", func() bool { return peer.node.Stats().Rejected > 0 })
	if s := dialler.node.Stats(); s.Connected != 0 {
		t.Fatalf("connected to a peer it cannot verify: %+v", s)
	}

	testpki.WriteFile(t, df.CA, bundle)
	eventually(t, "the dialler streaming to the peer after its CA bundle rotated", func() bool { return dialler.node.Stats().Connected == 1 })
}
