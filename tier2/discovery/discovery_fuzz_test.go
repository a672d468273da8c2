package discovery

import (
	"io"
	"log/slog"
	"math"
	"net/url"
	"strings"
	"testing"

	"github.com/hashicorp/consul/api"

	"github.com/infergate/infergate/shared/cluster"
)

// FuzzFromConsul feeds arbitrary Tier 1 registrations (service metadata,
// address, port) to the Consul answer parser. Any registration Tier 1 (or
// anyone with Consul write access) makes must yield either no cluster or one
// the router can use: a region, an http(s) URL with a host, a finite
// non-negative cost in a known unit, a non-negative capacity and clean
// model names.
func FuzzFromConsul(f *testing.F) {
	f.Add("t1-use1-a-10.0.0.5-8080", "10.0.0.5", 8080, "use1-a", "us-east-1", "llama-3-8b, qwen3-32b", "2.5", cluster.CostPerGPUHour, "spot", "64", "http")
	f.Add("t1", "", 443, "", "eu-west-1", "", "", "", "", "", "https")
	f.Add("t1", "fe80::1%eth0", 8080, "c", "r", ",,", "NaN", "per-gpu-hour", "", "-1", "")
	f.Add("t1", "h", 1, "c", "r", "m", "+Inf", cluster.CostPerMTok, "", "99999999999999999999", "ftp")
	f.Add("t1", "a b/c?d", -1, "c", "r", "m", "1e400", "dollars", "", "0x10", "http://x/")
	f.Add("t1", "10.0.0.1", 65536, "c", "r", "m", "-0", "", "on-demand", " 3", "HTTP")
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	f.Fuzz(func(t *testing.T, id, addr string, port int, name, region, models, cost, unit, pricing, capacity, scheme string) {
		meta := map[string]string{}
		for k, v := range map[string]string{cluster.MetaCluster: name, cluster.MetaRegion: region, cluster.MetaModels: models,
			cluster.MetaCost: cost, cluster.MetaCostUnit: unit, cluster.MetaPricing: pricing, cluster.MetaCapacity: capacity, cluster.MetaScheme: scheme} {
			if v != "" {
				meta[k] = v
			}
		}
		entries := []*api.ServiceEntry{
			{Node: &api.Node{Address: "10.9.9.9"}, Service: &api.AgentService{ID: id, Address: addr, Port: port, Meta: meta}},
			{Service: nil}, // Consul never sends this, but it must not crash
		}
		for _, c := range normalise(fromConsul(entries, log)) {
			if c.Region == "" {
				t.Fatalf("cluster without region: %+v", c)
			}
			if c.Name == "" || c.ID == "" {
				t.Fatalf("cluster without name or ID: %+v", c)
			}
			u, err := url.Parse(c.Address)
			if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.Path != "" || u.RawQuery != "" {
				t.Fatalf("unusable address %q (%v)", c.Address, err)
			}
			if math.IsNaN(c.Cost) || math.IsInf(c.Cost, 0) || c.Cost < 0 {
				t.Fatalf("cost %v", c.Cost)
			}
			if c.CostUnit != cluster.CostPerGPUHour && c.CostUnit != cluster.CostPerMTok {
				t.Fatalf("unknown cost unit %q", c.CostUnit)
			}
			if c.Capacity < 0 {
				t.Fatalf("capacity %d", c.Capacity)
			}
			for _, m := range c.Models {
				if m == "" || m != strings.TrimSpace(m) || strings.Contains(m, ",") {
					t.Fatalf("bad model name %q", m)
				}
			}
			if err := c.Validate(); err != nil {
				t.Fatalf("accepted cluster fails the static checks: %v", err)
			}
		}
	})
}
