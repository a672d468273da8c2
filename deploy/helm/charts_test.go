package helm

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	"gopkg.in/yaml.v3"
)

var charts = []string{"infergate-tier1", "infergate-tier2"}

// deployTools are what scripts/deploy-check.sh runs.
var deployTools = []string{"helm", "kubeconform", "terraform", "tflint"}

// toolsBin is where scripts/deploy-tools.sh caches the tools.
func toolsBin() string {
	if d := os.Getenv("TOOLS_BIN"); d != "" {
		return d
	}
	home, _ := os.UserHomeDir()
	return filepath.Join(home, ".cache", "infergate", "bin")
}

func findTool(name string) bool {
	if fi, err := os.Stat(filepath.Join(toolsBin(), name)); err == nil && !fi.IsDir() {
		return true
	}
	_, err := exec.LookPath(name)
	return err == nil
}

// TestDeployCheck runs scripts/deploy-check.sh (helm lint, helm template |
// kubeconform, terraform fmt, tflint). Without the tools it skips, except
// under CI, where a missing tool is a failure: `make tools` builds them.
func TestDeployCheck(t *testing.T) {
	if testing.Short() {
		t.Skip("deploy checks are slow; skipped with -short")
	}
	var missing []string
	for _, tool := range deployTools {
		if !findTool(tool) {
			missing = append(missing, tool)
		}
	}
	if len(missing) > 0 {
		msg := "deploy tools missing: " + strings.Join(missing, ", ") + " (run scripts/deploy-tools.sh)"
		if os.Getenv("CI") != "" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", filepath.Join("..", "..", "scripts", "deploy-check.sh"))
	cmd.Env = append(os.Environ(), "TOOLS_BIN="+toolsBin())
	var out bytes.Buffer
	cmd.Stdout = &out
	cmd.Stderr = &out
	err := cmd.Run()
	if err != nil {
		t.Fatalf("scripts/deploy-check.sh: %v\n%s", err, out.String())
	}
	t.Logf("%s", out.String())
}

func TestChartMetadata(t *testing.T) {
	for _, chart := range charts {
		var meta struct {
			APIVersion string `yaml:"apiVersion"`
			Name       string `yaml:"name"`
			Version    string `yaml:"version"`
			AppVersion string `yaml:"appVersion"`
			Type       string `yaml:"type"`
		}
		readYAML(t, filepath.Join(chart, "Chart.yaml"), &meta)
		if meta.APIVersion != "v2" || meta.Name != chart || meta.Version == "" || meta.AppVersion == "" || meta.Type != "application" {
			t.Errorf("%s/Chart.yaml: %+v", chart, meta)
		}
		var values map[string]any
		readYAML(t, filepath.Join(chart, "values.yaml"), &values)
		cfg, ok := values["config"].(map[string]any)
		if !ok || len(cfg) == 0 {
			t.Errorf("%s: values.config must be a non-empty YAML object (the passed-through config file)", chart)
		}
		for _, key := range []string{"image", "resources", "securityContext", "podSecurityContext", "serviceMonitor", "dashboards", "podDisruptionBudget"} {
			if _, ok := values[key]; !ok {
				t.Errorf("%s: values.yaml has no %s", chart, key)
			}
		}
		sc, _ := values["securityContext"].(map[string]any)
		if sc["readOnlyRootFilesystem"] != true || sc["runAsNonRoot"] != true || sc["allowPrivilegeEscalation"] != false {
			t.Errorf("%s: securityContext must be non-root, read-only root, no privilege escalation: %v", chart, sc)
		}
		ci, _ := filepath.Glob(filepath.Join(chart, "ci", "*.yaml"))
		if len(ci) == 0 {
			t.Errorf("%s: no ci/*.yaml value sets", chart)
		}
		for _, f := range ci {
			var v map[string]any
			readYAML(t, f, &v)
		}
	}
	var t1 map[string]any
	readYAML(t, filepath.Join("infergate-tier1", "values.yaml"), &t1)
	cfg := t1["config"].(map[string]any)
	if _, ok := cfg["scheduler"]; !ok {
		t.Error("infergate-tier1: values.config has no scheduler (picker) profile")
	}
}

func readYAML(t *testing.T, path string, v any) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(data, v); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}

