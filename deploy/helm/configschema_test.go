package helm

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// configTypos are values inside `config:` that infergate would refuse at
// start; the chart's schema (generated from the configuration types by
// deploy/tools/configdoc) must refuse them at install, naming the key.
var configTypos = map[string][]struct {
	set  string // a helm --set-json argument
	path string // what checkSchema reports
	name string // what helm's message must name
}{
	"infergate-tier1": {
		{`config.scrape={"intervall":"1s"}`, ".config.scrape.intervall", "intervall"},
		{`config.pools=[{"name":"a","modle":"m"}]`, ".config.pools[].modle", "modle"},
		{`config.retry={"max_attempts":0}`, ".config.retry.max_attempts", "max_attempts"},
		{`config.poolz=[]`, ".config.poolz", "poolz"},
	},
	"infergate-tier2": {
		{`config.routing={"breaker":{"open_timeot":"5s"}}`, ".config.routing.breaker.open_timeot", "open_timeot"},
		{`config.tenants=[{"id":"a","limts":{"rpm":1}}]`, ".config.tenants[].limts", "limts"},
		{`config.routing={"failover_budget":"soon"}`, ".config.routing.failover_budget", "failover_budget"},
	},
}

// TestChartConfigSchema: each chart's values.schema.json checks the keys
// inside config:, so a typo fails `helm install`/`template`/`lint` rather
// than the pod's start. Checked with the schema subset this package reads
// (always) and with helm itself (when installed; under CI it must be).
func TestChartConfigSchema(t *testing.T) {
	for _, chart := range charts {
		data, err := os.ReadFile(filepath.Join(chart, "values.schema.json"))
		if err != nil {
			t.Fatal(err)
		}
		var schema map[string]any
		if err := json.Unmarshal(data, &schema); err != nil {
			t.Fatal(err)
		}
		for _, tc := range configTypos[chart] {
			var values map[string]any
			readYAML(t, filepath.Join(chart, "values.yaml"), &values)
			key, val, _ := strings.Cut(tc.set, "=")
			var v any
			if err := json.Unmarshal([]byte(val), &v); err != nil {
				t.Fatal(err)
			}
			cfg := values["config"].(map[string]any)
			cfg[strings.TrimPrefix(key, "config.")] = jsonInts(v)
			problems := strings.Join(checkSchemaDeep(schema, values, ""), "\n")
			if !strings.Contains(problems, tc.path) {
				t.Errorf("%s: %s: the schema does not refuse %s:\n%s", chart, tc.set, tc.path, problems)
			}
		}
	}

	if !findTool("helm") {
		if os.Getenv("CI") != "" {
			t.Fatal("helm not installed (run scripts/deploy-tools.sh)")
		}
		t.Skip("helm not installed (run scripts/deploy-tools.sh)")
	}
	helm := filepath.Join(toolsBin(), "helm")
	if _, err := os.Stat(helm); err != nil {
		helm = "helm"
	}
	for _, chart := range charts {
		if out, err := exec.Command(helm, "template", "t", chart).CombinedOutput(); err != nil {
			t.Fatalf("%s: the default values fail: %v\n%s", chart, err, out)
		}
		for _, tc := range configTypos[chart] {
			out, err := exec.Command(helm, "template", "t", chart, "--set-json", tc.set).CombinedOutput()
			if err == nil || !strings.Contains(string(out), tc.name) {
				t.Errorf("%s --set-json %s: err %v, want a schema error naming %q:\n%s", chart, tc.set, err, tc.name, out)
			}
		}
	}
}

