package bench

import (
	"context"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/infergate/infergate/bench/scenario"
	"github.com/infergate/infergate/bench/workload"
	"github.com/infergate/infergate/tier1/picker"
	"github.com/infergate/infergate/tier1/prefix"
)

func eppPods(n int) []*picker.Pod {
	pods := make([]*picker.Pod, n)
	for i := range pods {
		pods[i] = &picker.Pod{Name: string(rune('a' + i)), Ready: true, Metrics: picker.Metrics{HasKV: true, NumBlocks: 1000}}
	}
	return pods
}

func seq(from, n int) []uint64 {
	h := make([]uint64, n)
	for i := range h {
		h[i] = uint64(from + i)
	}
	return h
}

// TestEPPIgnoresRouterInFlight: the upstream queue scorer reads only the
// scraped waiting queue, so a pod the router just flooded (InFlight) but
// whose scrape still shows an empty queue wins over one with a queue.
func TestEPPIgnoresRouterInFlight(t *testing.T) {
	pods := eppPods(2)
	pods[0].InFlight = 100
	pods[1].Metrics.Waiting = 3
	rt := NewEPPRouter(GIEv15Config())
	r := rand.New(rand.NewPCG(1, 2))
	for range 20 {
		if got := rt.Pick(r, &picker.Request{}, pods); got != 0 {
			t.Fatalf("picked %d, want 0 (shorter scraped queue)", got)
		}
	}
}

func TestEPPPrefixAffinityAndWindow(t *testing.T) {
	pods := eppPods(3)
	r := rand.New(rand.NewPCG(3, 4))
	rt := NewEPPRouter(GIEv15Config()).(*eppRouter)
	first := rt.Pick(r, &picker.Request{BlockHashes: seq(1, 300)}, pods)
	// Same first 256 blocks, different tail: inside GIE's window it is the
	// same prompt, so the same pod wins with a full match.
	req := &picker.Request{BlockHashes: append(seq(1, 256), seq(10000, 44)...)}
	if got := rt.Pick(r, req, pods); got != first {
		t.Fatalf("picked %d, want %d (prefix holder)", got, first)
	}
	if m := rt.match[pods[first].Name]; m != 256 {
		t.Errorf("matched %d blocks, want the 256-block window", m)
	}
	// llm-d's window is 8192 blocks: all 300 blocks are hashed and match.
	ld := NewEPPRouter(LLMDv010Config()).(*eppRouter)
	at := ld.Pick(r, &picker.Request{BlockHashes: seq(1, 300)}, pods)
	if got := ld.Pick(r, &picker.Request{BlockHashes: seq(1, 300)}, pods); got != at {
		t.Fatalf("llm-d picked %d, want %d", got, at)
	}
	if m := ld.match[pods[at].Name]; m != 300 {
		t.Errorf("llm-d matched %d blocks, want 300", m)
	}
	// A loaded prefix holder loses once queue and KV outweigh prefix 3:
	// queue 2 × 1 + kv 2 × 1 on an idle pod beats prefix 3 + kv 2 × 0.
	pods[first].Metrics.Waiting = 10
	pods[first].Metrics.KVUsage = 1
	if got := rt.Pick(r, &picker.Request{BlockHashes: seq(1, 10)}, pods); got == first {
		t.Errorf("picked the saturated prefix holder %d", got)
	}
}

func TestEPPLRUEviction(t *testing.T) {
	x := newPrefixIndex()
	x.add(seq(1, 4), "a", 4)
	x.add(seq(5, 2), "a", 4) // evicts 1 and 2
	for h, want := range map[uint64]bool{1: false, 2: false, 3: true, 6: true} {
		if _, ok := x.get(h)["a"]; ok != want {
			t.Errorf("hash %d held = %v, want %v", h, ok, want)
		}
	}
}

func TestEPPAdmit(t *testing.T) {
	pods := eppPods(2)
	rt := NewEPPRouter(GIEv15Config()).(*eppRouter)
	shed := &picker.Request{Sheddable: true, Priority: -1}
	if !rt.Admit(shed, pods) {
		t.Error("idle pool rejected a sheddable request")
	}
	for _, p := range pods {
		p.Metrics.Waiting = 5 // 5/5 = saturation 1
	}
	if rt.Admit(shed, pods) {
		t.Error("saturated pool admitted a sheddable request")
	}
	if !rt.Admit(&picker.Request{}, pods) {
		t.Error("a critical request must be dispatched at once, saturated or not")
	}
	pods[0].Metrics.Waiting, pods[1].Metrics.Waiting = 0, 0
	pods[0].MetricsAge = time.Second // stale counts as saturated (1.0)
	pods[1].MetricsAge = time.Second
	if rt.Admit(shed, pods) {
		t.Error("stale metrics must count as saturated")
	}
}

// TestUpstreamPolicyPerRun: each run builds its own router (two runs of
// one Policy never share a prefix index), and the router sees the request
// text hashed its own way: 64-byte blocks, up to its window.
func TestUpstreamPolicyPerRun(t *testing.T) {
	p, err := ParsePolicy(PolicyGIEv15)
	if err != nil || p.Profile != nil || p.Queue || p.NewRouter == nil {
		t.Fatalf("ParsePolicy(gie-v1.5) = %+v, %v", p, err)
	}
	f := scenario.Fleet{Model: "llama-3.1-8b", Pods: []scenario.PodGroup{{GPU: "h100", Count: 2}}}
	f.SetDefaults()
	w := workload.Request{ID: 1, PromptTokens: 9000, OutputTokens: 10}
	st := workload.Stream{Duration: time.Second, Requests: []workload.Request{w}}
	s1, err := newSim(context.Background(), Setup{Name: "t", Fleet: f}, p, 1, st, Options{})
	if err != nil {
		t.Fatal(err)
	}
	s2, err := newSim(context.Background(), Setup{Name: "t", Fleet: f}, p, 1, st, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if s1.router == nil || s1.router == s2.router {
		t.Fatal("runs must each build their own router")
	}
	got := s1.routerInput(0)
	text := workload.AppendText(nil, &w)
	want := prefix.Hash("llama-3.1-8b", text, 64, 256, nil)
	if !slices.Equal(got.BlockHashes, want) || len(want) != 256 {
		t.Errorf("router input: %d hashes, want GIE's first 256 64-byte blocks of the text", len(got.BlockHashes))
	}
	if got.PromptTokens != len(text)/4 {
		t.Errorf("router prompt tokens %d, want %d", got.PromptTokens, len(text)/4)
	}
}

// The harness calls the upstream router's legacy admission: under
// overload gie-v1.5 sheds sheddable requests, and only those.
func TestUpstreamAdmissionSheds(t *testing.T) {
	sc, err := scenario.Get("priority-mix-8b")
	if err != nil {
		t.Fatal(err)
	}
	st := sc.Stream(1)
	st.Requests = slices.DeleteFunc(st.Requests, func(r workload.Request) bool { return r.Arrival > 40*time.Second })
	st.Duration = 40 * time.Second
	shed := 0
	for _, r := range st.Requests {
		if r.Sheddable || r.Priority < 0 {
			shed++
		}
	}
	run, err := Run(context.Background(), Setup{Name: sc.Name, Fleet: sc.Fleet}, mustPolicy(t, PolicyGIEv15), 1, st, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if run.Shed == 0 || run.Shed > shed {
		t.Errorf("gie-v1.5 shed %d requests; %d are sheddable", run.Shed, shed)
	}
}