// metricRE finds metric names with a label selector in PromQL; infergateRE
// finds infergate metric names wherever they stand.
var (
	metricRE    = regexp.MustCompile(`([a-zA-Z_:][a-zA-Z0-9_:]*)\s*\{`)
	infergateRE = regexp.MustCompile(`\b(infergate_[a-zA-Z0-9_:]*)`)
)

type grafanaPanel struct {
	ID      int            `json:"id"`
	Type    string         `json:"type"`
	Title   string         `json:"title"`
	GridPos map[string]int `json:"gridPos"`
	Targets []struct {
		Expr  string `json:"expr"`
		RefID string `json:"refId"`
	} `json:"targets"`
}

func TestDashboards(t *testing.T) {
	// Metrics Tier 1 and Tier 2 export (each dashboard must use them).
	wantMetrics := map[string][]string{
		"infergate-tier1": {
			"infergate_tier1_requests_total", "infergate_tier1_ttft_seconds_bucket", "infergate_tier1_request_duration_seconds_bucket",
			"infergate_tier1_chosen_pod_score_sum", "infergate_tier1_retries_total", "infergate_tier1_shed_total",
			"infergate_tier1_queue_length", "infergate_tier1_pod_ready", "infergate_tier1_pod_in_flight",
			"infergate_tier1_scrape_age_seconds", "infergate_tier1_pod_queue_depth", "infergate_tier1_pod_kv_cache_usage",
		},
		"infergate-tier2": {
			"infergate_tier2_route_decisions_total", "infergate_tier2_requests_total", "infergate_tier2_breaker_state",
			"infergate_tier2_attempts_total", "infergate_tier2_cluster_utilization",
			"infergate_tier2_ratelimited_total", "infergate_tier2_cost_total", "infergate_tier2_tokens_total",
			"infergate_tier2_request_duration_seconds_bucket", "infergate_tier2_ttft_seconds_bucket",
		},
	}
	uids := map[string]string{}
	for _, chart := range charts {
		files, _ := filepath.Glob(filepath.Join(chart, "dashboards", "*.json"))
		if len(files) == 0 {
			t.Errorf("%s: no dashboards", chart)
		}
		seen := map[string]bool{}
		for _, f := range files {
			data, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			var d struct {
				UID        string         `json:"uid"`
				Title      string         `json:"title"`
				Schema     int            `json:"schemaVersion"`
				Panels     []grafanaPanel `json:"panels"`
				Templating struct {
					List []struct {
						Name string `json:"name"`
					} `json:"list"`
				} `json:"templating"`
			}
			if err := json.Unmarshal(data, &d); err != nil {
				t.Errorf("%s: %v", f, err)
				continue
			}
			if d.UID == "" || d.Title == "" || d.Schema == 0 || len(d.Panels) == 0 {
				t.Errorf("%s: uid %q title %q schemaVersion %d panels %d", f, d.UID, d.Title, d.Schema, len(d.Panels))
			}
			if other, dup := uids[d.UID]; dup {
				t.Errorf("%s: uid %q also used by %s", f, d.UID, other)
			}
			uids[d.UID] = f
			vars := map[string]bool{}
			for _, v := range d.Templating.List {
				vars[v.Name] = true
			}
			if !vars["datasource"] {
				t.Errorf("%s: no datasource variable", f)
			}
			ids := map[int]bool{}
			for _, p := range d.Panels {
				if ids[p.ID] {
					t.Errorf("%s: duplicate panel id %d", f, p.ID)
				}
				ids[p.ID] = true
				if p.GridPos["w"] == 0 || p.GridPos["h"] == 0 {
					t.Errorf("%s: panel %q has no size", f, p.Title)
				}
				if p.Type != "row" && len(p.Targets) == 0 {
					t.Errorf("%s: panel %q has no query", f, p.Title)
				}
				for _, tg := range p.Targets {
					for _, m := range infergateRE.FindAllStringSubmatch(tg.Expr, -1) {
						seen[m[1]] = true
					}
					for _, m := range metricRE.FindAllStringSubmatch(tg.Expr, -1) {
						name := m[1]
						if !strings.HasPrefix(name, "infergate_") {
							t.Errorf("%s: panel %q queries %q, not an infergate_ metric", f, p.Title, name)
						}
					}
					for _, v := range regexp.MustCompile(`\$([a-z_]+)`).FindAllStringSubmatch(tg.Expr, -1) {
						if !vars[v[1]] && !strings.HasPrefix(v[1], "__") {
							t.Errorf("%s: panel %q uses undefined variable $%s", f, p.Title, v[1])
						}
					}
				}
			}
		}
		var missing []string
		for _, m := range wantMetrics[chart] {
			if !seen[m] {
				missing = append(missing, m)
			}
		}
		sort.Strings(missing)
		if len(missing) > 0 {
			t.Errorf("%s dashboards never query %v", chart, missing)
		}
	}
}