// TestChartConfigSchemaAccepts: the generated config schema accepts the
// charts' own values (values.yaml, ci/*.yaml) and the complete example
// files (examples/tier1.yaml, examples/tier2.yaml) as config:, so it
// refuses typos without refusing a key infergate reads. Helm checks the
// examples too when installed.
func TestChartConfigSchemaAccepts(t *testing.T) {
	examples := map[string]string{
		"infergate-tier1": "../../examples/tier1.yaml",
		"infergate-tier2": "../../examples/tier2.yaml",
	}
	valueFiles := map[string]string{}
	for _, chart := range charts {
		data, err := os.ReadFile(filepath.Join(chart, "values.schema.json"))
		if err != nil {
			t.Fatal(err)
		}
		var schema map[string]any
		if err := json.Unmarshal(data, &schema); err != nil {
			t.Fatal(err)
		}
		files, _ := filepath.Glob(filepath.Join(chart, "ci", "*.yaml"))
		files = append([]string{filepath.Join(chart, "values.yaml")}, files...)
		for _, f := range files {
			var v map[string]any
			readYAML(t, f, &v)
			for _, p := range checkSchemaDeep(schema, v, "") {
				t.Errorf("%s: %s", f, p)
			}
		}
		var values map[string]any
		readYAML(t, filepath.Join(chart, "values.yaml"), &values)
		var example map[string]any
		readYAML(t, examples[chart], &example)
		if len(example) == 0 {
			t.Fatalf("%s is empty", examples[chart])
		}
		values["config"] = example
		for _, p := range checkSchemaDeep(schema, values, "") {
			t.Errorf("%s as %s's config: %s", examples[chart], chart, p)
		}
		// The example as a values file of its own, for helm below.
		f := filepath.Join(t.TempDir(), "values.yaml")
		if err := os.WriteFile(f, []byte("config:\n"+indent(t, examples[chart])), 0o644); err != nil {
			t.Fatal(err)
		}
		valueFiles[chart] = f
	}

	if !findTool("helm") {
		t.Skip("helm not installed (run scripts/deploy-tools.sh)")
	}
	helm := filepath.Join(toolsBin(), "helm")
	if _, err := os.Stat(helm); err != nil {
		helm = "helm"
	}
	for _, chart := range charts {
		if out, err := exec.Command(helm, "lint", "--strict", chart, "-f", valueFiles[chart]).CombinedOutput(); err != nil {
			t.Errorf("%s with %s as config: %v\n%s", chart, examples[chart], err, out)
		}
	}
}

// indent returns a file's lines indented two spaces, to nest it under a key.
func indent(t *testing.T, path string) string {
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for _, line := range strings.Split(strings.TrimRight(string(data), "\n"), "\n") {
		if line != "" {
			b.WriteString("  ")
		}
		b.WriteString(line + "\n")
	}
	return b.String()
}

// jsonInts turns whole float64s from encoding/json into ints, as YAML
// values decode, so checkSchema's integer type matches.
func jsonInts(v any) any {
	switch x := v.(type) {
	case float64:
		if x == float64(int(x)) {
			return int(x)
		}
	case map[string]any:
		for k, e := range x {
			x[k] = jsonInts(e)
		}
	case []any:
		for i, e := range x {
			x[i] = jsonInts(e)
		}
	}
	return v
}

// checkSchemaDeep is checkSchema plus what the config schema uses beyond
// it: items of arrays, additionalProperties schemas of maps, minimum and
// pattern.
func checkSchemaDeep(s map[string]any, v any, path string) []string {
	problems := checkSchema(s, v, path)
	if len(problems) > 0 {
		return problems
	}
	if min, ok := s["minimum"].(float64); ok {
		switch n := v.(type) {
		case int:
			if float64(n) < min {
				problems = append(problems, path+": below the minimum")
			}
		case float64:
			if n < min {
				problems = append(problems, path+": below the minimum")
			}
		}
	}
	if _, ok := s["pattern"].(string); ok {
		if str, ok := v.(string); ok && !durationLike(str) {
			problems = append(problems, path+": does not match the pattern")
		}
	}
	switch x := v.(type) {
	case []any:
		if items, ok := s["items"].(map[string]any); ok {
			for _, e := range x {
				problems = append(problems, checkSchemaDeep(items, e, path+"[]")...)
			}
		}
	case map[string]any:
		props, _ := s["properties"].(map[string]any)
		for k, e := range x {
			if ps, ok := props[k].(map[string]any); ok {
				// checkSchema checked this level; go deeper.
				for _, p := range checkSchemaDeep(ps, e, path+"."+k) {
					if !strings.Contains(strings.Join(problems, "\n"), p) {
						problems = append(problems, p)
					}
				}
			} else if ap, ok := s["additionalProperties"].(map[string]any); ok {
				problems = append(problems, checkSchemaDeep(ap, e, path+"."+k)...)
			}
		}
	}
	return problems
}

// durationLike is the schema's duration pattern, for the test's reader
// (which has no regexp engine of JSON Schema's flavour to hand).
func durationLike(s string) bool {
	if s == "0" {
		return true
	}
	if s == "" {
		return false
	}
	for s != "" {
		i := 0
		if s[0] == '-' {
			i = 1
		}
		j := i
		for j < len(s) && (s[j] >= '0' && s[j] <= '9' || s[j] == '.') {
			j++
		}
		if j == i {
			return false
		}
		k := j
		for k < len(s) && (s[k] < '0' || s[k] > '9') && s[k] != '.' {
			k++
		}
		switch s[j:k] {
		case "ns", "us", "µs", "ms", "s", "m", "h":
		default:
			return false
		}
		s = s[k:]
	}
	return true
}
