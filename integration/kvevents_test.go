package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/infergate/infergate/internal/testservice"
	"github.com/infergate/infergate/sim/fleet"
)

// kvStack is two simulated vLLM pods publishing KV-cache events over real
// ZeroMQ (pod kv-a in vLLM's current wire form, tagged maps; kv-b in the
// positional arrays of vLLM before #42892 and llm-d-inference-sim), each
// with a replay socket, in one `infergate-lab sim --fleet` process, and
// two real Tier 1 processes in front of the same pods: precise follows
// the events (kv_events.enabled), approx does not (the default).
type kvStack struct {
	dir              string
	fleetFile        string
	pods             []fleet.PodSpec
	sim              *proc
	precise, approx  *proc
	preciseConf      string
	preciseURL       string
	approxURL        string
	preciseMetrics   string
	kvPort, kvReplay map[string]int
}

const (
	kvModel = "kv-model"
	kvToken = "kv-tier1-token"
)

func startKVStack(t *testing.T) *kvStack {
	t.Helper()
	needBinary(t)
	s := &kvStack{dir: t.TempDir(), kvPort: map[string]int{}, kvReplay: map[string]int{}}
	fc := fleet.Config{TimeScale: 0.02, Host: "127.0.0.1"}
	for i, name := range []string{"kv-a", "kv-b"} {
		pub, replay := testservice.FreePort(t), testservice.FreePort(t)
		s.kvPort[name], s.kvReplay[name] = pub, replay
		fc.Pods = append(fc.Pods, fleet.PodSpec{Name: name, Port: testservice.FreePort(t),
			ServedModelName: kvModel, Engine: "vllm", GPU: "h100",
			KVEvents: fleet.KVEventsSpec{
				Endpoint:       fmt.Sprintf("tcp://*:%d", pub),
				ReplayEndpoint: fmt.Sprintf("tcp://*:%d", replay),
				Legacy:         i == 1,
			}})
	}
	s.pods = fc.Pods
	s.fleetFile = s.write(t, "fleet.yaml", mustYAML(t, fc))
	s.startSim(t)

	var url, metrics string
	s.preciseConf, url, metrics = s.tier1Config(t, "precise", true)
	s.preciseURL, s.preciseMetrics = url, metrics
	s.precise = s.startTier1(t, "precise")
	var approxConf string
	approxConf, s.approxURL, _ = s.tier1Config(t, "approx", false)
	s.approx = startProc(t, "tier1 approx", "tier1", "--config", approxConf, "--log-level", "warn")
	waitOK(t, s.approx, s.approxURL+"/ready", 30*time.Second)
	return s
}

func (s *kvStack) write(t *testing.T, name, content string) string {
	t.Helper()
	return writeIn(t, s.dir, name, content)
}

func (s *kvStack) startSim(t *testing.T) {
	t.Helper()
	s.sim = startProc(t, "sim", "sim", "--fleet", s.fleetFile, "--log-level", "warn")
	for _, p := range s.pods {
		waitOK(t, s.sim, s.podURL(p.Name)+"/health", 30*time.Second)
	}
}

func (s *kvStack) podURL(name string) string {
	for _, p := range s.pods {
		if p.Name == name {
			return "http://127.0.0.1:" + strconv.Itoa(p.Port)
		}
	}
	panic("no pod " + name)
}

// tier1Config writes a Tier 1 config naming both pods; with kv it follows
// their events (each pod's publisher and replay port given per pod, as
// the infergate.io/kv-events-port annotations would on Kubernetes).
func (s *kvStack) tier1Config(t *testing.T, name string, kv bool) (path, url, metrics string) {
	t.Helper()
	addr := "127.0.0.1:" + strconv.Itoa(testservice.FreePort(t))
	maddr := "127.0.0.1:" + strconv.Itoa(testservice.FreePort(t))
	var b strings.Builder
	fmt.Fprintf(&b, "listen: %s\nmetrics_listen: %s\nauth: {tokens: [%s]}\nscrape: {interval: 50ms}\n", addr, maddr, kvToken)
	if kv {
		b.WriteString("kv_events: {enabled: true}\n")
	}
	fmt.Fprintf(&b, "pools:\n  - {name: kv-pool, model: %s}\npods:\n", kvModel)
	for _, p := range s.pods {
		fmt.Fprintf(&b, "  - {name: %s, address: \"127.0.0.1:%d\", pool: kv-pool, engine: vllm, gpu: h100", p.Name, p.Port)
		if kv {
			fmt.Fprintf(&b, ", kv_events_port: %d, kv_events_replay_port: %d", s.kvPort[p.Name], s.kvReplay[p.Name])
		}
		b.WriteString("}\n")
	}
	return s.write(t, "tier1-"+name+".yaml", b.String()), "http://" + addr, "http://" + maddr + "/metrics"
}

