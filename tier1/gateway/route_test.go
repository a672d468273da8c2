package gateway

import (
	"context"
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/infergate/infergate/internal/admissiontest"
	"github.com/infergate/infergate/shared/openai"
	"github.com/infergate/infergate/tier1/admission"
	"github.com/infergate/infergate/tier1/picker"
	"github.com/infergate/infergate/tier1/prefix"
)

// The gateway takes the shared table's decisions (bench tests the same
// table against the benchmark's router).
func TestArrivalDecisionsMatchSharedTable(t *testing.T) {
	pods := []*fakePod{newFakePod(t, "p0"), newFakePod(t, "p1")}
	// Metrics never go stale here: a slow scrape on a loaded machine must
	// not turn an idle snapshot into a saturated one.
	e := newEnv(t, pods, "scheduler: {stale_after: 1h}\n")
	for _, tc := range admissiontest.Cases() {
		t.Run(tc.Name, func(t *testing.T) {
			for _, p := range pods {
				p.set(func(p *fakePod) { p.waiting, p.kv = tc.Waiting, tc.KV })
			}
			e.waitMetrics(t, tc.Waiting, tc.KV)
			st := e.gw.state.Load()
			pool := st.pools["llama-pool"]
			req := &picker.Request{ID: "x", Model: "llama", BaseModel: "llama", Pool: "llama-pool",
				Priority: tc.Priority, Sheddable: tc.Sheddable}
			if tc.Ahead {
				// It waits because a request like the newcomer's, but not
				// sheddable, was held at the last look.
				ahead := *req
				ahead.Sheddable, ahead.Priority = false, tc.AheadPrio
				key, keyed := e.gw.sched.HoldKey(&ahead)
				w, _ := pool.queue.enter(tc.AheadPrio, key, keyed, 10)
				pool.queue.held(key, keyed)
				defer pool.queue.leave(w)
			}
			prof := e.gw.sched.Profile()
			prof.Saturation.PrefillWait = tc.PrefillWait
			prof.Saturation.SheddableWait = tc.SheddableWait
			if err := e.gw.sched.Update(prof); err != nil {
				t.Fatal(err)
			}
			var names []string
			for _, p := range pool.pods {
				names = append(names, p.cfg.Name)
			}
			defer tc.Prime(e.gw.tracker, names)()
			c := &call{g: e.gw, st: st, pool: pool, req: req, cb: &cycleBuf{}}
			if got := c.arrival(context.Background()).Action; got != tc.Want {
				t.Errorf("decision %v, want %v", got, tc.Want)
			}
		})
	}
}

// waitMetrics waits until the scraper reports the given state for every pod.
func (e *env) waitMetrics(t *testing.T, waiting int, kv float64) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		ok := true
		for name := range e.pods {
			ps, found := e.gw.scraper.Get(name)
			if !found || ps.Metrics.Waiting != waiting || ps.Metrics.KVUsage != kv {
				ok = false
			}
		}
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("pods never reported waiting=%d kv=%g", waiting, kv)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// The proxy's scheduling input is admission.Prompt on the prompt text
// (the function bench calls with --inputs production), and equals the
// production hashing: prefix.Hash seeded with the model and cache_salt.
func TestRouteBuildsInputWithAdmissionPrompt(t *testing.T) {
	pod := newFakePod(t, "p0")
	e := newEnv(t, []*fakePod{pod}, "")
	st := e.gw.state.Load()
	text := []byte(`[{"role":"user","content":"` + string(slices.Repeat([]byte("tell me a story "), 40)) + `"}]`)
	body := `{"model":"llama","cache_salt":"s1","messages":` + string(text) + `}`
	c := &call{g: e.gw, st: st, ep: epChat, data: []byte(body)}
	if rf := c.route(t.Context()); rf != nil {
		t.Fatalf("refused: %+v", rf)
	}
	req := c.req
	parsed, err := parseBody(epChat, []byte(body))
	if err != nil {
		t.Fatal(err)
	}
	prompt := parsed.promptBytes(epChat)
	want := &picker.Request{Model: "llama"}
	admission.Prompt(want, "s1", prompt)
	if !slices.Equal(req.BlockHashes, want.BlockHashes) || req.PromptTokens != want.PromptTokens || len(want.BlockHashes) == 0 {
		t.Fatalf("proxy input %d tokens %d hashes, admission.Prompt %d tokens %d hashes",
			req.PromptTokens, len(req.BlockHashes), want.PromptTokens, len(want.BlockHashes))
	}
	direct := prefix.Hash("llama\x00s1", prompt, prefix.DefaultBlockBytes, prefix.DefaultPromptBlocks, nil)
	if !slices.Equal(direct, want.BlockHashes) || want.PromptTokens != len(prompt)/4 {
		t.Fatal("admission.Prompt differs from prefix.Hash seeded with model and cache_salt")
	}
}

// Tier 2 asks for usage by adding stream_options at the bytes its parser
// found (openai.Request.IncludeUsage): the prompt Tier 1 hashes for prefix
// affinity is the same with and without the member, so one conversation
// keeps its pod. (Re-encoding the body, as Tier 2 once did, escaped <>&
// and dropped whitespace, which changed the hashes.)
func TestPrefixHashesIgnoreIncludeUsage(t *testing.T) {
	pod := newFakePod(t, "p0")
	e := newEnv(t, []*fakePod{pod}, "")
	st := e.gw.state.Load()
	para := strings.Repeat("日本語 ✓ émoji 🎉 <b>bold</b> & \"quoted\" text,\n\t", 20)
	body := []byte("{ \"model\" : \"llama\",\n \"stream\":true, \"messages\" : [ {\"role\":\"system\",\"content\":\"" +
		strings.NewReplacer(`"`, `\"`, "\n\t", `\n\t`).Replace(para) + "\"},\n  {\"role\":\"user\",\"content\":\"hi <there> & bye\"} ] }\n")
	r, err := openai.ParseRequest(body)
	if err != nil {
		t.Fatal(err)
	}
	sp, changed, err := r.IncludeUsage(body)
	if err != nil || !changed {
		t.Fatalf("IncludeUsage: %v %v", changed, err)
	}
	hashes := func(b []byte) []uint64 {
		t.Helper()
		c := &call{g: e.gw, st: st, ep: epChat, data: b}
		if rf := c.route(t.Context()); rf != nil {
			t.Fatalf("refused: %+v", rf)
		}
		defer c.done("200")
		return slices.Clone(c.req.BlockHashes)
	}
	without, with := hashes(body), hashes(sp.Apply(body))
	if len(without) < 2 || !slices.Equal(without, with) {
		t.Fatalf("hashes differ: %d without the member, %d with", len(without), len(with))
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(body, &m); err != nil {
		t.Fatal(err)
	}
	m["stream_options"] = json.RawMessage(`{"include_usage":true}`)
	reencoded, _ := json.Marshal(m)
	if slices.Equal(without, hashes(reencoded)) {
		t.Fatal("a re-encoded body hashes the same: the test cannot tell")
	}
}
