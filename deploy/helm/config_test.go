package helm

import (
	"bytes"
	"fmt"
	"os/exec"
	"path/filepath"
	"testing"

	"gopkg.in/yaml.v3"

	"github.com/infergate/infergate/shared/config"
	tier1config "github.com/infergate/infergate/tier1/config"
)

// tier1ConfigAsRendered applies what templates/configmap.yaml adds to
// .Values.config: listen, metrics_listen, auth.token_env and peers with its
// mesh TLS (with replicas sharing state, release "t" in namespace
// "default") when absent.
func tier1ConfigAsRendered(t *testing.T, valuesFiles ...string) []byte {
	t.Helper()
	values := map[string]any{}
	for _, f := range valuesFiles {
		var v map[string]any
		readYAML(t, f, &v)
		mergeValues(values, v)
	}
	cfg, _ := values["config"].(map[string]any)
	if cfg == nil {
		t.Fatal("values have no config")
	}
	if _, ok := cfg["listen"]; !ok {
		cfg["listen"] = fmt.Sprintf(":%v", values["containerPort"])
	}
	if _, ok := cfg["metrics_listen"]; !ok {
		cfg["metrics_listen"] = fmt.Sprintf(":%v", values["metricsPort"])
	}
	auth, _ := cfg["auth"].(map[string]any)
	if auth == nil {
		auth = map[string]any{}
	}
	if _, ok := auth["token_env"]; !ok && auth["disabled"] != true {
		auth["token_env"] = values["auth"].(map[string]any)["tokenEnv"]
	}
	cfg["auth"] = auth
	peers, _ := values["peers"].(map[string]any)
	replicas, _ := values["replicaCount"].(int)
	if _, ok := cfg["peers"]; !ok && peers["enabled"] == true && replicas > 1 {
		dns := fmt.Sprintf("t-infergate-tier1-peers.default.svc.%v", values["clusterDomain"])
		cfg["peers"] = map[string]any{
			"listen":       fmt.Sprintf(":%v", peers["port"]),
			"dns":          dns,
			"hash_key_env": "INFERGATE_PEERS_HASH_KEY",
			"tls": map[string]any{
				"cert_file":   "/etc/infergate/tls/peers/tls.crt",
				"key_file":    "/etc/infergate/tls/peers/tls.key",
				"ca_file":     "/etc/infergate/tls/peers/ca.crt",
				"server_name": dns,
			},
		}
	}
	out, err := yaml.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// mergeValues merges src into dst the way Helm merges values files.
func mergeValues(dst, src map[string]any) {
	for k, v := range src {
		if sm, ok := v.(map[string]any); ok {
			if dm, ok := dst[k].(map[string]any); ok {
				mergeValues(dm, sm)
				continue
			}
		}
		dst[k] = v
	}
}

// TestTier1ChartConfigIsValid decodes the configuration the Tier 1 chart
// ships (default values and each ci/*.yaml) with the real Tier 1 loader, so
// the chart cannot drift from the config format.
func TestTier1ChartConfigIsValid(t *testing.T) {
	chart := "infergate-tier1"
	base := filepath.Join(chart, "values.yaml")
	sets := [][]string{{base}}
	ci, _ := filepath.Glob(filepath.Join(chart, "ci", "*.yaml"))
	for _, f := range ci {
		sets = append(sets, []string{base, f})
	}
	for _, files := range sets {
		data := tier1ConfigAsRendered(t, files...)
		var cfg tier1config.Config
		if err := config.Decode(fmt.Sprint(files), data, &cfg); err != nil {
			t.Errorf("%v: %v\n%s", files, err, data)
		}
		// Every shipped value set runs 2 replicas sharing state.
		if !cfg.Peers.Enabled() {
			t.Errorf("%v: replicas do not share state (no peers section)", files)
		}
	}
}

// TestTier1ChartConfigRendered does the same on the ConfigMap helm really
// renders, when helm is installed.
func TestTier1ChartConfigRendered(t *testing.T) {
	helm := filepath.Join(toolsBin(), "helm")
	if !findTool("helm") {
		t.Skip("helm not installed (run scripts/deploy-tools.sh)")
	}
	if _, err := exec.LookPath(helm); err != nil {
		helm = "helm"
	}
	args := [][]string{nil}
	ci, _ := filepath.Glob(filepath.Join("infergate-tier1", "ci", "*.yaml"))
	for _, f := range ci {
		args = append(args, []string{"-f", f})
	}
	for _, extra := range args {
		cmdArgs := append([]string{"template", "t", "infergate-tier1", "-s", "templates/configmap.yaml"}, extra...)
		out, err := exec.Command(helm, cmdArgs...).CombinedOutput()
		if err != nil {
			t.Fatalf("helm %v: %v\n%s", cmdArgs, err, out)
		}
		var cm struct {
			Data map[string]string `yaml:"data"`
		}
		dec := yaml.NewDecoder(bytes.NewReader(out))
		if err := dec.Decode(&cm); err != nil {
			t.Fatalf("helm %v: %v", cmdArgs, err)
		}
		var cfg tier1config.Config
		if err := config.Decode("rendered tier1.yaml", []byte(cm.Data["tier1.yaml"]), &cfg); err != nil {
			t.Errorf("helm %v: %v\n%s", cmdArgs, err, cm.Data["tier1.yaml"])
		}
		if cfg.Listen != ":8080" || cfg.MetricsListen != ":9090" || cfg.Auth.TokenEnv != "INFERGATE_TOKEN" {
			t.Errorf("helm %v: listen %q metrics_listen %q token_env %q", cmdArgs, cfg.Listen, cfg.MetricsListen, cfg.Auth.TokenEnv)
		}
	}
}
