package integration

import (
	"cmp"
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/infergate/infergate/devstack"
	"github.com/infergate/infergate/internal/testservice"
	"github.com/infergate/infergate/sim/fleet"
)

// timeScale runs the simulated GPUs 20 times faster than real time.
const timeScale = 0.05

// stack is the whole topology as separate processes: one `infergate-lab sim
// --fleet` hosting every simulated pod (they stand in for GPUs), one
// `infergate tier1` per cluster registering itself in a real Consul agent,
// one `infergate tier2` that finds the clusters only through Consul and keeps
// tenants and limits in a real Redis. The clusters are devstack.Topology():
// us-east/cluster-a (cheapest) and cluster-b, eu-west/cluster-c and
// cluster-d.
type stack struct {
	dir       string
	redis     *testservice.Redis
	consul    *testservice.Consul
	sim       *proc
	tier1     map[string]*proc  // by cluster
	tier1Addr map[string]string // by cluster, host:port
	// tier1Metrics and tier2Metrics are the /metrics URLs: each tier
	// serves them on their own listener, not the API port.
	tier1Metrics map[string]string
	tier2Metrics string
	tier1Conf    map[string]string // by cluster, config file
	clusters     map[string]devstack.Cluster
	tier2        *proc
	tier2URL     string // http://host:port
	adminURL     string
	adminToken   string
	apiKey       string // tenant "acme"
	tier1Token   string
	opts         stackOptions
}

// stackOptions vary the stack for one test; the zero value is the default
// stack.
type stackOptions struct {
	// timeScale is real seconds per simulated second; default timeScale.
	// Fault tests slow the GPUs down so requests are in flight when a
	// process dies.
	timeScale float64
	// redisAddrs is the Redis Tier 2 uses (several: a Redis Cluster);
	// default a fresh single node, s.redis.
	redisAddrs []string
	// tenants are seeded next to acme, each with its own key.
	tenants []seedTenant
}

// seedTenant is a tenant and API key in tier2's config, with a
// requests-per-minute limit (0: unlimited).
type seedTenant struct {
	id, key string
	rpm     int
}

func startStack(t *testing.T) *stack {
	t.Helper()
	return startStackOpts(t, stackOptions{})
}

func startStackOpts(t *testing.T, o stackOptions) *stack {
	t.Helper()
	needBinary(t)
	s := &stack{
		dir: t.TempDir(), tier1: map[string]*proc{}, tier1Addr: map[string]string{}, tier1Metrics: map[string]string{}, tier1Conf: map[string]string{},
		clusters:   map[string]devstack.Cluster{},
		adminToken: "it-admin-token", apiKey: "sk-it-acme", tier1Token: "it-tier1-token",
		opts: o,
	}
	if len(o.redisAddrs) == 0 {
		s.redis = testservice.StartRedis(t)
	}
	s.consul = testservice.StartConsul(t)

	// One fleet file for every pod; replicas are expanded here so each pod
	// gets its own free port (fleet numbers replicas' ports consecutively).
	topo := devstack.Topology()
	fc := fleet.Config{TimeScale: cmp.Or(o.timeScale, timeScale), Host: "127.0.0.1"}
	podsOf := map[string][]fleet.PodSpec{}
	for _, c := range topo {
		s.clusters[c.Name] = c
		for _, spec := range c.Pods {
			n := max(spec.Replicas, 1)
			for i := range n {
				p := spec
				p.Replicas = 1
				if n > 1 {
					p.Name = fmt.Sprintf("%s-%d", spec.Name, i)
				}
				p.Port = testservice.FreePort(t)
				fc.Pods = append(fc.Pods, p)
				podsOf[c.Name] = append(podsOf[c.Name], p)
			}
		}
	}
	fleetFile := s.write(t, "fleet.yaml", mustYAML(t, fc))
	s.sim = startProc(t, "sim", "sim", "--fleet", fleetFile, "--log-level", "warn")
	for _, p := range fc.Pods {
		waitOK(t, s.sim, fmt.Sprintf("http://127.0.0.1:%d/health", p.Port), 30*time.Second)
	}

	for _, c := range topo {
		s.startTier1(t, c, podsOf[c.Name])
	}
	for _, c := range topo {
		waitOK(t, s.tier1[c.Name], "http://"+s.tier1Addr[c.Name]+"/ready", 30*time.Second)
	}
	s.startTier2(t)
	// Tier 2 is ready once it knows a model; wait until it has polled every
	// cluster's load too, which shows as cost-first picking cluster-a.
	s.waitServedBy(t, "cluster-a", 30*time.Second)
	return s
}

func (s *stack) write(t *testing.T, name, content string) string {
	t.Helper()
	return writeIn(t, s.dir, name, content)
}

