package integration

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/infergate/infergate/internal/testservice"
	"github.com/infergate/infergate/sim/fleet"
)

// obsStack is a small fleet as separate processes: simulated pods (two
// vLLM, one TGI, which exports no KV-cache usage, so a scorer input is
// reported missing) behind one Tier 1, whose config also names a pod
// that is down (its scrapes fail), and two Tier 2 replicas sharing a real
// Redis with a static cluster list priced per GPU-hour.
type obsStack struct {
	tier1, tier1Metrics string
	tier2, tier2Metrics []string // per replica
	key, limitedKey     string
	budgetKey           string
}

const obsModel = "obs-model"

func startObsStack(t *testing.T) *obsStack {
	t.Helper()
	needBinary(t)
	dir := t.TempDir()
	write := func(name, content string) string {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	rs := testservice.StartRedis(t)
	fc := fleet.Config{TimeScale: 0.02, Host: "127.0.0.1"}
	for i, engine := range []string{"vllm", "vllm", "tgi"} {
		fc.Pods = append(fc.Pods, fleet.PodSpec{Name: fmt.Sprintf("pod-%d", i), Port: testservice.FreePort(t),
			ServedModelName: obsModel, Engine: engine, GPU: "h100"})
	}
	sim := startProc(t, "sim", "sim", "--fleet", write("fleet.yaml", mustYAML(t, fc)), "--log-level", "warn")
	for _, p := range fc.Pods {
		waitOK(t, sim, fmt.Sprintf("http://127.0.0.1:%d/health", p.Port), 30*time.Second)
	}

	const tier1Token = "obs-tier1-token"
	s := &obsStack{key: "sk-obs", limitedKey: "sk-obs-limited", budgetKey: "sk-obs-budget"}
	addr := "127.0.0.1:" + strconv.Itoa(testservice.FreePort(t))
	maddr := "127.0.0.1:" + strconv.Itoa(testservice.FreePort(t))
	var b strings.Builder
	fmt.Fprintf(&b, "listen: %s\nmetrics_listen: %s\ncluster: obs-a\nregion: east\nauth: {tokens: [%s]}\nscrape: {interval: 100ms}\n", addr, maddr, tier1Token)
	fmt.Fprintf(&b, "pools:\n  - {name: obs-pool, model: %s}\npods:\n", obsModel)
	for _, p := range fc.Pods {
		fmt.Fprintf(&b, "  - {name: %s, address: \"127.0.0.1:%d\", pool: obs-pool, engine: %s, gpu: h100}\n", p.Name, p.Port, p.Engine)
	}
	fmt.Fprintf(&b, "  - {name: pod-down, address: \"127.0.0.1:%d\", pool: obs-pool, engine: vllm, gpu: h100}\n", testservice.FreePort(t))
	t1 := startProc(t, "tier1", "tier1", "--config", write("tier1.yaml", b.String()), "--log-level", "warn")
	s.tier1, s.tier1Metrics = "http://"+addr, "http://"+maddr+"/metrics"
	waitOK(t, t1, s.tier1+"/ready", 30*time.Second)

	for i := range 2 {
		api := "127.0.0.1:" + strconv.Itoa(testservice.FreePort(t))
		admin := "127.0.0.1:" + strconv.Itoa(testservice.FreePort(t))
		met := "127.0.0.1:" + strconv.Itoa(testservice.FreePort(t))
		cfg := fmt.Sprintf(`listen: %s
region: east
clusters:
  - {name: obs-a, region: east, address: %q, models: [%s], cost: 3.6, cost_unit: gpu-hour, capacity: 64}
tier1: {token: %s, poll_interval: 200ms}
routing: {tokens_per_gpu_second: 1000}
redis: {addresses: [%s], key_prefix: "obs:"}
limits: {replicas: 2}
tenants:
  - {id: acme}
  - {id: limited, limits: {rpm: 3}}
  - {id: budget, limits: {token_budget: 40, budget_period: day}}
keys:
  - {tenant: acme, name: it, key: %s}
  - {tenant: limited, name: it, key: %s}
  - {tenant: budget, name: it, key: %s}
admin: {listen: %s, token: obs-admin}
metrics: {listen: %s}
`, api, s.tier1, obsModel, tier1Token, rs.Addr(), s.key, s.limitedKey, s.budgetKey, admin, met)
		p := startProc(t, fmt.Sprintf("tier2-%d", i), "tier2", "--config", write(fmt.Sprintf("tier2-%d.yaml", i), cfg), "--log-level", "warn")
		s.tier2 = append(s.tier2, "http://"+api)
		s.tier2Metrics = append(s.tier2Metrics, "http://"+met+"/metrics")
		waitOK(t, p, "http://"+api+"/ready", 30*time.Second)
	}
	return s
}

// post sends a chat completion to Tier 2 replica i.
func (s *obsStack) post(t *testing.T, i int, key, body string) (*http.Response, []byte) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	resp, b, err := httpDo(ctx, http.MethodPost, s.tier2[i]+"/v1/chat/completions", key, body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, b
}

func chatBody(model string, stream bool, maxTokens int) string {
	return fmt.Sprintf(`{"model":%q,"stream":%v,"max_tokens":%d,"messages":[{"role":"user","content":"hello there"}]}`, model, stream, maxTokens)
}

// seriesNames is every sample name in a /metrics page (histograms'
// _bucket, _sum and _count included).
func seriesNames(t *testing.T, url string) map[string]bool {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %s", url, resp.Status)
	}
	names := map[string]bool{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		if i := strings.IndexAny(line, "{ "); i > 0 {
			names[line[:i]] = true
		}
	}
	return names
}

