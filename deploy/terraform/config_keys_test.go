package terraform

import (
	"reflect"
	"testing"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hclsyntax"

	"github.com/infergate/infergate/deploy/configkeys"
	"github.com/infergate/infergate/tier2/server"
)

// TestModuleConfigMatchesTier2 checks the keys of the configuration the
// module generates (locals.base_config) against the YAML keys of Tier 2's
// configuration type (tier2/server.Config, by reflection), so the module
// cannot write a key `infergate tier2` would reject.
func TestModuleConfigMatchesTier2(t *testing.T) {
	keys := configkeys.Of(reflect.TypeFor[server.Config]())
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
	checkKeys(t, keys, base, "base_config")
}

// checkKeys walks an HCL object expression (through merge() calls,
// conditionals and for expressions) and checks every literal key against
// the struct's YAML keys.
func checkKeys(t *testing.T, n *configkeys.Node, e hclsyntax.Expression, path string) {
	if !n.Checked() {
		return // not a struct (string, list of strings, map, ...)
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
			sub, known := n.Field(name)
			if !known {
				t.Errorf("%s.%s: Tier 2's configuration has no YAML key %q", path, name, name)
				continue
			}
			checkKeys(t, sub, item.ValueExpr, path+"."+name)
		}
	case *hclsyntax.FunctionCallExpr:
		for _, arg := range x.Args {
			checkKeys(t, n, arg, path)
		}
	case *hclsyntax.ConditionalExpr:
		checkKeys(t, n, x.TrueResult, path)
		checkKeys(t, n, x.FalseResult, path)
	case *hclsyntax.ForExpr:
		checkKeys(t, n, x.ValExpr, path+"[]")
	case *hclsyntax.TupleConsExpr:
		for _, el := range x.Exprs {
			checkKeys(t, n, el, path+"[]")
		}
	}
}