// writeIn writes content to dir/name (0600) and returns the path.
func writeIn(t *testing.T, dir, name, content string) string {
	t.Helper()
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func mustYAML(t *testing.T, v any) string {
	t.Helper()
	b, err := yaml.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// startTier1 writes a cluster's Tier 1 config and starts it. The Tier 1
// registers itself in Consul (service infergate-tier1, HTTP check on its
// /ready every second) and deregisters when it stops.
func (s *stack) startTier1(t *testing.T, c devstack.Cluster, pods []fleet.PodSpec) {
	t.Helper()
	addr := "127.0.0.1:" + strconv.Itoa(testservice.FreePort(t))
	metricsAddr := "127.0.0.1:" + strconv.Itoa(testservice.FreePort(t))
	var b strings.Builder
	fmt.Fprintf(&b, "listen: %s\nmetrics_listen: %s\ncluster: %s\nregion: %s\n", addr, metricsAddr, c.Name, c.Region)
	fmt.Fprintf(&b, "auth: {tokens: [%s]}\nscrape: {interval: 100ms}\n", s.tier1Token)
	fmt.Fprintf(&b, "consul: {address: %q, cost: %v, pricing: %s, capacity: 64, check_interval: 1s}\npools:\n",
		s.consul.Addr(), c.Cost, c.Pricing)
	for _, p := range c.Pools {
		fmt.Fprintf(&b, "  - {name: %s, model: %q, adapters: [%s]}\n", p.Name, p.Model, strings.Join(p.Adapters, ", "))
	}
	b.WriteString("pods:\n")
	for _, p := range pods {
		fmt.Fprintf(&b, "  - {name: %s, address: \"127.0.0.1:%d\", pool: %s, engine: %s, gpu: %s}\n",
			p.Name, p.Port, c.Pool(p.ServedModelName), p.Engine, p.GPU)
	}
	s.tier1Conf[c.Name] = s.write(t, "tier1-"+c.Name+".yaml", b.String())
	s.tier1Addr[c.Name] = addr
	s.tier1Metrics[c.Name] = "http://" + metricsAddr + "/metrics"
	s.runTier1(t, c.Name)
}

// runTier1 (re)starts a cluster's Tier 1 process from its config.
func (s *stack) runTier1(t *testing.T, cluster string) {
	t.Helper()
	s.tier1[cluster] = startProc(t, "tier1 "+cluster, "tier1", "--config", s.tier1Conf[cluster], "--log-level", "warn")
}

func (s *stack) startTier2(t *testing.T) {
	t.Helper()
	addr := "127.0.0.1:" + strconv.Itoa(testservice.FreePort(t))
	adminAddr := "127.0.0.1:" + strconv.Itoa(testservice.FreePort(t))
	metricsAddr := "127.0.0.1:" + strconv.Itoa(testservice.FreePort(t))
	var tenants, keys strings.Builder
	for _, ten := range s.opts.tenants {
		fmt.Fprintf(&tenants, "  - id: %s\n    limits: {rpm: %d}\n", ten.id, ten.rpm)
		fmt.Fprintf(&keys, "  - {tenant: %s, name: integration, key: %s}\n", ten.id, ten.key)
	}
	// No static clusters: everything Tier 2 routes to comes from Consul.
	cfg := fmt.Sprintf(`listen: %s
region: %s
region_order: [%s]
consul:
  address: %s
  wait_time: 5s
  min_interval: 50ms
tier1:
  token: %s
  poll_interval: 200ms
routing:
  max_attempts: 4
  failover_budget: 20s
  first_byte_timeout: 10s
  response_timeout: 30s
redis:
  addresses: [%s]
  key_prefix: "it:"
admin:
  listen: %s
  token: %s
tenants:
  - id: acme
    name: ACME Corp
    limits: {rpm: 100000, concurrent: 64}
%s
keys:
  - tenant: acme
    name: integration
    key: %s
%s
metrics:
  listen: %s
`, addr, devstack.HomeRegion, devstack.FailoverRegion, s.consul.Addr(), s.tier1Token,
		strings.Join(s.redisAddrs(), ", "), adminAddr, s.adminToken, tenants.String(), s.apiKey, keys.String(), metricsAddr)
	path := s.write(t, "tier2.yaml", cfg)
	s.tier2 = startProc(t, "tier2", "tier2", "--config", path, "--log-level", "warn")
	s.tier2URL, s.adminURL = "http://"+addr, "http://"+adminAddr
	s.tier2Metrics = "http://" + metricsAddr + "/metrics"
	waitOK(t, s.tier2, s.tier2URL+"/ready", 30*time.Second)
	waitOK(t, s.tier2, s.adminURL+"/openapi.json", 10*time.Second)
}

// redisAddrs is the Redis Tier 2 is configured with.
func (s *stack) redisAddrs() []string {
	if len(s.opts.redisAddrs) > 0 {
		return s.opts.redisAddrs
	}
	return []string{s.redis.Addr()}
}

// chat sends one small non-streaming chat completion to Tier 2 and returns
// the response (body read) and the serving cluster.
func (s *stack) chat(ctx context.Context, key, model string) (*http.Response, []byte, error) {
	body := fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":"hello"}],"max_tokens":4}`, model)
	return httpDo(ctx, http.MethodPost, s.tier2URL+"/v1/chat/completions", key, body)
}

// waitServedBy sends requests until one is served by cluster.
func (s *stack) waitServedBy(t *testing.T, cluster string, timeout time.Duration) {
	t.Helper()
	waitFor(t, "tier2 to route to "+cluster, timeout, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		resp, body, err := s.chat(ctx, s.apiKey, devstack.LlamaModel)
		if err != nil {
			return err
		}
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("%s: %s", resp.Status, body)
		}
		if got := resp.Header.Get("X-Infergate-Cluster"); got != cluster {
			return fmt.Errorf("served by %q", got)
		}
		return nil
	})
}
