package helm

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"testing"

	"gopkg.in/yaml.v3"

	"github.com/infergate/infergate/deploy/configkeys"
	"github.com/infergate/infergate/tier2/server"
)

// checkYAMLKeys checks every key of the decoded YAML value v against the
// key tree n of the type infergate decodes it into.
func checkYAMLKeys(t *testing.T, n *configkeys.Node, v any, path string) {
	if !n.Checked() {
		return
	}
	switch x := v.(type) {
	case map[string]any:
		for k, val := range x {
			sub, known := n.Field(k)
			if !known {
				t.Errorf("%s.%s: Tier 2's configuration has no YAML key %q", path, k, k)
				continue
			}
			checkYAMLKeys(t, sub, val, path+"."+k)
		}
	case []any:
		for _, el := range x {
			checkYAMLKeys(t, n, el, path+"[]")
		}
	}
}

// TestTier2ChartConfigKeys renders the Tier 2 ConfigMap (default values and
// each ci/*.yaml) and checks every key against Tier 2's configuration
// type (tier2/server.Config, by reflection), so the chart cannot write a key `infergate tier2` would reject.
// Without helm it checks values.yaml's config as written.
func TestTier2ChartConfigKeys(t *testing.T) {
	keys := configkeys.Of(reflect.TypeFor[server.Config]())
	chart := "infergate-tier2"
	var values map[string]any
	readYAML(t, filepath.Join(chart, "values.yaml"), &values)
	checkYAMLKeys(t, keys, values["config"], "values.config")

	if !findTool("helm") {
		t.Log("helm not installed: rendered ConfigMaps not checked")
		return
	}
	helm := filepath.Join(toolsBin(), "helm")
	if _, err := os.Stat(helm); err != nil {
		helm = "helm"
	}
	sets := [][]string{nil}
	ci, _ := filepath.Glob(filepath.Join(chart, "ci", "*.yaml"))
	for _, f := range ci {
		sets = append(sets, []string{"-f", f})
	}
	for _, extra := range sets {
		args := append([]string{"template", "t", chart, "-s", "templates/configmap.yaml"}, extra...)
		out, err := exec.Command(helm, args...).CombinedOutput()
		if err != nil {
			t.Fatalf("helm %v: %v\n%s", args, err, out)
		}
		var cm struct {
			Data map[string]string `yaml:"data"`
		}
		if err := yaml.NewDecoder(bytes.NewReader(out)).Decode(&cm); err != nil {
			t.Fatal(err)
		}
		var cfg map[string]any
		if err := yaml.Unmarshal([]byte(cm.Data["tier2.yaml"]), &cfg); err != nil {
			t.Fatalf("helm %v: tier2.yaml: %v", args, err)
		}
		checkYAMLKeys(t, keys, cfg, "tier2.yaml")
		if cfg["region"] == nil {
			t.Errorf("helm %v: no region in tier2.yaml", args)
		}
	}
}
