package terraform

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hclsyntax"
	"github.com/zclconf/go-cty/cty"
	"github.com/zclconf/go-cty/cty/function"
	"github.com/zclconf/go-cty/cty/function/stdlib"
	ctyjson "github.com/zclconf/go-cty/cty/json"

	"github.com/infergate/infergate/deploy/configkeys"
	"github.com/infergate/infergate/internal/testpki"
	"github.com/infergate/infergate/shared/config"
	"github.com/infergate/infergate/shared/tlsfiles"
	"github.com/infergate/infergate/tier2/server"
)

// moduleEval evaluates the module's locals, variable validations and
// resource preconditions with HCL itself (the expression language
// Terraform uses, with its type unification of conditionals), given
// variable values, without providers. Functions are the cty standard
// library's, plus yamlencode (as JSON, which is YAML) and base64encode.
type moduleEval struct {
	t         *testing.T
	d         *dir
	locals    map[string]hclsyntax.Expression
	vals      map[string]cty.Value
	ctx       *hcl.EvalContext
	resolving map[string]bool
}

// Values for the module's required variables.
var requiredVarValues = map[string]cty.Value{
	"name":                        cty.StringVal("infergate"),
	"region":                      cty.StringVal("us-east-1"),
	"vpc_id":                      cty.StringVal("vpc-0123456789abcdef0"),
	"public_subnet_ids":           cty.ListVal([]cty.Value{cty.StringVal("subnet-a"), cty.StringVal("subnet-b")}),
	"private_subnet_ids":          cty.ListVal([]cty.Value{cty.StringVal("subnet-c"), cty.StringVal("subnet-d")}),
	"image":                       cty.StringVal("ghcr.io/infergate/infergate:test"),
	"certificate_arn":             cty.StringVal("arn:aws:acm:us-east-1:123456789012:certificate/abc"),
	"admin_token_secret_arn":      cty.StringVal("arn:aws:secretsmanager:us-east-1:123456789012:secret:infergate/admin-AbCdEf"),
	"redis_auth_token_secret_arn": cty.StringVal("arn:aws:secretsmanager:us-east-1:123456789012:secret:infergate/redis-AbCdEf"),
	"consul_address":              cty.StringVal("https://consul.example.internal:8501"),
}

func newModuleEval(t *testing.T, overrides map[string]cty.Value) *moduleEval {
	t.Helper()
	d := parseDir(t, modulePath)
	vars := map[string]cty.Value{}
	for name, b := range d.variables {
		if a, ok := b.Body.Attributes["default"]; ok {
			v, diags := a.Expr.Value(nil)
			if diags.HasErrors() {
				t.Fatalf("variable %s default: %s", name, diags.Error())
			}
			vars[name] = v
		} else if v, ok := requiredVarValues[name]; ok {
			vars[name] = v
		} else {
			t.Fatalf("no test value for required variable %s", name)
		}
	}
	for k, v := range overrides {
		if _, ok := vars[k]; !ok {
			t.Fatalf("override of undeclared variable %s", k)
		}
		vars[k] = v
	}
	m := &moduleEval{t: t, d: d, locals: map[string]hclsyntax.Expression{}, vals: map[string]cty.Value{}, resolving: map[string]bool{}}
	for _, body := range d.files {
		for _, b := range body.Blocks {
			if b.Type == "locals" {
				for name, a := range b.Body.Attributes {
					m.locals[name] = a.Expr
				}
			}
		}
	}
	str := cty.StringVal
	m.ctx = &hcl.EvalContext{
		Variables: map[string]cty.Value{
			"var": cty.ObjectVal(vars),
			// What the providers would know after apply.
			"aws_elasticache_replication_group": cty.ObjectVal(map[string]cty.Value{"this": cty.ObjectVal(map[string]cty.Value{
				"primary_endpoint_address":       str("master.redis.example"),
				"configuration_endpoint_address": str("config.redis.example"),
			})}),
			"aws_cloudwatch_log_group": cty.ObjectVal(map[string]cty.Value{"this": cty.ObjectVal(map[string]cty.Value{"name": str("/ecs/test")})}),
		},
		Functions: map[string]function.Function{
			"merge": stdlib.MergeFunc, "coalesce": stdlib.CoalesceFunc, "length": stdlib.LengthFunc,
			"concat": stdlib.ConcatFunc, "compact": stdlib.CompactFunc, "format": stdlib.FormatFunc,
			"join": stdlib.JoinFunc, "regexall": stdlib.RegexAllFunc, "substr": stdlib.SubstrFunc,
			"replace": stdlib.ReplaceFunc, "contains": stdlib.ContainsFunc,
			"yamlencode": function.New(&function.Spec{
				Params: []function.Parameter{{Name: "v", Type: cty.DynamicPseudoType, AllowNull: true}},
				Type:   function.StaticReturnType(cty.String),
				Impl: func(args []cty.Value, _ cty.Type) (cty.Value, error) {
					b, err := ctyjson.Marshal(args[0], args[0].Type())
					return cty.StringVal(string(b)), err
				},
			}),
			"base64encode": function.New(&function.Spec{
				Params: []function.Parameter{{Name: "s", Type: cty.String}},
				Type:   function.StaticReturnType(cty.String),
				Impl: func(args []cty.Value, _ cty.Type) (cty.Value, error) {
					return cty.StringVal(base64.StdEncoding.EncodeToString([]byte(args[0].AsString()))), nil
				},
			}),
		},
	}
	return m
}

