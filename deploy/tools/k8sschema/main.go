// Command k8sschema converts the Kubernetes OpenAPI v2 document
// (api/openapi-spec/swagger.json in the k8s.io/kubernetes module) into the
// standalone, strict JSON schemas kubeconform reads, entirely offline.
//
// The layout matches kubeconform's schema-location template
// "{{ .ResourceKind }}{{ .KindSuffix }}.json": one file per kind named
// {kind}-{group}-{version}.json (lower case, group cut at its first dot, so
// rbac.authorization.k8s.io/v1 Role is role-rbac-v1.json), or {kind}-{version}.json
// for the core group (service-v1.json). Like openapi2jsonschema
// --kubernetes --strict --stand-alone (what kubeconform's published schemas
// are made with):
//   - every $ref is inlined, so each file stands alone;
//   - every object schema with properties gets additionalProperties: false;
//   - optional fields also accept null;
//   - int-or-string fields accept a string or an integer, quantities a
//     string or a number;
//   - apiVersion and kind are pinned to the kind's group/version and name.
//
// It also writes minimal ServiceMonitor (monitoring.coreos.com/v1) and
// cert-manager Certificate (cert-manager.io/v1) schemas, since those CRDs
// are not in the Kubernetes document, and one schema per
// version of each CustomResourceDefinition file given with -crd (the
// charts' own CRDs, such as the InferencePool), made strict the same way.
//
// Usage:
//
//	k8sschema -swagger swagger.json -out DIR [-kinds Deployment,Service,...|all] [-crd file.yaml,...]
package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"gopkg.in/yaml.v3"
)

// defaultKinds are the kinds the infergate Helm charts render.
var defaultKinds = []string{
	"ClusterRole", "ClusterRoleBinding", "ConfigMap", "CustomResourceDefinition", "Deployment", "HorizontalPodAutoscaler", "NetworkPolicy",
	"PodDisruptionBudget", "Role", "RoleBinding", "Secret", "Service", "ServiceAccount",
}

func main() {
	if err := run(os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "k8sschema:", err)
		os.Exit(1)
	}
}

func run(args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("k8sschema", flag.ContinueOnError)
	swagger := fs.String("swagger", "", "path to the Kubernetes swagger.json (OpenAPI v2)")
	out := fs.String("out", "", "directory to write the schemas into")
	kinds := fs.String("kinds", strings.Join(defaultKinds, ","), `comma-separated kinds to convert, or "all"`)
	crds := fs.String("crd", "", "comma-separated CustomResourceDefinition YAML files to write schemas for")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *swagger == "" || *out == "" {
		return errors.New("-swagger and -out are required")
	}
	data, err := os.ReadFile(*swagger)
	if err != nil {
		return err
	}
	var want map[string]bool
	if *kinds != "all" {
		want = map[string]bool{}
		for _, k := range strings.Split(*kinds, ",") {
			if k = strings.TrimSpace(k); k != "" {
				want[k] = true
			}
		}
	}
	files, err := Convert(data, want)
	if err != nil {
		return err
	}
	files["servicemonitor-monitoring-v1.json"] = serviceMonitorSchema()
	files["certificate-cert-manager-v1.json"] = certificateSchema()
	for _, f := range strings.Split(*crds, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		b, err := os.ReadFile(f)
		if err != nil {
			return err
		}
		schemas, err := CRDSchemas(b)
		if err != nil {
			return fmt.Errorf("%s: %w", f, err)
		}
		for n, sch := range schemas {
			files[n] = sch
		}
	}
	if err := os.MkdirAll(*out, 0o755); err != nil {
		return err
	}
	names := make([]string, 0, len(files))
	for n := range files {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		b, err := json.MarshalIndent(files[n], "", "  ")
		if err != nil {
			return fmt.Errorf("%s: %w", n, err)
		}
		if err := os.WriteFile(filepath.Join(*out, n), append(b, '\n'), 0o644); err != nil {
			return err
		}
	}
	fmt.Fprintf(stdout, "k8sschema: wrote %d schemas to %s\n", len(names), *out)
	return nil
}

type gvk struct {
	Group   string `json:"group"`
	Version string `json:"version"`
	Kind    string `json:"kind"`
}

// FileName is the kubeconform file name for a group/version/kind.
func FileName(group, version, kind string) string {
	name := strings.ToLower(kind)
	if group != "" {
		name += "-" + strings.ToLower(strings.SplitN(group, ".", 2)[0])
	}
	return name + "-" + strings.ToLower(version) + ".json"
}

