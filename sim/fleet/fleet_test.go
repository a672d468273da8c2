package fleet

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func writeFile(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "fleet.yaml")
	if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestLoad(t *testing.T) {
	tests := []struct {
		name    string
		yaml    string
		wantErr string
		check   func(t *testing.T, c Config)
	}{
		{
			name: "defaults",
			yaml: "pods:\n  - name: a\n",
			check: func(t *testing.T, c Config) {
				p := c.Pods[0]
				if c.TimeScale != 1 || c.Host != "127.0.0.1" || p.Model != "llama-3.1-8b" || p.GPU != "h100" || p.Engine != "vllm" || p.Replicas != 1 {
					t.Errorf("defaults not applied: %+v %+v", c, p)
				}
			},
		},
		{name: "unknown field names field and line", yaml: "pods:\n  - name: a\n    gpus: h100\n", wantErr: `:3:5: pods[0].gpus: unknown key "gpus"; did you mean "gpu"?`},
		{name: "no pods", yaml: "time_scale: 0.5\n", wantErr: "at least one pod"},
		{name: "bad engine", yaml: "pods:\n  - name: a\n    engine: triton\n", wantErr: "unknown engine"},
		{name: "duplicate names", yaml: "pods:\n  - name: a\n  - name: a\n", wantErr: "duplicate pod name"},
		{name: "replica names collide", yaml: "pods:\n  - name: a\n    replicas: 2\n  - name: a-1\n", wantErr: "duplicate pod name \"a-1\""},
		{name: "replica ports collide", yaml: "pods:\n  - name: a\n    port: 9000\n    replicas: 2\n  - name: b\n    port: 9001\n", wantErr: "port 9001 already used"},
		{name: "bad lora", yaml: "pods:\n  - name: a\n    lora_modules: [\"=x\"]\n", wantErr: "invalid LoRA module"},
		{name: "negative replicas", yaml: "pods:\n  - name: a\n    replicas: -1\n", wantErr: "replicas must be at least 1"},
		{name: "negative time scale", yaml: "time_scale: -1\npods:\n  - name: a\n", wantErr: "time_scale"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := Load(writeFile(t, tt.yaml))
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			tt.check(t, c)
		})
	}
}

func TestExampleFleetLoads(t *testing.T) {
	c, err := Load(filepath.Join("..", "..", "examples", "fleet.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	engines := map[string]bool{}
	gpus := map[string]bool{}
	for _, p := range c.Pods {
		engines[p.Engine] = true
		gpus[p.GPU] = true
	}
	for _, e := range []string{"vllm", "vllm-legacy", "sglang", "tgi"} {
		if !engines[e] {
			t.Errorf("example fleet lacks a %s pod", e)
		}
	}
	if len(gpus) < 3 {
		t.Errorf("example fleet uses GPUs %v, want a mix", gpus)
	}
	// Every pod must build (model fits its GPUs, flags valid); port 0 so
	// the test does not depend on the fixed ports being free.
	for i := range c.Pods {
		c.Pods[i].Port = 0
	}
	c.Logger = quiet()
	f, err := Start(context.Background(), c)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
}

func TestStartServesEveryPod(t *testing.T) {
	cfg := Config{
		TimeScale: 0.02,
		Logger:    quiet(),
		Pods: []PodSpec{
			{Name: "fast", GPU: "h100", ServedModelName: "llama", Replicas: 2, LoRAModules: []string{"sql=/a/sql", "bare"}},
			{Name: "slow", GPU: "a10g", ServedModelName: "llama", Engine: "sglang"},
			{Name: "tgi", GPU: "l4", ServedModelName: "llama", Engine: "tgi"},
		},
	}
	f, err := Start(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := f.Close(); err != nil {
			t.Error(err)
		}
	})
	if len(f.Pods) != 4 {
		t.Fatalf("%d pods, want 4", len(f.Pods))
	}
	if f.Pod("fast-0") == nil || f.Pod("fast-1") == nil || f.Pod("fast") != nil {
		t.Fatalf("replica names: %s", f)
	}
	seen := map[string]bool{}
	wantMetric := map[string]string{"fast-0": "vllm:num_requests_running", "fast-1": "vllm:num_requests_running",
		"slow": "sglang:num_running_reqs", "tgi": "tgi_batch_current_size"}
	for _, p := range f.Pods {
		if seen[p.Addr] || !strings.HasPrefix(p.Addr, "127.0.0.1:") {
			t.Fatalf("pod %s address %q", p.Spec.Name, p.Addr)
		}
		seen[p.Addr] = true
		body := `{"model":"llama","messages":[{"role":"user","content":"hi"}],"max_tokens":2}`
		resp, err := http.Post(p.URL+"/v1/chat/completions", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		var out struct {
			Usage struct {
				CompletionTokens int `json:"completion_tokens"`
			} `json:"usage"`
		}
		err = json.NewDecoder(resp.Body).Decode(&out)
		resp.Body.Close()
		if err != nil || resp.StatusCode != 200 || out.Usage.CompletionTokens != 2 {
			t.Fatalf("pod %s: status %d err %v usage %+v", p.Spec.Name, resp.StatusCode, err, out.Usage)
		}
		mresp, err := http.Get(p.URL + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		m, _ := io.ReadAll(mresp.Body)
		mresp.Body.Close()
		if !strings.Contains(string(m), wantMetric[p.Spec.Name]) {
			t.Errorf("pod %s /metrics lacks %s", p.Spec.Name, wantMetric[p.Spec.Name])
		}
	}
	// The replicas carry the adapters, with bare names as their own path.
	resp, err := http.Get(f.Pod("fast-1").URL + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{`"id":"sql"`, `"root":"/a/sql"`, `"id":"bare"`, `"root":"bare"`} {
		if !strings.Contains(string(b), want) {
			t.Errorf("/v1/models lacks %s: %s", want, b)
		}
	}
	if by := f.ByModel(); len(by) != 1 || len(by["llama"]) != 4 {
		t.Errorf("ByModel = %v", by)
	}
	if s := f.String(); !strings.Contains(s, "slow\thttp://127.0.0.1:") || !strings.Contains(s, "engine=sglang") {
		t.Errorf("String() = %q", s)
	}
}

func TestStartFailsCleanly(t *testing.T) {
	cfg := Config{Logger: quiet(), Pods: []PodSpec{
		{Name: "ok"},
		{Name: "too-big", Model: "llama-3.1-70b", GPU: "l4"}, // 141 GB of weights on one 24 GB GPU
	}}
	if _, err := Start(context.Background(), cfg); err == nil || !strings.Contains(err.Error(), "too-big") {
		t.Fatalf("err = %v, want a failure naming the pod", err)
	}
	// A port already taken fails too, naming the pod.
	f, err := Start(context.Background(), Config{Logger: quiet(), Pods: []PodSpec{{Name: "first"}}})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	_, port, _ := net.SplitHostPort(f.Pods[0].Addr)
	p, err := strconv.Atoi(port)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Start(context.Background(), Config{Logger: quiet(), Pods: []PodSpec{{Name: "clash", Port: p}}}); err == nil || !strings.Contains(err.Error(), "clash") {
		t.Fatalf("err = %v, want a listen failure naming the pod", err)
	}
}
