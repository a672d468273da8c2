package helm

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"

	"gopkg.in/yaml.v3"

	"github.com/infergate/infergate/deploy/configkeys"
	"github.com/infergate/infergate/shared/config"
	"github.com/infergate/infergate/shared/tlsfiles"
	tier1config "github.com/infergate/infergate/tier1/config"
	"github.com/infergate/infergate/tier2/server"
)

// render runs helm template on chart as release "t" in namespace ns and
// returns the raw output and the documents by kind.
func render(t *testing.T, chart, ns string, args ...string) (string, map[string][]map[string]any, error) {
	t.Helper()
	helm := filepath.Join(toolsBin(), "helm")
	if _, err := exec.LookPath(helm); err != nil {
		helm = "helm"
	}
	cmdArgs := append([]string{"template", "t", chart, "--namespace", ns}, args...)
	out, err := exec.Command(helm, cmdArgs...).CombinedOutput()
	if err != nil {
		return string(out), nil, err
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
	return string(out), byKind, nil
}

func mustRender(t *testing.T, chart, ns string, args ...string) (string, map[string][]map[string]any) {
	t.Helper()
	raw, docs, err := render(t, chart, ns, args...)
	if err != nil {
		t.Fatalf("helm template %s %v: %v\n%s", chart, args, err, raw)
	}
	return raw, docs
}

func named(docs []map[string]any, name string) map[string]any {
	for _, d := range docs {
		if dig(d, "metadata", "name") == name {
			return d
		}
	}
	return nil
}

// --- kubeconform --------------------------------------------------------

var (
	schemaOnce sync.Once
	schemaDir  string
	schemaErr  error
)

// k8sSchemas returns the directory of kubeconform schemas that
// scripts/deploy-check.sh uses (same Kubernetes version, same stamp),
// generating it the same way when it is missing or stale.
func k8sSchemas(t *testing.T) string {
	t.Helper()
	schemaOnce.Do(func() { schemaDir, schemaErr = ensureSchemas() })
	if schemaErr != nil {
		t.Fatalf("kubeconform schemas: %v", schemaErr)
	}
	return schemaDir
}

func ensureSchemas() (string, error) {
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		return "", err
	}
	script, err := os.ReadFile(filepath.Join(root, "scripts", "deploy-check.sh"))
	if err != nil {
		return "", err
	}
	m := regexp.MustCompile(`K8S_VERSION=\$\{K8S_VERSION:-([0-9.]+)\}`).FindSubmatch(script)
	if m == nil {
		return "", errors.New("no K8S_VERSION default in scripts/deploy-check.sh")
	}
	version := string(m[1])
	if v := os.Getenv("K8S_VERSION"); v != "" {
		version = v
	}
	dir := os.Getenv("K8S_SCHEMA_DIR")
	if dir == "" {
		home, _ := os.UserHomeDir()
		dir = filepath.Join(home, ".cache", "infergate", "k8s-schemas", "v"+version)
	}
	// The stamp deploy-check.sh writes: sha256 of the generator and the
	// chart CRDs, first 16 hex digits.
	crd := filepath.Join(root, "deploy", "helm", "infergate-tier1", "files", "inferencepool-crd.yaml")
	h := sha256.New()
	for _, f := range []string{filepath.Join(root, "deploy", "tools", "k8sschema", "main.go"), crd} {
		b, err := os.ReadFile(f)
		if err != nil {
			return "", err
		}
		h.Write(b)
	}
	stamp := hex.EncodeToString(h.Sum(nil))[:16]
	if b, err := os.ReadFile(filepath.Join(dir, ".generated")); err == nil && strings.TrimSpace(string(b)) == stamp {
		return dir, nil
	}
	// Outside any module, so the main go.mod is never touched.
	tmp, err := os.MkdirTemp("", "k8sschema-mod")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(tmp)
	dl := exec.Command("go", "mod", "download", "-json", "k8s.io/kubernetes@v"+version)
	dl.Dir = tmp
	dl.Env = append(os.Environ(), "GOFLAGS=-mod=mod")
	out, err := dl.Output()
	if err != nil {
		return "", fmt.Errorf("go mod download k8s.io/kubernetes@v%s: %w", version, err)
	}
	var mod struct{ Dir string }
	if err := json.Unmarshal(out, &mod); err != nil || mod.Dir == "" {
		return "", fmt.Errorf("go mod download: %v (%s)", err, out)
	}
	gen := exec.Command("go", "run", "./deploy/tools/k8sschema", "-swagger", filepath.Join(mod.Dir, "api", "openapi-spec", "swagger.json"),
		"-out", dir+".tmp", "-crd", crd)
	gen.Dir = root
	os.RemoveAll(dir + ".tmp")
	if out, err := gen.CombinedOutput(); err != nil {
		return "", fmt.Errorf("k8sschema: %v\n%s", err, out)
	}
	if err := os.WriteFile(filepath.Join(dir+".tmp", ".generated"), []byte(stamp+"\n"), 0o644); err != nil {
		return "", err
	}
	os.RemoveAll(dir)
	return dir, os.Rename(dir+".tmp", dir)
}

