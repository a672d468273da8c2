package admin

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/infergate/infergate/internal/testservice"
	"github.com/infergate/infergate/tier2/ratelimit"
	"github.com/infergate/infergate/tier2/tenant"
)

const token = "admin-secret-token"

type client struct {
	t   *testing.T
	srv *httptest.Server
}

func (c client) do(method, path, tok string, body any) (int, map[string]any) {
	c.t.Helper()
	var rd io.Reader
	switch b := body.(type) {
	case nil:
	case string:
		rd = strings.NewReader(b)
	default:
		js, _ := json.Marshal(b)
		rd = bytes.NewReader(js)
	}
	req, _ := http.NewRequest(method, c.srv.URL+path, rd)
	if tok != "" {
		req.Header.Set("Authorization", "Bearer "+tok)
	}
	if rd != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		c.t.Fatal(err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	var m map[string]any
	if len(data) > 0 {
		if err := json.Unmarshal(data, &m); err != nil {
			c.t.Fatalf("%s %s: non-JSON body %q", method, path, data)
		}
	}
	return resp.StatusCode, m
}

func newServer(t *testing.T, store Store, lim UsageReader, br BreakerReporter) client {
	t.Helper()
	s := New(Options{Store: store, Limiter: lim, Token: token, Breakers: br})
	srv := httptest.NewServer(s.Handler())
	t.Cleanup(srv.Close)
	return client{t: t, srv: srv}
}

func memStore(t *testing.T) *tenant.Store {
	s, err := tenant.New(context.Background(), tenant.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func errParam(m map[string]any) string {
	e, _ := m["error"].(map[string]any)
	p, _ := e["param"].(string)
	return p
}

func TestAuth(t *testing.T) {
	c := newServer(t, memStore(t), nil, nil)
	for _, tok := range []string{"", "wrong", token + "x", strings.ToUpper(token)} {
		for _, path := range []string{"/admin/v1/tenants", "/admin/v1/clusters", "/admin/v1/tenants/x/keys", "/admin/v1/breakers"} {
			code, body := c.do("GET", path, tok, nil)
			if code != http.StatusUnauthorized {
				t.Fatalf("GET %s with token %q: %d", path, tok, code)
			}
			if e, _ := body["error"].(map[string]any); e["type"] != "authentication_error" {
				t.Fatalf("401 body not OpenAI-shaped: %v", body)
			}
		}
	}
	if code, _ := c.do("POST", "/admin/v1/tenants", "", map[string]any{"id": "x"}); code != 401 {
		t.Fatalf("unauthenticated create: %d", code)
	}
	if code, _ := c.do("GET", "/admin/v1/tenants", token, nil); code != 200 {
		t.Fatalf("with token: %d", code)
	}
	// No token configured: nothing gets in, not even an empty bearer.
	open := newServer(t, memStore(t), nil, nil)
	open.srv.Config.Handler = New(Options{Store: memStore(t)}).Handler()
	if code, _ := open.do("GET", "/admin/v1/tenants", "", nil); code != 401 {
		t.Fatalf("server without a token accepted a request: %d", code)
	}
}

func TestValidation(t *testing.T) {
	c := newServer(t, memStore(t), nil, nil)
	if code, _ := c.do("POST", "/admin/v1/tenants", token, map[string]any{"id": "acme"}); code != 201 {
		t.Fatalf("create: %d", code)
	}
	tests := []struct {
		name, method, path string
		body               any
		param              string
	}{
		{"negative rpm", "POST", "/admin/v1/tenants", map[string]any{"id": "b", "limits": map[string]any{"rpm": -1}}, "limits.rpm"},
		{"bad policy", "POST", "/admin/v1/tenants", map[string]any{"id": "b", "policy": "random"}, "policy"},
		{"bad id", "POST", "/admin/v1/tenants", map[string]any{"id": "has space"}, "id"},
		{"unknown field", "POST", "/admin/v1/tenants", map[string]any{"id": "b", "rpm": 5}, "rpm"},
		{"wrong type", "POST", "/admin/v1/tenants", `{"id":"b","limits":{"tpm":"lots"}}`, "limits.tpm"},
		{"bad period", "PUT", "/admin/v1/tenants/acme/limits", map[string]any{"limits": map[string]any{"token_budget": 5, "budget_period": "year"}}, "limits.budget_period"},
		{"model limit", "PUT", "/admin/v1/tenants/acme/limits", map[string]any{"model_limits": map[string]any{"llama": map[string]any{"concurrent": -1}}}, "model_limits.llama.concurrent"},
		{"id mismatch", "PUT", "/admin/v1/tenants/acme", map[string]any{"id": "other"}, "id"},
		{"negative weight", "PUT", "/admin/v1/clusters/c1/override", map[string]any{"weight": -2}, "weight"},
		{"bad cluster name", "PUT", "/admin/v1/clusters/a%20b/override", map[string]any{"drain": true}, "name"},
		{"long key name", "POST", "/admin/v1/tenants/acme/keys", map[string]any{"name": strings.Repeat("x", 200)}, "name"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, body := c.do(tt.method, tt.path, token, tt.body)
			if code != 400 || errParam(body) != tt.param {
				t.Fatalf("got %d %v, want 400 naming %q", code, body, tt.param)
			}
		})
	}
	if code, _ := c.do("POST", "/admin/v1/tenants", token, "{not json"); code != 400 {
		t.Fatalf("bad JSON: %d", code)
	}
	if code, _ := c.do("POST", "/admin/v1/tenants", token, map[string]any{"id": "acme"}); code != 409 {
		t.Fatalf("duplicate: %d", code)
	}
	if code, _ := c.do("GET", "/admin/v1/tenants/nope", token, nil); code != 404 {
		t.Fatalf("missing tenant: %d", code)
	}
}

type fakeBreakers []BreakerState

func (f fakeBreakers) Breakers() []BreakerState { return f }

func TestTenantsKeysOverrides(t *testing.T) {
	store := memStore(t)
	c := newServer(t, store, nil, fakeBreakers{{Cluster: "c1", Model: "m", State: "open"}})
	code, body := c.do("POST", "/admin/v1/tenants", token, map[string]any{"id": "acme", "name": "Acme", "limits": map[string]any{"rpm": 60, "token_budget": 1000}})
	if code != 201 || body["policy"] != "cost-first" {
		t.Fatalf("create: %d %v", code, body)
	}
	if lim := body["limits"].(map[string]any); lim["budget_period"] != "month" {
		t.Fatalf("defaults: %v", body)
	}
	code, body = c.do("PUT", "/admin/v1/tenants/acme/limits", token, map[string]any{"limits": map[string]any{"rpm": 5, "tpm": 1000}, "model_limits": map[string]any{"big": map[string]any{"concurrent": 2}}})
	if code != 200 {
		t.Fatalf("limits: %d %v", code, body)
	}
	if tn, _ := store.Tenant("acme"); tn.Limits.RPM != 5 || tn.ModelLimits["big"].Concurrent != 2 || tn.Name != "Acme" {
		t.Fatalf("limits not stored, or other fields lost: %+v", tn)
	}
	code, body = c.do("POST", "/admin/v1/tenants/acme/keys", token, map[string]any{"name": "ci"})
	raw, _ := body["key"].(string)
	if code != 201 || raw == "" || body["prefix"] == "" {
		t.Fatalf("create key: %d %v", code, body)
	}
	keyID := body["id"].(string)
	code, body = c.do("GET", "/admin/v1/tenants/acme/keys", token, nil)
	js, _ := json.Marshal(body)
	if code != 200 || strings.Contains(string(js), raw) || !strings.Contains(string(js), keyID) {
		t.Fatalf("list keys leaks or misses the key: %s", js)
	}
	auth, _ := tenant.NewAuthenticator(context.Background(), store, nil)
	r := httptest.NewRequest("GET", "/", nil)
	r.Header.Set("Authorization", "Bearer "+raw)
	if tn, err := auth.Authenticate(context.Background(), r); err != nil || tn.ID != "acme" {
		t.Fatalf("new key does not authenticate: %v", err)
	}
	if code, _ := c.do("DELETE", "/admin/v1/tenants/acme/keys/"+keyID, token, nil); code != 204 {
		t.Fatalf("delete key: %d", code)
	}
	if _, err := auth.Authenticate(context.Background(), r); err == nil {
		t.Fatal("deleted key still authenticates")
	}
	if code, _ := c.do("DELETE", "/admin/v1/tenants/acme/keys/"+keyID, token, nil); code != 404 {
		t.Fatalf("delete key twice: %d", code)
	}
	if code, body := c.do("PUT", "/admin/v1/clusters/us-east-1/override", token, map[string]any{"drain": true, "cost": 1.5}); code != 200 || body["drain"] != true {
		t.Fatalf("override: %d %v", code, body)
	}
	if o := store.Overrides()["us-east-1"]; !o.Drain || o.Cost == nil || *o.Cost != 1.5 || o.Weight != nil {
		t.Fatalf("stored override: %+v", o)
	}
	if code, body := c.do("GET", "/admin/v1/clusters", token, nil); code != 200 || body["overrides"].(map[string]any)["us-east-1"] == nil {
		t.Fatalf("list overrides: %d %v", code, body)
	}
	if code, _ := c.do("DELETE", "/admin/v1/clusters/us-east-1/override", token, nil); code != 204 {
		t.Fatalf("delete override: %d", code)
	}
	if code, _ := c.do("GET", "/admin/v1/clusters/us-east-1/override", token, nil); code != 404 {
		t.Fatalf("deleted override: %d", code)
	}
	if code, body := c.do("GET", "/admin/v1/breakers", token, nil); code != 200 || len(body["data"].([]any)) != 1 {
		t.Fatalf("breakers: %d %v", code, body)
	}
	if code, _ := c.do("DELETE", "/admin/v1/tenants/acme", token, nil); code != 204 {
		t.Fatalf("delete tenant: %d", code)
	}
	if code, body := c.do("GET", "/admin/v1/tenants", token, nil); code != 200 || len(body["data"].([]any)) != 0 {
		t.Fatalf("list after delete: %d %v", code, body)
	}
}

// TestQuotaChangeReachesAllReplicas: three replicas (store + limiter each)
// share one Redis; a limit lowered through one replica's admin API holds
// on all of them within 1s, and the usage endpoint sees every replica's
// admissions.
func TestQuotaChangeReachesAllReplicas(t *testing.T) {
	rs := testservice.StartRedis(t)
	ctx := context.Background()
	type replica struct {
		store *tenant.Store
		lim   *ratelimit.Limiter
	}
	var reps []replica
	for i := 0; i < 3; i++ {
		rdb := redis.NewClient(&redis.Options{Addr: rs.Addr()})
		t.Cleanup(func() { rdb.Close() })
		st, err := tenant.New(ctx, tenant.Options{Redis: rdb})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { st.Close() })
		l := ratelimit.New(ratelimit.Options{Redis: rdb, Replicas: 3, Timeout: time.Second})
		t.Cleanup(func() { l.Close() })
		reps = append(reps, replica{st, l})
	}
	c := newServer(t, reps[0].store, reps[0].lim, nil)
	if code, _ := c.do("POST", "/admin/v1/tenants", token, map[string]any{"id": "acme", "limits": map[string]any{"rpm": 1000}}); code != 201 {
		t.Fatalf("create: %d", code)
	}
	start := time.Now()
	if code, _ := c.do("PUT", "/admin/v1/tenants/acme/limits", token, map[string]any{"limits": map[string]any{"rpm": 4, "concurrent": 10}}); code != 200 {
		t.Fatalf("limits: %d", code)
	}
	for i, r := range reps {
		for {
			if tn, ok := r.store.Tenant("acme"); ok && tn.Limits.RPM == 4 {
				break
			}
			if time.Since(start) > time.Second {
				t.Fatalf("replica %d did not see the new limit within 1s", i)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	t.Logf("new limit on all replicas after %v", time.Since(start))
	// Each replica admits with its own cached tenant; together they admit
	// exactly 4.
	admitted := 0
	var held []*ratelimit.Reservation
	for round := 0; round < 3; round++ {
		for _, r := range reps {
			tn, _ := r.store.Tenant("acme")
			res, d, err := r.lim.Admit(ctx, tn, "m", 10)
			if err != nil {
				t.Fatal(err)
			}
			if d.Allowed {
				admitted++
				held = append(held, res)
			}
		}
	}
	if admitted != 4 {
		t.Fatalf("replicas admitted %d, limit 4", admitted)
	}
	code, body := c.do("GET", "/admin/v1/tenants/acme/usage", token, nil)
	if code != 200 {
		t.Fatalf("usage: %d %v", code, body)
	}
	scope := body["scopes"].([]any)[0].(map[string]any)
	rpm := scope["rpm"].(map[string]any)
	conc := scope["concurrent"].(map[string]any)
	if rpm["used"].(float64) < 4 || rpm["limit"].(float64) != 4 || conc["used"].(float64) < 4 {
		t.Fatalf("usage: %v", body)
	}
	for _, r := range held {
		r.Finish(ctx, 10)
	}
}

// TestOpenAPICoversRoutes keeps the hand-written document in step with
// the routes actually registered.
func TestOpenAPICoversRoutes(t *testing.T) {
	s := New(Options{Store: memStore(t), Token: token})
	c := newServer(t, memStore(t), nil, nil)
	code, doc := c.do("GET", "/openapi.json", "", nil)
	if code != 200 || !strings.HasPrefix(doc["openapi"].(string), "3.") {
		t.Fatalf("openapi: %d", code)
	}
	paths := doc["paths"].(map[string]any)
	param := regexp.MustCompile(`:(\w+)`)
	served := map[string]bool{}
	for _, r := range s.e.Routes() {
		served[param.ReplaceAllString(r.Path, "{$1}")] = true
	}
	for p := range paths {
		if !served[p] {
			t.Errorf("openapi.json documents %s, which is not served", p)
		}
	}
	for _, r := range s.e.Routes() {
		if strings.HasPrefix(r.Method, "echo_") {
			continue // echo's internal not-found routes for the group
		}
		p := param.ReplaceAllString(r.Path, "{$1}")
		item, ok := paths[p].(map[string]any)
		if !ok {
			t.Errorf("route %s %s missing from openapi.json", r.Method, p)
			continue
		}
		op, ok := item[strings.ToLower(r.Method)].(map[string]any)
		if !ok {
			t.Errorf("method %s %s missing from openapi.json", r.Method, p)
			continue
		}
		// Every write goes to the tenant store, which may be unavailable.
		if r.Method != http.MethodGet {
			if _, ok := op["responses"].(map[string]any)["503"]; !ok {
				t.Errorf("%s %s: no 503 response in openapi.json", r.Method, p)
			}
		}
	}
}

// TestStoreUnavailable stops Redis under the tenant store: every admin
// write answers 503 store_unavailable (reads keep serving the cache), and
// once Redis is back the same writes succeed.
func TestStoreUnavailable(t *testing.T) {
	rs := testservice.StartRedis(t)
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: rs.Addr(), MaxRetries: -1, DialTimeout: time.Second})
	t.Cleanup(func() { rdb.Close() })
	st, err := tenant.New(ctx, tenant.Options{Redis: rdb})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	c := newServer(t, st, nil, nil)
	if code, m := c.do("POST", "/admin/v1/tenants", token, map[string]any{"id": "acme"}); code != 201 {
		t.Fatalf("create acme: %d %v", code, m)
	}

	writes := []struct {
		method, path string
		body         any
		up           int // status once Redis is back
	}{
		{"POST", "/admin/v1/tenants", map[string]any{"id": "beta"}, 201},
		{"PUT", "/admin/v1/tenants/acme", map[string]any{"policy": "latency-first"}, 200},
		{"PUT", "/admin/v1/tenants/acme/limits", map[string]any{"limits": map[string]any{"rpm": 10}}, 200},
		{"POST", "/admin/v1/tenants/acme/keys", map[string]any{"name": "ci"}, 201},
		{"PUT", "/admin/v1/clusters/use1-a/override", map[string]any{"drain": true}, 200},
		{"DELETE", "/admin/v1/clusters/use1-a/override", nil, 204},
		{"DELETE", "/admin/v1/tenants/beta", nil, 204},
	}

	rs.Stop()
	for _, w := range writes {
		t.Run("down "+w.method+" "+w.path, func(t *testing.T) {
			c := client{t: t, srv: c.srv}
			code, m := c.do(w.method, w.path, token, w.body)
			e, _ := m["error"].(map[string]any)
			if code != 503 || e["type"] != "service_unavailable" || e["code"] != "store_unavailable" || e["message"] == "" {
				t.Fatalf("= %d %v, want 503 service_unavailable/store_unavailable", code, m)
			}
		})
	}
	if code, m := c.do("GET", "/admin/v1/tenants/acme", token, nil); code != 200 {
		t.Fatalf("read from the cache while Redis is down: %d %v", code, m)
	}

	// Redis comes back empty (no persistence); the store notices the reset
	// and drops acme from its cache, so recreate it first.
	rs.Start()
	deadline := time.Now().Add(10 * time.Second)
	for {
		code, m := c.do("POST", "/admin/v1/tenants", token, map[string]any{"id": "acme"})
		if code == 201 {
			break
		}
		if (code != 409 && code != 503) || time.Now().After(deadline) {
			t.Fatalf("recreate acme: %d %v", code, m)
		}
		// 409: the cache still has acme from before the restart; 503: the
		// client has not reconnected yet. Either clears within a reload.
		time.Sleep(50 * time.Millisecond)
	}
	for _, w := range writes {
		t.Run("up "+w.method+" "+w.path, func(t *testing.T) {
			c := client{t: t, srv: c.srv}
			if code, m := c.do(w.method, w.path, token, w.body); code != w.up {
				t.Fatalf("= %d %v, want %d", code, m, w.up)
			}
		})
	}
}