func (s *kvStack) startTier1(t *testing.T, name string) *proc {
	t.Helper()
	p := startProc(t, "tier1 "+name, "tier1", "--config", s.preciseConf, "--log-level", "warn")
	waitOK(t, p, s.preciseURL+"/ready", 30*time.Second)
	return p
}

// kvComplete sends a completion whose prompt is token ids (so Tier 1 knows
// its exact tokens without a tokenizer) to base, a Tier 1 or a pod, and
// returns the pod that served it (Tier 1's X-Infergate-Pod).
func kvComplete(t *testing.T, base string, prompt []int) string {
	t.Helper()
	body, err := json.Marshal(map[string]any{"model": kvModel, "prompt": prompt, "max_tokens": 1})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	resp, b, err := httpDo(ctx, http.MethodPost, base+"/v1/completions", kvToken, string(body))
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("POST %s/v1/completions: %d %s", base, resp.StatusCode, b)
	}
	return resp.Header.Get("X-Infergate-Pod")
}

func resetPrefixCache(t *testing.T, podURL string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, b, err := httpDo(ctx, http.MethodPost, podURL+"/reset_prefix_cache", "", "")
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("reset_prefix_cache: %v %v %s", err, resp, b)
	}
}

// kvPod is a pod's KV-event view in Tier 1's /debug/pods.
type kvPod struct {
	State        string `json:"state"`
	Blocks       int    `json:"blocks"`
	BlockSize    int    `json:"block_size"`
	PrefixSource string `json:"prefix_source"`
	ready        bool   // the pod's ready in /debug/pods: scraped, a candidate
}

func (s *kvStack) kvPods(t *testing.T) map[string]kvPod {
	t.Helper()
	var dbg struct {
		Pods []struct {
			Name     string `json:"name"`
			Ready    bool   `json:"ready"`
			KVEvents *kvPod `json:"kv_events"`
		} `json:"pods"`
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, b, err := httpDo(ctx, http.MethodGet, s.preciseURL+"/debug/pods", kvToken, "")
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /debug/pods: %s: %s", resp.Status, b)
	}
	if err := json.Unmarshal(b, &dbg); err != nil {
		t.Fatal(err)
	}
	out := map[string]kvPod{}
	for _, p := range dbg.Pods {
		if p.KVEvents == nil {
			t.Fatalf("pod %s: no kv_events in /debug/pods with kv_events on", p.Name)
		}
		k := *p.KVEvents
		k.ready = p.Ready
		out[p.Name] = k
	}
	return out
}

// waitKV waits until pod's KV-event view in the precise Tier 1 passes ok.
func (s *kvStack) waitKV(t *testing.T, pod, what string, ok func(kvPod) bool) {
	t.Helper()
	waitFor(t, pod+" "+what, 20*time.Second, func() error {
		p := s.kvPods(t)[pod]
		if !ok(p) {
			return fmt.Errorf("%+v", p)
		}
		return nil
	})
}

func kvOther(pod string) string {
	if pod == "kv-a" {
		return "kv-b"
	}
	return "kv-a"
}

// kvTokens is n token ids from first on.
func kvTokens(first, n int) []int {
	p := make([]int, n)
	for i := range p {
		p[i] = first + i
	}
	return p
}

