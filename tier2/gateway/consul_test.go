package gateway_test

import (
	"context"
	"io"
	"log/slog"
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/infergate/infergate/internal/testservice"
	"github.com/infergate/infergate/tier1/register"
	"github.com/infergate/infergate/tier2/discovery"
)

// TestConsulRouting runs a real Consul agent: Tier 1 stand-ins register and
// deregister, and routing follows within 2 s; with Consul stopped, routing
// carries on with the last known clusters.
func TestConsulRouting(t *testing.T) {
	consul := testservice.StartConsul(t)
	client, err := discovery.NewConsulClient(discovery.ConsulOptions{Address: consul.Addr()})
	if err != nil {
		t.Fatal(err)
	}
	disc, err := discovery.New(discovery.Options{
		Consul: &discovery.ConsulOptions{Address: consul.Addr(), WaitTime: 5 * time.Second, MaxBackoff: 200 * time.Millisecond},
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = disc.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	s := newStack(t, stackOpts{src: disc})

	reg := func(s *tier1, cost float64) func(context.Context) error {
		t.Helper()
		host, port, _ := net.SplitHostPort(s.addr)
		p, _ := strconv.Atoi(port)
		dereg, err := register.Register(context.Background(), client, register.Registration{
			Address: host, Port: p, Region: s.region, Cluster: s.name, Models: s.models, Cost: cost, Capacity: 100,
			CheckHTTP: s.URL() + "/ready", CheckInterval: time.Second, InitialStatus: api.HealthPassing,
		})
		if err != nil {
			t.Fatal(err)
		}
		return dereg
	}
	servedBy := func(name string) func() bool {
		return func() bool {
			r, err := s.try("key-cost", "/v1/chat/completions", `{"model":"m"}`)
			return err == nil && r.code == 200 && r.cluster == name
		}
	}

	b := newTier1(t, "b", "east", "m")
	c := newTier1(t, "c", "east", "m")
	if r := s.chat(t, "key-cost"); r.code != 404 {
		t.Fatalf("nothing registered: %d %s", r.code, r.body)
	}
	reg(b, 5)
	took := waitFor(t, 2*time.Second, "first cluster routable", servedBy("b"))
	t.Logf("registered b: routed to it after %v", took)

	deregC := reg(c, 1)
	took = waitFor(t, 2*time.Second, "cheaper cluster takes over", servedBy("c"))
	t.Logf("registered cheaper c: routed to it after %v", took)

	if err := deregC(context.Background()); err != nil {
		t.Fatal(err)
	}
	took = waitFor(t, 2*time.Second, "deregistered cluster dropped", servedBy("b"))
	t.Logf("deregistered c: back on b after %v", took)
	if c0 := c.hits.Load(); !servedBy("b")() || c.hits.Load() != c0 {
		t.Fatal("traffic still reaches the deregistered cluster")
	}

	reg(c, 1)
	waitFor(t, 2*time.Second, "c back", servedBy("c"))
	consul.Stop()
	for i := range 20 {
		r := s.chat(t, "key-cost")
		if r.code != 200 || r.cluster != "c" {
			t.Fatalf("request %d with Consul down: %d from %q: %s", i, r.code, r.cluster, r.body)
		}
		time.Sleep(25 * time.Millisecond)
	}
	if n := len(disc.Clusters()); n != 2 {
		t.Fatalf("with Consul down, discovery has %d clusters, want the last good 2", n)
	}
	// Failover still works on the last known set.
	c.kill()
	for range 5 {
		if r := s.chat(t, "key-cost"); r.code != 200 || r.cluster != "b" {
			t.Fatalf("Consul down and c dead: %d from %q", r.code, r.cluster)
		}
	}
}