// eval evaluates e after the locals it references.
func (m *moduleEval) eval(e hcl.Expression, what string) cty.Value {
	m.t.Helper()
	for _, tr := range e.Variables() {
		if tr.RootName() == "local" && len(tr) > 1 {
			if a, ok := tr[1].(hcl.TraverseAttr); ok {
				m.local(a.Name)
			}
		}
	}
	m.ctx.Variables["local"] = cty.ObjectVal(m.vals)
	v, diags := e.Value(m.ctx)
	if diags.HasErrors() {
		m.t.Fatalf("%s: %s", what, diags.Error())
	}
	return v
}

func (m *moduleEval) local(name string) cty.Value {
	m.t.Helper()
	if v, ok := m.vals[name]; ok {
		return v
	}
	e, ok := m.locals[name]
	if !ok {
		m.t.Fatalf("no local %s", name)
	}
	if m.resolving[name] {
		m.t.Fatalf("local %s depends on itself", name)
	}
	m.resolving[name] = true
	v := m.eval(e, "local."+name)
	m.vals[name] = v
	return v
}

// localJSON decodes a local's value through JSON.
func (m *moduleEval) localJSON(name string, out any) {
	m.t.Helper()
	v := m.local(name)
	b, err := ctyjson.Marshal(v, v.Type())
	if err != nil {
		m.t.Fatalf("local.%s: %v", name, err)
	}
	if err := json.Unmarshal(b, out); err != nil {
		m.t.Fatalf("local.%s: %v", name, err)
	}
}

// failedChecks returns the error messages of the failing validations of
// variable name and the failing preconditions of every resource.
func (m *moduleEval) failedChecks(name string) []string {
	m.t.Helper()
	var failed []string
	check := func(b *hclsyntax.Block, what string) {
		cond := m.eval(b.Body.Attributes["condition"].Expr, what)
		if cond.False() {
			msg := m.eval(b.Body.Attributes["error_message"].Expr, what)
			failed = append(failed, msg.AsString())
		}
	}
	for _, b := range m.d.variables[name].Body.Blocks {
		if b.Type == "validation" {
			check(b, "validation of var."+name)
		}
	}
	for _, body := range m.d.files {
		for _, r := range body.Blocks {
			if r.Type != "resource" {
				continue
			}
			for _, lc := range r.Body.Blocks {
				if lc.Type != "lifecycle" {
					continue
				}
				for _, pc := range lc.Body.Blocks {
					if pc.Type == "precondition" {
						check(pc, "precondition of "+strings.Join(r.Labels, "."))
					}
				}
			}
		}
	}
	sort.Strings(failed)
	return failed
}