// TestValuesSchema checks that values.schema.json (which Helm enforces on
// install, template and lint) accepts the chart's own values.yaml and every
// ci/*.yaml, so the two cannot drift apart even without helm installed.
func TestValuesSchema(t *testing.T) {
	for _, chart := range charts {
		data, err := os.ReadFile(filepath.Join(chart, "values.schema.json"))
		if err != nil {
			t.Fatal(err)
		}
		var schema map[string]any
		if err := json.Unmarshal(data, &schema); err != nil {
			t.Fatalf("%s/values.schema.json: %v", chart, err)
		}
		files, _ := filepath.Glob(filepath.Join(chart, "ci", "*.yaml"))
		files = append([]string{filepath.Join(chart, "values.yaml")}, files...)
		for _, f := range files {
			var v any
			readYAML(t, f, &v)
			for _, problem := range checkSchema(schema, v, "") {
				t.Errorf("%s: %s", f, problem)
			}
		}
		var bad any
		readYAML(t, filepath.Join(chart, "values.yaml"), &bad)
		bad.(map[string]any)["serviceMonitr"] = map[string]any{"enabled": true}
		if len(checkSchema(schema, bad, "")) == 0 {
			t.Errorf("%s: schema accepts an unknown top-level key", chart)
		}
	}
}

// checkSchema is a small JSON-schema subset: type, properties,
// additionalProperties false, enum.
func checkSchema(s map[string]any, v any, path string) []string {
	var problems []string
	if typ, ok := s["type"]; ok {
		var types []string
		switch tt := typ.(type) {
		case string:
			types = []string{tt}
		case []any:
			for _, x := range tt {
				types = append(types, x.(string))
			}
		}
		okType := false
		for _, want := range types {
			if jsonType(v, want) {
				okType = true
			}
		}
		if !okType {
			return []string{fmt.Sprintf("%s: %T is not %v", path, v, types)}
		}
	}
	if enum, ok := s["enum"].([]any); ok {
		found := false
		for _, e := range enum {
			if e == v {
				found = true
			}
		}
		if !found {
			problems = append(problems, fmt.Sprintf("%s: %v not in %v", path, v, enum))
		}
	}
	m, isMap := v.(map[string]any)
	props, _ := s["properties"].(map[string]any)
	if isMap && props != nil {
		for k, val := range m {
			ps, ok := props[k].(map[string]any)
			if !ok {
				if s["additionalProperties"] == false {
					problems = append(problems, fmt.Sprintf("%s.%s: not allowed by the schema", path, k))
				}
				continue
			}
			problems = append(problems, checkSchema(ps, val, path+"."+k)...)
		}
	}
	return problems
}

func jsonType(v any, want string) bool {
	switch want {
	case "object":
		_, ok := v.(map[string]any)
		return ok
	case "array":
		_, ok := v.([]any)
		return ok
	case "string":
		_, ok := v.(string)
		return ok
	case "boolean":
		_, ok := v.(bool)
		return ok
	case "integer":
		_, ok := v.(int)
		return ok
	case "number":
		switch v.(type) {
		case int, float64:
			return true
		}
	case "null":
		return v == nil
	}
	return false
}
