package admin

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/infergate/infergate/shared/cluster"
	"github.com/infergate/infergate/tier2/discovery"
	"github.com/infergate/infergate/tier2/ratelimit"
	"github.com/infergate/infergate/tier2/route"
	"github.com/infergate/infergate/tier2/tenant"
)

// schemaCheck walks a JSON value against the openapi.json schema named
// ref and reports every key the document does not list, and every value
// of the wrong JSON type: the hand-written document and the handlers'
// structs cannot drift apart unnoticed.
type schemaCheck struct {
	t       *testing.T
	schemas map[string]any
	seen    map[string]bool // schema name.property seen in a response
}

func newSchemaCheck(t *testing.T) *schemaCheck {
	var doc map[string]any
	if err := json.Unmarshal(openAPIDoc, &doc); err != nil {
		t.Fatal(err)
	}
	return &schemaCheck{t: t, schemas: doc["components"].(map[string]any)["schemas"].(map[string]any), seen: map[string]bool{}}
}

func (sc *schemaCheck) resolve(s map[string]any) (map[string]any, string) {
	name := ""
	for {
		if ref, ok := s["$ref"].(string); ok {
			name = strings.TrimPrefix(ref, "#/components/schemas/")
			s = sc.schemas[name].(map[string]any)
			continue
		}
		all, ok := s["allOf"].([]any)
		if !ok {
			return s, name
		}
		// Merge allOf's parts (objects only here).
		merged := map[string]any{"type": "object", "properties": map[string]any{}}
		for _, part := range all {
			p, n := sc.resolve(part.(map[string]any))
			if name == "" {
				name = n
			}
			for k, v := range p {
				if k == "properties" {
					for pk, pv := range v.(map[string]any) {
						merged["properties"].(map[string]any)[pk] = pv
					}
				} else if k != "type" {
					merged[k] = v
				}
			}
		}
		if s["nullable"] == true {
			merged["nullable"] = true
		}
		return merged, name
	}
}

func (sc *schemaCheck) check(path string, v any, s map[string]any) {
	nullable := s["nullable"] == true
	s, name := sc.resolve(s)
	nullable = nullable || s["nullable"] == true
	if v == nil {
		if !nullable {
			sc.t.Errorf("%s: null, but the schema does not allow it", path)
		}
		return
	}
	typ, _ := s["type"].(string)
	switch x := v.(type) {
	case map[string]any:
		if typ != "object" && typ != "" {
			sc.t.Errorf("%s: object, schema says %s", path, typ)
			return
		}
		props, _ := s["properties"].(map[string]any)
		addl, _ := s["additionalProperties"].(map[string]any)
		for k, kv := range x {
			if ps, ok := props[k].(map[string]any); ok {
				sc.seen[name+"."+k] = true
				sc.check(path+"."+k, kv, ps)
			} else if addl != nil {
				sc.check(path+"["+k+"]", kv, addl)
			} else {
				sc.t.Errorf("%s: key %q is not in openapi.json (%s)", path, k, name)
			}
		}
	case []any:
		if typ != "array" {
			sc.t.Errorf("%s: array, schema says %s", path, typ)
			return
		}
		for i, e := range x {
			sc.check(fmt.Sprintf("%s[%d]", path, i), e, s["items"].(map[string]any))
		}
	case string:
		if typ != "string" {
			sc.t.Errorf("%s: string, schema says %s", path, typ)
		}
		if enum, ok := s["enum"].([]any); ok {
			found := false
			for _, e := range enum {
				found = found || e == x
			}
			if !found {
				sc.t.Errorf("%s: %q is not one of %v", path, x, enum)
			}
		}
	case float64:
		if typ != "number" && typ != "integer" {
			sc.t.Errorf("%s: number, schema says %s", path, typ)
		}
	case bool:
		if typ != "boolean" {
			sc.t.Errorf("%s: boolean, schema says %s", path, typ)
		}
	}
}

// body checks a response body against the schema of name.
func (sc *schemaCheck) body(name string, m map[string]any) {
	sc.t.Helper()
	sc.check(name, m, map[string]any{"$ref": "#/components/schemas/" + name})
}

