package server

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/infergate/infergate/internal/testpki"
	"github.com/infergate/infergate/shared/config"
	"github.com/infergate/infergate/tier1/picker"
)

// meshFiles issues a replica certificate from ca into dir and returns the
// peers.tls block naming the files.
func meshFiles(t *testing.T, dir, name string, ca *testpki.CA) string {
	t.Helper()
	f := testpki.Write(t, dir, name, ca.Issue(t, testpki.LeafOptions{DNSNames: []string{"tier1-peers.test"}}), ca)
	return fmt.Sprintf("{cert_file: %q, key_file: %q, ca_file: %q, server_name: tier1-peers.test}", f.Cert, f.Key, f.CA)
}

func decode(t *testing.T, yml string) *Config {
	t.Helper()
	var cfg Config
	if err := config.Decode("t.yaml", []byte(yml), &cfg); err != nil {
		t.Fatal(err)
	}
	return &cfg
}

const peersBase = "auth: {disabled: true}\nmetrics_listen: \"-\"\npools: [{name: p, model: m}]\n" +
	"pods: [{name: p0, address: \"127.0.0.1:1\", pool: p, engine: vllm}]\n"

// Four Tier 1 servers configured as replicas share their dispatches over
// the mutually authenticated mesh (real certificates, real handshakes).
func TestReplicasShareState(t *testing.T) {
	const n = 4
	dir := t.TempDir()
	ca := testpki.NewCA(t, "mesh")
	key := filepath.Join(dir, "hash.key")
	if err := os.WriteFile(key, []byte("a-deployment-wide-prefix-hash-secret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	lns := make([]net.Listener, n)
	var static string
	for i := range lns {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		lns[i] = ln
		static += fmt.Sprintf("%q,", ln.Addr().String())
	}
	srvs := make([]*Server, n)
	for i := range srvs {
		cfg := decode(t, peersBase+fmt.Sprintf("peers: {listen: %q, static: [%s], tls: %s, hash_key_file: %q, heartbeat: 20ms, ttl: 300ms}\n",
			lns[i].Addr().String(), static, meshFiles(t, dir, fmt.Sprint("r", i), ca), key))
		api, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		srv, err := New(ctx, cfg, Options{PeersListener: lns[i], ShutdownTimeout: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { done <- srv.Serve(ctx, api, nil) }()
		t.Cleanup(func() { cancel(); <-done; srv.Close() })
		srvs[i] = srv
	}
	for i, srv := range srvs {
		deadline := time.Now().Add(10 * time.Second)
		for s := srv.Peers().Stats(); s.Connected != n-1 || s.Origins != n-1; s = srv.Peers().Stats() {
			if time.Now().After(deadline) {
				t.Fatalf("replica %d: %+v, want %d peers connected", i, s, n-1)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	req := &picker.Request{PromptTokens: 500, BlockHashes: []uint64{1, 2, 3}}
	srvs[1].Gateway().Tracker().Dispatched("p0", req)
	// A pod the replicas do not route to: its state is not kept.
	srvs[1].Gateway().Tracker().Dispatched("not-a-pod", &picker.Request{PromptTokens: 5, BlockHashes: []uint64{4}})
	for _, i := range []int{0, 2, 3} {
		tr := srvs[i].Gateway().Tracker()
		deadline := time.Now().Add(10 * time.Second)
		for tr.InFlight("p0") != 1 || tr.Index().Match([]uint64{1, 2, 3}, []string{"p0"}, nil)[0] != 3 {
			if time.Now().After(deadline) {
				t.Fatalf("replica %d never saw replica 1's dispatch (in flight %d)", i, tr.InFlight("p0"))
			}
			time.Sleep(5 * time.Millisecond)
		}
		if tr.InFlight("not-a-pod") != 0 || tr.Index().PodLen("not-a-pod") != 0 {
			t.Errorf("replica %d keeps state for a pod it does not route to", i)
		}
	}
	if s := srvs[0].Peers().Stats(); s.Rejected != 0 {
		t.Errorf("replica 0 stats %+v: want none rejected", s)
	}
	// Replica 1 sent the dispatch the others applied: its metrics must
	// show the connections and the messages.
	mfs, err := srvs[1].Gateway().Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, mf := range mfs {
		if len(mf.GetMetric()) > 0 && mf.GetMetric()[0].GetGauge() != nil {
			got[mf.GetName()] = mf.GetMetric()[0].GetGauge().GetValue()
		} else if len(mf.GetMetric()) > 0 {
			got[mf.GetName()] = mf.GetMetric()[0].GetCounter().GetValue()
		}
	}
	if got["infergate_tier1_peers_connected"] != n-1 || got["infergate_tier1_peers_frames_sent_total"] == 0 || got["infergate_tls_certificate_expiry_timestamp_seconds"] == 0 {
		t.Errorf("peers metrics: connected %v, frames sent %v, certificate expiry %v", got["infergate_tier1_peers_connected"],
			got["infergate_tier1_peers_frames_sent_total"], got["infergate_tls_certificate_expiry_timestamp_seconds"])
	}
}

// TestPeersMisconfiguredFailsFast: a replica the mesh would refuse does
// not start; the error names the file at fault.
func TestPeersMisconfiguredFailsFast(t *testing.T) {
	dir := t.TempDir()
	mesh, other := testpki.NewCA(t, "mesh"), testpki.NewCA(t, "other")
	good := testpki.Write(t, dir, "good", mesh.Issue(t, testpki.LeafOptions{}), mesh)
	bad := testpki.Write(t, dir, "bad", other.Issue(t, testpki.LeafOptions{}), nil)
	for _, tt := range []struct{ name, tls, want string }{
		{"certificate from another CA", fmt.Sprintf("{cert_file: %q, key_file: %q, ca_file: %q}", bad.Cert, bad.Key, good.CA), bad.Cert},
		{"missing CA file", fmt.Sprintf("{cert_file: %q, key_file: %q, ca_file: %q}", good.Cert, good.Key, filepath.Join(dir, "nope.crt")), "nope.crt"},
		{"key of another certificate", fmt.Sprintf("{cert_file: %q, key_file: %q, ca_file: %q}", good.Cert, bad.Key, good.CA), bad.Key},
	} {
		t.Run(tt.name, func(t *testing.T) {
			cfg := decode(t, peersBase+fmt.Sprintf("peers: {listen: \"127.0.0.1:0\", static: [\"127.0.0.1:1\"], tls: %s}\n", tt.tls))
			_, err := New(t.Context(), cfg, Options{})
			if err == nil || !strings.Contains(err.Error(), tt.want) || !strings.Contains(err.Error(), "peers.tls") {
				t.Fatalf("err = %v, want it to name peers.tls and %s", err, tt.want)
			}
		})
	}
}
