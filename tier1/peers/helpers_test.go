package peers

import (
	"context"
	"math/rand/v2"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/infergate/infergate/internal/testpki"
	"github.com/infergate/infergate/shared/tlsfiles"
	"github.com/infergate/infergate/tier1/picker"

	"github.com/infergate/infergate/tier1/prefix"
)

// meshPKI is a mesh CA and the certificates it issues, written to files
// and loaded as a replica loads them (LoadTLS): every handshake in these
// tests is real TLS 1.3 on a real socket.
type meshPKI struct {
	dir string
	ca  *testpki.CA
	n   int
}

func newMeshPKI(t *testing.T, name string) *meshPKI {
	t.Helper()
	return &meshPKI{dir: t.TempDir(), ca: testpki.NewCA(t, name)}
}

// files issues a certificate for localhost / 127.0.0.1 (or o) and writes
// it with the CA.
func (p *meshPKI) files(t *testing.T, o testpki.LeafOptions) TLSFiles {
	t.Helper()
	p.n++
	prefix := filepath.Base(p.dir) + "-" + string(rune('a'+p.n))
	f := testpki.Write(t, p.dir, prefix, p.ca.Issue(t, o), p.ca)
	return TLSFiles{CertFile: f.Cert, KeyFile: f.Key, CAFile: f.CA}
}

func (p *meshPKI) tls(t *testing.T) *TLS {
	t.Helper()
	return loadTLS(t, p.files(t, testpki.LeafOptions{}))
}

func loadTLS(t *testing.T, f TLSFiles) *TLS {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	m, err := LoadTLS(ctx, f, tlsfiles.Options{Interval: -1})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// replica is one Tier 1 replica's tracker and node, on a real socket.
type replica struct {
	tr     *picker.Tracker
	node   *Node
	addr   string
	cancel context.CancelFunc
	done   chan struct{}
}

func fastOpts(m *TLS) Options {
	return Options{TLS: m, Flush: 2 * time.Millisecond, Heartbeat: 20 * time.Millisecond,
		TTL: 300 * time.Millisecond, Refresh: 50 * time.Millisecond, DialTimeout: 2 * time.Second}
}

func listen(t *testing.T) net.Listener {
	t.Helper()
	return listenOn(t, "127.0.0.1:0")
}

func listenOn(t *testing.T, addr string) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	return ln
}

func start(t *testing.T, ln net.Listener, opts Options, peers *Static) *replica {
	t.Helper()
	return startWith(t, picker.NewTracker(picker.TrackerOptions{Index: exactIndex}), ln, opts, peers)
}

func startWith(t *testing.T, tr *picker.Tracker, ln net.Listener, opts Options, peers *Static) *replica {
	t.Helper()
	if peers != nil {
		opts.Discover = discoverFunc(func() []string { return *peers })
	}
	n, err := New(tr, opts)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &replica{tr: tr, node: n, cancel: cancel, done: make(chan struct{})}
	if ln != nil {
		r.addr = ln.Addr().String()
	}
	go func() { defer close(r.done); _ = n.Run(ctx, ln) }()
	t.Cleanup(r.stop)
	return r
}

func (r *replica) stop() {
	r.cancel()
	<-r.done
}

type discoverFunc func() []string

func (f discoverFunc) Peers(context.Context) ([]string, error) { return f(), nil }

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// replicas starts n replicas of one mesh, each with its own certificate
// from pki and the full address list (itself included, as a headless
// Service's DNS answer would be), and waits until each streams to the
// others.
func replicas(t *testing.T, n int, pki *meshPKI, tweak func(*Options)) []*replica {
	t.Helper()
	lns := make([]net.Listener, n)
	addrs := make(Static, n)
	for i := range lns {
		lns[i] = listen(t)
		addrs[i] = lns[i].Addr().String()
	}
	rs := make([]*replica, n)
	for i := range rs {
		opts := fastOpts(pki.tls(t))
		if tweak != nil {
			tweak(&opts)
		}
		rs[i] = start(t, lns[i], opts, &addrs)
	}
	for _, r := range rs {
		eventually(t, "every replica connected to its peers", func() bool {
			s := r.node.Stats()
			return s.Connected == n-1 && s.Origins == n-1
		})
	}
	return rs
}

// picks is what a replica's scheduler would do with a few requests now:
// the first-ranked pod of each, with a fixed tie-break seed. It changes
// when any count the scorers read changes.
func picks(t *testing.T, tr *picker.Tracker, names ...string) []string {
	t.Helper()
	s, err := picker.NewScheduler(picker.ProfileConfig{}, picker.Options{Tracker: tr, Rand: rand.New(rand.NewPCG(1, 2))})
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for i := range 12 {
		pods := make([]*picker.Pod, len(names))
		for j, n := range names {
			pods[j] = &picker.Pod{Name: n, Address: n + ":8000", Pool: "pool", BaseModel: "m", Engine: "vllm", Ready: true,
				MetricsAge: 10 * time.Millisecond, Metrics: picker.Metrics{HasKV: true}}
		}
		tr.Apply(pods)
		req := &picker.Request{Model: "m", PromptTokens: 1000 + 100*i, BlockHashes: []uint64{uint64(i) + 1000}}
		res, err := s.Schedule(req, pods)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, res.Ranked[0].Name)
	}
	return out
}

func splitHostPort(a string) (string, string, error) { return net.SplitHostPort(a) }

func contains(s, sub string) bool { return strings.Contains(s, sub) }

func tlsOptions() tlsfiles.Options { return tlsfiles.Options{Interval: -1} }

func insecureCreds() credentials.TransportCredentials { return insecure.NewCredentials() }

// exactIndex keeps every block, for tests that count blocks exactly.
var exactIndex = prefix.IndexOptions{Stride: 1}
