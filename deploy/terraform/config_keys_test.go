package terraform

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hclsyntax"
)

// yamlStructs maps each struct type declared in the Go files to its YAML
// keys and, for each key, the field's type name ("" when not a local struct).
func yamlStructs(t *testing.T, files ...string) map[string]map[string]string {
	t.Helper()
	out := map[string]map[string]string{}
	fset := token.NewFileSet()
	for _, f := range files {
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
				name := strings.Split(tag, ",")[0]
				if name == "" || name == "-" {
					continue
				}
				keys[name] = typeName(field.Type)
			}
			out[ts.Name.Name] = keys
			return true
		})
	}
	return out
}

func typeName(e ast.Expr) string {
	switch x := e.(type) {
	case *ast.Ident:
		return x.Name
	case *ast.StarExpr:
		return typeName(x.X)
	case *ast.ArrayType:
		return typeName(x.Elt)
	case *ast.SelectorExpr:
		return x.Sel.Name
	}
	return ""
}

// TestModuleConfigMatchesTier2 checks the keys of the configuration the
// module generates (locals.base_config) against the YAML tags of Tier 2's
// configuration structs, read from the Go source, so the module cannot
// write a key `infergate tier2` would reject.
func TestModuleConfigMatchesTier2(t *testing.T) {
	root := filepath.Join("..", "..")
	main := filepath.Join(root, "tier2", "server", "config.go")
	disc := filepath.Join(root, "tier2", "discovery", "discovery.go")
	for _, f := range []string{main, disc} {
		if _, err := os.Stat(f); err != nil {
			t.Fatalf("Tier 2 config source not found: %v", err)
		}
	}
	structs := yamlStructs(t, main, disc)
	if structs["Config"] == nil {
		t.Fatal("no Config struct in tier2/server/config.go")
	}
	m := parseDir(t, modulePath)
	var base hclsyntax.Expression
	for _, body := range m.files {
		for _, b := range body.Blocks {
			if b.Type == "locals" {
				if a, ok := b.Body.Attributes["base_config"]; ok {
					base = a.Expr
				}
			}
		}
	}
	if base == nil {
		t.Fatal("module has no locals.base_config")
	}
	checkKeys(t, structs, "Config", base, "base_config")
}

// checkKeys walks an HCL object expression (through merge() calls,
// conditionals and for expressions) and checks every literal key against
// the struct's YAML keys.
func checkKeys(t *testing.T, structs map[string]map[string]string, typ string, e hclsyntax.Expression, path string) {
	keys, ok := structs[typ]
	if !ok {
		return // not a struct we know (string, list of strings, ...)
	}
	switch x := e.(type) {
	case *hclsyntax.ObjectConsExpr:
		for _, item := range x.Items {
			k, diags := item.KeyExpr.Value(&hcl.EvalContext{})
			if diags.HasErrors() || k.Type().FriendlyName() != "string" {
				t.Errorf("%s: key is not a literal", path)
				continue
			}
			name := k.AsString()
			fieldType, known := keys[name]
			if !known {
				t.Errorf("%s.%s: Tier 2's %s has no YAML key %q", path, name, typ, name)
				continue
			}
			checkKeys(t, structs, fieldType, item.ValueExpr, path+"."+name)
		}
	case *hclsyntax.FunctionCallExpr:
		for _, arg := range x.Args {
			checkKeys(t, structs, typ, arg, path)
		}
	case *hclsyntax.ConditionalExpr:
		checkKeys(t, structs, typ, x.TrueResult, path)
		checkKeys(t, structs, typ, x.FalseResult, path)
	case *hclsyntax.ForExpr:
		checkKeys(t, structs, typ, x.ValExpr, path+"[]")
	case *hclsyntax.TupleConsExpr:
		for _, el := range x.Exprs {
			checkKeys(t, structs, typ, el, path+"[]")
		}
	}
}
