// Package terraform holds no Go code: its test parses the Terraform under
// deploy/terraform offline (no providers, no `terraform init`) and checks
// what `terraform validate` would need providers for, as far as HCL alone
// allows: every file parses, the module's interface (required variables and
// outputs) is what the docs promise, every example root passes each
// required variable, and every var., local., module., data. and resource
// reference names something declared.
package terraform

import (
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"testing"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hclparse"
	"github.com/hashicorp/hcl/v2/hclsyntax"
)

const modulePath = "modules/tier2-region"

// The module's interface. Changing it is a breaking change for users: update
// docs/deploy-aws.md and the examples along with these lists.
var (
	wantRequiredVars = []string{
		"admin_token_secret_arn",
		"certificate_arn",
		"consul_address",
		"image",
		"name",
		"private_subnet_ids",
		"public_subnet_ids",
		"redis_auth_token_secret_arn",
		"region",
		"vpc_id",
	}
	wantOutputs = []string{
		"admin_url",
		"api_url",
		"config_yaml",
		"ecs_cluster_name",
		"endpoint_dns",
		"execution_role_arn",
		"lb_arn",
		"lb_zone_id",
		"log_group_name",
		"redis_endpoint",
		"redis_replication_group_id",
		"service_name",
		"task_definition_arn",
		"task_role_arn",
		"task_security_group_id",
	}
	wantExamples = []string{"eu-west-1", "us-east-1"}
)

// Arguments of a module block that are not the module's variables.
var moduleMetaArgs = map[string]bool{
	"source": true, "version": true, "providers": true, "count": true,
	"for_each": true, "depends_on": true,
}

// dir is one parsed Terraform configuration directory.
type dir struct {
	path      string
	files     map[string]*hclsyntax.Body
	variables map[string]*hclsyntax.Block
	outputs   map[string]*hclsyntax.Block
	locals    map[string]bool
	resources map[string]bool // "aws_lb.this"
	data      map[string]bool // "aws_partition.current"
	modules   map[string]*hclsyntax.Block
	providers map[string]string // required_providers name -> version
	tfVersion string
}

func parseDir(t *testing.T, path string) *dir {
	t.Helper()
	matches, err := filepath.Glob(filepath.Join(path, "*.tf"))
	if err != nil {
		t.Fatal(err)
	}
	if len(matches) == 0 {
		t.Fatalf("%s: no .tf files", path)
	}
	d := &dir{
		path: path, files: map[string]*hclsyntax.Body{},
		variables: map[string]*hclsyntax.Block{}, outputs: map[string]*hclsyntax.Block{},
		locals: map[string]bool{}, resources: map[string]bool{}, data: map[string]bool{},
		modules: map[string]*hclsyntax.Block{}, providers: map[string]string{},
	}
	p := hclparse.NewParser()
	for _, m := range matches {
		f, diags := p.ParseHCLFile(m)
		if diags.HasErrors() {
			t.Fatalf("%s: %s", m, diags.Error())
		}
		body := f.Body.(*hclsyntax.Body)
		d.files[m] = body
		for _, b := range body.Blocks {
			switch b.Type {
			case "variable":
				d.variables[b.Labels[0]] = b
			case "output":
				d.outputs[b.Labels[0]] = b
			case "locals":
				for name := range b.Body.Attributes {
					if d.locals[name] {
						t.Errorf("%s: local %q defined twice", m, name)
					}
					d.locals[name] = true
				}
			case "resource":
				d.resources[b.Labels[0]+"."+b.Labels[1]] = true
			case "data":
				d.data[b.Labels[0]+"."+b.Labels[1]] = true
			case "module":
				d.modules[b.Labels[0]] = b
			case "terraform":
				if a, ok := b.Body.Attributes["required_version"]; ok {
					d.tfVersion = stringValue(t, a.Expr)
				}
				for _, rb := range b.Body.Blocks {
					if rb.Type != "required_providers" {
						continue
					}
					for name, a := range rb.Body.Attributes {
						v, diags := a.Expr.Value(nil)
						if diags.HasErrors() {
							t.Fatalf("%s: required_providers.%s: %s", m, name, diags.Error())
						}
						if !v.Type().IsObjectType() || !v.Type().HasAttribute("version") {
							t.Errorf("%s: provider %s has no version constraint", m, name)
							continue
						}
						d.providers[name] = v.GetAttr("version").AsString()
					}
				}
			}
		}
	}
	return d
}