// checkValueKeys checks every key of a decoded value against the key tree
// of the type infergate decodes it into.
func checkValueKeys(t *testing.T, n *configkeys.Node, v any, path string) {
	t.Helper()
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
			checkValueKeys(t, sub, val, path+"."+k)
		}
	case []any:
		for _, el := range x {
			checkValueKeys(t, n, el, path+"[]")
		}
	}
}

func obj(attrs map[string]cty.Value) cty.Value { return cty.ObjectVal(attrs) }

// tlsVar is var.tls as Terraform hands it to the module after applying
// the type's optional() defaults.
func tlsVar(clientCA, clientAuth cty.Value, admin, metrics bool) cty.Value {
	return obj(map[string]cty.Value{
		"certificate_arn": cty.StringVal("arn:aws:secretsmanager:us-east-1:123456789012:secret:infergate/tls-cert-AbCdEf"),
		"private_key_arn": cty.StringVal("arn:aws:secretsmanager:us-east-1:123456789012:secret:infergate/tls-key-AbCdEf"),
		"client_ca_arn":   clientCA,
		"client_auth":     clientAuth,
		"min_version":     cty.StringVal("1.3"),
		"admin":           cty.BoolVal(admin),
		"metrics":         cty.BoolVal(metrics),
	})
}

const ssmCA = "arn:aws:ssm:us-east-1:123456789012:parameter/infergate/tier1-ca"

func tier1TLSVar() cty.Value {
	return obj(map[string]cty.Value{
		"ca_arn":          cty.StringVal(ssmCA),
		"certificate_arn": cty.StringVal("arn:aws:secretsmanager:us-east-1:123456789012:secret:infergate/tier1-client-cert-AbCdEf"),
		"private_key_arn": cty.StringVal("arn:aws:secretsmanager:us-east-1:123456789012:secret:infergate/tier1-client-key-AbCdEf"),
		"server_name":     cty.StringVal("tier1.use1.internal.example.com"),
		"min_version":     cty.NullVal(cty.String),
	})
}

// TestModuleWithoutTLS: by default the configuration has no TLS keys, the
// config container writes only the configuration, and the load balancer
// terminates TLS and forwards TCP with HTTP health checks, as before TLS
// existed in the module.
func TestModuleWithoutTLS(t *testing.T) {
	m := newModuleEval(t, nil)
	var cfg map[string]any
	m.localJSON("base_config", &cfg)
	if _, ok := cfg["tls"]; ok {
		t.Errorf("tls in the default configuration: %v", cfg["tls"])
	}
	for _, k := range []string{"admin", "metrics", "tier1"} {
		if sub, _ := cfg[k].(map[string]any); sub["tls"] != nil {
			t.Errorf("%s.tls in the default configuration", k)
		}
	}
	if s := m.local("config_init_script").AsString(); strings.Contains(s, "/tls") || strings.Contains(s, "printf") {
		t.Errorf("config container writes TLS files without var.tls: %s", s)
	}
	if n := m.local("tls_files").LengthInt(); n != 0 {
		t.Errorf("%d TLS files", n)
	}
	for name, want := range map[string]string{
		"lb_listener_protocol": "TLS", "api_target_protocol": "TCP", "adm_target_protocol": "TCP", "health_check_protocol": "HTTP",
	} {
		if got := m.local(name).AsString(); got != want {
			t.Errorf("local.%s = %q, want %q", name, got, want)
		}
	}
	if f := m.failedChecks("tls"); len(f) != 0 {
		t.Errorf("defaults fail checks: %v", f)
	}
}

