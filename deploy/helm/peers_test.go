package helm

import (
	"bytes"
	"encoding/base64"
	"errors"
	"io"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"

	"github.com/infergate/infergate/shared/config"
	tier1config "github.com/infergate/infergate/tier1/config"
)

// helmTemplateRaw renders the Tier 1 chart as release "t" in namespace
// "llm" and returns the raw output and the documents by kind.
func helmTemplateRaw(t *testing.T, args ...string) (string, map[string][]map[string]any, error) {
	t.Helper()
	helm := filepath.Join(toolsBin(), "helm")
	if _, err := exec.LookPath(helm); err != nil {
		helm = "helm"
	}
	cmdArgs := append([]string{"template", "t", "infergate-tier1", "--namespace", "llm"}, args...)
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

// peersRender is what the chart renders for replica state sharing.
type peersRender struct {
	raw       string
	cfg       tier1config.Config
	service   map[string]any // <fullname>-peers, nil if absent
	secret    map[string]any // <fullname>-peers-token, nil if absent
	port      map[string]any // container port "peers", nil if absent
	env       map[string]any // INFERGATE_PEERS_HASH_KEY, nil if absent
	selector  any            // the Deployment's spec.selector.matchLabels
	deployEnv []any
}

func renderPeers(t *testing.T, args ...string) peersRender {
	t.Helper()
	raw, docs, err := helmTemplateRaw(t, args...)
	if err != nil {
		t.Fatalf("helm template %v: %v\n%s", args, err, raw)
	}
	r := peersRender{raw: raw}
	n := 0
	for _, cm := range docs["ConfigMap"] {
		s, ok := dig(cm, "data", "tier1.yaml").(string)
		if !ok {
			continue
		}
		n++
		// Strict decoding and Validate, as Tier 1 does at start.
		if err := config.Decode("rendered tier1.yaml", []byte(s), &r.cfg); err != nil {
			t.Fatalf("helm template %v: %v\n%s", args, err, s)
		}
	}
	if n != 1 {
		t.Fatalf("helm template %v: %d ConfigMaps with tier1.yaml", args, n)
	}
	for _, svc := range docs["Service"] {
		if dig(svc, "metadata", "name") == "t-infergate-tier1-peers" {
			r.service = svc
		}
	}
	for _, sec := range docs["Secret"] {
		if dig(sec, "metadata", "name") == "t-infergate-tier1-peers-token" {
			r.secret = sec
		}
	}
	if len(docs["Deployment"]) != 1 {
		t.Fatalf("helm template %v: %d Deployments", args, len(docs["Deployment"]))
	}
	dep := docs["Deployment"][0]
	r.selector = dig(dep, "spec", "selector", "matchLabels")
	containers, _ := dig(dep, "spec", "template", "spec", "containers").([]any)
	if len(containers) != 1 {
		t.Fatalf("helm template %v: %d containers", args, len(containers))
	}
	c := containers[0]
	ports, _ := dig(c, "ports").([]any)
	for _, p := range ports {
		if dig(p, "name") == "peers" {
			r.port = p.(map[string]any)
		}
	}
	r.deployEnv, _ = dig(c, "env").([]any)
	for _, e := range r.deployEnv {
		if dig(e, "name") == "INFERGATE_PEERS_HASH_KEY" {
			r.env = e.(map[string]any)
		}
	}
	return r
}

// TestTier1ChartPeers checks that the chart runs its replicas with routing
// state sharing on: a config peers section Tier 1 accepts (mutual TLS with
// the mounted mesh certificate), a headless Service that also lists unready
// replicas, the peer port, and the prefix-hash key from a Secret; and that
// none of it renders when sharing is off.
func TestTier1ChartPeers(t *testing.T) {
	if !findTool("helm") {
		t.Skip("helm not installed (run scripts/deploy-tools.sh)")
	}

	t.Run("defaults", func(t *testing.T) {
		r := renderPeers(t)
		p := r.cfg.Peers
		if !p.Enabled() || p.Listen != ":7946" || p.DNS != "t-infergate-tier1-peers.llm.svc.cluster.local" ||
			p.PeerPort() != 7946 || p.HashKeyEnv != "INFERGATE_PEERS_HASH_KEY" || p.TokenEnv != "" || p.InsecurePlaintext {
			t.Errorf("rendered peers: %+v (port %d)", p, p.PeerPort())
		}
		if tl := p.TLS; tl.CertFile != "/etc/infergate/tls/peers/tls.crt" || tl.KeyFile != "/etc/infergate/tls/peers/tls.key" ||
			tl.CAFile != "/etc/infergate/tls/peers/ca.crt" || tl.ServerName != p.DNS {
			t.Errorf("rendered peers.tls: %+v", tl)
		}

		svc := r.service
		if svc == nil {
			t.Fatal("no Service t-infergate-tier1-peers")
		}
		if dig(svc, "spec", "clusterIP") != "None" || dig(svc, "spec", "publishNotReadyAddresses") != true {
			t.Errorf("peers Service is not headless with publishNotReadyAddresses: %v", svc["spec"])
		}
		if !reflect.DeepEqual(dig(svc, "spec", "selector"), r.selector) || r.selector == nil {
			t.Errorf("peers Service selector %v, Deployment's %v", dig(svc, "spec", "selector"), r.selector)
		}
		sp, _ := dig(svc, "spec", "ports").([]any)
		if len(sp) != 1 || dig(sp[0], "name") != "peers" || dig(sp[0], "port") != 7946 || dig(sp[0], "targetPort") != "peers" {
			t.Errorf("peers Service ports: %v", sp)
		}

		if r.port == nil || r.port["containerPort"] != 7946 || r.port["protocol"] != "TCP" {
			t.Errorf("container port peers: %v", r.port)
		}

		if r.env == nil {
			t.Fatal("no INFERGATE_PEERS_HASH_KEY in the container env")
		}
		if dig(r.env, "valueFrom", "secretKeyRef", "name") != "t-infergate-tier1-peers-token" ||
			dig(r.env, "valueFrom", "secretKeyRef", "key") != "token" || r.env["value"] != nil {
			t.Errorf("INFERGATE_PEERS_HASH_KEY: %v", r.env)
		}
		if r.secret == nil {
			t.Fatal("no Secret t-infergate-tier1-peers-token")
		}
		if dig(r.secret, "metadata", "annotations", "helm.sh/resource-policy") != "keep" {
			t.Errorf("peers Secret is not kept across uninstall/upgrade: %v", dig(r.secret, "metadata"))
		}
		b64, _ := dig(r.secret, "data", "token").(string)
		tok, err := base64.StdEncoding.DecodeString(b64)
		if err != nil || len(tok) < 32 {
			t.Fatalf("peers Secret token: %d bytes, %v", len(tok), err)
		}
		// The key the Secret holds is the one Tier 1 resolves.
		t.Setenv("INFERGATE_PEERS_HASH_KEY", string(tok))
		got, err := p.ResolveHashKey()
		if err != nil || string(got) != string(tok) {
			t.Errorf("ResolveHashKey: %v (key matches: %v)", err, string(got) == string(tok))
		}
		// The client token Secret is a different one.
		for _, e := range r.deployEnv {
			if dig(e, "name") == "INFERGATE_TOKEN" && dig(e, "valueFrom", "secretKeyRef", "name") == "t-infergate-tier1-peers-token" {
				t.Error("client token comes from the peers Secret")
			}
		}
	})

	t.Run("existingSecret", func(t *testing.T) {
		r := renderPeers(t, "--set", "peers.existingSecret=my-peers", "--set", "peers.existingSecretKey=shared")
		if r.secret != nil {
			t.Error("the chart created a peers Secret although peers.existingSecret is set")
		}
		if dig(r.env, "valueFrom", "secretKeyRef", "name") != "my-peers" || dig(r.env, "valueFrom", "secretKeyRef", "key") != "shared" {
			t.Errorf("INFERGATE_PEERS_HASH_KEY: %v", r.env)
		}
	})

	t.Run("token and clusterDomain", func(t *testing.T) {
		r := renderPeers(t, "--set", "peers.token=s3cret-peer-token", "--set", "clusterDomain=k8s.internal", "--set", "peers.port=7000")
		if b64, _ := dig(r.secret, "data", "token").(string); b64 != base64.StdEncoding.EncodeToString([]byte("s3cret-peer-token")) {
			t.Errorf("peers Secret does not hold peers.token: %q", b64)
		}
		if p := r.cfg.Peers; p.DNS != "t-infergate-tier1-peers.llm.svc.k8s.internal" || p.Listen != ":7000" || p.PeerPort() != 7000 ||
			p.TLS.ServerName != p.DNS {
			t.Errorf("rendered peers: %+v", p)
		}
		sp, _ := dig(r.service, "spec", "ports").([]any)
		if len(sp) != 1 || dig(sp[0], "port") != 7000 || r.port["containerPort"] != 7000 {
			t.Errorf("port 7000: Service %v, container %v", sp, r.port)
		}
	})

	t.Run("config.peers kept as written", func(t *testing.T) {
		r := renderPeers(t, "--set-json", `config.peers={"listen":":7946","static":["10.0.0.1:7946","10.0.0.2:7946"],"hash_key_env":"INFERGATE_PEERS_HASH_KEY"}`)
		if p := r.cfg.Peers; p.DNS != "" || len(p.Static) != 2 {
			t.Errorf("chart changed config.peers: %+v", p)
		}
		// The mesh certificate is mounted, so its paths are added.
		if p := r.cfg.Peers; p.TLS.CertFile != "/etc/infergate/tls/peers/tls.crt" || p.TLS.CAFile != "/etc/infergate/tls/peers/ca.crt" {
			t.Errorf("config.peers without tls: chart rendered %+v", p.TLS)
		}
		if r.service == nil || r.env == nil {
			t.Error("Service or token env missing with a user config.peers")
		}
	})

	for _, off := range [][]string{
		{"--set", "peers.enabled=false"},
		{"--set", "replicaCount=1"},
		{"-f", filepath.Join("infergate-tier1", "ci", "full-values.yaml"), "--set", "peers.enabled=false"},
	} {
		t.Run("off "+strings.Join(off, " "), func(t *testing.T) {
			r := renderPeers(t, off...)
			if r.cfg.Peers.Enabled() || r.service != nil || r.secret != nil || r.port != nil || r.env != nil {
				t.Errorf("peers rendered: config %+v, Service %v, Secret %v, port %v, env %v",
					r.cfg.Peers, r.service != nil, r.secret != nil, r.port, r.env)
			}
			for _, s := range []string{"peers", "7946", "PEERS"} {
				if strings.Contains(r.raw, s) {
					t.Errorf("output contains %q", s)
				}
			}
		})
	}

	t.Run("schema", func(t *testing.T) {
		for _, bad := range [][]string{
			{"--set", "peers.bogus=1"},
			{"--set", "peers.port=0"},
			{"--set", "peers.enabled=yes-please"},
		} {
			if out, _, err := helmTemplateRaw(t, bad...); err == nil {
				t.Errorf("helm template %v: accepted", bad)
			} else if !strings.Contains(out, "peers") {
				t.Errorf("helm template %v: error does not name peers: %s", bad, out)
			}
		}
	})
}
