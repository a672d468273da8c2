package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/infergate/infergate/internal/testservice"
	"github.com/infergate/infergate/shared/cluster"
)

// TestTier2Command covers what `infergate tier2` itself does around
// tier2/server (whose tests cover the wiring): flags, the config file, the
// --listen override, the listeners, logging, and a clean exit when its
// context ends.
func TestTier2Command(t *testing.T) {
	tier1 := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_ = json.NewEncoder(w).Encode(cluster.LoadSummary{Models: map[string]cluster.ModelLoad{"m": {ReadyPods: 1, KVHeadroom: 1}}})
	}))
	defer tier1.Close()

	port := testservice.FreePort(t)
	adminPort := testservice.FreePort(t)
	cfg := fmt.Sprintf(`
listen: 127.0.0.1:1
region: east
clusters:
  - {name: a, region: east, address: %q, models: [m], cost: 1}
tier1: {token: t1secret, poll_interval: 100ms}
admin: {listen: "127.0.0.1:%d", token_env: INFERGATE_TEST_ADMIN_TOKEN}
metrics: {listen: "127.0.0.1:0"}
`, tier1.URL, adminPort)
	path := filepath.Join(t.TempDir(), "tier2.yaml")
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("INFERGATE_TEST_ADMIN_TOKEN", "admintoken")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var stdout, stderr bytes.Buffer
	done := make(chan error, 1)
	listen := fmt.Sprintf("127.0.0.1:%d", port)
	go func() { done <- runTier2(ctx, []string{"--config", path, "--listen", listen}, &stdout, &stderr) }()
	deadline := time.Now().Add(10 * time.Second)
	for {
		resp, err := http.Get("http://" + listen + "/ready")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("tier2 never became ready: %v\n%s", err, stderr.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	req, _ := http.NewRequest(http.MethodGet, fmt.Sprintf("http://127.0.0.1:%d/admin/v1/tenants", adminPort), nil)
	req.Header.Set("Authorization", "Bearer admintoken")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("admin API with the token from the environment: %d", resp.StatusCode)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("runTier2: %v", err)
	}
	if want := "infergate tier2 listening on " + listen; !strings.Contains(stdout.String(), want) {
		t.Errorf("stdout %q, want %q", stdout.String(), want)
	}
	if !strings.Contains(stderr.String(), "no redis configured") {
		t.Errorf("the in-memory mode was not logged:\n%s", stderr.String())
	}
}

func TestTier2CommandErrors(t *testing.T) {
	bad := filepath.Join(t.TempDir(), "bad.yaml")
	if err := os.WriteFile(bad, []byte("region: r\nconsul: {}\nbogus: 1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"no config", nil, "--config is required"},
		{"bad log level", []string{"--config", bad, "--log-level", "loud"}, "--log-level"},
		{"strict config", []string{"--config", bad}, "bogus"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			err := runTier2(context.Background(), tc.args, &stdout, &stderr)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want it to mention %q", err, tc.want)
			}
		})
	}
}
