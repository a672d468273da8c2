package admin

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/infergate/infergate/tier2/discovery"
)

// rawDo sends body as is with the given Authorization header value.
func rawDo(t *testing.T, srv *httptest.Server, method, path, authz string, body io.Reader) int {
	t.Helper()
	req, err := http.NewRequest(method, srv.URL+path, body)
	if err != nil {
		t.Fatal(err)
	}
	if authz != "" {
		req.Header.Set("Authorization", authz)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode
}

func TestNameBounds(t *testing.T) {
	c := newServer(t, memStore(t), nil, nil)
	if code, _ := c.do("POST", "/admin/v1/tenants", token, map[string]any{"id": "acme"}); code != 201 {
		t.Fatalf("create: %d", code)
	}
	long := strings.Repeat("é", 129) // characters, not bytes, are counted
	tests := []struct {
		name, method, path string
		body               any
		param              string
	}{
		{"1 MB tenant name", "POST", "/admin/v1/tenants", map[string]any{"id": "big", "name": strings.Repeat("x", 1<<20-100)}, "name"},
		{"129-char tenant name", "POST", "/admin/v1/tenants", map[string]any{"id": "big", "name": long}, "name"},
		{"control char in name", "PUT", "/admin/v1/tenants/acme", map[string]any{"name": "a\x1b[31mb"}, "name"},
		{"long region", "POST", "/admin/v1/tenants", map[string]any{"id": "r", "policy": "region-pinned", "region": long}, "region"},
		{"long model name", "PUT", "/admin/v1/tenants/acme/limits", map[string]any{"model_limits": map[string]any{strings.Repeat("m", 257): map[string]any{"rpm": 1}}}, "model_limits"},
		{"129-char key name", "POST", "/admin/v1/tenants/acme/keys", map[string]any{"name": long}, "name"},
		{"newline in key name", "POST", "/admin/v1/tenants/acme/keys", map[string]any{"name": "ci\nkey"}, "name"},
		{"65-char tenant id", "POST", "/admin/v1/tenants", map[string]any{"id": strings.Repeat("a", 65)}, "id"},
		{"65-char cluster name", "PUT", "/admin/v1/clusters/" + strings.Repeat("c", 65) + "/override", map[string]any{"drain": true}, "name"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, body := c.do(tt.method, tt.path, token, tt.body)
			if code != 400 || errParam(body) != tt.param {
				t.Fatalf("got %d %v, want 400 naming %q", code, errParam(body), tt.param)
			}
		})
	}
	if code, body := c.do("POST", "/admin/v1/tenants", token, map[string]any{"id": "ok", "name": strings.Repeat("é", 128)}); code != 201 {
		t.Fatalf("128-char name refused: %d %v", code, body)
	}
	if code, body := c.do("POST", "/admin/v1/tenants/acme/keys", token, map[string]any{"name": "CI key (prod) ✓"}); code != 201 {
		t.Fatalf("ordinary key name refused: %d %v", code, body)
	}
}

func TestBodyShape(t *testing.T) {
	c := newServer(t, memStore(t), nil, nil)
	auth := "Bearer " + token
	tests := []struct {
		name string
		body string
		want int
	}{
		{"second document", `{"id":"a"}{"id":"b"}`, 400},
		{"trailing garbage", `{"id":"a"} x`, 400},
		{"trailing array", `{"id":"a"}[]`, 400},
		{"trailing whitespace is fine", "{\"id\":\"a\"}\n\t ", 201},
		{"over 1 MiB", `{"id":"b","name":"` + strings.Repeat("x", MaxBodyBytes) + `"}`, 413},
		{"over 1 MiB of trailing spaces", `{"id":"c"}` + strings.Repeat(" ", MaxBodyBytes), 413},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if code := rawDo(t, c.srv, "POST", "/admin/v1/tenants", auth, strings.NewReader(tt.body)); code != tt.want {
				t.Fatalf("got %d, want %d", code, tt.want)
			}
		})
	}
	// Without a Content-Length (chunked) the limit still holds.
	big := io.MultiReader(strings.NewReader(`{"id":"d","name":"`), bytes.NewReader(bytes.Repeat([]byte("x"), 2*MaxBodyBytes)), strings.NewReader(`"}`))
	if code := rawDo(t, c.srv, "POST", "/admin/v1/tenants", auth, big); code != 413 {
		t.Fatalf("chunked oversize body: %d, want 413", code)
	}
	if _, ok := memStoreTenant(c, "b"); ok {
		t.Fatal("a tenant from a refused body was stored")
	}
}

func memStoreTenant(c client, id string) (int, bool) {
	code, _ := c.do("GET", "/admin/v1/tenants/"+id, token, nil)
	return code, code == 200
}

func TestAuthSchemeCaseInsensitive(t *testing.T) {
	c := newServer(t, memStore(t), nil, nil)
	for _, h := range []string{"Bearer " + token, "bearer " + token, "BEARER " + token, "BeArEr " + token, "Bearer   " + token} {
		if code := rawDo(t, c.srv, "GET", "/admin/v1/tenants", h, nil); code != 200 {
			t.Errorf("Authorization %q: %d, want 200", h[:10], code)
		}
	}
	for _, h := range []string{"Basic " + token, "Bearer" + token, "Bearer ", "Bearer " + strings.ToUpper(token), token} {
		if code := rawDo(t, c.srv, "GET", "/admin/v1/tenants", h, nil); code != 401 {
			t.Errorf("Authorization %q: %d, want 401", h, code)
		}
	}
}

func TestOverrideUnknownCluster(t *testing.T) {
	disc, err := discovery.New(discovery.Options{Static: []discovery.Cluster{
		{Name: "use1-a", Region: "us-east-1", Address: "http://127.0.0.1:1"},
	}})
	if err != nil {
		t.Fatal(err)
	}
	store := memStore(t)
	s := New(Options{Store: store, Token: token, Clusters: DiscoveryClusters(disc)})
	srv := httptest.NewServer(s.Handler())
	t.Cleanup(srv.Close)
	c := client{t: t, srv: srv}

	if code, body := c.do("PUT", "/admin/v1/clusters/use1-a/override", token, map[string]any{"drain": true}); code != 200 {
		t.Fatalf("known cluster: %d %v", code, body)
	}
	code, body := c.do("PUT", "/admin/v1/clusters/use1-typo/override", token, map[string]any{"drain": true})
	if code != 404 || errParam(body) != "name" || !strings.Contains(body["error"].(map[string]any)["message"].(string), "use1-typo") {
		t.Fatalf("unknown cluster: %d %v, want 404 naming it", code, body)
	}
	if _, ok := store.Overrides()["use1-typo"]; ok {
		t.Fatal("override for an unknown cluster was stored")
	}
	if code, body := c.do("PUT", "/admin/v1/clusters/use1-b/override?force=true", token, map[string]any{"drain": true}); code != 200 {
		t.Fatalf("forced: %d %v", code, body)
	}
	if _, ok := store.Overrides()["use1-b"]; !ok {
		t.Fatal("forced override not stored")
	}
	// Removing an override never needs the cluster to exist.
	if code, _ := c.do("DELETE", "/admin/v1/clusters/use1-b/override", token, nil); code != 204 {
		t.Fatalf("delete: %d", code)
	}
	// An invalid name is still a 400, not a 404.
	if code, body := c.do("PUT", "/admin/v1/clusters/a%20b/override", token, map[string]any{"drain": true}); code != 400 || errParam(body) != "name" {
		t.Fatalf("bad name: %d %v", code, body)
	}
}
