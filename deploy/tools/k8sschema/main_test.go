package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

const fakeSwagger = `{"definitions": {
  "io.k8s.api.apps.v1.Thing": {
    "type": "object",
    "required": ["spec"],
    "properties": {
      "apiVersion": {"type": "string"},
      "kind": {"type": "string"},
      "metadata": {"$ref": "#/definitions/io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta", "description": "meta"},
      "spec": {"$ref": "#/definitions/io.k8s.api.apps.v1.ThingSpec"}
    },
    "x-kubernetes-group-version-kind": [{"group": "apps", "version": "v1", "kind": "Thing"}]
  },
  "io.k8s.api.apps.v1.ThingSpec": {
    "type": "object",
    "properties": {
      "port": {"$ref": "#/definitions/io.k8s.apimachinery.pkg.util.intstr.IntOrString"},
      "cpu": {"$ref": "#/definitions/io.k8s.apimachinery.pkg.api.resource.Quantity"},
      "self": {"$ref": "#/definitions/io.k8s.api.apps.v1.ThingSpec"}
    }
  },
  "io.k8s.api.core.v1.Other": {
    "type": "object",
    "properties": {"kind": {"type": "string"}},
    "x-kubernetes-group-version-kind": [{"group": "", "version": "v1", "kind": "Other"}]
  },
  "io.k8s.api.rbac.v1.Role": {
    "type": "object",
    "properties": {"kind": {"type": "string"}},
    "x-kubernetes-group-version-kind": [{"group": "rbac.authorization.k8s.io", "version": "v1", "kind": "Role"}]
  },
  "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta": {
    "type": "object",
    "properties": {"name": {"type": "string"}, "labels": {"type": "object", "additionalProperties": {"type": "string"}}}
  },
  "io.k8s.apimachinery.pkg.util.intstr.IntOrString": {"type": "string", "format": "int-or-string"},
  "io.k8s.apimachinery.pkg.api.resource.Quantity": {"type": "string"}
}}`

func TestFileName(t *testing.T) {
	for _, tc := range []struct{ group, version, kind, want string }{
		{"apps", "v1", "Deployment", "deployment-apps-v1.json"},
		{"", "v1", "Service", "service-v1.json"},
		{"rbac.authorization.k8s.io", "v1", "RoleBinding", "rolebinding-rbac-v1.json"},
		{"autoscaling", "v2", "HorizontalPodAutoscaler", "horizontalpodautoscaler-autoscaling-v2.json"},
	} {
		if got := FileName(tc.group, tc.version, tc.kind); got != tc.want {
			t.Errorf("FileName(%q,%q,%q) = %q, want %q", tc.group, tc.version, tc.kind, got, tc.want)
		}
	}
}

func TestConvert(t *testing.T) {
	files, err := Convert([]byte(fakeSwagger), nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"thing-apps-v1.json", "other-v1.json", "role-rbac-v1.json"} {
		if files[n] == nil {
			t.Errorf("missing %s (have %v)", n, keys(files))
		}
	}
	b, _ := json.Marshal(files["thing-apps-v1.json"])
	var s struct {
		AdditionalProperties *bool          `json:"additionalProperties"`
		Required             []string       `json:"required"`
		Properties           map[string]any `json:"properties"`
	}
	if err := json.Unmarshal(b, &s); err != nil {
		t.Fatal(err)
	}
	if s.AdditionalProperties == nil || *s.AdditionalProperties {
		t.Errorf("top level not strict: %s", b)
	}
	kind := s.Properties["kind"].(map[string]any)
	if enum := kind["enum"].([]any); len(enum) != 1 || enum[0] != "Thing" {
		t.Errorf("kind enum = %v", kind["enum"])
	}
	api := s.Properties["apiVersion"].(map[string]any)
	if enum := api["enum"].([]any); len(enum) != 1 || enum[0] != "apps/v1" {
		t.Errorf("apiVersion enum = %v", api["enum"])
	}
	meta := s.Properties["metadata"].(map[string]any)
	if meta["description"] != "meta" || meta["additionalProperties"] != false {
		t.Errorf("metadata not inlined strictly: %v", meta)
	}
	if typ, _ := meta["type"].([]any); len(typ) != 2 || typ[1] != "null" {
		t.Errorf("optional metadata should accept null, type = %v", meta["type"])
	}
	spec := s.Properties["spec"].(map[string]any)
	if _, isList := spec["type"].([]any); isList {
		t.Errorf("required spec should not accept null: %v", spec["type"])
	}
	sp := spec["properties"].(map[string]any)
	port := sp["port"].(map[string]any)
	if one := port["oneOf"].([]any); len(one) != 3 {
		t.Errorf("int-or-string port oneOf = %v", one)
	}
	if _, ok := sp["self"].(map[string]any); !ok {
		t.Errorf("recursive type not cut: %v", sp["self"])
	}
	if bytesContains(b, "$ref") {
		t.Errorf("schema still has $ref: %s", b)
	}
}

func TestConvertMissingKind(t *testing.T) {
	if _, err := Convert([]byte(fakeSwagger), map[string]bool{"Thing": true, "Nope": true}); err == nil {
		t.Fatal("want an error for a kind the document lacks")
	}
}

func TestRunWritesFiles(t *testing.T) {
	dir := t.TempDir()
	sw := filepath.Join(dir, "swagger.json")
	if err := os.WriteFile(sw, []byte(fakeSwagger), 0o644); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "out")
	if err := run([]string{"-swagger", sw, "-out", out, "-kinds", "Thing,Role"}, new(nopWriter)); err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"thing-apps-v1.json", "role-rbac-v1.json", "servicemonitor-monitoring-v1.json", "certificate-cert-manager-v1.json"} {
		if _, err := os.Stat(filepath.Join(out, n)); err != nil {
			t.Error(err)
		}
	}
	if _, err := os.Stat(filepath.Join(out, "other-v1.json")); err == nil {
		t.Error("other-v1.json written though not asked for")
	}
}

type nopWriter struct{}

func (nopWriter) Write(p []byte) (int, error) { return len(p), nil }

func keys(m map[string]any) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

func bytesContains(b []byte, s string) bool { return strings.Contains(string(b), s) }