// TestModuleTLSFiles follows var.tls and var.tier1_tls to the task: the
// configuration's TLS blocks (decoded strictly as infergate's TLS blocks)
// name exactly the files the config container writes, each from the
// secret ECS injects into that container alone; running the container's
// script with real PEM files yields files infergate loads; the execution
// role may read exactly those ARNs (SSM ones through ssm:GetParameters).
func TestModuleTLSFiles(t *testing.T) {
	m := newModuleEval(t, map[string]cty.Value{
		"tls":                tlsVar(cty.StringVal("arn:aws:secretsmanager:us-east-1:123456789012:secret:infergate/clients-ca-AbCdEf"), cty.StringVal("verify_if_given"), true, true),
		"tier1_tls":          tier1TLSVar(),
		"lb_tls_passthrough": cty.True,
	})
	var cfg map[string]any
	m.localJSON("base_config", &cfg)
	// Every key, through the locals, is one Tier 2's configuration has.
	checkValueKeys(t, configkeys.Of(reflect.TypeFor[server.Config]()), cfg, "base_config")

	// The blocks decode strictly as infergate's TLS blocks, and the paths
	// they name are the files the config container writes.
	decode := func(path string, v any, out any) {
		t.Helper()
		b, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		if err := config.Decode(path, b, out); err != nil {
			t.Fatalf("%s: %v\n%s", path, err, b)
		}
	}
	var api, admin, metrics tlsfiles.Server
	var tier1 tlsfiles.Client
	decode("tls", cfg["tls"], &api)
	decode("admin.tls", cfg["admin"].(map[string]any)["tls"], &admin)
	decode("metrics.tls", cfg["metrics"].(map[string]any)["tls"], &metrics)
	decode("tier1.tls", cfg["tier1"].(map[string]any)["tls"], &tier1)
	if api != admin || api != metrics {
		t.Errorf("admin/metrics TLS differ from the API's: %+v %+v %+v", api, admin, metrics)
	}
	if api.ClientAuth != "verify_if_given" || api.MinVersion != "1.3" || api.ClientCAFile == "" {
		t.Errorf("api TLS: %+v", api)
	}
	if tier1.ServerName != "tier1.use1.internal.example.com" || tier1.MinVersion != "" {
		t.Errorf("tier1 TLS: %+v", tier1)
	}
	if err := api.Validate("tls"); err != nil {
		t.Error(err)
	}
	if err := tier1.Validate("tier1.tls"); err != nil {
		t.Error(err)
	}
	named := []string{api.CertFile, api.KeyFile, api.ClientCAFile, tier1.CAFile, tier1.CertFile, tier1.KeyFile}

	var files []struct{ Env, File, ARN string }
	m.localJSON("tls_files", &files)
	var written []string
	envARN := map[string]string{}
	for _, f := range files {
		written = append(written, "/etc/infergate/tls/"+f.File)
		envARN[f.Env] = f.ARN
	}
	slices.Sort(named)
	slices.Sort(written)
	if !slices.Equal(named, written) {
		t.Errorf("configuration names %v, config container writes %v", named, written)
	}

	// The secrets reach the config container only.
	var defs []map[string]any
	m.localJSON("container_definitions", &defs)
	for _, c := range defs {
		secrets, _ := c["secrets"].([]any)
		got := map[string]string{}
		for _, s := range secrets {
			s := s.(map[string]any)
			got[s["name"].(string)] = s["valueFrom"].(string)
		}
		switch c["name"] {
		case "config":
			if fmt.Sprint(got) != fmt.Sprint(envARN) {
				t.Errorf("config container secrets %v, want %v", got, envARN)
			}
		case "tier2":
			for env := range envARN {
				if _, ok := got[env]; ok {
					t.Errorf("tier2 container receives %s", env)
				}
			}
		}
	}

	// IAM: the execution role reads exactly these ARNs besides the tokens.
	var smARNs, ssmARNs []string
	m.localJSON("secret_arns", &smARNs)
	m.localJSON("ssm_parameter_arns", &ssmARNs)
	if !slices.Equal(ssmARNs, []string{ssmCA}) {
		t.Errorf("ssm_parameter_arns = %v", ssmARNs)
	}
	for env, arn := range envARN {
		if arn != ssmCA && !slices.Contains(smARNs, arn) {
			t.Errorf("execution role cannot read %s (%s)", arn, env)
		}
	}
	if slices.Contains(smARNs, ssmCA) {
		t.Error("an SSM parameter ARN is in the Secrets Manager statement")
	}

	// Passthrough: TCP listeners and targets, HTTPS health checks (client
	// certificates are optional here).
	for name, want := range map[string]string{
		"lb_listener_protocol": "TCP", "api_target_protocol": "TCP", "adm_target_protocol": "TCP", "health_check_protocol": "HTTPS",
	} {
		if got := m.local(name).AsString(); got != want {
			t.Errorf("local.%s = %q, want %q", name, got, want)
		}
	}
	if f := m.failedChecks("tls"); len(f) != 0 {
		t.Errorf("checks fail: %v", f)
	}

	// Run the config container's script (its paths moved into a temporary
	// directory) with real PEM text in the environment, as ECS would.
	sh, err := exec.LookPath("sh")
	if err != nil {
		t.Skip("no sh")
	}
	root := t.TempDir()
	script := strings.ReplaceAll(m.local("config_init_script").AsString(), "/etc/infergate", root)
	if os.Geteuid() != 0 { // chown to the container's user needs root
		script = strings.ReplaceAll(script, "chown -R 65532:65532", "true")
	}
	serverCA, clientCA := testpki.NewCA(t, "servers"), testpki.NewCA(t, "clients")
	server, client := serverCA.Issue(t, testpki.LeafOptions{}), clientCA.Issue(t, testpki.LeafOptions{})
	pems := map[string][]byte{
		"INFERGATE_TLS_CERT": server.CertPEM, "INFERGATE_TLS_KEY": server.KeyPEM, "INFERGATE_TLS_CLIENT_CA": clientCA.CertPEM,
		"INFERGATE_TIER1_CA": serverCA.CertPEM, "INFERGATE_TIER1_CERT": client.CertPEM, "INFERGATE_TIER1_KEY": client.KeyPEM,
	}
	cmd := exec.Command(sh, "-c", script)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "INFERGATE_CONFIG_B64=" + base64.StdEncoding.EncodeToString([]byte(m.local("config_yaml").AsString()))}
	for env, pem := range pems {
		cmd.Env = append(cmd.Env, env+"="+string(pem))
	}
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("config script: %v\n%s\n%s", err, out, script)
	}
	if b, err := os.ReadFile(filepath.Join(root, "tier2.yaml")); err != nil || string(b) != m.local("config_yaml").AsString() {
		t.Errorf("tier2.yaml not written as rendered: %v", err)
	}
	move := func(p string) string { return strings.Replace(p, "/etc/infergate", root, 1) }
	for _, f := range files {
		fi, err := os.Stat(move("/etc/infergate/tls/" + f.File))
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm() != 0o600 {
			t.Errorf("%s: mode %v, want 0600", f.File, fi.Mode().Perm())
		}
	}
	ctx := context.Background()
	apiFiles := api
	apiFiles.CertFile, apiFiles.KeyFile, apiFiles.ClientCAFile = move(api.CertFile), move(api.KeyFile), move(api.ClientCAFile)
	if _, err := tlsfiles.NewServer(ctx, apiFiles, tlsfiles.Options{Interval: -1}); err != nil {
		t.Errorf("infergate cannot load the written API files: %v", err)
	}
	tier1Files := tier1
	tier1Files.CAFile, tier1Files.CertFile, tier1Files.KeyFile = move(tier1.CAFile), move(tier1.CertFile), move(tier1.KeyFile)
	if _, err := tlsfiles.NewClient(ctx, tier1Files, tlsfiles.Options{Interval: -1}); err != nil {
		t.Errorf("infergate cannot load the written Tier 1 client files: %v", err)
	}
}

