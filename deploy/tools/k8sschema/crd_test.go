package main

import (
	"os"
	"path/filepath"
	"testing"
)

// The chart's InferencePool CRD becomes a strict schema: pinned apiVersion
// and kind, closed spec objects, open status.
func TestCRDSchemasInferencePool(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("..", "..", "helm", "infergate-tier1", "files", "inferencepool-crd.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	got, err := CRDSchemas(b)
	if err != nil {
		t.Fatal(err)
	}
	sch, ok := got["inferencepool-inference-v1.json"].(map[string]any)
	if !ok || len(got) != 1 {
		t.Fatalf("schemas %v", got)
	}
	props := sch["properties"].(map[string]any)
	if e := props["apiVersion"].(map[string]any)["enum"].([]any); len(e) != 1 || e[0] != "inference.networking.k8s.io/v1" {
		t.Errorf("apiVersion enum %v", e)
	}
	spec := props["spec"].(map[string]any)
	if spec["additionalProperties"] != false {
		t.Error("spec accepts unknown fields")
	}
	ref := spec["properties"].(map[string]any)["endpointPickerRef"].(map[string]any)
	if ref["additionalProperties"] != false {
		t.Error("endpointPickerRef accepts unknown fields")
	}
	if _, closed := props["status"].(map[string]any)["additionalProperties"]; closed {
		t.Error("status (x-kubernetes-preserve-unknown-fields) was closed")
	}
	for _, bad := range []string{"kind: ConfigMap\n", "not: [yaml"} {
		if _, err := CRDSchemas([]byte(bad)); err == nil {
			t.Errorf("CRDSchemas(%q) succeeded", bad)
		}
	}
}
