package helm

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"os/exec"
	"path/filepath"
	"testing"

	"gopkg.in/yaml.v3"

	"github.com/infergate/infergate/shared/config"
	tier1config "github.com/infergate/infergate/tier1/config"
	"github.com/infergate/infergate/tier2/server"
)

// renderChart runs helm template on chart and returns the documents by kind.
func renderChart(t *testing.T, chart string, args ...string) map[string][]map[string]any {
	t.Helper()
	helm := filepath.Join(toolsBin(), "helm")
	if _, err := exec.LookPath(helm); err != nil {
		helm = "helm"
	}
	cmdArgs := append([]string{"template", "t", chart, "--namespace", "obs"}, args...)
	out, err := exec.Command(helm, cmdArgs...).CombinedOutput()
	if err != nil {
		t.Fatalf("helm %v: %v\n%s", cmdArgs, err, out)
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
			t.Fatalf("helm %v: %v", cmdArgs, err)
		}
		if doc != nil {
			k, _ := doc["kind"].(string)
			byKind[k] = append(byKind[k], doc)
		}
	}
	return byKind
}

// dig walks nested maps by key.
func dig(v any, keys ...string) any {
	for _, k := range keys {
		m, ok := v.(map[string]any)
		if !ok {
			return nil
		}
		v = m[k]
	}
	return v
}

// metricsWiring is what a chart renders for /metrics.
type metricsWiring struct {
	listen        string         // metrics listen address in the config file
	containerPort map[string]int // container ports by name
	smPorts       []string       // ServiceMonitor endpoint ports
	smPaths       []string       // and their paths
	smServices    []string       // names of the Services the ServiceMonitor selects
	servicePorts  map[string]map[string]any
	apiPorts      []string // port names on Services the ServiceMonitor does not select
}

// inspectMetrics decodes the rendered config strictly (with the real
// config type, via listen) and follows the ServiceMonitor's selector to
// the Services and ports it scrapes.
func inspectMetrics(t *testing.T, docs map[string][]map[string]any, cfgKey string, listen func([]byte) (string, error)) metricsWiring {
	t.Helper()
	w := metricsWiring{containerPort: map[string]int{}, servicePorts: map[string]map[string]any{}}
	found := false
	for _, cm := range docs["ConfigMap"] {
		if s, ok := dig(cm, "data", cfgKey).(string); ok {
			l, err := listen([]byte(s))
			if err != nil {
				t.Fatalf("rendered %s: %v\n%s", cfgKey, err, s)
			}
			w.listen, found = l, true
		}
	}
	if !found {
		t.Fatalf("no ConfigMap with %s", cfgKey)
	}
	for _, d := range docs["Deployment"] {
		for _, c := range dig(d, "spec", "template", "spec", "containers").([]any) {
			ports, _ := dig(c, "ports").([]any)
			for _, p := range ports {
				w.containerPort[dig(p, "name").(string)] = dig(p, "containerPort").(int)
			}
		}
	}
	var sel map[string]any
	for _, sm := range docs["ServiceMonitor"] {
		sel, _ = dig(sm, "spec", "selector", "matchLabels").(map[string]any)
		for _, e := range dig(sm, "spec", "endpoints").([]any) {
			w.smPorts = append(w.smPorts, fmt.Sprint(dig(e, "port")))
			w.smPaths = append(w.smPaths, fmt.Sprint(dig(e, "path")))
		}
	}
	for _, s := range docs["Service"] {
		name := dig(s, "metadata", "name").(string)
		labels, _ := dig(s, "metadata", "labels").(map[string]any)
		selected := sel != nil
		for k, v := range sel {
			if labels[k] != v {
				selected = false
			}
		}
		for _, p := range dig(s, "spec", "ports").([]any) {
			pn := dig(p, "name").(string)
			if selected {
				w.servicePorts[pn] = p.(map[string]any)
			} else {
				w.apiPorts = append(w.apiPorts, fmt.Sprintf("%s/%s", name, pn))
			}
		}
		if selected {
			w.smServices = append(w.smServices, name)
		}
	}
	return w
}

