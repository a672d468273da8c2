package helm

import (
	"bytes"
	"errors"
	"io"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"

	"gopkg.in/yaml.v3"

	"github.com/infergate/infergate/shared/config"
	tier1config "github.com/infergate/infergate/tier1/config"
)

// TestTier1ChartDiscovery renders the Tier 1 chart and checks the
// Kubernetes discovery it configures: by selector with the defaults (one
// value to change), through the chart's own InferencePool with the full
// values, and RBAC no wider than that needs.
func TestTier1ChartDiscovery(t *testing.T) {
	if !findTool("helm") {
		t.Skip("helm not installed (run scripts/deploy-tools.sh)")
	}
	helm := filepath.Join(toolsBin(), "helm")
	if _, err := exec.LookPath(helm); err != nil {
		helm = "helm"
	}
	render := func(args ...string) map[string][]map[string]any {
		t.Helper()
		out, err := exec.Command(helm, append([]string{"template", "t", "infergate-tier1", "--namespace", "llm"}, args...)...).CombinedOutput()
		if err != nil {
			t.Fatalf("helm template %v: %v\n%s", args, err, out)
		}
		byKind := map[string][]map[string]any{}
		dec := yaml.NewDecoder(bytes.NewReader(out))
		for {
			var doc map[string]any
			err := dec.Decode(&doc)
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			if doc != nil {
				k, _ := doc["kind"].(string)
				byKind[k] = append(byKind[k], doc)
			}
		}
		return byKind
	}
	tier1Config := func(docs map[string][]map[string]any) tier1config.Config {
		t.Helper()
		for _, cm := range docs["ConfigMap"] {
			data, _ := cm["data"].(map[string]any)
			if s, ok := data["tier1.yaml"].(string); ok {
				var cfg tier1config.Config
				if err := config.Decode("tier1.yaml", []byte(s), &cfg); err != nil {
					t.Fatalf("rendered config: %v\n%s", err, s)
				}
				return cfg
			}
		}
		t.Fatal("no tier1.yaml ConfigMap")
		return tier1config.Config{}
	}
	roleResources := func(docs map[string][]map[string]any) []string {
		var res []string
		for _, r := range docs["Role"] {
			rules, _ := r["rules"].([]any)
			for _, rule := range rules {
				m := rule.(map[string]any)
				for _, x := range m["resources"].([]any) {
					res = append(res, x.(string))
				}
				if verbs := m["verbs"].([]any); len(verbs) != 3 {
					t.Errorf("role verbs %v, want get, list, watch", verbs)
				}
			}
		}
		slices.Sort(res)
		return res
	}

	def := render()
	cfg := tier1Config(def)
	if src := cfg.Kubernetes.Sources; len(src) != 1 || src[0].Selector != "app=vllm" || src[0].Port != 8000 || len(cfg.Pods) != 0 {
		t.Errorf("default discovery: %+v, static pods %v", src, cfg.Pods)
	}
	if got := roleResources(def); !slices.Equal(got, []string{"pods"}) {
		t.Errorf("default Role resources %v, want only pods", got)
	}
	if len(def["ClusterRole"])+len(def["CustomResourceDefinition"])+len(def["InferencePool"]) != 0 {
		t.Error("defaults render cluster-scoped RBAC, the CRD or an InferencePool")
	}

	cfg = tier1Config(render("--set", "discovery.selector=app=vllm-llama-70b"))
	if src := cfg.Kubernetes.Sources; len(src) != 1 || src[0].Selector != "app=vllm-llama-70b" {
		t.Errorf("one-line selector: %+v", src)
	}

	full := render("-f", filepath.Join("infergate-tier1", "ci", "full-values.yaml"))
	cfg = tier1Config(full)
	if src := cfg.Kubernetes.Sources; len(src) != 1 || src[0].InferencePool != "t-infergate-tier1" || !cfg.Kubernetes.NodeGPU {
		t.Errorf("full values discovery: %+v", cfg.Kubernetes)
	}
	if got := roleResources(full); !slices.Equal(got, []string{"inferencepools", "pods"}) {
		t.Errorf("full Role resources %v", got)
	}
	if len(full["CustomResourceDefinition"]) != 1 || len(full["InferencePool"]) != 1 || len(full["ClusterRole"]) != 1 {
		t.Errorf("full values: %d CRDs, %d InferencePools, %d ClusterRoles", len(full["CustomResourceDefinition"]), len(full["InferencePool"]), len(full["ClusterRole"]))
	}
	for _, p := range full["InferencePool"] {
		ref := p["spec"].(map[string]any)["endpointPickerRef"].(map[string]any)
		if ref["name"] != "t-infergate-tier1-epp" || ref["failureMode"] != "FailOpen" {
			t.Errorf("endpointPickerRef %v", ref)
		}
	}
	eppService := false
	for _, s := range full["Service"] {
		eppService = eppService || s["metadata"].(map[string]any)["name"] == "t-infergate-tier1-epp"
	}
	if !eppService {
		t.Error("no ext_proc Service for the endpointPickerRef")
	}
}
