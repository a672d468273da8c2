package discovery_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/infergate/infergate/internal/testservice"
	"github.com/infergate/infergate/shared/cluster"
	"github.com/infergate/infergate/tier1/register"
	"github.com/infergate/infergate/tier2/discovery"
)

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// readyServer is a stand-in for a Tier 1's /ready endpoint: a real loopback
// HTTP server whose health the test flips.
func readyServer(t *testing.T) (*atomic.Bool, string, int) {
	t.Helper()
	var down atomic.Bool
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if down.Load() {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusOK)
	}))
	t.Cleanup(srv.Close)
	u, _ := url.Parse(srv.URL)
	port, _ := strconv.Atoi(u.Port())
	return &down, u.Hostname(), port
}

func waitFor(t *testing.T, limit time.Duration, what string, cond func() bool) time.Duration {
	t.Helper()
	start := time.Now()
	for time.Since(start) < limit {
		if cond() {
			return time.Since(start)
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("%s: not within %v", what, limit)
	return 0
}

func TestStaticWithoutConsul(t *testing.T) {
	d, err := discovery.New(discovery.Options{Logger: quiet(), Static: []discovery.Cluster{
		{Name: "b", Region: "eu", Address: "http://127.0.0.1:2/", Models: []string{"m2", "m1"}},
		{Name: "a", Region: "us", Address: "http://127.0.0.1:1", Models: []string{"m1"}, Cost: 2},
	}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := d.Run(ctx); err != nil {
		t.Fatalf("Run: %v", err)
	}
	cs := d.Clusters()
	if len(cs) != 2 || cs[0].ID != "a" || cs[1].Address != "http://127.0.0.1:2" || cs[1].Models[0] != "m1" {
		t.Fatalf("clusters = %+v", cs)
	}
	if cs[0].CostUnit != cluster.CostPerGPUHour {
		t.Errorf("default cost unit = %q", cs[0].CostUnit)
	}
	if st := d.Status(); st.Consul || st.Reachable || st.Clusters != 2 || !st.LastSuccess.IsZero() {
		t.Errorf("static status = %+v", st)
	}
}

func TestStaticValidation(t *testing.T) {
	for _, tc := range []struct {
		name string
		c    discovery.Cluster
	}{
		{"no name", discovery.Cluster{Region: "r", Address: "http://x:1"}},
		{"no region", discovery.Cluster{Name: "a", Address: "http://x:1"}},
		{"bad address", discovery.Cluster{Name: "a", Region: "r", Address: "x:1"}},
		{"negative cost", discovery.Cluster{Name: "a", Region: "r", Address: "http://x:1", Cost: -1}},
		{"bad unit", discovery.Cluster{Name: "a", Region: "r", Address: "http://x:1", CostUnit: "usd"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := discovery.New(discovery.Options{Static: []discovery.Cluster{tc.c}}); err == nil {
				t.Fatal("want an error")
			}
		})
	}
}

func TestRegisterValidation(t *testing.T) {
	good := register.Registration{Address: "127.0.0.1", Port: 1, Region: "r", Cluster: "c", Models: []string{"m"}, CheckHTTP: "http://127.0.0.1:1/ready"}
	for _, tc := range []struct {
		name string
		mod  func(*register.Registration)
	}{
		{"no address", func(r *register.Registration) { r.Address = "" }},
		{"bad port", func(r *register.Registration) { r.Port = 70000 }},
		{"bad region", func(r *register.Registration) { r.Region = "us east" }},
		{"no models", func(r *register.Registration) { r.Models = nil }},
		{"comma model", func(r *register.Registration) { r.Models = []string{"a,b"} }},
		{"bad unit", func(r *register.Registration) { r.CostUnit = "usd" }},
		{"no check", func(r *register.Registration) { r.CheckHTTP = "" }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := good
			tc.mod(&r)
			client, _ := api.NewClient(&api.Config{Address: "127.0.0.1:1"})
			if _, err := register.Register(context.Background(), client, r); err == nil {
				t.Fatal("want a validation error")
			}
		})
	}
}

// TestConsulWatch runs a real Consul agent: a registered, healthy Tier 1
// appears, deregistering it removes it, and stopping Consul keeps the last
// good list; restarting Consul (dev mode forgets everything, so the index
// goes backwards) is followed.
func TestConsulWatch(t *testing.T) {
	consul := testservice.StartConsul(t)
	client, err := discovery.NewConsulClient(discovery.ConsulOptions{Address: consul.Addr()})
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	d, err := discovery.New(discovery.Options{
		Logger:   quiet(),
		Registry: reg,
		Consul:   &discovery.ConsulOptions{Address: consul.Addr(), WaitTime: 5 * time.Second, MaxBackoff: 200 * time.Millisecond},
		Static:   []discovery.Cluster{{Name: "seed", Region: "r0", Address: "http://127.0.0.1:9"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	if cs := d.Clusters(); len(cs) != 1 || cs[0].Name != "seed" {
		t.Fatalf("before Consul answers, want the seed; got %+v", cs)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })

	// Consul answers "nothing registered": that replaces the seeds.
	waitFor(t, 5*time.Second, "empty consul answer", func() bool { return len(d.Clusters()) == 0 })

	down, host, port := readyServer(t)
	changed := d.Changed()
	dereg, err := register.Register(context.Background(), client, register.Registration{
		Address: host, Port: port, Region: "us-east", Cluster: "east-1",
		Models: []string{"llama", "qwen"}, Cost: 2.5, CostUnit: cluster.CostPerGPUHour, Pricing: "spot", Capacity: 64,
		CheckHTTP: "http://" + host + ":" + strconv.Itoa(port) + "/ready", CheckInterval: time.Second,
		InitialStatus: api.HealthPassing, // registered once ready, as Tier 1 does
	})
	if err != nil {
		t.Fatal(err)
	}
	took := waitFor(t, 2*time.Second, "registered cluster visible", func() bool { return len(d.Clusters()) == 1 })
	t.Logf("registration visible after %v", took)
	select {
	case <-changed:
	default:
		t.Error("Changed channel did not fire")
	}
	c := d.Clusters()[0]
	want := discovery.Cluster{ID: "infergate-tier1-east-1", Name: "east-1", Region: "us-east", Address: "http://" + host + ":" + strconv.Itoa(port),
		Models: []string{"llama", "qwen"}, Cost: 2.5, CostUnit: "gpu-hour", Pricing: "spot", Capacity: 64}
	if c.ID != want.ID || c.Name != want.Name || c.Region != want.Region || c.Address != want.Address ||
		c.Cost != want.Cost || c.CostUnit != want.CostUnit || c.Pricing != want.Pricing || c.Capacity != want.Capacity ||
		len(c.Models) != 2 || c.Models[0] != "llama" || c.Models[1] != "qwen" {
		t.Fatalf("cluster = %+v\nwant %+v", c, want)
	}

	if err := dereg(context.Background()); err != nil {
		t.Fatal(err)
	}
	took = waitFor(t, 2*time.Second, "deregistered cluster gone", func() bool { return len(d.Clusters()) == 0 })
	t.Logf("deregistration visible after %v", took)

	// Default initial status is critical: visible once the first check
	// passes (Consul runs checks at least 1s apart, staggered randomly).
	if _, err := register.Register(context.Background(), client, register.Registration{
		Address: host, Port: port, Region: "us-east", Cluster: "east-1", Models: []string{"llama"},
		CheckHTTP: "http://" + host + ":" + strconv.Itoa(port) + "/ready", CheckInterval: time.Second,
	}); err != nil {
		t.Fatal(err)
	}
	took = waitFor(t, 5*time.Second, "re-registered", func() bool { return len(d.Clusters()) == 1 })
	t.Logf("re-registration visible after %v", took)

	// A failing health check removes the cluster.
	down.Store(true)
	took = waitFor(t, 5*time.Second, "unhealthy cluster gone", func() bool { return len(d.Clusters()) == 0 })
	t.Logf("failing check visible after %v", took)
	down.Store(false)
	waitFor(t, 5*time.Second, "healthy again", func() bool { return len(d.Clusters()) == 1 })

	consul.Stop()
	waitFor(t, 5*time.Second, "a failed query", func() bool {
		return counter(t, reg, "infergate_tier2_discovery_queries_total", "error") > 0
	})
	if cs := d.Clusters(); len(cs) != 1 || cs[0].Name != "east-1" {
		t.Fatalf("with Consul down, want the last good list; got %+v", cs)
	}
	time.Sleep(300 * time.Millisecond)
	if age := time.Since(d.LastGood()); age < 250*time.Millisecond {
		t.Errorf("last good answer is %v old while Consul is down", age)
	}
	// The admin API's view: unreachable, the error and when, the last
	// success kept, the clusters still in use.
	st := d.Status()
	if !st.Consul || st.Reachable || st.LastError == nil || st.LastErrorAt.IsZero() || st.LastSuccess.IsZero() ||
		st.LastErrorAt.Before(st.LastSuccess) || st.Clusters != 1 || st.Address != consul.Addr() {
		t.Errorf("status with Consul down = %+v", st)
	}

	// A fresh dev agent has index 1-ish and no services: the watch must
	// reset its index and see the empty catalog rather than block forever.
	consul.Start()
	waitFor(t, 5*time.Second, "restart followed", func() bool { return len(d.Clusters()) == 0 })
	if st := d.Status(); !st.Reachable || st.LastError != nil || st.Clusters != 0 {
		t.Errorf("status with Consul back = %+v", st)
	}
}

func counter(t *testing.T, reg *prometheus.Registry, name, result string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "result" && l.GetValue() == result {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}

// TestConsulACL runs discovery against Consul with ACLs on (default deny)
// and a Tier 1 registered with a service:write token. A service:read token
// sees it; an unknown token gets 403s, which count as errors and leave the
// seeds in place; no token (anonymous, denied service:read) gets Consul's
// empty answer. Deleting the good token while discovery runs turns its
// queries into errors and keeps the last good list.
func TestConsulACL(t *testing.T) {
	const mgmt = "0f3e2d1c-5b4a-4938-8776-a5b4c3d2e1f0"
	consul := testservice.StartConsulOpts(t, testservice.ConsulOpts{ACLToken: mgmt})
	admin, err := discovery.NewConsulClient(discovery.ConsulOptions{Address: consul.Addr(), Token: mgmt})
	if err != nil {
		t.Fatal(err)
	}
	writeTok, _ := aclToken(t, admin, "tier1-register", `service "infergate-tier1" { policy = "write" }`)
	readTok, readID := aclToken(t, admin, "tier2-discover", `
service "infergate-tier1" { policy = "read" }
node_prefix "" { policy = "read" }`)

	tier1, err := discovery.NewConsulClient(discovery.ConsulOptions{Address: consul.Addr(), Token: writeTok})
	if err != nil {
		t.Fatal(err)
	}
	_, host, port := readyServer(t)
	if _, err := register.Register(context.Background(), tier1, register.Registration{
		Address: host, Port: port, Region: "us-east", Cluster: "east-1", Models: []string{"llama"},
		CheckHTTP: "http://" + host + ":" + strconv.Itoa(port) + "/ready", CheckInterval: time.Second,
		InitialStatus: api.HealthPassing,
	}); err != nil {
		t.Fatal(err)
	}

	seed := discovery.Cluster{Name: "seed", Region: "r0", Address: "http://127.0.0.1:9"}
	start := func(t *testing.T, token string) (*discovery.Discovery, *prometheus.Registry) {
		t.Helper()
		reg := prometheus.NewRegistry()
		d, err := discovery.New(discovery.Options{
			Logger:   quiet(),
			Registry: reg,
			Consul:   &discovery.ConsulOptions{Address: consul.Addr(), Token: token, WaitTime: 5 * time.Second, MaxBackoff: 200 * time.Millisecond},
			Static:   []discovery.Cluster{seed},
		})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- d.Run(ctx) }()
		t.Cleanup(func() { cancel(); <-done })
		return d, reg
	}
	names := func(cs []discovery.Cluster) []string {
		var out []string
		for _, c := range cs {
			out = append(out, c.Name)
		}
		return out
	}

	for _, tc := range []struct {
		name, token string
		result      string   // the query result counted: ok or error
		want        []string // cluster names once it has
	}{
		{"unknown token", "00000000-0000-4000-8000-000000000000", "error", []string{"seed"}},
		{"no token", "", "ok", nil},
		{"service:read", readTok, "ok", []string{"east-1"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d, reg := start(t, tc.token)
			// The counter goes up just before the list is updated: wait for both.
			waitFor(t, 5*time.Second, fmt.Sprintf("a %s query and clusters %v", tc.result, tc.want), func() bool {
				return counter(t, reg, "infergate_tier2_discovery_queries_total", tc.result) > 0 &&
					slices.Equal(names(d.Clusters()), tc.want)
			})
			if tc.result == "error" {
				if n := counter(t, reg, "infergate_tier2_discovery_queries_total", "ok"); n != 0 {
					t.Fatalf("%v ok queries with an unknown token", n)
				}
				if !d.LastGood().IsZero() {
					t.Fatal("LastGood set without a good answer")
				}
			}
		})
	}

	t.Run("token deleted", func(t *testing.T) {
		d, reg := start(t, readTok)
		waitFor(t, 5*time.Second, "east-1 visible", func() bool { return slices.Equal(names(d.Clusters()), []string{"east-1"}) })
		if _, err := admin.ACL().TokenDelete(readID, nil); err != nil {
			t.Fatal(err)
		}
		// Consul 1.16 first ends the blocking query in flight with an empty
		// 200 (LastIndex 1, not flagged as filtered by ACLs), which is
		// indistinguishable from "nothing registered", so the list may
		// empty here; only the following queries get 403 ACL not found.
		failed := func() float64 { return counter(t, reg, "infergate_tier2_discovery_queries_total", "error") }
		waitFor(t, 15*time.Second, "a failed query", func() bool { return failed() > 0 })
		changed := d.Changed()
		last, n := d.Clusters(), failed()
		t.Logf("list when the 403s started: %v", names(last))
		waitFor(t, 15*time.Second, "more failed queries", func() bool { return failed() >= n+2 })
		select {
		case <-changed:
			t.Fatalf("the list changed on errors: %v -> %v", names(last), names(d.Clusters()))
		default:
		}
		if got := names(d.Clusters()); !slices.Equal(got, names(last)) {
			t.Fatalf("clusters = %v, want the last good %v", got, names(last))
		}
	})
}

// aclToken creates a policy with rules and a token holding it through the
// management client; it returns the token's secret and accessor IDs.
func aclToken(t *testing.T, admin *api.Client, name, rules string) (secret, accessor string) {
	t.Helper()
	p, _, err := admin.ACL().PolicyCreate(&api.ACLPolicy{Name: name, Rules: rules}, nil)
	if err != nil {
		t.Fatalf("create policy %s: %v", name, err)
	}
	tok, _, err := admin.ACL().TokenCreate(&api.ACLToken{Description: name, Policies: []*api.ACLTokenPolicyLink{{ID: p.ID}}}, nil)
	if err != nil {
		t.Fatalf("create token %s: %v", name, err)
	}
	return tok.SecretID, tok.AccessorID
}