// check asserts the whole chain: the ServiceMonitor scrapes /metrics on the
// port named metrics of one Service (the -metrics one) that only it
// selects; that port targets the metrics container port, which is the port
// the config's metrics listener binds on every interface; no other Service
// carries it.
func (w metricsWiring) check(t *testing.T, label, fullname, wantListen string, wantPort int) {
	t.Helper()
	if w.listen != wantListen {
		t.Errorf("%s: metrics listen %q, want %q", label, w.listen, wantListen)
	}
	host, port, err := net.SplitHostPort(w.listen)
	if err != nil || host != "" || port != fmt.Sprint(wantPort) {
		t.Errorf("%s: metrics listen %q: not all interfaces on port %d (%v)", label, w.listen, wantPort, err)
	}
	if got := w.containerPort["metrics"]; got != wantPort {
		t.Errorf("%s: container port metrics = %d, want %d (ports %v)", label, got, wantPort, w.containerPort)
	}
	if w.containerPort["http"] == wantPort {
		t.Errorf("%s: metrics port %d is the API port", label, wantPort)
	}
	if len(w.smPorts) != 1 || w.smPorts[0] != "metrics" || w.smPaths[0] != "/metrics" {
		t.Errorf("%s: ServiceMonitor endpoints ports %v paths %v, want one: metrics /metrics", label, w.smPorts, w.smPaths)
	}
	if len(w.smServices) != 1 || w.smServices[0] != fullname+"-metrics" {
		t.Errorf("%s: ServiceMonitor selects Services %v, want only %s-metrics", label, w.smServices, fullname)
	}
	p := w.servicePorts["metrics"]
	if p == nil || p["targetPort"] != "metrics" || p["port"] != wantPort || len(w.servicePorts) != 1 {
		t.Errorf("%s: scraped Service ports %v, want only metrics: %d -> targetPort metrics", label, w.servicePorts, wantPort)
	}
	for _, ap := range w.apiPorts {
		if filepath.Base(ap) == "metrics" {
			t.Errorf("%s: Service port %s is not the ServiceMonitor's", label, ap)
		}
	}
}

func tier1MetricsListen(data []byte) (string, error) {
	var cfg tier1config.Config
	err := config.Decode("tier1.yaml", data, &cfg)
	return cfg.MetricsListen, err
}

// tier2Fields is Tier 2's configuration without its methods: decoded
// strictly, but not validated (the chart's defaults leave consul or
// clusters to the user).
type tier2Fields server.Config

func tier2MetricsListen(data []byte) (string, error) {
	var cfg tier2Fields
	err := config.Decode("tier2.yaml", data, &cfg)
	return cfg.Metrics.Listen, err
}

// TestChartMetricsWiring renders both charts and checks that Prometheus
// scrapes the /metrics listener, never the API port (which answers 404 on
// /metrics).
func TestChartMetricsWiring(t *testing.T) {
	if !findTool("helm") {
		t.Skip("helm not installed (run scripts/deploy-tools.sh)")
	}
	const t1, t2 = "infergate-tier1", "infergate-tier2"
	sm := []string{"--set", "serviceMonitor.enabled=true"}
	full1 := []string{"-f", filepath.Join(t1, "ci", "full-values.yaml")}

	inspectMetrics(t, renderChart(t, t1, sm...), "tier1.yaml", tier1MetricsListen).
		check(t, "tier1 defaults", "t-"+t1, ":9090", 9090)
	inspectMetrics(t, renderChart(t, t1, full1...), "tier1.yaml", tier1MetricsListen).
		check(t, "tier1 full values", "t-"+t1, ":9090", 9090)
	inspectMetrics(t, renderChart(t, t1, append(sm, "--set", "metricsPort=9100")...), "tier1.yaml", tier1MetricsListen).
		check(t, "tier1 metricsPort=9100", "t-"+t1, ":9100", 9100)
	inspectMetrics(t, renderChart(t, t2, sm...), "tier2.yaml", tier2MetricsListen).
		check(t, "tier2 defaults", "t-"+t2, ":9464", 9464)

	// A metrics_listen set in values is kept as written.
	w := inspectMetrics(t, renderChart(t, t1, "--set", "config.metrics_listen=-"), "tier1.yaml", tier1MetricsListen)
	if w.listen != "-" {
		t.Errorf("config.metrics_listen=-: rendered %q", w.listen)
	}
	// Without the ServiceMonitor there is no metrics Service at all, and
	// the API Service never carries the metrics port.
	if len(w.smPorts) != 0 || len(w.smServices) != 0 {
		t.Errorf("serviceMonitor disabled: endpoints %v Services %v", w.smPorts, w.smServices)
	}
	for _, ap := range w.apiPorts {
		if filepath.Base(ap) == "metrics" {
			t.Errorf("serviceMonitor disabled: Service port %s", ap)
		}
	}
}