// TestModuleTLSModes checks the load balancer in each TLS mode and the
// checks that refuse combinations that cannot work.
func TestModuleTLSModes(t *testing.T) {
	null := cty.NullVal(cty.String)
	ca := cty.StringVal("arn:aws:secretsmanager:us-east-1:123456789012:secret:infergate/ca-AbCdEf")
	tests := []struct {
		name                         string
		tls                          cty.Value
		passthrough                  bool
		listener, api, admin, health string
		failing                      []string // substrings of the failing checks' messages
	}{
		{name: "re-encrypt", tls: tlsVar(null, null, true, false),
			listener: "TLS", api: "TLS", admin: "TLS", health: "HTTPS"},
		{name: "re-encrypt, admin plain inside the VPC", tls: tlsVar(null, null, false, false),
			listener: "TLS", api: "TLS", admin: "TCP", health: "HTTPS"},
		{name: "passthrough with client certificates required", tls: tlsVar(ca, cty.StringVal("require"), true, false), passthrough: true,
			listener: "TCP", api: "TCP", admin: "TCP", health: "TCP"},
		{name: "passthrough without var.tls", tls: cty.NullVal(tlsVar(null, null, true, false).Type()), passthrough: true,
			listener: "TCP", api: "TCP", admin: "TCP", health: "HTTP",
			failing: []string{"lb_tls_passthrough needs tls.admin", "lb_tls_passthrough needs var.tls"}},
		{name: "passthrough with a plain admin API", tls: tlsVar(null, null, false, false), passthrough: true,
			listener: "TCP", api: "TCP", admin: "TCP", health: "HTTPS",
			failing: []string{"lb_tls_passthrough needs tls.admin"}},
		{name: "client certificates behind a terminating load balancer", tls: tlsVar(ca, cty.StringVal("require"), true, false),
			listener: "TLS", api: "TLS", admin: "TLS", health: "TCP",
			failing: []string{"tls.client_auth needs lb_tls_passthrough"}},
		{name: "client_auth without a CA", tls: tlsVar(null, cty.StringVal("require"), true, false), passthrough: true,
			listener: "TCP", api: "TCP", admin: "TCP", health: "TCP",
			failing: []string{"needs tls.client_ca_arn"}},
		{name: "bad client_auth", tls: tlsVar(ca, cty.StringVal("always"), true, false), passthrough: true,
			listener: "TCP", api: "TCP", admin: "TCP", health: "HTTPS",
			failing: []string{"must be \"require\" or \"verify_if_given\""}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := newModuleEval(t, map[string]cty.Value{"tls": tt.tls, "lb_tls_passthrough": cty.BoolVal(tt.passthrough)})
			for name, want := range map[string]string{
				"lb_listener_protocol": tt.listener, "api_target_protocol": tt.api, "adm_target_protocol": tt.admin, "health_check_protocol": tt.health,
			} {
				if got := m.local(name).AsString(); got != want {
					t.Errorf("local.%s = %q, want %q", name, got, want)
				}
			}
			failed := m.failedChecks("tls")
			if len(failed) != len(tt.failing) {
				t.Fatalf("failing checks %q, want %d matching %q", failed, len(tt.failing), tt.failing)
			}
			for _, want := range tt.failing {
				if !slices.ContainsFunc(failed, func(f string) bool { return strings.Contains(f, want) }) {
					t.Errorf("no failing check says %q: %q", want, failed)
				}
			}
		})
	}

	m := newModuleEval(t, map[string]cty.Value{"tier1_tls": obj(map[string]cty.Value{
		"ca_arn": null, "certificate_arn": cty.StringVal("arn:aws:secretsmanager:us-east-1:1:secret:c"), "private_key_arn": null,
		"server_name": null, "min_version": null,
	})})
	if f := m.failedChecks("tier1_tls"); len(f) != 1 || !strings.Contains(f[0], "go together") {
		t.Errorf("a client certificate without its key: checks %q", f)
	}
}