// Convert turns the swagger document's definitions into standalone strict
// schemas keyed by file name. want limits the kinds converted (nil: all). It
// fails when a wanted kind is missing.
func Convert(swagger []byte, want map[string]bool) (map[string]any, error) {
	var doc struct {
		Definitions map[string]map[string]any `json:"definitions"`
	}
	if err := json.Unmarshal(swagger, &doc); err != nil {
		return nil, fmt.Errorf("parse swagger: %w", err)
	}
	if len(doc.Definitions) == 0 {
		return nil, errors.New("swagger document has no definitions")
	}
	c := &converter{defs: doc.Definitions, active: map[string]bool{}}
	files := map[string]any{}
	found := map[string]bool{}
	names := make([]string, 0, len(doc.Definitions))
	for n := range doc.Definitions {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, name := range names {
		def := doc.Definitions[name]
		gvks := gvksOf(def)
		// Definitions with several GVKs (DeleteOptions, WatchEvent) are
		// shared helper types, not resources a chart renders.
		if len(gvks) != 1 {
			continue
		}
		g := gvks[0]
		if want != nil && !want[g.Kind] {
			continue
		}
		// Only the io.k8s.api.* types are resources (skip the apimachinery
		// meta types such as Status and the list types a chart never renders).
		if strings.HasSuffix(g.Kind, "List") && want == nil {
			continue
		}
		schema, err := c.resolve(name)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		m := schema.(map[string]any)
		apiVersion := g.Version
		if g.Group != "" {
			apiVersion = g.Group + "/" + g.Version
		}
		props, _ := m["properties"].(map[string]any)
		if props != nil {
			if _, ok := props["apiVersion"]; ok {
				props["apiVersion"] = map[string]any{"type": "string", "enum": []any{apiVersion}}
			}
			if _, ok := props["kind"]; ok {
				props["kind"] = map[string]any{"type": "string", "enum": []any{g.Kind}}
			}
		}
		m["$schema"] = "http://json-schema.org/schema#"
		m["x-kubernetes-group-version-kind"] = []any{map[string]any{"group": g.Group, "version": g.Version, "kind": g.Kind}}
		files[FileName(g.Group, g.Version, g.Kind)] = m
		found[g.Kind] = true
	}
	var missing []string
	for k := range want {
		if !found[k] {
			missing = append(missing, k)
		}
	}
	if len(missing) > 0 {
		sort.Strings(missing)
		return nil, fmt.Errorf("kinds not in the swagger document: %s", strings.Join(missing, ", "))
	}
	return files, nil
}

func gvksOf(def map[string]any) []gvk {
	raw, ok := def["x-kubernetes-group-version-kind"]
	if !ok {
		return nil
	}
	b, _ := json.Marshal(raw)
	var out []gvk
	if json.Unmarshal(b, &out) != nil {
		return nil
	}
	return out
}

type converter struct {
	defs   map[string]map[string]any
	active map[string]bool // definitions being inlined (cycle guard)
}

const refPrefix = "#/definitions/"

// resolve returns a deep, converted copy of the named definition.
func (c *converter) resolve(name string) (any, error) {
	def, ok := c.defs[name]
	if !ok {
		return nil, fmt.Errorf("unknown definition %q", name)
	}
	switch name {
	case "io.k8s.apimachinery.pkg.util.intstr.IntOrString":
		return map[string]any{"oneOf": []any{map[string]any{"type": "string"}, map[string]any{"type": "integer"}}}, nil
	case "io.k8s.apimachinery.pkg.api.resource.Quantity":
		return map[string]any{"oneOf": []any{map[string]any{"type": "string"}, map[string]any{"type": "number"}}}, nil
	}
	if c.active[name] {
		// A recursive type (JSONSchemaProps): accept anything below here
		// rather than inlining forever.
		return map[string]any{}, nil
	}
	c.active[name] = true
	defer delete(c.active, name)
	return c.convert(def)
}

func (c *converter) convert(v any) (any, error) {
	switch t := v.(type) {
	case map[string]any:
		if ref, ok := t["$ref"].(string); ok {
			if !strings.HasPrefix(ref, refPrefix) {
				return nil, fmt.Errorf("unsupported $ref %q", ref)
			}
			resolved, err := c.resolve(strings.TrimPrefix(ref, refPrefix))
			if err != nil {
				return nil, err
			}
			// Keep a description that sat beside the $ref.
			if d, ok := t["description"]; ok {
				if m, ok := resolved.(map[string]any); ok {
					m["description"] = d
				}
			}
			return resolved, nil
		}
		out := make(map[string]any, len(t)+1)
		for k, val := range t {
			switch k {
			case "properties":
				props, ok := val.(map[string]any)
				if !ok {
					return nil, errors.New("properties is not an object")
				}
				required := map[string]bool{}
				if req, ok := t["required"].([]any); ok {
					for _, r := range req {
						if s, ok := r.(string); ok {
							required[s] = true
						}
					}
				}
				np := make(map[string]any, len(props))
				for pk, pv := range props {
					cv, err := c.convert(pv)
					if err != nil {
						return nil, fmt.Errorf("%s: %w", pk, err)
					}
					if !required[pk] {
						cv = allowNull(cv)
					}
					np[pk] = cv
				}
				out[k] = np
			case "x-kubernetes-group-version-kind", "x-kubernetes-list-map-keys",
				"x-kubernetes-list-type", "x-kubernetes-patch-merge-key",
				"x-kubernetes-patch-strategy", "x-kubernetes-map-type", "x-kubernetes-unions":
				// Annotations for the API server, not validation.
			default:
				cv, err := c.convert(val)
				if err != nil {
					return nil, err
				}
				out[k] = cv
			}
		}
		if t["format"] == "int-or-string" {
			delete(out, "type")
			delete(out, "format")
			out["oneOf"] = []any{map[string]any{"type": "string"}, map[string]any{"type": "integer"}}
		}
		if _, hasProps := out["properties"]; hasProps {
			if _, set := out["additionalProperties"]; !set {
				out["additionalProperties"] = false
			}
			if _, set := out["type"]; !set {
				out["type"] = "object"
			}
		}
		return out, nil
	case []any:
		out := make([]any, len(t))
		for i, e := range t {
			cv, err := c.convert(e)
			if err != nil {
				return nil, err
			}
			out[i] = cv
		}
		return out, nil
	default:
		return v, nil
	}
}

// allowNull lets an optional field be null, as Helm and kubectl render
// empty optional values.
func allowNull(v any) any {
	m, ok := v.(map[string]any)
	if !ok {
		return v
	}
	switch typ := m["type"].(type) {
	case string:
		m["type"] = []any{typ, "null"}
	case []any:
		for _, e := range typ {
			if e == "null" {
				return m
			}
		}
		m["type"] = append(typ, "null")
	default:
		if one, ok := m["oneOf"].([]any); ok {
			m["oneOf"] = append(one, map[string]any{"type": "null"})
		}
	}
	return m
}

// serviceMonitorSchema is a minimal strict schema for the Prometheus
// Operator's ServiceMonitor (monitoring.coreos.com/v1): the top level, the
// spec and the endpoint fields are checked; nested structures the charts do
// not use (relabelings, TLS, OAuth2 ...) are only type-checked.
func serviceMonitorSchema() map[string]any {
	str := func() map[string]any { return map[string]any{"type": "string"} }
	obj := func() map[string]any { return map[string]any{"type": "object"} }
	arr := func(items map[string]any) map[string]any { return map[string]any{"type": "array", "items": items} }
	strMap := func() map[string]any {
		return map[string]any{"type": "object", "additionalProperties": map[string]any{"type": "string"}}
	}
	labelSelector := map[string]any{
		"type":                 "object",
		"additionalProperties": false,
		"properties": map[string]any{
			"matchLabels": strMap(),
			"matchExpressions": arr(map[string]any{
				"type": "object", "additionalProperties": false, "required": []any{"key", "operator"},
				"properties": map[string]any{"key": str(), "operator": str(), "values": arr(str())},
			}),
		},
	}
	endpoint := map[string]any{
		"type":                 "object",
		"additionalProperties": false,
		"properties": map[string]any{
			"port":                     str(),
			"targetPort":               map[string]any{"oneOf": []any{str(), map[string]any{"type": "integer"}}},
			"path":                     str(),
			"scheme":                   map[string]any{"type": "string", "enum": []any{"http", "https", "HTTP", "HTTPS"}},
			"params":                   obj(),
			"interval":                 str(),
			"scrapeTimeout":            str(),
			"honorLabels":              map[string]any{"type": "boolean"},
			"honorTimestamps":          map[string]any{"type": "boolean"},
			"trackTimestampsStaleness": map[string]any{"type": "boolean"},
			"enableHttp2":              map[string]any{"type": "boolean"},
			"followRedirects":          map[string]any{"type": "boolean"},
			"filterRunning":            map[string]any{"type": "boolean"},
			"proxyUrl":                 str(),
			"bearerTokenFile":          str(),
			"bearerTokenSecret":        obj(),
			"authorization":            obj(),
			"basicAuth":                obj(),
			"oauth2":                   obj(),
			"tlsConfig":                obj(),
			"relabelings":              arr(obj()),
			"metricRelabelings":        arr(obj()),
		},
	}
	return map[string]any{
		"$schema":              "http://json-schema.org/schema#",
		"description":          "Minimal ServiceMonitor schema (monitoring.coreos.com/v1) written by infergate's k8sschema.",
		"type":                 "object",
		"required":             []any{"apiVersion", "kind", "metadata", "spec"},
		"additionalProperties": false,
		"x-kubernetes-group-version-kind": []any{map[string]any{
			"group": "monitoring.coreos.com", "version": "v1", "kind": "ServiceMonitor",
		}},
		"properties": map[string]any{
			"apiVersion": map[string]any{"type": "string", "enum": []any{"monitoring.coreos.com/v1"}},
			"kind":       map[string]any{"type": "string", "enum": []any{"ServiceMonitor"}},
			"metadata":   obj(),
			"spec": map[string]any{
				"type":                 "object",
				"additionalProperties": false,
				"required":             []any{"endpoints", "selector"},
				"properties": map[string]any{
					"endpoints": arr(endpoint),
					"selector":  labelSelector,
					"namespaceSelector": map[string]any{
						"type": "object", "additionalProperties": false,
						"properties": map[string]any{"any": map[string]any{"type": "boolean"}, "matchNames": arr(str())},
					},
					"jobLabel":        str(),
					"targetLabels":    arr(str()),
					"podTargetLabels": arr(str()),
					"sampleLimit":     map[string]any{"type": "integer"},
					"targetLimit":     map[string]any{"type": "integer"},
					"attachMetadata":  obj(),
					"scrapeClass":     str(),
				},
			},
		},
	}
}

// certificateUsages are the key usages cert-manager's Certificate accepts.
var certificateUsages = []any{
	"signing", "digital signature", "content commitment", "key encipherment", "key agreement",
	"data encipherment", "cert sign", "crl sign", "encipher only", "decipher only", "any",
	"server auth", "client auth", "code signing", "email protection", "s/mime", "ipsec end system",
	"ipsec tunnel", "ipsec user", "timestamping", "ocsp signing", "microsoft sgc", "netscape sgc",
}

// certificateSchema is a minimal strict schema for cert-manager's
// Certificate (cert-manager.io/v1), written from the CRD's spec: the fields
// the charts set are checked (names, enums, closed objects); the rest of
// the spec is only type-checked. Its file name is the one kubeconform asks
// for: the group cut at its first dot, "cert-manager".
func certificateSchema() map[string]any {
	str := func() map[string]any { return map[string]any{"type": "string"} }
	obj := func() map[string]any { return map[string]any{"type": "object"} }
	arr := func(items map[string]any) map[string]any { return map[string]any{"type": "array", "items": items} }
	enum := func(v ...any) map[string]any { return map[string]any{"type": "string", "enum": v} }
	strMap := func() map[string]any {
		return map[string]any{"type": "object", "additionalProperties": map[string]any{"type": "string"}}
	}
	return map[string]any{
		"$schema":              "http://json-schema.org/schema#",
		"description":          "Minimal Certificate schema (cert-manager.io/v1) written by infergate's k8sschema.",
		"type":                 "object",
		"required":             []any{"apiVersion", "kind", "metadata", "spec"},
		"additionalProperties": false,
		"x-kubernetes-group-version-kind": []any{map[string]any{
			"group": "cert-manager.io", "version": "v1", "kind": "Certificate",
		}},
		"properties": map[string]any{
			"apiVersion": enum("cert-manager.io/v1"),
			"kind":       enum("Certificate"),
			"metadata":   obj(),
			"spec": map[string]any{
				"type":                 "object",
				"additionalProperties": false,
				"required":             []any{"issuerRef", "secretName"},
				"properties": map[string]any{
					"secretName": map[string]any{"type": "string", "minLength": 1},
					"issuerRef": map[string]any{
						"type": "object", "additionalProperties": false, "required": []any{"name"},
						"properties": map[string]any{"name": str(), "kind": str(), "group": str()},
					},
					"commonName":              str(),
					"dnsNames":                arr(str()),
					"ipAddresses":             arr(str()),
					"uris":                    arr(str()),
					"emailAddresses":          arr(str()),
					"otherNames":              arr(obj()),
					"duration":                str(),
					"renewBefore":             str(),
					"renewBeforePercentage":   map[string]any{"type": "integer"},
					"usages":                  arr(enum(certificateUsages...)),
					"isCA":                    map[string]any{"type": "boolean"},
					"encodeUsagesInRequest":   map[string]any{"type": "boolean"},
					"revisionHistoryLimit":    map[string]any{"type": "integer"},
					"literalSubject":          str(),
					"signatureAlgorithm":      str(),
					"subject":                 obj(),
					"keystores":               obj(),
					"nameConstraints":         obj(),
					"additionalOutputFormats": arr(obj()),
					"privateKey": map[string]any{
						"type": "object", "additionalProperties": false,
						"properties": map[string]any{
							"algorithm":      enum("RSA", "ECDSA", "Ed25519"),
							"encoding":       enum("PKCS1", "PKCS8"),
							"size":           map[string]any{"type": "integer"},
							"rotationPolicy": enum("Never", "Always"),
						},
					},
					"secretTemplate": map[string]any{
						"type": "object", "additionalProperties": false,
						"properties": map[string]any{"annotations": strMap(), "labels": strMap()},
					},
				},
			},
		},
	}
}

// CRDSchemas converts a CustomResourceDefinition (YAML) into one strict
// kubeconform schema per version: objects with properties reject unknown
// fields (unless x-kubernetes-preserve-unknown-fields), apiVersion and kind
// are pinned, and metadata is any object.
func CRDSchemas(crdYAML []byte) (map[string]any, error) {
	var crd struct {
		Kind string `yaml:"kind"`
		Spec struct {
			Group string `yaml:"group"`
			Names struct {
				Kind string `yaml:"kind"`
			} `yaml:"names"`
			Versions []struct {
				Name   string `yaml:"name"`
				Schema struct {
					OpenAPIV3Schema map[string]any `yaml:"openAPIV3Schema"`
				} `yaml:"schema"`
			} `yaml:"versions"`
		} `yaml:"spec"`
	}
	if err := yaml.Unmarshal(crdYAML, &crd); err != nil {
		return nil, err
	}
	if crd.Kind != "CustomResourceDefinition" || crd.Spec.Group == "" || crd.Spec.Names.Kind == "" {
		return nil, errors.New("not a CustomResourceDefinition with spec.group and spec.names.kind")
	}
	out := map[string]any{}
	for _, v := range crd.Spec.Versions {
		root := v.Schema.OpenAPIV3Schema
		if root == nil {
			return nil, fmt.Errorf("version %s has no openAPIV3Schema", v.Name)
		}
		sch := strictCRD(root).(map[string]any)
		props, _ := sch["properties"].(map[string]any)
		if props == nil {
			props = map[string]any{}
			sch["properties"] = props
		}
		gv := crd.Spec.Group + "/" + v.Name
		props["apiVersion"] = map[string]any{"type": "string", "enum": []any{gv}}
		props["kind"] = map[string]any{"type": "string", "enum": []any{crd.Spec.Names.Kind}}
		props["metadata"] = map[string]any{"type": "object"}
		sch["$schema"] = "http://json-schema.org/schema#"
		sch["x-kubernetes-group-version-kind"] = []any{map[string]any{
			"group": crd.Spec.Group, "version": v.Name, "kind": crd.Spec.Names.Kind,
		}}
		out[FileName(crd.Spec.Group, v.Name, crd.Spec.Names.Kind)] = sch
	}
	return out, nil
}

// strictCRD copies a CRD schema node, closing objects that list properties.
func strictCRD(v any) any {
	switch t := v.(type) {
	case map[string]any:
		m := make(map[string]any, len(t)+1)
		for k, x := range t {
			m[k] = strictCRD(x)
		}
		if _, ok := m["properties"]; ok && m["x-kubernetes-preserve-unknown-fields"] != true {
			if _, set := m["additionalProperties"]; !set {
				m["additionalProperties"] = false
			}
		}
		return m
	case []any:
		out := make([]any, len(t))
		for i, x := range t {
			out[i] = strictCRD(x)
		}
		return out
	}
	return v
}
