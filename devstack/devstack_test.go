package devstack

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

// The stack's pods are simulated (sim/server): they stand in for GPUs.
func TestStart(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	st, err := Start(ctx, Options{Listen: "127.0.0.1:0", AdminListen: "127.0.0.1:0", TimeScale: 0.05, APIKey: "sk-test"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := st.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	if len(st.Clusters) != 4 || st.AdminToken == "" || st.Tier1Token == "" {
		t.Fatalf("stack: %d clusters, admin token %q, tier1 token %q", len(st.Clusters), st.AdminToken, st.Tier1Token)
	}

	do := func(method, url, token, body string) (*http.Response, string) {
		t.Helper()
		req, err := http.NewRequestWithContext(ctx, method, url, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp, string(b)
	}

	chat := `{"model":"` + LlamaModel + `","messages":[{"role":"user","content":"hi"}],"max_tokens":4}`
	tests := []struct {
		name, method, url, token, body string
		want                           int
	}{
		{"chat", "POST", st.BaseURL + "/chat/completions", "sk-test", chat, http.StatusOK},
		{"adapter", "POST", st.BaseURL + "/chat/completions", "sk-test", strings.Replace(chat, LlamaModel, SQLLoRA, 1), http.StatusOK},
		{"qwen in one cluster", "POST", st.BaseURL + "/chat/completions", "sk-test", strings.Replace(chat, LlamaModel, QwenModel, 1), http.StatusOK},
		{"wrong key", "POST", st.BaseURL + "/chat/completions", "sk-nope", chat, http.StatusUnauthorized},
		{"unknown model", "POST", st.BaseURL + "/chat/completions", "sk-test", strings.Replace(chat, LlamaModel, "gpt-none", 1), http.StatusNotFound},
		{"admin", "GET", st.AdminURL + "/admin/v1/tenants/" + TenantID, st.AdminToken, "", http.StatusOK},
		{"admin without token", "GET", st.AdminURL + "/admin/v1/tenants", "", "", http.StatusUnauthorized},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			resp, body := do(tt.method, tt.url, tt.token, tt.body)
			if resp.StatusCode != tt.want {
				t.Fatalf("%s %s: %s, want %d: %s", tt.method, tt.url, resp.Status, tt.want, body)
			}
			if tt.want == http.StatusOK && strings.HasSuffix(tt.url, "/chat/completions") {
				var out struct {
					Choices []struct{ Message struct{ Content string } }
					Usage   struct {
						CompletionTokens int `json:"completion_tokens"`
					}
				}
				if err := json.Unmarshal([]byte(body), &out); err != nil || len(out.Choices) == 0 || out.Usage.CompletionTokens == 0 {
					t.Fatalf("answer %s (%v)", body, err)
				}
				if resp.Header.Get("X-Infergate-Cluster") == "" {
					t.Errorf("no X-Infergate-Cluster header")
				}
			}
		})
	}

	// Qwen lives only in cluster-b.
	resp, body := do("POST", st.BaseURL+"/chat/completions", "sk-test", strings.Replace(chat, LlamaModel, QwenModel, 1))
	if got := resp.Header.Get("X-Infergate-Cluster"); got != "cluster-b" {
		t.Errorf("qwen served by %q, want cluster-b (%s)", got, body)
	}
}

func TestStartPortInUse(t *testing.T) {
	ctx := context.Background()
	st, err := Start(ctx, Options{Listen: "127.0.0.1:0", AdminListen: "127.0.0.1:0", TimeScale: 0.05, Clusters: Topology()[:1]})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if _, err := Start(ctx, Options{Listen: st.Addr, AdminListen: "127.0.0.1:0"}); err == nil || !strings.Contains(err.Error(), "listen") {
		t.Fatalf("second stack on %s: err %v, want a listen error", st.Addr, err)
	}
}
