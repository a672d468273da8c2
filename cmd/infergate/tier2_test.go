package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/infergate/infergate/shared/cluster"
	"github.com/infergate/infergate/shared/config"
	"github.com/infergate/infergate/shared/testservice"
)

func TestTier2ExampleConfigLoads(t *testing.T) {
	var cfg tier2Config
	if err := config.Load("../../examples/tier2.yaml", &cfg); err != nil {
		t.Fatal(err)
	}
	if cfg.Region != "us-east" || len(cfg.Clusters) != 2 || cfg.Clusters[0].CostUnit != "gpu-hour" || cfg.Routing.Breaker.OpenTimeout != 10*time.Second {
		t.Fatalf("decoded %+v", cfg)
	}
}

func TestTier2ConfigErrors(t *testing.T) {
	for _, tc := range []struct{ name, yaml, want string }{
		{"no region", "clusters: [{name: a, region: r, address: 'http://x:1'}]", "region is required"},
		{"no clusters", "region: r", "either consul or clusters"},
		{"bad policy", "region: r\nconsul: {}\nrouting: {default_policy: cheap}", "unknown routing policy"},
		{"bad cluster", "region: r\nclusters: [{name: a, region: r, address: 'x:1'}]", "address"},
		{"unknown field", "region: r\nconsul: {}\nbogus: 1", "bogus"},
		{"duplicate cluster", "region: r\nclusters: [{name: a, region: r, address: 'http://x:1'}, {name: a, region: r, address: 'http://x:2'}]", "duplicate"},
		{"admin without token", "region: r\nconsul: {}\nadmin: {listen: '127.0.0.1:0'}", "admin.token"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var cfg tier2Config
			err := config.Decode("test.yaml", []byte(tc.yaml), &cfg)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want it to mention %q", err, tc.want)
			}
		})
	}
}

// TestTier2Command runs `infergate tier2` on embedded defaults (no Consul,
// no Redis) in front of a stand-in Tier 1 (a real loopback server serving
// chat completions and the load summary) and sends it a request.
func TestTier2Command(t *testing.T) {
	var mu sync.Mutex
	var sawAuth string
	tier1 := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == cluster.LoadPath {
			_ = json.NewEncoder(w).Encode(cluster.LoadSummary{Models: map[string]cluster.ModelLoad{"m": {ReadyPods: 1, KVHeadroom: 1}}})
			return
		}
		mu.Lock()
		sawAuth = r.Header.Get("Authorization")
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"choices":[{"message":{"content":"hi"}}],"usage":{"total_tokens":3}}`)
	}))
	defer tier1.Close()

	port := testservice.FreePort(t)
	adminPort := testservice.FreePort(t)
	cfg := fmt.Sprintf(`
listen: 127.0.0.1:%d
region: east
clusters:
  - {name: a, region: east, address: %q, models: [m], cost: 1}
tier1: {token: t1secret, poll_interval: 100ms}
tenants: [{id: acme, limits: {rpm: 2}}]
keys: [{tenant: acme, key: sk-test}]
admin: {listen: "127.0.0.1:%d", token: admintoken}
`, port, tier1.URL, adminPort)
	path := filepath.Join(t.TempDir(), "tier2.yaml")
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var stdout, stderr bytes.Buffer
	done := make(chan error, 1)
	go func() { done <- runTier2(ctx, []string{"--config", path}, &stdout, &stderr) }()
	base := fmt.Sprintf("http://127.0.0.1:%d", port)
	deadline := time.Now().Add(10 * time.Second)
	for {
		resp, err := http.Get(base + "/ready")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				break
			}
		}
		if time.Now().After(deadline) {
			cancel()
			t.Fatalf("tier2 never became ready: %v\n%s", err, stderr.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	post := func(key string) *http.Response {
		req, _ := http.NewRequest(http.MethodPost, base+"/v1/chat/completions", strings.NewReader(`{"model":"m","messages":[]}`))
		req.Header.Set("Authorization", "Bearer "+key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp
	}
	if resp := post("wrong"); resp.StatusCode != 401 {
		t.Errorf("bad key: %d", resp.StatusCode)
	}
	if resp := post("sk-test"); resp.StatusCode != 200 || resp.Header.Get("X-Infergate-Cluster") != "a" {
		t.Errorf("good key: %d %v", resp.StatusCode, resp.Header)
	}
	// The tenant's limit (2 a minute) through tier2/ratelimit: the second
	// request passes, the third gets an OpenAI 429 with Retry-After.
	if resp := post("sk-test"); resp.StatusCode != 200 {
		t.Errorf("second request: %d", resp.StatusCode)
	}
	if resp := post("sk-test"); resp.StatusCode != 429 || resp.Header.Get("Retry-After") == "" {
		t.Errorf("third request: %d %v", resp.StatusCode, resp.Header)
	}
	mu.Lock()
	if sawAuth != "Bearer t1secret" {
		t.Errorf("tier1 saw Authorization %q", sawAuth)
	}
	mu.Unlock()
	// The admin API is on its own listener and reports the breakers.
	req, _ := http.NewRequest(http.MethodGet, fmt.Sprintf("http://127.0.0.1:%d/admin/v1/breakers", adminPort), nil)
	req.Header.Set("Authorization", "Bearer admintoken")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(string(b), `"cluster":"a"`) {
		t.Errorf("admin breakers: %d %s", resp.StatusCode, b)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("runTier2: %v", err)
	}
	if !strings.Contains(stderr.String(), "no redis configured") {
		t.Errorf("the in-memory mode was not logged:\n%s", stderr.String())
	}
}