// TestKVEventsRouting runs precise prefix routing end to end: simulated
// pods publish their KV-cache events over ZeroMQ to a real Tier 1.
//
// What it shows, with the tier1/kvevents unit tests that cover the rest
// over real ZeroMQ against sim/kvpub publishers:
//   - both wire forms decode: kv-a sends tagged maps, kv-b positional
//     arrays, and each pod's blocks reach the index (also TestKVPubForms);
//   - after a pod drops a prefix (AllBlocksCleared from POST
//     /reset_prefix_cache) the next request with it goes to the pod that
//     still holds part of it, while a Tier 1 with the approximate index
//     alone sends it back to the pod that no longer has it;
//   - a Tier 1 that restarts joins the running pods by replaying their
//     buffered events from sequence 0, and its index converges with no new
//     traffic (a gap mid-stream, replayed or not: TestGapReplayed,
//     TestGapUnrepaired);
//   - a pod restart (its publisher's connection ends, its sequence starts
//     over) clears the pod's entries (also TestRestartConnect,
//     TestRestartBind).
func TestKVEventsRouting(t *testing.T) {
	s := startKVStack(t)
	const bs = 16
	prompt := kvTokens(1000, 20*bs+5)
	// half shares prompt's first 10 blocks, then differs.
	half := append(kvTokens(1000, 10*bs), kvTokens(50000, 2*bs)...)

	// Precise: prompt goes to x (no pod has events yet: approximate).
	x := kvComplete(t, s.preciseURL, prompt)
	if x != "kv-a" && x != "kv-b" {
		t.Fatalf("served by %q", x)
	}
	z := kvOther(x)
	s.waitKV(t, x, "holds the prompt", func(p kvPod) bool { return p.State == "fresh" && p.Blocks >= 20 && p.BlockSize == bs })
	// z gets the first half of the prompt another way (straight to the pod).
	kvComplete(t, s.podURL(z), half)
	s.waitKV(t, z, "holds the half", func(p kvPod) bool { return p.State == "fresh" && p.Blocks >= 12 && p.BlockSize == bs })
	// Both wire forms decoded: each pod is fresh with its blocks indexed.
	for name, p := range s.kvPods(t) {
		if p.State != "fresh" || p.PrefixSource != "exact" {
			t.Errorf("pod %s: %+v, want fresh, exact", name, p)
		}
	}
	if got := kvComplete(t, s.preciseURL, prompt); got != x {
		t.Fatalf("precise, before the reset: %s, want %s (all 20 blocks, against %s's 10)", got, x, z)
	}

	// x drops its prefix cache: AllBlocksCleared. The precise Tier 1 now
	// sends the prompt to z, which still holds its first half.
	resetPrefixCache(t, s.podURL(x))
	s.waitKV(t, x, "cleared", func(p kvPod) bool { return p.State == "fresh" && p.Blocks == 0 })
	if got := kvComplete(t, s.preciseURL, prompt); got != z {
		t.Fatalf("precise, after %s's reset: %s, want %s (10 of the prompt's blocks, against none)", x, got, z)
	}

	// The same situation before the approximate Tier 1, with another
	// prompt: it sends q to w, v holds q's first half, w is reset; the
	// approximate index still credits w with q, and q goes back to w.
	q := kvTokens(200000, 20*bs+5)
	qHalf := append(kvTokens(200000, 10*bs), kvTokens(260000, 2*bs)...)
	w := kvComplete(t, s.approxURL, q)
	v := kvOther(w)
	kvComplete(t, s.podURL(v), qHalf)
	resetPrefixCache(t, s.podURL(w))
	s.waitKV(t, w, "cleared", func(p kvPod) bool { return p.Blocks == 0 })
	if got := kvComplete(t, s.approxURL, q); got != w {
		t.Fatalf("approximate, after %s's reset: %s, want %s (the approximate index does not see the reset)", w, got, w)
	}

	// The approximate Tier 1 may have picked z as w, whose reset dropped
	// the prompt: send it to z again, straight to the pod (x holds none
	// of it: only q's tokens reached it since its reset).
	kvComplete(t, s.podURL(z), prompt)

	// Restart the precise Tier 1 while the pods keep their caches: on
	// connecting it replays each pod's buffered events from sequence 0,
	// so it knows z holds the prompt before any new request.
	s.precise.kill(t)
	s.precise = s.startTier1(t, "precise")
	s.waitKV(t, z, "replayed after Tier 1's restart", func(p kvPod) bool { return p.State == "fresh" && p.Blocks >= 20 })
	s.waitKV(t, x, "replayed after Tier 1's restart", func(p kvPod) bool { return p.State == "fresh" && p.ready })
	// A Tier 1 is ready once one pod is: wait until both are candidates.
	s.waitKV(t, z, "ready after Tier 1's restart", func(p kvPod) bool { return p.ready })
	if got := kvComplete(t, s.preciseURL, prompt); got != z {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, b, _ := httpDo(ctx, http.MethodGet, s.preciseURL+"/debug/pods", kvToken, "")
		t.Fatalf("precise, after Tier 1's restart: %s, want %s (replayed: it holds the whole prompt)\n%s", got, z, b)
	}

	// Restart the pods (the simulator's process): their caches are gone,
	// and so are their entries, though no AllBlocksCleared was sent.
	s.sim.kill(t)
	for _, p := range s.pods {
		s.waitKV(t, p.Name, "dropped with its publisher", func(k kvPod) bool { return k.Blocks == 0 && k.State == "absent" })
	}
	s.startSim(t)
	// The restarted pods' new streams are followed (reconnect with
	// backoff): new blocks are indexed again, none of the old ones.
	// One new prompt: whether its batch arrives live or Tier 1 connects
	// after it was sent, its reconnection replays the pod's buffer.
	kvComplete(t, s.podURL(z), kvTokens(300000, 2*bs))
	s.waitKV(t, z, "following the restarted pod", func(p kvPod) bool { return p.State == "fresh" && p.Blocks > 0 })
	if p := s.kvPods(t)[z]; p.Blocks >= 20 {
		t.Errorf("pod %s after its restart: %+v: the old prompt's blocks are back", z, p)
	}
}
