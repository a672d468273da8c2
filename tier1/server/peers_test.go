package server

import (
	"context"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/infergate/infergate/shared/config"
	"github.com/infergate/infergate/tier1/picker"
)

// Three Tier 1 servers configured as replicas share their dispatches.
func TestReplicasShareState(t *testing.T) {
	t.Setenv("TEST_PEERS_TOKEN", "s3cret")
	const n = 3
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
		yml := "auth: {disabled: true}\nmetrics_listen: \"-\"\npools: [{name: p, model: m}]\n" +
			"pods: [{name: p0, address: \"127.0.0.1:1\", pool: p, engine: vllm}]\n" +
			fmt.Sprintf("peers: {listen: %q, static: [%s], token_env: TEST_PEERS_TOKEN, heartbeat: 20ms, ttl: 300ms}\n", lns[i].Addr().String(), static)
		var cfg Config
		if err := config.Decode("t.yaml", []byte(yml), &cfg); err != nil {
			t.Fatal(err)
		}
		api, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		srv, err := New(ctx, &cfg, Options{PeersListener: lns[i], ShutdownTimeout: time.Second})
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
		for srv.Peers().Stats().Connected != n-1 {
			if time.Now().After(deadline) {
				t.Fatalf("replica %d: %+v, want %d peers connected", i, srv.Peers().Stats(), n-1)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	req := &picker.Request{PromptTokens: 500, BlockHashes: []uint64{1, 2, 3}}
	srvs[1].Gateway().Tracker().Dispatched("p0", req)
	for _, i := range []int{0, 2} {
		tr := srvs[i].Gateway().Tracker()
		deadline := time.Now().Add(10 * time.Second)
		for tr.InFlight("p0") != 1 || tr.Index().PodLen("p0") != 3 {
			if time.Now().After(deadline) {
				t.Fatalf("replica %d never saw replica 1's dispatch (in flight %d)", i, tr.InFlight("p0"))
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	if s := srvs[0].Peers().Stats(); s.Rejected != 0 {
		t.Errorf("replica 0 stats %+v: want none rejected", s)
	}
	// Replica 1 sent the dispatch the others applied: its metrics must
	// show the connections and the frames.
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
	if got["infergate_peers_connected"] != n-1 || got["infergate_peers_frames_sent_total"] == 0 {
		t.Errorf("peers metrics: connected %v, frames sent %v", got["infergate_peers_connected"], got["infergate_peers_frames_sent_total"])
	}
}