// missing lists name's properties no checked response carried.
func (sc *schemaCheck) missing(names ...string) []string {
	var out []string
	for _, n := range names {
		s, _ := sc.resolve(map[string]any{"$ref": "#/components/schemas/" + n})
		for k := range s["properties"].(map[string]any) {
			if !sc.seen[n+"."+k] {
				out = append(out, n+"."+k)
			}
		}
	}
	sort.Strings(out)
	return out
}

// loadServer is a real loopback server standing in for a Tier 1
// router's load summary (GET /infergate/load); the router polls it.
func loadServer(t *testing.T, sum cluster.LoadSummary) string {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != cluster.LoadPath {
			http.NotFound(w, r)
			return
		}
		_ = json.NewEncoder(w).Encode(sum)
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

// deadAddress is a loopback URL nothing listens on.
func deadAddress(t *testing.T) string {
	srv := httptest.NewServer(http.NotFoundHandler())
	u := srv.URL
	srv.Close()
	return u
}

// TestClusters runs a router polling real sockets — a healthy cluster in
// the own region, one that is down, one drained — and reads the admin
// API's view of them: grouped by region in failover order, each with its
// state, health, load, cost in both units, override, breakers and last
// error, every key as openapi.json documents it.
func TestClusters(t *testing.T) {
	good := loadServer(t, cluster.LoadSummary{Models: map[string]cluster.ModelLoad{
		"m": {Pool: "p", ReadyPods: 2, Pods: 3, Queue: 1, Running: 2, KVHeadroom: 0.8}}})
	disc, err := discovery.New(discovery.Options{Static: []discovery.Cluster{
		{Name: "east-a", Region: "east", Address: good, Models: []string{"m"}, Cost: 2, CostUnit: cluster.CostPerGPUHour, Pricing: "spot", Capacity: 64},
		{Name: "west-dead", Region: "west", Address: deadAddress(t), Models: []string{"m"}, Cost: 0.5, CostUnit: cluster.CostPerMTok},
		{Name: "eu-drained", Region: "eu", Address: good, Models: []string{"m"}, Cost: 1},
	}, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	store := memStore(t)
	ctx := context.Background()
	w := 2.0
	if err := store.SetOverride(ctx, "eu-drained", tenant.ClusterOverride{Drain: true}); err != nil {
		t.Fatal(err)
	}
	if err := store.SetOverride(ctx, "east-a", tenant.ClusterOverride{Weight: &w}); err != nil {
		t.Fatal(err)
	}
	if err := store.SetOverride(ctx, "not-yet", tenant.ClusterOverride{Drain: true}); err != nil {
		t.Fatal(err)
	}
	router, err := route.New(disc, route.Options{Region: "east", RegionOrder: []string{"west"}, PollInterval: 20 * time.Millisecond,
		TokensPerGPUSecond: 1000, Registry: prometheus.NewRegistry(), Logger: slog.New(slog.DiscardHandler),
		Overrides: func() map[string]route.Override {
			out := map[string]route.Override{}
			for n, o := range store.Overrides() {
				out[n] = route.Override{Drain: o.Drain, Weight: o.Weight, Cost: o.Cost}
			}
			return out
		}})
	if err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error)
	go func() { done <- router.Run(rctx) }()
	t.Cleanup(func() { cancel(); <-done })

	s := New(Options{Store: store, Token: token, Router: router})
	srv := httptest.NewServer(s.Handler())
	t.Cleanup(srv.Close)
	c := client{t: t, srv: srv}

	// Until the dead cluster has failed two polls and the good one answered.
	var body map[string]any
	deadline := time.Now().Add(10 * time.Second)
	for {
		var code int
		code, body = c.do("GET", "/admin/v1/clusters", token, nil)
		if code != 200 {
			t.Fatalf("clusters: %d %v", code, body)
		}
		js, _ := json.Marshal(body)
		if strings.Contains(string(js), `"state":"unreachable"`) && strings.Contains(string(js), `"state":"ok"`) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("clusters never settled: %s", js)
		}
		time.Sleep(20 * time.Millisecond)
	}
	sc := newSchemaCheck(t)
	sc.body("ClusterList", body)

	var list ClusterList
	js, _ := json.Marshal(body)
	if err := json.Unmarshal(js, &list); err != nil {
		t.Fatal(err)
	}
	var regions []string
	for _, r := range list.Regions {
		regions = append(regions, fmt.Sprintf("%s:%v:%d", r.Region, r.Own, len(r.Clusters)))
	}
	if got := strings.Join(regions, ","); got != "east:true:1,west:false:1,eu:false:1" || list.Region != "east" || list.TokensPerGPUSecond != 1000 {
		t.Errorf("regions = %s (region %s)", got, list.Region)
	}
	if _, ok := list.Overrides["not-yet"]; !ok || len(list.Overrides) != 3 {
		t.Errorf("overrides = %v, want all three (also the one for an undiscovered cluster)", list.Overrides)
	}
	a := list.Regions[0].Clusters[0]
	if a.Name != "east-a" || a.State != "ok" || a.Health.ReadyPods != 2 || a.Health.Pods != 3 || !a.Health.LoadFresh ||
		a.Health.LoadAgeSeconds == nil || a.Health.LastPollAt == nil || a.Load.Models["m"].Queue != 1 || a.Override == nil || a.Capacity != 64 {
		t.Errorf("east-a = %+v", a)
	}
	// 2 per GPU-hour at 3.6 Mtok per GPU-hour, weight 2.
	if a.Cost.PerMTok == nil || fmt.Sprintf("%.4f", *a.Cost.PerMTok) != "0.5556" || *a.Cost.PerGPUHour != 2 ||
		fmt.Sprintf("%.4f", a.Cost.Effective) != "0.2778" || a.Cost.Weight != 2 || a.Cost.Unit != "gpu-hour" {
		t.Errorf("east-a cost = %+v", a.Cost)
	}
	d := list.Regions[1].Clusters[0]
	if d.State != "unreachable" || d.Health.ConsecutivePollFailures < 2 || !strings.Contains(d.Health.LastPollError, "connection refused") ||
		d.LastError == nil || !strings.HasPrefix(d.LastError.Message, "load poll:") || d.Health.LoadAt != nil {
		t.Errorf("west-dead = %+v", d)
	}
	if d.Cost.PerGPUHour == nil || fmt.Sprintf("%.2f", *d.Cost.PerGPUHour) != "1.80" {
		t.Errorf("west-dead cost = %+v", d.Cost)
	}
	if e := list.Regions[2].Clusters[0]; e.State != "drained" || !e.Drained {
		t.Errorf("eu-drained = %+v", e)
	}

	// Without a router the overrides alone, in the same shape.
	s2 := New(Options{Store: store, Token: token})
	srv2 := httptest.NewServer(s2.Handler())
	t.Cleanup(srv2.Close)
	code, body2 := client{t: t, srv: srv2}.do("GET", "/admin/v1/clusters", token, nil)
	sc.body("ClusterList", body2)
	if code != 200 || len(body2["regions"].([]any)) != 0 || len(body2["overrides"].(map[string]any)) != 3 {
		t.Errorf("without a router: %d %v", code, body2)
	}
}

// fixedStatus is a StatusReporter with every field set.
type fixedStatus struct{}

func (fixedStatus) Status(context.Context) Status {
	yes, ms, at := true, 0.4, time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	return Status{Region: "east", ReplicaID: "host-abc123", Version: "0.1.0", StartedAt: at, UptimeSeconds: 12,
		Redis:   RedisStatus{Mode: "standalone", Reachable: &yes, LatencyMS: &ms},
		Limiter: LimiterStatus{Replicas: 2, Admissions: 5},
		Consul:  ConsulStatus{Mode: "consul", Address: "127.0.0.1:8500", Reachable: &yes, LastSuccessAt: &at, LastError: "timeout", LastErrorAt: &at, ClustersFound: 3}}
}

// TestStatusAndUsageList: /status as the reporter gives it, /usage every
// tenant's usage a page at a time; both as openapi.json documents them.
func TestStatusAndUsageList(t *testing.T) {
	store := memStore(t)
	ctx := context.Background()
	for _, tn := range []tenant.Tenant{
		{ID: "a", Name: "A", Limits: tenant.Limits{RPM: 10, TPM: 1000, Concurrent: 2, TokenBudget: 100, BudgetPeriod: "day"},
			ModelLimits: map[string]tenant.Limits{"m": {RPM: 5}}},
		{ID: "b", Disabled: true},
		{ID: "c", Limits: tenant.Limits{RPM: 1}},
	} {
		if err := store.CreateTenant(ctx, tn); err != nil {
			t.Fatal(err)
		}
	}
	lim := ratelimit.New(ratelimit.Options{})
	t.Cleanup(func() { lim.Close() })
	ta, _ := store.Tenant("a")
	res, _, err := lim.Admit(ctx, ta, "m", 30)
	if err != nil || res == nil {
		t.Fatal(err)
	}
	s := New(Options{Store: store, Token: token, Limiter: lim, Status: fixedStatus{}})
	srv := httptest.NewServer(s.Handler())
	t.Cleanup(srv.Close)
	c := client{t: t, srv: srv}
	sc := newSchemaCheck(t)

	code, st := c.do("GET", "/admin/v1/status", token, nil)
	if code != 200 || st["replica_id"] != "host-abc123" || st["consul"].(map[string]any)["clusters_found"] != 3.0 {
		t.Fatalf("status: %d %v", code, st)
	}
	sc.body("Status", st)

	code, page := c.do("GET", "/admin/v1/usage?limit=2", token, nil)
	if code != 200 || page["has_more"] != true || page["next_after"] != "b" || len(page["data"].([]any)) != 2 {
		t.Fatalf("first page: %d %v", code, page)
	}
	sc.body("UsageList", page)
	first := page["data"].([]any)[0].(map[string]any)
	scopes := first["scopes"].([]any)
	wide := scopes[0].(map[string]any)
	if first["tenant_id"] != "a" || first["name"] != "A" || len(scopes) != 2 ||
		wide["rpm"].(map[string]any)["remaining"] != 9.0 || wide["tpm"].(map[string]any)["used"] != 30.0 ||
		wide["budget"].(map[string]any)["reset_at"] == nil || wide["concurrent"].(map[string]any)["reset_at"] != nil {
		t.Errorf("tenant a: %v", first)
	}
	if page["data"].([]any)[1].(map[string]any)["disabled"] != true {
		t.Errorf("tenant b: %v", page["data"].([]any)[1])
	}
	code, page = c.do("GET", "/admin/v1/usage?limit=2&after=b", token, nil)
	if code != 200 || page["has_more"] != false || page["next_after"] != "" || len(page["data"].([]any)) != 1 {
		t.Fatalf("second page: %d %v", code, page)
	}
	sc.body("UsageList", page)
	code, one := c.do("GET", "/admin/v1/tenants/a/usage", token, nil)
	if code != 200 {
		t.Fatalf("usage of a: %d", code)
	}
	sc.body("Usage", one)
	for _, bad := range []string{"0", "1001", "x"} {
		if code, body := c.do("GET", "/admin/v1/usage?limit="+bad, token, nil); code != 400 || errParam(body) != "limit" {
			t.Errorf("limit=%s: %d %v", bad, code, body)
		}
	}
	if miss := sc.missing("Status", "RedisStatus", "LimiterStatus", "ConsulStatus", "UsageList", "TenantUsage", "Value", "ScopeUsage"); len(miss) > 0 {
		t.Errorf("documented but never answered: %v", miss)
	}
	res.Finish(ctx, 10)

	// Without a reporter: 501, not a made-up status.
	s2 := New(Options{Store: store, Token: token})
	srv2 := httptest.NewServer(s2.Handler())
	t.Cleanup(srv2.Close)
	if code, _ := (client{t: t, srv: srv2}).do("GET", "/admin/v1/status", token, nil); code != http.StatusNotImplemented {
		t.Errorf("status without a reporter: %d", code)
	}

}