// kubeconform validates manifests strictly, as scripts/deploy-check.sh
// does. Every kind the charts render has a schema (the cert-manager
// Certificate a minimal hand-written one from deploy/tools/k8sschema), so
// nothing is skipped.
func kubeconform(t *testing.T, manifests string) (string, error) {
	t.Helper()
	dir := k8sSchemas(t)
	bin := filepath.Join(toolsBin(), "kubeconform")
	if _, err := exec.LookPath(bin); err != nil {
		bin = "kubeconform"
	}
	cmd := exec.Command(bin, "-strict", "-summary", "-schema-location", dir+"/{{ .ResourceKind }}{{ .KindSuffix }}.json")
	cmd.Stdin = strings.NewReader(manifests)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

func needTools(t *testing.T, tools ...string) {
	t.Helper()
	for _, tool := range tools {
		if !findTool(tool) {
			msg := tool + " not installed (run scripts/deploy-tools.sh)"
			if os.Getenv("CI") != "" {
				t.Fatal(msg)
			}
			t.Skip(msg)
		}
	}
}

// --- what a rendered Deployment mounts ---------------------------------

type mount struct {
	dir, secret string
	mode        any
}

// deployment returns the only Deployment's container, its TLS mounts
// (volume name tls-*) by name, and its pod template.
func deployment(t *testing.T, docs map[string][]map[string]any) (map[string]any, map[string]mount, map[string]any) {
	t.Helper()
	if len(docs["Deployment"]) != 1 {
		t.Fatalf("%d Deployments", len(docs["Deployment"]))
	}
	pod := dig(docs["Deployment"][0], "spec", "template").(map[string]any)
	containers := dig(pod, "spec", "containers").([]any)
	if len(containers) != 1 {
		t.Fatalf("%d containers", len(containers))
	}
	c := containers[0].(map[string]any)
	secrets := map[string]map[string]any{}
	vols, _ := dig(pod, "spec", "volumes").([]any)
	for _, v := range vols {
		if s, ok := dig(v, "secret").(map[string]any); ok {
			secrets[dig(v, "name").(string)] = s
		}
	}
	mounts := map[string]mount{}
	vms, _ := dig(c, "volumeMounts").([]any)
	for _, vm := range vms {
		name := dig(vm, "name").(string)
		if !strings.HasPrefix(name, "tls-") {
			continue
		}
		if dig(vm, "readOnly") != true || dig(vm, "subPath") != nil {
			t.Errorf("mount %s: readOnly %v subPath %v (a subPath mount never sees a rotated Secret)", name, dig(vm, "readOnly"), dig(vm, "subPath"))
		}
		s := secrets[name]
		if s == nil {
			t.Errorf("mount %s has no Secret volume", name)
			continue
		}
		mounts[name] = mount{dir: dig(vm, "mountPath").(string), secret: s["secretName"].(string), mode: s["defaultMode"]}
	}
	return c, mounts, pod
}

// checkFiles checks that each path lies directly in the mount named by
// want[path] and is a key of a kubernetes.io/tls Secret.
func checkFiles(t *testing.T, mounts map[string]mount, want map[string]string) {
	t.Helper()
	for p, mountName := range want {
		m, ok := mounts[mountName]
		if !ok {
			t.Errorf("%s: no mount %s (mounts %v)", p, mountName, mounts)
			continue
		}
		if path.Dir(p) != m.dir || !slices.Contains([]string{"tls.crt", "tls.key", "ca.crt"}, path.Base(p)) {
			t.Errorf("%s is not tls.crt, tls.key or ca.crt in %s's mount %s", p, mountName, m.dir)
		}
		if m.mode != 288 { // 0440
			t.Errorf("mount %s: defaultMode %v, want 0440", mountName, m.mode)
		}
	}
}

// checkNoTLSChecksum: rotation is the binary's file reload, never a
// restart, so no pod annotation follows the TLS Secrets.
func checkNoTLSChecksum(t *testing.T, pod map[string]any) {
	t.Helper()
	for k := range dig(pod, "metadata", "annotations").(map[string]any) {
		if strings.HasPrefix(k, "checksum/") && k != "checksum/config" {
			t.Errorf("pod annotation %s restarts pods on a Secret change", k)
		}
	}
}

// --- NetworkPolicy -----------------------------------------------------

// ingressByPort returns, per TCP port, the rule's from list (nil: from
// anywhere) and fails when a port has two rules or a rule several ports.
func ingressByPort(t *testing.T, np map[string]any) map[int][]any {
	t.Helper()
	out := map[int][]any{}
	rules, _ := dig(np, "spec", "ingress").([]any)
	for _, r := range rules {
		ports := dig(r, "ports").([]any)
		if len(ports) != 1 || dig(ports[0], "protocol") != "TCP" {
			t.Errorf("ingress rule ports %v, want one TCP port", ports)
			continue
		}
		p := dig(ports[0], "port").(int)
		if _, dup := out[p]; dup {
			t.Errorf("two ingress rules for port %d", p)
		}
		from, has := r.(map[string]any)["from"]
		if has && (from == nil || len(from.([]any)) == 0) {
			t.Errorf("port %d: an empty from list (means anywhere)", p)
		}
		if has {
			out[p] = from.([]any)
		} else {
			out[p] = nil
		}
	}
	return out
}

func asYAML(v any) string {
	b, _ := yaml.Marshal(v)
	return string(b)
}

// --- Tier 1 ------------------------------------------------------------

func tier1Config(t *testing.T, docs map[string][]map[string]any) (tier1config.Config, map[string]any) {
	t.Helper()
	for _, cm := range docs["ConfigMap"] {
		if s, ok := dig(cm, "data", "tier1.yaml").(string); ok {
			var raw map[string]any
			if err := yaml.Unmarshal([]byte(s), &raw); err != nil {
				t.Fatal(err)
			}
			checkYAMLKeys(t, configkeys.Of(reflect.TypeFor[tier1config.Config]()), raw, "tier1.yaml")
			var cfg tier1config.Config
			if err := config.Decode("rendered tier1.yaml", []byte(s), &cfg); err != nil {
				t.Errorf("rendered tier1.yaml: %v\n%s", err, s)
			}
			return cfg, raw
		}
	}
	t.Fatal("no tier1.yaml ConfigMap")
	return tier1config.Config{}, nil
}

var tier1TLSValues = []string{
	"--set", "tls.enabled=true",
	"--set", "tls.clientAuth=require",
	"--set", "tls.certManager.enabled=true",
	"--set", "tls.certManager.issuerRef.name=infergate-ca",
	"--set", "tls.certManager.issuerRef.kind=ClusterIssuer",
	"--set", "tls.certManager.dnsNames={tier1.use1.internal.example.com}",
	"--set", "tls.metrics.enabled=true",
	"--set", "tls.metrics.clientAuth=require",
	"--set", "extProc.enabled=true",
	"--set", "tls.extProc.enabled=true",
	"--set", "tls.upstream.enabled=true",
	"--set", "tls.upstream.clientCert=true",
	"--set", "tls.upstream.serverName=vllm.llm.svc",
	"--set", "peers.tls.certManager.enabled=true",
	"--set", "peers.tls.certManager.issuerRef.name=infergate-mesh",
	"--set", "serviceMonitor.enabled=true",
}

// TestTier1ChartTLS renders Tier 1 with TLS on every listener from
// cert-manager, mutual TLS required on the API, HTTPS to the model
// servers, the mesh certificate from a mesh issuer and the NetworkPolicy,
// and follows each setting to where it takes effect.
func TestTier1ChartTLS(t *testing.T) {
	needTools(t, "helm")
	raw, docs := mustRender(t, "infergate-tier1", "llm", tier1TLSValues...)
	cfg, rawCfg := tier1Config(t, docs)
	c, mounts, pod := deployment(t, docs)
	const secret, meshSecret = "t-infergate-tier1-tls", "t-infergate-tier1-peers-tls"

	// The Secrets are mounted, and the config's paths point into them.
	for name, want := range map[string]string{"tls-api": secret, "tls-metrics": secret, "tls-ext-proc": secret, "tls-upstream": secret, "tls-peers": meshSecret} {
		if mounts[name].secret != want {
			t.Errorf("mount %s: Secret %q, want %q", name, mounts[name].secret, want)
		}
	}
	if len(mounts) != 5 {
		t.Errorf("TLS mounts %v", mounts)
	}
	checkFiles(t, mounts, map[string]string{
		cfg.TLS.CertFile: "tls-api", cfg.TLS.KeyFile: "tls-api", cfg.TLS.ClientCAFile: "tls-api",
		cfg.MetricsTLS.CertFile: "tls-metrics", cfg.MetricsTLS.KeyFile: "tls-metrics", cfg.MetricsTLS.ClientCAFile: "tls-metrics",
		cfg.ExtProcTLS.CertFile: "tls-ext-proc", cfg.ExtProcTLS.KeyFile: "tls-ext-proc",
		cfg.Upstream.TLS.CAFile: "tls-upstream", cfg.Upstream.TLS.CertFile: "tls-upstream", cfg.Upstream.TLS.KeyFile: "tls-upstream",
		cfg.Peers.TLS.CertFile: "tls-peers", cfg.Peers.TLS.KeyFile: "tls-peers", cfg.Peers.TLS.CAFile: "tls-peers",
	})
	if cfg.TLS.ClientAuth != "require" || cfg.TLS.MinVersion != "1.3" || cfg.MetricsTLS.ClientAuth != "require" ||
		cfg.ExtProcTLS.ClientCAFile != "" || cfg.Upstream.Scheme != "https" || cfg.Upstream.TLS.ServerName != "vllm.llm.svc" {
		t.Errorf("TLS config: tls %+v metrics_tls %+v ext_proc_tls %+v upstream %+v", cfg.TLS, cfg.MetricsTLS, cfg.ExtProcTLS, cfg.Upstream)
	}
	if sn := cfg.Peers.TLS.ServerName; sn != "t-infergate-tier1-peers.llm.svc.cluster.local" {
		t.Errorf("peers.tls.server_name %q", sn)
	}
	if _, ok := rawCfg["peers"].(map[string]any)["token_env"]; ok {
		t.Error("config.peers still carries token_env")
	}
	checkNoTLSChecksum(t, pod)

	// Client certificates required: the kubelet (which has none) checks
	// the API port over TCP.
	for _, probe := range []string{"livenessProbe", "readinessProbe"} {
		p := c[probe].(map[string]any)
		if p["httpGet"] != nil || dig(p, "tcpSocket", "port") != "http" {
			t.Errorf("%s: %v", probe, p)
		}
	}

	// cert-manager: one Certificate for the Services, one for the mesh.
	certs := docs["Certificate"]
	if len(certs) != 2 {
		t.Fatalf("%d Certificates", len(certs))
	}
	api := named(certs, "t-infergate-tier1")
	if api == nil || dig(api, "apiVersion") != "cert-manager.io/v1" || dig(api, "spec", "secretName") != secret {
		t.Fatalf("Certificate t-infergate-tier1: %v", api)
	}
	if ref := dig(api, "spec", "issuerRef"); !reflect.DeepEqual(ref, map[string]any{"name": "infergate-ca", "kind": "ClusterIssuer", "group": "cert-manager.io"}) {
		t.Errorf("issuerRef %v", ref)
	}
	dns := dig(api, "spec", "dnsNames").([]any)
	for _, want := range []string{
		"t-infergate-tier1", "t-infergate-tier1.llm.svc", "t-infergate-tier1.llm.svc.cluster.local",
		"t-infergate-tier1-metrics.llm.svc", "t-infergate-tier1-epp.llm.svc", "tier1.use1.internal.example.com",
	} {
		if !slices.Contains(dns, any(want)) {
			t.Errorf("Certificate dnsNames %v lack %s", dns, want)
		}
	}
	if u := dig(api, "spec", "usages").([]any); !slices.Contains(u, any("server auth")) || !slices.Contains(u, any("client auth")) {
		t.Errorf("usages %v", u)
	}
	if dig(api, "spec", "privateKey", "rotationPolicy") != "Always" {
		t.Errorf("privateKey %v", dig(api, "spec", "privateKey"))
	}
	mesh := named(certs, "t-infergate-tier1-peers")
	if mesh == nil || dig(mesh, "spec", "secretName") != meshSecret || dig(mesh, "spec", "issuerRef", "name") != "infergate-mesh" {
		t.Fatalf("mesh Certificate: %v", mesh)
	}
	if dns := dig(mesh, "spec", "dnsNames").([]any); !slices.Contains(dns, any(cfg.Peers.TLS.ServerName)) {
		t.Errorf("mesh Certificate dnsNames %v lack the name peers verify, %s", dns, cfg.Peers.TLS.ServerName)
	}
	if u := dig(mesh, "spec", "usages").([]any); !slices.Contains(u, any("server auth")) || !slices.Contains(u, any("client auth")) {
		t.Errorf("mesh usages %v", u)
	}
	if s := named(docs["Secret"], meshSecret); s != nil {
		t.Error("the chart generated the mesh Secret although cert-manager writes it")
	}

	// Prometheus scrapes https, verifying with the Secret's CA and
	// presenting its certificate (the listener requires one).
	ep := dig(docs["ServiceMonitor"][0], "spec", "endpoints").([]any)[0]
	if dig(ep, "scheme") != "https" || dig(ep, "tlsConfig", "ca", "secret", "name") != secret ||
		dig(ep, "tlsConfig", "cert", "secret", "key") != "tls.crt" || dig(ep, "tlsConfig", "keySecret", "key") != "tls.key" ||
		dig(ep, "tlsConfig", "serverName") != "t-infergate-tier1-metrics.llm.svc" {
		t.Errorf("ServiceMonitor endpoint %v", ep)
	}
	if !slices.Contains(dns, any(dig(ep, "tlsConfig", "serverName"))) {
		t.Error("the ServiceMonitor's serverName is not in the certificate")
	}
	// The ext_proc Service no longer claims plaintext HTTP/2.
	if epp := named(docs["Service"], "t-infergate-tier1-epp"); dig(epp, "spec", "ports").([]any)[0].(map[string]any)["appProtocol"] != nil {
		t.Errorf("epp Service appProtocol with TLS: %v", dig(epp, "spec", "ports"))
	}

	// NetworkPolicy: each port only from its sources.
	if len(docs["NetworkPolicy"]) != 1 {
		t.Fatalf("%d NetworkPolicies", len(docs["NetworkPolicy"]))
	}
	np := docs["NetworkPolicy"][0]
	sel := dig(docs["Deployment"][0], "spec", "selector", "matchLabels")
	if !reflect.DeepEqual(dig(np, "spec", "podSelector", "matchLabels"), sel) {
		t.Errorf("NetworkPolicy selects %v, Deployment %v", dig(np, "spec", "podSelector"), sel)
	}
	if pt := dig(np, "spec", "policyTypes"); !reflect.DeepEqual(pt, []any{"Ingress"}) {
		t.Errorf("policyTypes %v", pt)
	}
	ports := ingressByPort(t, np)
	want := map[int]string{
		8080: asYAML([]any{map[string]any{"podSelector": map[string]any{}}}),
		9090: asYAML([]any{map[string]any{"namespaceSelector": map[string]any{"matchLabels": map[string]any{"kubernetes.io/metadata.name": "monitoring"}}}}),
		9002: asYAML([]any{map[string]any{"namespaceSelector": map[string]any{"matchLabels": map[string]any{"kubernetes.io/metadata.name": "envoy-gateway-system"}}}}),
		7946: asYAML([]any{map[string]any{"podSelector": map[string]any{"matchLabels": sel}}}),
	}
	if len(ports) != len(want) {
		t.Errorf("ingress ports %v, want %v", ports, want)
	}
	for p, w := range want {
		if got := asYAML(ports[p]); got != w {
			t.Errorf("port %d from:\n%s\nwant:\n%s", p, got, w)
		}
	}
	// Every container port is one the policy names.
	for _, cp := range c["ports"].([]any) {
		if _, ok := ports[dig(cp, "containerPort").(int)]; !ok {
			t.Errorf("container port %v has no ingress rule", cp)
		}
	}

	needTools(t, "kubeconform")
	if out, err := kubeconform(t, raw); err != nil {
		t.Errorf("kubeconform: %v\n%s", err, out)
	}
	// The Certificate schema is strict: a misspelt field fails.
	bad := strings.Replace(raw, "\n  usages:\n", "\n  usage:\n", 1)
	if bad == raw {
		t.Fatal("no usages in the rendered Certificates")
	}
	if out, err := kubeconform(t, bad); err == nil {
		t.Errorf("kubeconform accepts a Certificate with spec.usage:\n%s", out)
	}
}

// TestTier1ChartMeshGenerated: without cert-manager or an existing Secret
// the chart generates the mesh CA and certificate, and two replicas holding
// that Secret complete a mutual TLS handshake with the paths the config
// names, verifying the name the config sets; a client without a
// certificate from the mesh CA is refused.
func TestTier1ChartMeshGenerated(t *testing.T) {
	needTools(t, "helm")
	_, docs := mustRender(t, "infergate-tier1", "llm")
	cfg, _ := tier1Config(t, docs)
	_, mounts, pod := deployment(t, docs)
	checkNoTLSChecksum(t, pod)
	s := named(docs["Secret"], "t-infergate-tier1-peers-tls")
	if s == nil || s["type"] != "kubernetes.io/tls" || dig(s, "metadata", "annotations", "helm.sh/resource-policy") != "keep" {
		t.Fatalf("generated mesh Secret: %v", s)
	}
	if mounts["tls-peers"].secret != "t-infergate-tier1-peers-tls" || len(mounts) != 1 {
		t.Errorf("TLS mounts %v", mounts)
	}
	checkFiles(t, mounts, map[string]string{cfg.Peers.TLS.CertFile: "tls-peers", cfg.Peers.TLS.KeyFile: "tls-peers", cfg.Peers.TLS.CAFile: "tls-peers"})
	if cfg.TLS.Enabled() || cfg.MetricsTLS.Enabled() || len(docs["Certificate"]) != 0 {
		t.Errorf("TLS beyond the mesh by default: tls %+v metrics_tls %+v, %d Certificates", cfg.TLS, cfg.MetricsTLS, len(docs["Certificate"]))
	}

	// Write the Secret's files where the config says they are (moved under
	// a temporary directory) and run the handshake with infergate's own
	// TLS loader.
	dir := t.TempDir()
	move := func(p string) string { return filepath.Join(dir, filepath.Base(p)) }
	for k, b64 := range s["data"].(map[string]any) {
		b, err := base64.StdEncoding.DecodeString(b64.(string))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, k), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	pt := cfg.Peers.TLS
	ctx := context.Background()
	srv, err := tlsfiles.NewServer(ctx, tlsfiles.Server{CertFile: move(pt.CertFile), KeyFile: move(pt.KeyFile), ClientCAFile: move(pt.CAFile), ClientAuth: "require"}, tlsfiles.Options{Interval: -1})
	if err != nil {
		t.Fatal(err)
	}
	cli, err := tlsfiles.NewClient(ctx, tlsfiles.Client{CAFile: move(pt.CAFile), CertFile: move(pt.CertFile), KeyFile: move(pt.KeyFile), ServerName: pt.ServerName}, tlsfiles.Options{Interval: -1})
	if err != nil {
		t.Fatal(err)
	}
	handshake := func(clientConf *tls.Config) (peerCerts int, err error) {
		a, b := net.Pipe()
		defer a.Close()
		defer b.Close()
		sc := tls.Server(a, srv.Config())
		done := make(chan error, 1)
		go func() {
			err := sc.Handshake()
			if err == nil {
				peerCerts = len(sc.ConnectionState().PeerCertificates)
			}
			a.Close()
			done <- err
		}()
		cerr := tls.Client(b, clientConf).Handshake()
		b.Close()
		serr := <-done
		return peerCerts, errors.Join(cerr, serr)
	}
	if n, err := handshake(cli.Config()); err != nil || n != 1 {
		t.Fatalf("mesh handshake: %v (client certificates seen %d)", err, n)
	}
	// A client without a certificate is refused.
	pool := x509.NewCertPool()
	ca, _ := os.ReadFile(move(pt.CAFile))
	pool.AppendCertsFromPEM(ca)
	if _, err := handshake(&tls.Config{RootCAs: pool, ServerName: pt.ServerName, MinVersion: tls.VersionTLS13}); err == nil {
		t.Error("a peer without a client certificate completed the handshake")
	}

	// An existing Secret replaces the generated one.
	_, docs = mustRender(t, "infergate-tier1", "llm", "--set", "peers.tls.secretName=mesh-from-vault")
	if _, mounts, _ := deployment(t, docs); mounts["tls-peers"].secret != "mesh-from-vault" {
		t.Errorf("peers.tls.secretName: mounts %v", mounts)
	}
	if named(docs["Secret"], "t-infergate-tier1-peers-tls") != nil || len(docs["Certificate"]) != 0 {
		t.Error("a mesh Secret or Certificate rendered besides peers.tls.secretName")
	}
	// No mesh, no certificate.
	raw, docs := mustRender(t, "infergate-tier1", "llm", "--set", "replicaCount=1")
	if _, mounts, _ := deployment(t, docs); len(mounts) != 0 || strings.Contains(raw, "peers-tls") {
		t.Errorf("replicaCount=1: mounts %v", mounts)
	}
}

// TestTier1ChartTLSDefaults: without tls values the listeners are plain,
// the probes plain HTTP, and the NetworkPolicy is on with its defaults;
// verify_if_given keeps HTTP probes working, over HTTPS.
func TestTier1ChartTLSDefaults(t *testing.T) {
	needTools(t, "helm")
	_, docs := mustRender(t, "infergate-tier1", "llm")
	c, _, _ := deployment(t, docs)
	if p := c["readinessProbe"].(map[string]any); dig(p, "httpGet", "scheme") != nil || dig(p, "httpGet", "path") != "/ready" {
		t.Errorf("default readinessProbe %v", p)
	}
	np := docs["NetworkPolicy"]
	if len(np) != 1 {
		t.Fatalf("%d NetworkPolicies by default", len(np))
	}
	ports := ingressByPort(t, np[0])
	if _, ok := ports[9002]; ok {
		t.Error("ext_proc port open without extProc.enabled")
	}
	if len(ports) != 3 {
		t.Errorf("default ingress ports %v", ports)
	}

	_, docs = mustRender(t, "infergate-tier1", "llm", "--set", "tls.enabled=true", "--set", "tls.secretName=tier1-tls")
	c, mounts, _ := deployment(t, docs)
	cfg, _ := tier1Config(t, docs)
	if p := c["readinessProbe"].(map[string]any); dig(p, "httpGet", "scheme") != "HTTPS" || dig(p, "httpGet", "path") != "/ready" {
		t.Errorf("verify_if_given readinessProbe %v", p)
	}
	if mounts["tls-api"].secret != "tier1-tls" || cfg.TLS.ClientAuth != "verify_if_given" || len(docs["Certificate"]) != 0 {
		t.Errorf("existing Secret: mounts %v tls %+v Certificates %d", mounts, cfg.TLS, len(docs["Certificate"]))
	}

	// allowAll, egress, and a closed port.
	_, docs = mustRender(t, "infergate-tier1", "llm", "--set", "networkPolicy.api.allowAll=true", "--set", "networkPolicy.metrics.from=null",
		"--set", "networkPolicy.egress.enabled=true", "--set-json", `networkPolicy.egress.rules=[{"to":[{"ipBlock":{"cidr":"10.100.0.1/32"}}],"ports":[{"port":443,"protocol":"TCP"}]}]`)
	np0 := docs["NetworkPolicy"][0]
	ports = ingressByPort(t, np0)
	if from, ok := ports[8080]; !ok || from != nil {
		t.Errorf("allowAll: port 8080 from %v (present %v)", from, ok)
	}
	if _, ok := ports[9090]; ok {
		t.Error("metrics port open with an empty from list")
	}
	if pt := dig(np0, "spec", "policyTypes"); !reflect.DeepEqual(pt, []any{"Ingress", "Egress"}) {
		t.Errorf("policyTypes %v", pt)
	}
	egress := asYAML(dig(np0, "spec", "egress"))
	for _, want := range []string{"k8s-app: kube-dns", "port: 53", "port: 7946", "cidr: 10.100.0.1/32"} {
		if !strings.Contains(egress, want) {
			t.Errorf("egress lacks %q:\n%s", want, egress)
		}
	}

	_, docs = mustRender(t, "infergate-tier1", "llm", "--set", "networkPolicy.enabled=false")
	if len(docs["NetworkPolicy"]) != 0 {
		t.Error("networkPolicy.enabled=false renders one")
	}
}

// TestChartTLSValuesRejected: settings that cannot work fail at render
// with the value to fix, and the schema rejects misspelt keys and bad
// values in the TLS and NetworkPolicy blocks.
func TestChartTLSValuesRejected(t *testing.T) {
	needTools(t, "helm")
	for _, tt := range []struct {
		chart string
		args  []string
		want  string
	}{
		{"infergate-tier1", []string{"--set", "tls.enabled=true"}, "tls.secretName"},
		{"infergate-tier1", []string{"--set", "tls.metrics.enabled=true"}, "tls.metrics.enabled needs a certificate"},
		{"infergate-tier1", []string{"--set", "tls.certManager.enabled=true"}, "issuerRef.name"},
		{"infergate-tier1", []string{"--set", "tls.extProc.enabled=true", "--set", "tls.secretName=x"}, "needs extProc.enabled"},
		{"infergate-tier1", []string{"--set", "peers.tls.certManager.enabled=true"}, "peers.tls.certManager.issuerRef.name"},
		{"infergate-tier1", []string{"--set", "tls.certManger.enabled=true"}, "certManger"},
		{"infergate-tier1", []string{"--set", "tls.clientAuth=always"}, "clientAuth"},
		{"infergate-tier1", []string{"--set", "tls.minVersion=1.1"}, "minVersion"},
		{"infergate-tier1", []string{"--set", "peers.tls.secretname=x"}, "secretname"},
		{"infergate-tier1", []string{"--set", "tls.upstream.caSecret=x"}, "caSecret"},
		{"infergate-tier1", []string{"--set-json", `networkPolicy.api.form=[{"podSelector":{}}]`}, "form"},
		{"infergate-tier1", []string{"--set-json", `networkPolicy.api.from=[{"podselector":{}}]`}, "podselector"},
		{"infergate-tier2", []string{"--set", "tls.enabled=true"}, "tls.secretName"},
		{"infergate-tier2", []string{"--set", "tls.tier1.enabled=true"}, "tls.tier1.secretName"},
		{"infergate-tier2", []string{"--set", "tls.tier1.certManager.enabled=true", "--set", "tls.tier1.enabled=true"}, "tls.tier1.certManager.issuerRef.name"},
		{"infergate-tier2", []string{"--set", "tls.admin.clientAuth=yes"}, "clientAuth"},
		{"infergate-tier2", []string{"--set", "tls.tier1.serverNmae=x"}, "serverNmae"},
		{"infergate-tier2", []string{"--set", "networkPolicy.admin.allowall=true"}, "allowall"},
	} {
		out, _, err := render(t, tt.chart, "llm", tt.args...)
		if err == nil {
			t.Errorf("%s %v: rendered", tt.chart, tt.args)
		} else if !strings.Contains(out, tt.want) {
			t.Errorf("%s %v: error does not say %q:\n%s", tt.chart, tt.args, tt.want, out)
		}
	}
}

// --- Tier 2 ------------------------------------------------------------

// TestTier2ChartTLS renders Tier 2 with TLS on the front door (existing
// Secret), the admin listener requiring client certificates (its own
// Secret), metrics over TLS, a cert-manager client certificate for mutual
// TLS to Tier 1, and the NetworkPolicy.
func TestTier2ChartTLS(t *testing.T) {
	needTools(t, "helm")
	raw, docs := mustRender(t, "infergate-tier2", "infergate",
		"--set", "tls.enabled=true", "--set", "tls.secretName=tier2-tls",
		"--set", "tls.admin.enabled=true", "--set", "tls.admin.secretName=tier2-admin-tls", "--set", "tls.admin.clientAuth=require",
		"--set", "tls.metrics.enabled=true",
		"--set", "tls.tier1.enabled=true", "--set", "tls.tier1.serverName=tier1.use1.internal.example.com",
		"--set", "tls.tier1.certManager.enabled=true", "--set", "tls.tier1.certManager.issuerRef.name=infergate-ca",
		"--set", "tier1Auth.existingSecret=tier1-client-token",
		"--set", "serviceMonitor.enabled=true",
		"--set-json", `networkPolicy.admin.from=[{"ipBlock":{"cidr":"10.0.42.0/24"}}]`,
	)
	var cfg tier2Fields
	var rawCfg map[string]any
	for _, cm := range docs["ConfigMap"] {
		if s, ok := dig(cm, "data", "tier2.yaml").(string); ok {
			if err := config.Decode("rendered tier2.yaml", []byte(s), &cfg); err != nil {
				t.Fatalf("%v\n%s", err, s)
			}
			_ = yaml.Unmarshal([]byte(s), &rawCfg)
		}
	}
	checkYAMLKeys(t, configkeys.Of(reflect.TypeFor[server.Config]()), rawCfg, "tier2.yaml")
	c, mounts, pod := deployment(t, docs)
	checkNoTLSChecksum(t, pod)
	for name, want := range map[string]string{"tls-api": "tier2-tls", "tls-admin": "tier2-admin-tls", "tls-metrics": "tier2-tls", "tls-tier1": "t-infergate-tier2-tier1-client"} {
		if mounts[name].secret != want {
			t.Errorf("mount %s: Secret %q, want %q", name, mounts[name].secret, want)
		}
	}
	checkFiles(t, mounts, map[string]string{
		cfg.TLS.CertFile: "tls-api", cfg.TLS.KeyFile: "tls-api",
		cfg.Admin.TLS.CertFile: "tls-admin", cfg.Admin.TLS.KeyFile: "tls-admin", cfg.Admin.TLS.ClientCAFile: "tls-admin",
		cfg.Metrics.TLS.CertFile: "tls-metrics", cfg.Metrics.TLS.KeyFile: "tls-metrics",
		cfg.Tier1.TLS.CAFile: "tls-tier1", cfg.Tier1.TLS.CertFile: "tls-tier1", cfg.Tier1.TLS.KeyFile: "tls-tier1",
	})
	if cfg.TLS.ClientCAFile != "" || cfg.Admin.TLS.ClientAuth != "require" || cfg.Tier1.TLS.ServerName != "tier1.use1.internal.example.com" ||
		cfg.Tier1.TokenEnv != "INFERGATE_TIER1_TOKEN" {
		t.Errorf("tls %+v admin.tls %+v tier1 %+v", cfg.TLS, cfg.Admin.TLS, cfg.Tier1)
	}
	if p := c["livenessProbe"].(map[string]any); dig(p, "httpGet", "scheme") != "HTTPS" {
		t.Errorf("livenessProbe %v", p)
	}

	// Only the Tier 1 client certificate comes from cert-manager: usage
	// client auth, not server auth.
	if len(docs["Certificate"]) != 1 {
		t.Fatalf("%d Certificates", len(docs["Certificate"]))
	}
	cc := docs["Certificate"][0]
	if dig(cc, "metadata", "name") != "t-infergate-tier2-tier1-client" || dig(cc, "spec", "secretName") != "t-infergate-tier2-tier1-client" ||
		dig(cc, "spec", "issuerRef", "name") != "infergate-ca" {
		t.Errorf("client Certificate %v", cc)
	}
	if u := dig(cc, "spec", "usages").([]any); !slices.Contains(u, any("client auth")) || slices.Contains(u, any("server auth")) {
		t.Errorf("client Certificate usages %v", u)
	}
	ep := dig(docs["ServiceMonitor"][0], "spec", "endpoints").([]any)[0]
	if dig(ep, "scheme") != "https" || dig(ep, "tlsConfig", "ca", "secret", "name") != "tier2-tls" || dig(ep, "tlsConfig", "cert") != nil {
		t.Errorf("ServiceMonitor endpoint %v", ep)
	}

	// NetworkPolicy: the API from anywhere, admin from its allow-list,
	// metrics from the monitoring namespace.
	ports := ingressByPort(t, docs["NetworkPolicy"][0])
	if from, ok := ports[8080]; !ok || from != nil {
		t.Errorf("API port: from %v (rule present %v), want anywhere", from, ok)
	}
	if got := asYAML(ports[8081]); got != asYAML([]any{map[string]any{"ipBlock": map[string]any{"cidr": "10.0.42.0/24"}}}) {
		t.Errorf("admin port from %s", got)
	}
	if got := asYAML(ports[9464]); !strings.Contains(got, "kubernetes.io/metadata.name: monitoring") {
		t.Errorf("metrics port from %s", got)
	}
	if len(ports) != 3 {
		t.Errorf("ingress ports %v", ports)
	}

	needTools(t, "kubeconform")
	if out, err := kubeconform(t, raw); err != nil {
		t.Errorf("kubeconform: %v\n%s", err, out)
	}

	// With cert-manager for the listeners and client certificates
	// required at the front door: the Service names, server and client
	// auth, TCP probes; the admin port closed by default.
	_, docs = mustRender(t, "infergate-tier2", "infergate", "--set", "tls.enabled=true", "--set", "tls.clientAuth=require",
		"--set", "tls.certManager.enabled=true", "--set", "tls.certManager.issuerRef.name=letsencrypt",
		"--set", "tls.certManager.dnsNames={api.infergate.example.com}")
	c, mounts, _ = deployment(t, docs)
	if mounts["tls-api"].secret != "t-infergate-tier2-tls" {
		t.Errorf("mounts %v", mounts)
	}
	if p := c["readinessProbe"].(map[string]any); p["httpGet"] != nil || dig(p, "tcpSocket", "port") != "http" {
		t.Errorf("readinessProbe with client certificates required: %v", p)
	}
	crt := named(docs["Certificate"], "t-infergate-tier2")
	dns := dig(crt, "spec", "dnsNames").([]any)
	for _, want := range []string{"api.infergate.example.com", "t-infergate-tier2.infergate.svc", "t-infergate-tier2-admin.infergate.svc.cluster.local"} {
		if !slices.Contains(dns, any(want)) {
			t.Errorf("dnsNames %v lack %s", dns, want)
		}
	}
	if u := dig(crt, "spec", "usages").([]any); !slices.Contains(u, any("server auth")) || !slices.Contains(u, any("client auth")) {
		t.Errorf("usages %v", u)
	}
	if _, open := ingressByPort(t, docs["NetworkPolicy"][0])[8081]; open {
		t.Error("admin port open by default")
	}
}
