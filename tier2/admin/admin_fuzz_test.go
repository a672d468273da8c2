package admin

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"

	"github.com/infergate/infergate/tier2/tenant"
)

type knownSet map[string]bool

func (k knownSet) KnownCluster(name string) bool { return k[name] }

// FuzzAdminBodies sends arbitrary bodies (and path names and Authorization
// headers) through the admin API's real echo handler. It must answer every
// one with an OpenAI-shaped JSON error or success, never a 500, and never
// store a tenant, key or override that breaks the documented bounds.
func FuzzAdminBodies(f *testing.F) {
	routes := []struct{ method, path string }{
		{"POST", "/admin/v1/tenants"},
		{"PUT", "/admin/v1/tenants/acme"},
		{"PUT", "/admin/v1/tenants/acme/limits"},
		{"POST", "/admin/v1/tenants/acme/keys"},
		{"PUT", "/admin/v1/clusters/%s/override"},
		{"PUT", "/admin/v1/clusters/%s/override?force=true"},
	}
	seeds := []string{
		`{"id":"b","name":"Beta","policy":"region-pinned","region":"us-east-1","limits":{"rpm":60,"tpm":1000,"token_budget":5,"budget_period":"day"},"model_limits":{"llama":{"concurrent":2}}}`,
		`{"limits":{"rpm":1},"model_limits":{"m":{"tpm":-1}}}`,
		`{"name":"ci"}`,
		`{"drain":true,"weight":0.5,"cost":1.2}`,
		`{"weight":-1e308}`,
		`{"id":"b"}{"id":"c"}`,
		`{"id":"b","name":"\u0000\u202e"}`,
		`{"limits":{"rpm":1e30}}`,
		`[]`, `null`, `"x"`, ``,
	}
	for i := range routes {
		for _, s := range seeds {
			f.Add(uint8(i), "use1-a", "Bearer "+token, []byte(s))
		}
	}
	f.Add(uint8(4), "a/../b", "bearer "+token, []byte(`{"drain":true}`))
	f.Add(uint8(0), "", "Basic "+token, []byte(`{"id":"x"}`))
	f.Fuzz(func(t *testing.T, route uint8, cluster, authz string, body []byte) {
		store, err := tenant.New(context.Background(), tenant.Options{Seed: []tenant.Tenant{{ID: "acme"}}})
		if err != nil {
			t.Fatal(err)
		}
		defer store.Close()
		h := New(Options{Store: store, Token: token, Clusters: knownSet{"use1-a": true}}).Handler()
		r := routes[int(route)%len(routes)]
		path := strings.Replace(r.path, "%s", url.PathEscape(cluster), 1)
		req := httptest.NewRequest(r.method, path, bytes.NewReader(body))
		req.Header.Set("Authorization", authz)
		req.Header.Set("Content-Type", "application/json")
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)

		switch rec.Code {
		case 200, 201, 204:
		case 400, 401, 404, 405, 409, 413:
			var e struct {
				Error struct {
					Message string `json:"message"`
					Type    string `json:"type"`
				} `json:"error"`
			}
			if err := json.Unmarshal(rec.Body.Bytes(), &e); err != nil || e.Error.Message == "" || e.Error.Type == "" {
				t.Fatalf("%d without an OpenAI-shaped error: %q", rec.Code, rec.Body.Bytes())
			}
			if rec.Code == 401 {
				if _, ok := bearerToken(authz); ok && authz[7:] == token {
					t.Fatalf("right token refused: %q", authz)
				}
			}
		default:
			t.Fatalf("%s %s: status %d: %s", r.method, path, rec.Code, rec.Body.Bytes())
		}
		if len(body) > MaxBodyBytes && rec.Code < 300 {
			t.Fatalf("body of %d bytes accepted", len(body))
		}
		for _, tn := range store.Tenants() {
			if err := tn.Validate(); err != nil {
				t.Fatalf("stored tenant fails validation: %v", err)
			}
		}
		for _, k := range store.Keys("acme") {
			if !tenant.ValidName(k.Name, tenant.MaxNameLen) {
				t.Fatalf("stored key name %q", k.Name)
			}
		}
		for name, o := range store.Overrides() {
			if !tenant.ValidID(name) || o.Validate() != nil {
				t.Fatalf("stored override %q %+v", name, o)
			}
			if name != "use1-a" && r.path == routes[4].path {
				t.Fatalf("override for unknown cluster %q stored without force", name)
			}
		}
	})
}