// dashboardMetrics is every infergate metric name a Grafana dashboard's
// queries and template variables use.
func dashboardMetrics(t *testing.T, path string) []string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		Panels []struct {
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
		Templating struct {
			List []struct {
				Definition string `json:"definition"`
			} `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal(data, &d); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	var exprs []string
	for _, p := range d.Panels {
		for _, tg := range p.Targets {
			exprs = append(exprs, tg.Expr)
		}
	}
	for _, v := range d.Templating.List {
		exprs = append(exprs, v.Definition)
	}
	re := regexp.MustCompile(`\binfergate_[a-zA-Z0-9_:]+`)
	set := map[string]bool{}
	for _, e := range exprs {
		for _, m := range re.FindAllString(e, -1) {
			set[m] = true
		}
	}
	out := make([]string, 0, len(set))
	for m := range set {
		out = append(out, m)
	}
	sort.Strings(out)
	if len(out) == 0 {
		t.Fatalf("%s: no metric found in its queries", path)
	}
	return out
}

// TestDashboardMetricsExist sends traffic through the stack — answers,
// a stream, a 429, a budget refusal, client errors — then finds every
// metric name the shipped Grafana dashboards query in the live /metrics
// of the tier each dashboard is for, and every live infergate metric in
// docs/metrics.md's table.
func TestDashboardMetricsExist(t *testing.T) {
	s := startObsStack(t)
	for i := range 4 {
		if resp, b := s.post(t, i%2, s.key, chatBody(obsModel, i == 3, 8)); resp.StatusCode != http.StatusOK {
			t.Fatalf("request %d: %s %s", i, resp.Status, b)
		}
	}
	for i := range 4 {
		s.post(t, i%2, s.limitedKey, chatBody(obsModel, false, 4))
	}
	if resp, b := s.post(t, 0, s.budgetKey, chatBody(obsModel, false, 100)); resp.StatusCode != http.StatusTooManyRequests || !strings.Contains(string(b), `"budget_exceeded"`) {
		t.Errorf("budget refusal: %s %s", resp.Status, b)
	}
	if resp, _ := s.post(t, 1, s.key, chatBody("no-such-model", false, 4)); resp.StatusCode != http.StatusNotFound {
		t.Errorf("unknown model: %s", resp.Status)
	}
	if resp, _ := s.post(t, 0, s.key, `{"model":`); resp.StatusCode != http.StatusBadRequest {
		t.Errorf("bad JSON: %s", resp.Status)
	}

	tier1 := func() map[string]bool { return seriesNames(t, s.tier1Metrics) }
	tier2 := func() map[string]bool {
		all := map[string]bool{}
		for _, u := range s.tier2Metrics {
			for n := range seriesNames(t, u) {
				all[n] = true
			}
		}
		return all
	}
	for _, d := range []struct {
		path string
		live func() map[string]bool
	}{
		{"../deploy/helm/infergate-tier1/dashboards/infergate-tier1.json", tier1},
		{"../deploy/helm/infergate-tier2/dashboards/infergate-tier2.json", tier2},
	} {
		want := dashboardMetrics(t, d.path)
		var missing []string
		// Scrapes, polls and the pod that is down take a moment to show.
		waitFor(t, "dashboard metrics in /metrics", 15*time.Second, func() error {
			live := d.live()
			missing = missing[:0]
			for _, m := range want {
				if !live[m] {
					missing = append(missing, m)
				}
			}
			if len(missing) > 0 {
				return fmt.Errorf("%s queries %v, not in the live /metrics", filepath.Base(d.path), missing)
			}
			return nil
		})
		t.Logf("%s: all %d metrics live", filepath.Base(d.path), len(want))
	}

	// The manual's table names every infergate metric a tier exports.
	doc, err := os.ReadFile("../docs/metrics.md")
	if err != nil {
		t.Fatal(err)
	}
	documented := map[string]bool{}
	for _, m := range regexp.MustCompile("`(infergate_[a-z0-9_]+)`").FindAllStringSubmatch(string(doc), -1) {
		documented[m[1]] = true
	}
	for _, live := range []map[string]bool{tier1(), tier2()} {
		for name := range live {
			if !strings.HasPrefix(name, "infergate_") {
				continue
			}
			base := name
			for _, suf := range []string{"_bucket", "_sum", "_count"} {
				if b, ok := strings.CutSuffix(name, suf); ok && documented[b] {
					base = b
				}
			}
			if !documented[base] {
				t.Errorf("docs/metrics.md does not list %s", base)
			}
		}
	}
}

// TestRateLimitHeadersAcrossReplicas: a per-minute limit shared by two
// Tier 2 replicas through Redis answers, on every response of either
// replica, a reset within the minute, remaining requests counting down,
// and on the refusals a Retry-After of at most 60 seconds.
func TestRateLimitHeadersAcrossReplicas(t *testing.T) {
	s := startObsStack(t)
	var remaining []string
	refused := 0
	for i := range 6 {
		resp, b := s.post(t, i%2, s.limitedKey, chatBody(obsModel, false, 4))
		h := resp.Header
		reset, err := time.ParseDuration(h.Get("x-ratelimit-reset-requests"))
		if err != nil || reset <= 0 || reset > time.Minute {
			t.Errorf("request %d (replica %d): x-ratelimit-reset-requests = %q, want in (0, 60s]", i, i%2, h.Get("x-ratelimit-reset-requests"))
		}
		if h.Get("x-ratelimit-limit-requests") != "3" {
			t.Errorf("request %d: x-ratelimit-limit-requests = %q", i, h.Get("x-ratelimit-limit-requests"))
		}
		remaining = append(remaining, h.Get("x-ratelimit-remaining-requests"))
		switch resp.StatusCode {
		case http.StatusOK:
			if h.Get("Retry-After") != "" {
				t.Errorf("request %d: Retry-After on a 200", i)
			}
		case http.StatusTooManyRequests:
			refused++
			ra, err := strconv.Atoi(h.Get("Retry-After"))
			if err != nil || ra < 1 || ra > 60 {
				t.Errorf("request %d (replica %d): Retry-After = %q, want 1..60", i, i%2, h.Get("Retry-After"))
			}
			if !strings.Contains(string(b), `"rate_limit_exceeded"`) || !strings.Contains(string(b), "3 requests per minute") {
				t.Errorf("request %d: refusal body %s", i, b)
			}
		default:
			t.Fatalf("request %d: %s %s", i, resp.Status, b)
		}
	}
	if got := strings.Join(remaining, ","); got != "2,1,0,0,0,0" || refused != 3 {
		t.Errorf("remaining-requests = %s with %d refused, want 2,1,0,0,0,0 and 3", got, refused)
	}
}
