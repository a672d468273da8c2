package helm

import (
	"bytes"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"
)

// tier2YAMLStructs maps the struct types of Tier 2's configuration (read
// from tier2/server's source) to their YAML keys and each key's field type
// name.
func tier2YAMLStructs(t *testing.T) map[string]map[string]string {
	t.Helper()
	root := filepath.Join("..", "..")
	files := []string{
		filepath.Join(root, "tier2", "server", "config.go"),
		filepath.Join(root, "tier2", "discovery", "discovery.go"),
	}
	out := map[string]map[string]string{}
	fset := token.NewFileSet()
	for _, f := range files {
		if _, err := os.Stat(f); err != nil {
			t.Fatalf("Tier 2 config source not found: %v", err)
		}
		file, err := parser.ParseFile(fset, f, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		ast.Inspect(file, func(n ast.Node) bool {
			ts, ok := n.(*ast.TypeSpec)
			if !ok {
				return true
			}
			st, ok := ts.Type.(*ast.StructType)
			if !ok {
				return true
			}
			keys := map[string]string{}
			for _, field := range st.Fields.List {
				if field.Tag == nil || len(field.Names) == 0 {
					continue
				}
				tag := reflect.StructTag(strings.Trim(field.Tag.Value, "`")).Get("yaml")
				if name := strings.Split(tag, ",")[0]; name != "" && name != "-" {
					keys[name] = goTypeName(field.Type)
				}
			}
			out[ts.Name.Name] = keys
			return true
		})
	}
	if out["Config"] == nil {
		t.Fatal("no Config struct in tier2/server/config.go")
	}
	return out
}

func goTypeName(e ast.Expr) string {
	switch x := e.(type) {
	case *ast.Ident:
		return x.Name
	case *ast.StarExpr:
		return goTypeName(x.X)
	case *ast.ArrayType:
		return goTypeName(x.Elt)
	case *ast.SelectorExpr:
		return x.Sel.Name
	}
	return ""
}

func checkYAMLKeys(t *testing.T, structs map[string]map[string]string, typ string, v any, path string) {
	keys, ok := structs[typ]
	if !ok {
		return
	}
	switch x := v.(type) {
	case map[string]any:
		for k, val := range x {
			ft, known := keys[k]
			if !known {
				t.Errorf("%s.%s: Tier 2's %s has no YAML key %q", path, k, typ, k)
				continue
			}
			checkYAMLKeys(t, structs, ft, val, path+"."+k)
		}
	case []any:
		for _, el := range x {
			checkYAMLKeys(t, structs, typ, el, path+"[]")
		}
	}
}

// TestTier2ChartConfigKeys renders the Tier 2 ConfigMap (default values and
// each ci/*.yaml) and checks every key against Tier 2's configuration
// structs, so the chart cannot write a key `infergate tier2` would reject.
// Without helm it checks values.yaml's config as written.
func TestTier2ChartConfigKeys(t *testing.T) {
	structs := tier2YAMLStructs(t)
	chart := "infergate-tier2"
	var values map[string]any
	readYAML(t, filepath.Join(chart, "values.yaml"), &values)
	checkYAMLKeys(t, structs, "Config", values["config"], "values.config")

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
		checkYAMLKeys(t, structs, "Config", cfg, "tier2.yaml")
		if cfg["region"] == nil {
			t.Errorf("helm %v: no region in tier2.yaml", args)
		}
	}
}