func stringValue(t *testing.T, e hcl.Expression) string {
	t.Helper()
	v, diags := e.Value(nil)
	if diags.HasErrors() {
		t.Fatalf("not a literal: %s", diags.Error())
	}
	return v.AsString()
}

func (d *dir) requiredVars() []string {
	var out []string
	for name, b := range d.variables {
		if _, hasDefault := b.Body.Attributes["default"]; !hasDefault {
			out = append(out, name)
		}
	}
	sort.Strings(out)
	return out
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func TestAllFilesParse(t *testing.T) {
	p := hclparse.NewParser()
	n := 0
	err := filepath.WalkDir(".", func(path string, de os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if de.IsDir() && strings.HasPrefix(de.Name(), ".terraform") {
			return filepath.SkipDir
		}
		if strings.HasSuffix(path, ".tf") || strings.HasSuffix(path, ".tfvars.example") || strings.HasSuffix(path, ".tflint.hcl") {
			n++
			if _, diags := p.ParseHCLFile(path); diags.HasErrors() {
				t.Errorf("%s: %s", path, diags.Error())
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if n < 10 {
		t.Fatalf("found only %d Terraform files", n)
	}
}

func TestModuleInterface(t *testing.T) {
	m := parseDir(t, modulePath)
	if got := m.requiredVars(); !reflect.DeepEqual(got, wantRequiredVars) {
		t.Errorf("required variables (no default):\n got %v\nwant %v", got, wantRequiredVars)
	}
	if got := sortedKeys(m.outputs); !reflect.DeepEqual(got, wantOutputs) {
		t.Errorf("outputs:\n got %v\nwant %v", got, wantOutputs)
	}
	for name, b := range m.variables {
		for _, attr := range []string{"description", "type"} {
			if _, ok := b.Body.Attributes[attr]; !ok {
				t.Errorf("variable %q has no %s", name, attr)
			}
		}
	}
	for name, b := range m.outputs {
		if _, ok := b.Body.Attributes["description"]; !ok {
			t.Errorf("output %q has no description", name)
		}
	}
	if m.providers["aws"] == "" {
		t.Error("module does not pin the aws provider in required_providers")
	}
	if m.tfVersion == "" {
		t.Error("module has no required_version")
	}
}

func TestExamplesPassRequiredVariables(t *testing.T) {
	m := parseDir(t, modulePath)
	required := m.requiredVars()
	entries, err := os.ReadDir("examples")
	if err != nil {
		t.Fatal(err)
	}
	var examples []string
	for _, e := range entries {
		if e.IsDir() {
			examples = append(examples, e.Name())
		}
	}
	if !reflect.DeepEqual(examples, wantExamples) {
		t.Errorf("examples = %v, want %v", examples, wantExamples)
	}
	for _, name := range examples {
		t.Run(name, func(t *testing.T) {
			ex := parseDir(t, filepath.Join("examples", name))
			if ex.providers["aws"] != m.providers["aws"] {
				t.Errorf("aws provider constraint %q, module has %q", ex.providers["aws"], m.providers["aws"])
			}
			if ex.tfVersion == "" {
				t.Error("no required_version")
			}
			var calls int
			for label, b := range ex.modules {
				src := stringValue(t, b.Body.Attributes["source"].Expr)
				if filepath.Clean(filepath.Join(ex.path, src)) != filepath.Clean(modulePath) {
					continue
				}
				calls++
				for _, v := range required {
					if _, ok := b.Body.Attributes[v]; !ok {
						t.Errorf("module %q does not pass required variable %q", label, v)
					}
				}
				for arg := range b.Body.Attributes {
					if !moduleMetaArgs[arg] && m.variables[arg] == nil {
						t.Errorf("module %q passes %q, which the module does not declare", label, arg)
					}
				}
				// The region argument must match the provider's region.
				if r, ok := b.Body.Attributes["region"]; ok && stringValue(t, r.Expr) != name {
					t.Errorf("module %q region = %q in example %s", label, stringValue(t, r.Expr), name)
				}
			}
			if calls == 0 {
				t.Fatalf("no module block uses %s", modulePath)
			}
			if _, err := os.Stat(filepath.Join(ex.path, "terraform.tfvars.example")); err != nil {
				t.Error(err)
			}
		})
	}
}

// TestReferences checks every var., local., data., module. and resource
// reference against the declarations of its directory (and module outputs
// against the called module), which is most of what `terraform validate`
// catches without provider schemas.
func TestReferences(t *testing.T) {
	m := parseDir(t, modulePath)
	dirs := []*dir{m}
	entries, _ := os.ReadDir("examples")
	for _, e := range entries {
		if e.IsDir() {
			dirs = append(dirs, parseDir(t, filepath.Join("examples", e.Name())))
		}
	}
	for _, d := range dirs {
		used := map[string]bool{}
		for file, body := range d.files {
			diags := hclsyntax.VisitAll(body, func(n hclsyntax.Node) hcl.Diagnostics {
				e, ok := n.(*hclsyntax.ScopeTraversalExpr)
				if !ok {
					return nil
				}
				tr := e.Traversal
				root := tr.RootName()
				attr := func(i int) string {
					if i < len(tr) {
						if a, ok := tr[i].(hcl.TraverseAttr); ok {
							return a.Name
						}
					}
					return ""
				}
				pos := e.SrcRange.String()
				switch {
				case root == "var":
					used[attr(1)] = true
					if d.variables[attr(1)] == nil {
						t.Errorf("%s: undeclared variable var.%s", pos, attr(1))
					}
				case root == "local":
					if !d.locals[attr(1)] {
						t.Errorf("%s: undeclared local.%s", pos, attr(1))
					}
				case root == "data":
					if !d.data[attr(1)+"."+attr(2)] {
						t.Errorf("%s: undeclared data.%s.%s", pos, attr(1), attr(2))
					}
				case root == "module":
					mb := d.modules[attr(1)]
					if mb == nil {
						t.Errorf("%s: undeclared module.%s", pos, attr(1))
						break
					}
					src := stringValue(t, mb.Body.Attributes["source"].Expr)
					if filepath.Clean(filepath.Join(d.path, src)) == filepath.Clean(modulePath) && m.outputs[attr(2)] == nil {
						t.Errorf("%s: module.%s has no output %q", pos, attr(1), attr(2))
					}
				case strings.HasPrefix(root, "aws_"):
					if !d.resources[root+"."+attr(1)] {
						t.Errorf("%s: undeclared resource %s.%s", pos, root, attr(1))
					}
				}
				return nil
			})
			if diags.HasErrors() {
				t.Errorf("%s: %s", file, diags.Error())
			}
		}
		for name := range d.variables {
			if !used[name] {
				t.Errorf("%s: variable %q is declared but never used", d.path, name)
			}
		}
	}
}

// TestTerraformPinnedToMPL guards the licence rule: the Terraform CLI the
// project builds stays at 1.5.7, the last MPL-2.0 release.
func TestTerraformPinnedToMPL(t *testing.T) {
	data, err := os.ReadFile(filepath.Join("..", "..", "scripts", "deploy-tools.sh"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(data), "\nTERRAFORM_VERSION=v1.5.7\n") {
		t.Error("scripts/deploy-tools.sh must pin TERRAFORM_VERSION=v1.5.7 (the last MPL-2.0 release)")
	}
}
