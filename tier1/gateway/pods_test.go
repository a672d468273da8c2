package gateway

import (
	"os"

	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/infergate/infergate/shared/config"
)

func TestSetDiscoveredPods(t *testing.T) {
	static, found := newFakePod(t, "static"), newFakePod(t, "found")
	e := newEnv(t, []*fakePod{static}, "")

	// A discovered pod joins; one with a static pod's name, an unknown pool
	// or a bad address is skipped; an unknown engine is detected instead.
	err := e.gw.SetDiscoveredPods([]PodConfig{
		{Name: "found", Address: found.addr(), Pool: "llama-pool", Engine: "nope"},
		{Name: "static", Address: found.addr(), Pool: "llama-pool"},
		{Name: "lost", Address: found.addr(), Pool: "no-such-pool"},
		{Name: "bad", Address: "no-port", Pool: "llama-pool"},
	})
	if err != nil {
		t.Fatal(err)
	}
	st := e.gw.state.Load()
	if len(st.pods) != 2 || st.pods["found"] == nil || st.pods["static"].cfg.Address != static.addr() {
		t.Fatalf("pods after discovery: %v", podNames(st))
	}
	if eng := st.pods["found"].cfg.Engine; eng != "" {
		t.Errorf("unknown engine kept: %q", eng)
	}
	e.pods["found"] = found
	e.waitReady(t)
	static.set(func(p *fakePod) { p.waiting = 50 })
	e.waitScraped(t)
	if r := e.do(t, "POST", "/v1/chat/completions", chatBody("llama", "hi"), nil); r.status != 200 || r.header.Get(DefaultPodHeader) != "found" {
		t.Fatalf("discovered pod not chosen: %d from %q", r.status, r.header.Get(DefaultPodHeader))
	}

	// Gone from discovery: out at once, static pods stay.
	if err := e.gw.SetDiscoveredPods(nil); err != nil {
		t.Fatal(err)
	}
	if st := e.gw.state.Load(); len(st.pods) != 1 || st.pods["static"] == nil {
		t.Fatalf("pods after the discovered one left: %v", podNames(st))
	}
	if r := e.do(t, "POST", "/v1/chat/completions", chatBody("llama", "hi"), nil); r.header.Get(DefaultPodHeader) != "static" {
		t.Fatalf("served by %q", r.header.Get(DefaultPodHeader))
	}
}

// A configuration reload keeps the discovered pods.
func TestReloadKeepsDiscoveredPods(t *testing.T) {
	static, found := newFakePod(t, "static"), newFakePod(t, "found")
	path := filepath.Join(t.TempDir(), "tier1.yaml")
	write := func(extra string) {
		cfg := "auth: {tokens: [" + testToken + "]}\nscrape: {interval: 10ms}\npools: [{name: llama-pool, model: llama}]\n" +
			"pods: [{name: static, address: \"" + static.addr() + "\", pool: llama-pool}]\n" + extra
		if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("")
	var cfg Config
	if err := config.Load(path, &cfg); err != nil {
		t.Fatal(err)
	}
	e := startEnv(t, &cfg, []*fakePod{static}, "")
	if err := e.gw.SetDiscoveredPods([]PodConfig{{Name: "found", Address: found.addr(), Pool: "llama-pool"}}); err != nil {
		t.Fatal(err)
	}
	write("pod_header: x-served-by\n")
	if err := e.gw.Reload(path); err != nil {
		t.Fatal(err)
	}
	st := e.gw.state.Load()
	if st.cfg.PodHeader != "x-served-by" || st.pods["found"] == nil || st.pods["static"] == nil {
		t.Fatalf("after reload: header %q pods %v", st.cfg.PodHeader, podNames(st))
	}
}

func TestReadyNamesDiscoveryProblem(t *testing.T) {
	e := newEnv(t, nil, "")
	e.gw.SetDiscoveryProblem("the InferencePool CRD is not installed")
	r := e.do(t, "GET", "/ready", "", nil)
	if r.status != 503 || !strings.Contains(r.body, "InferencePool CRD") {
		t.Fatalf("/ready %d %s", r.status, r.body)
	}
	p := newFakePod(t, "p")
	if err := e.gw.SetDiscoveredPods([]PodConfig{{Name: "p", Address: p.addr(), Pool: "llama-pool"}}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		r = e.do(t, "GET", "/ready", "", nil)
		if r.status == 200 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("/ready %d %s with a ready pod", r.status, r.body)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if !strings.Contains(r.body, `"discovery"`) {
		t.Errorf("/ready 200 without the discovery note: %s", r.body)
	}
}

func podNames(st *state) []string {
	var out []string
	for n := range st.pods {
		out = append(out, n)
	}
	return out
}
