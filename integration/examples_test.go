package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/infergate/infergate/shared/config"
	"github.com/infergate/infergate/sim/fleet"
	"github.com/infergate/infergate/tier1/picker"
	tier1 "github.com/infergate/infergate/tier1/server"
	tier2 "github.com/infergate/infergate/tier2/server"
)

// examplePortRE finds the ports the examples fix: a pod's `port:` in the
// fleet and every 127.0.0.1:PORT (listeners, pod and cluster addresses).
var examplePortRE = regexp.MustCompile(`(port: |127\.0\.0\.1:)(\d+)`)

// Tokens the test exports for the examples' *_env keys.
const (
	exampleTier1Token = "tier1-example-token"
	exampleAdminToken = "admin-example-token"
)

// TestExamples proves that examples/ is one set a person can start as
// examples/README.md says: every file loads with the loader that reads it
// in production (`infergate check` for the tiers' files, the fleet and
// picker-profile loaders for the others), then the simulated fleet of
// fleet.yaml, the Tier 1 of tier1.yaml and the Tier 2 of tier2.yaml start
// as separate processes, and every model name Tier 2's /v1/models lists
// answers 200 through Tier 2 → Tier 1 → a simulated pod (the pods stand
// in for GPUs).
//
// The rewrite step, so that the test runs beside anything else: every
// port the examples fix (fleet `port:`, every 127.0.0.1:PORT) moves by one
// offset, chosen so that all the moved ports are free; nothing else in the
// files changes. The *_env tokens come from the environment, as a user
// would export them; the API key is the one tier2.yaml names.
func TestExamples(t *testing.T) {
	needBinary(t)
	files, err := filepath.Glob("../examples/*")
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv("INFERGATE_TIER1_TOKEN", exampleTier1Token)
	t.Setenv("INFERGATE_ADMIN_TOKEN", exampleAdminToken)

	// Every file loads, with the loader that reads it.
	loaded := map[string]bool{}
	for _, path := range files {
		name := filepath.Base(path)
		switch name {
		case "README.md":
			continue
		case "tier1.yaml", "tier2.yaml":
			out, err := exec.Command(binary, "check", "--config", path).CombinedOutput()
			want := fmt.Sprintf("%s: ok (%s)", path, strings.TrimSuffix(name, ".yaml"))
			if err != nil || strings.TrimSpace(string(out)) != want {
				t.Errorf("infergate check %s: %v\n%s", name, err, out)
			}
		case "fleet.yaml":
			if _, err := fleet.Load(path); err != nil {
				t.Errorf("%s: %v", name, err)
			}
		case "picker-no-hold.yaml":
			data, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := picker.ParseProfile(path, data); err != nil {
				t.Errorf("%s: %v", name, err)
			}
		default:
			t.Errorf("examples/%s: no loader known; add it to this test", name)
		}
		loaded[name] = true
	}
	for _, name := range []string{"fleet.yaml", "tier1.yaml", "tier2.yaml"} {
		if !loaded[name] {
			t.Fatalf("examples/%s is missing", name)
		}
	}
	if t.Failed() {
		t.FailNow()
	}

	// The files agree: Tier 2's cluster is Tier 1 (name, region, address),
	// they share the token variable, and every model Tier 2 lists for it
	// is one Tier 1 serves.
	var c1 tier1.Config
	var c2 tier2.Config
	if err := config.Load("../examples/tier1.yaml", &c1); err != nil {
		t.Fatal(err)
	}
	if err := config.Load("../examples/tier2.yaml", &c2); err != nil {
		t.Fatal(err)
	}
	if len(c2.Clusters) != 1 {
		t.Fatalf("tier2.yaml has %d clusters; the example stack runs one Tier 1", len(c2.Clusters))
	}
	cl := c2.Clusters[0]
	if cl.Name != c1.Cluster || cl.Region != c1.Region || cl.Address != "http://"+c1.Listen || c2.Tier1.TokenEnv != c1.Auth.TokenEnv {
		t.Errorf("tier2.yaml's cluster %s/%s at %s (token from $%s) is not tier1.yaml's %s/%s on %s ($%s)",
			cl.Region, cl.Name, cl.Address, c2.Tier1.TokenEnv, c1.Region, c1.Cluster, c1.Listen, c1.Auth.TokenEnv)
	}
	var served []string
	for _, p := range c1.Pools {
		served = append(served, p.Model)
		served = append(served, p.Adapters...)
	}
	for _, m := range cl.Models {
		if !slices.Contains(served, m) {
			t.Errorf("tier2.yaml lists %q for %s; tier1.yaml's pools serve %v", m, cl.Name, served)
		}
	}
	if len(c2.Keys) == 0 || c2.Keys[0].Key == "" {
		t.Fatal("tier2.yaml names no API key to send")
	}
	apiKey := c2.Keys[0].Key

	// The rewrite: every fixed port moves by one offset.
	dir := t.TempDir()
	texts := map[string]string{}
	var ports []int
	for _, name := range []string{"fleet.yaml", "tier1.yaml", "tier2.yaml"} {
		b, err := os.ReadFile("../examples/" + name)
		if err != nil {
			t.Fatal(err)
		}
		texts[name] = string(b)
		for _, m := range examplePortRE.FindAllStringSubmatch(string(b), -1) {
			p, _ := strconv.Atoi(m[2])
			ports = append(ports, p)
		}
	}
	offset := freeOffset(t, ports)
	for name, text := range texts {
		text = examplePortRE.ReplaceAllStringFunc(text, func(s string) string {
			m := examplePortRE.FindStringSubmatch(s)
			p, _ := strconv.Atoi(m[2])
			return m[1] + strconv.Itoa(p+offset)
		})
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	at := func(addr string) string { // an example's address, moved
		host, port, _ := net.SplitHostPort(addr)
		p, _ := strconv.Atoi(port)
		return net.JoinHostPort(host, strconv.Itoa(p+offset))
	}
	t.Logf("example ports moved by %d", offset)

	// Step 1: the simulated fleet.
	sim := startProc(t, "sim", "sim", "--fleet", filepath.Join(dir, "fleet.yaml"), "--time-scale", "0.05")
	for _, p := range c1.Pods {
		waitOK(t, sim, "http://"+at(p.Address)+"/v1/models", 30*time.Second)
	}
	// Step 2: Tier 1.
	t1 := startProc(t, "tier1", "tier1", "--config", filepath.Join(dir, "tier1.yaml"))
	waitOK(t, t1, "http://"+at(c1.Listen)+"/ready", 30*time.Second)
	// Step 3: Tier 2.
	t2 := startProc(t, "tier2", "tier2", "--config", filepath.Join(dir, "tier2.yaml"))
	base := "http://" + at(c2.Listen)
	waitOK(t, t2, base+"/ready", 30*time.Second)

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	resp, b, err := httpDo(ctx, http.MethodGet, base+"/v1/models", apiKey, "")
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /v1/models: %v %v %s", err, resp, b)
	}
	var models struct {
		Data []struct{ ID string } `json:"data"`
	}
	if err := json.Unmarshal(b, &models); err != nil {
		t.Fatal(err)
	}
	var listed []string
	for _, m := range models.Data {
		listed = append(listed, m.ID)
	}
	if len(listed) != len(cl.Models) {
		t.Errorf("/v1/models lists %v, want tier2.yaml's %v", listed, cl.Models)
	}
	// Every model name Tier 2 lists answers, through Tier 1 to a pod of
	// the model's pool (the pod header names the pod).
	podsOf := map[string][]string{}
	for _, p := range c1.Pods {
		podsOf[p.Pool] = append(podsOf[p.Pool], p.Name)
	}
	poolOf := map[string]string{}
	for _, p := range c1.Pools {
		poolOf[p.Model] = p.Name
		for _, a := range p.Adapters {
			poolOf[a] = p.Name
		}
	}
	for _, model := range listed {
		for _, stream := range []bool{false, true} {
			resp, b, err := httpDo(ctx, http.MethodPost, base+"/v1/chat/completions", apiKey, chatBody(model, stream, 8))
			if err != nil {
				t.Fatalf("%s: %v", model, err)
			}
			if resp.StatusCode != http.StatusOK {
				t.Errorf("%s (stream %v): %s %s", model, stream, resp.Status, b)
				continue
			}
			if got := resp.Header.Get("X-Infergate-Cluster"); got != cl.Name {
				t.Errorf("%s: X-Infergate-Cluster %q, want %s", model, got, cl.Name)
			}
			if pod := resp.Header.Get(c1.PodHeader); !slices.Contains(podsOf[poolOf[model]], pod) {
				t.Errorf("%s: %s %q, want a pod of pool %s %v", model, c1.PodHeader, pod, poolOf[model], podsOf[poolOf[model]])
			}
			if stream && !bytes.Contains(b, []byte("data: [DONE]")) {
				t.Errorf("%s: stream without [DONE]: %.300s", model, b)
			}
		}
	}

	// The status pages the files' comments point at answer, and their
	// JSON takes the tokens the files name.
	for _, u := range []struct{ page, api, token string }{
		{"http://" + at(c1.MetricsListen) + "/status", "http://" + at(c1.MetricsListen) + "/status/api/summary", exampleTier1Token},
		{"http://" + at(c2.Admin.Listen) + "/status", "http://" + at(c2.Admin.Listen) + "/admin/v1/clusters", exampleAdminToken},
	} {
		for _, g := range []struct{ url, token string }{{u.page, ""}, {u.api, u.token}} {
			if resp, b, err := httpDo(ctx, http.MethodGet, g.url, g.token, ""); err != nil || resp.StatusCode != http.StatusOK {
				t.Errorf("GET %s: %v %v %.200s", g.url, err, resp, b)
			}
		}
	}
	if resp, b, err := httpDo(ctx, http.MethodGet, "http://"+at(c2.Metrics.Listen)+"/metrics", "", ""); err != nil || resp.StatusCode != http.StatusOK || !bytes.Contains(b, []byte("infergate_tier2_")) {
		t.Errorf("Tier 2 /metrics: %v %v", err, resp)
	}

	// They start quietly, with only the warnings the examples mean to
	// show (docs/troubleshooting.md): Tier 1 that the SGLang and TGI pods
	// lack metrics some scorers read (the fleet has every engine's
	// dialect), Tier 2 that without Redis it keeps tenants in memory.
	expected := map[*proc]string{t1: "pod does not export metrics that enabled scorers need", t2: "no redis configured"}
	for _, p := range []*proc{t1, t2} {
		for _, line := range strings.Split(p.logs.String(), "\n") {
			if strings.Contains(line, "level=WARN") || strings.Contains(line, "level=ERROR") || strings.Contains(line, `"level":"WARN"`) || strings.Contains(line, `"level":"ERROR"`) {
				if strings.Contains(line, expected[p]) {
					continue
				}
				t.Errorf("%s: %s", p.name, line)
			}
		}
	}
}

// freeOffset returns an offset that moves every port in ports onto a
// free one, in 20000..32000 (below Linux's ephemeral ports, so a port the
// kernel hands out meanwhile is unlikely to take one).
func freeOffset(t *testing.T, ports []int) int {
	t.Helper()
	lo, hi := slices.Min(ports), slices.Max(ports)
	for range 50 {
		offset := 20000 - lo + rand.IntN(12000-(hi-lo))
		ok := true
		for _, p := range ports {
			ln, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p+offset))
			if err != nil {
				ok = false
				break
			}
			ln.Close()
		}
		if ok {
			return offset
		}
	}
	t.Fatal("no free offset for the examples' ports")
	return 0
}
