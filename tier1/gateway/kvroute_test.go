package gateway

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/infergate/infergate/shared/config"
	"github.com/infergate/infergate/sim/kvpub"
	"github.com/infergate/infergate/tier1/kvevents"
	"github.com/infergate/infergate/tier1/picker"
	"github.com/infergate/infergate/tier1/tokenize"
)

// Precise prefix routing through the gateway: real ZeroMQ publishers
// (sim/kvpub, standing in for vLLM's) in front of fake pods, a tokenizer
// loaded from files, the gateway's subscriber and request path.

// byteTokenizer writes a byte-level tokenizer.json without merges (each
// byte one token, its id the byte's rank in the byte-level alphabet) and
// a chat template, and returns the tokenizer block naming them.
func byteTokenizer(t *testing.T) tokenize.Config {
	t.Helper()
	// The GPT-2 byte-to-character table, as tokenizer.json spells bytes.
	var chars []rune
	for b := '!'; b <= '~'; b++ {
		chars = append(chars, b)
	}
	for b := '¡'; b <= '¬'; b++ {
		chars = append(chars, b)
	}
	for b := '®'; b <= 'ÿ'; b++ {
		chars = append(chars, b)
	}
	vocab := map[string]int{}
	n := 0
	for b := range 256 {
		r := rune(b)
		if !slices.Contains(chars, r) {
			r = rune(256 + n)
			n++
		}
		vocab[string(r)] = b
	}
	f := map[string]any{
		"version": "1.0", "added_tokens": []any{}, "normalizer": nil, "post_processor": nil,
		"pre_tokenizer": map[string]any{"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
		"model": map[string]any{"type": "BPE", "dropout": nil, "unk_token": nil, "continuing_subword_prefix": nil,
			"end_of_word_suffix": nil, "fuse_unk": false, "byte_fallback": false, "vocab": vocab, "merges": []any{}},
	}
	data, err := json.Marshal(f)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	c := tokenize.Config{File: filepath.Join(dir, "tokenizer.json"), ChatTemplateFile: filepath.Join(dir, "chat.jinja")}
	if err := os.WriteFile(c.File, data, 0o644); err != nil {
		t.Fatal(err)
	}
	tmpl := "{% for m in messages %}<{{ m.role }}>{{ m.content }}\n{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}"
	if err := os.WriteFile(c.ChatTemplateFile, []byte(tmpl), 0o644); err != nil {
		t.Fatal(err)
	}
	return c
}

// kvPub opens a publisher bound on loopback, with replay.
func kvPub(t *testing.T) (*kvpub.Publisher, int, int) {
	t.Helper()
	p, err := kvpub.Open(context.Background(), kvpub.Config{Endpoint: "tcp://127.0.0.1:0", ReplayEndpoint: "tcp://127.0.0.1:0",
		Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	port := func(ep string) int {
		_, ps, _ := net.SplitHostPort(strings.TrimPrefix(ep, "tcp://"))
		n, _ := strconv.Atoi(ps)
		return n
	}
	return p, port(p.Addr()), port(p.ReplayAddr())
}

// publish reports ids as cached on p, block by block (engine hashes are
// the publisher's business: here 1, 2, ...).
func publish(p *kvpub.Publisher, ids []uint32, bs int) {
	for i := 0; (i+1)*bs <= len(ids); i++ {
		p.Stored(uint64(i+1), uint64(i), i > 0, ids[i*bs:(i+1)*bs], "", 0)
	}
}

func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestKVEventsRouteChat(t *testing.T) {
	tc := byteTokenizer(t)
	tok, err := tokenize.Load(tc)
	if err != nil {
		t.Fatal(err)
	}
	pods := []*fakePod{newFakePod(t, "a"), newFakePod(t, "b")}
	pubs := map[string]*kvpub.Publisher{}
	var b strings.Builder
	fmt.Fprintf(&b, "auth: {tokens: [%s]}\nscrape: {interval: 10ms}\nkv_events: {enabled: true}\n", testToken)
	fmt.Fprintf(&b, "pools:\n  - name: llama-pool\n    model: llama\n    tokenizer: {file: %q, chat_template_file: %q}\npods:\n", tc.File, tc.ChatTemplateFile)
	for _, p := range pods {
		pub, port, replay := kvPub(t)
		pubs[p.name] = pub
		fmt.Fprintf(&b, "  - {name: %s, address: %q, pool: llama-pool, engine: vllm, kv_events_port: %d, kv_events_replay_port: %d}\n",
			p.name, p.addr(), port, replay)
	}
	var cfg Config
	if err := config.Decode("kv.yaml", []byte(b.String()), &cfg); err != nil {
		t.Fatalf("%v\n%s", err, b.String())
	}
	e := startEnv(t, &cfg, pods, "")
	for name, pub := range pubs {
		waitUntil(t, "pod "+name+"'s subscription", pub.Subscribed)
	}

	content := strings.Repeat("The quick brown fox jumps over the lazy dog. ", 50)
	body := chatBody("llama", content)
	want := tok.Encode("<user>"+content+"\n<assistant>", false)
	hashes := kvevents.HashTokens(want, 16, "")

	// Before any event both pods are absent: the approximate index
	// decides, and now holds the prompt for the pod picked (x).
	r := e.do(t, "POST", "/v1/chat/completions", body, nil)
	x := r.header.Get("X-Infergate-Pod")
	if r.status != 200 || x == "" {
		t.Fatalf("first request: %d %q", r.status, r.body)
	}
	y := "a"
	if x == "a" {
		y = "b"
	}
	// x's cache was reset; y holds the prompt (reached another way). y is
	// also a little busier, so that if the hashes did not match (both
	// exact 0) x would win the tie.
	pubs[x].Cleared()
	publish(pubs[y], want, 16)
	e.pods[y].set(func(p *fakePod) { p.waiting = 1 })
	e.waitScraped(t)
	idx := e.gw.kv.idx
	waitUntil(t, "the events in the index", func() bool {
		m := idx.Match(hashes, 16, []string{x, y}, nil)
		return idx.State(x) == kvevents.StateFresh && idx.State(y) == kvevents.StateFresh && m[0] == 0 && m[1] == len(hashes)
	})

	r = e.do(t, "POST", "/v1/chat/completions", body, nil)
	if got := r.header.Get("X-Infergate-Pod"); r.status != 200 || got != y {
		t.Fatalf("after x's reset: pod %q (status %d), want %s, which holds the prompt", got, r.status, y)
	}
	if n := e.gw.tracker.PrefixSourceCount(picker.PrefixExact); n != 1 {
		t.Errorf("exact dispatches %d, want 1", n)
	}
	if v := testutil.ToFloat64(e.gw.kv.exactTokens[exactOK]); v != 1 {
		t.Errorf("exact_tokens{result=exact} %v, want 1 (the first request found no fresh pod)", v)
	}
	if v := testutil.ToFloat64(e.gw.kv.exactTokens[exactNoFreshPod]); v != 1 {
		t.Errorf("exact_tokens{result=no_fresh_pod} %v, want 1", v)
	}

	// /debug/pods says which evidence each pod's prefix score uses.
	r = e.do(t, "GET", "/debug/pods", "", nil)
	var dbg struct {
		Pods []podDebug `json:"pods"`
	}
	if err := json.Unmarshal([]byte(r.body), &dbg); err != nil {
		t.Fatal(err)
	}
	for _, p := range dbg.Pods {
		if p.KVEvents == nil || p.KVEvents.State != "fresh" || p.KVEvents.PrefixSource != "exact" {
			t.Errorf("pod %s: kv_events %+v, want fresh and exact", p.Name, p.KVEvents)
		}
		if p.Name == y && (p.KVEvents.Blocks != len(hashes) || p.KVEvents.BlockSize != 16) {
			t.Errorf("pod %s: %+v, want %d blocks of 16", p.Name, p.KVEvents, len(hashes))
		}
	}

	// Pods follow the configuration: a pod removed on reload leaves the
	// index, one added is followed.
	next := *e.cfg
	next.Pods = slices.Clone(next.Pods)
	next.Pods = next.Pods[:1]
	if err := e.gw.Apply(&next); err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, s := range idx.Stats() {
		names = append(names, s.Pod)
	}
	if !slices.Equal(names, []string{next.Pods[0].Name}) {
		t.Errorf("index pods after reload %v, want %v", names, []string{next.Pods[0].Name})
	}
	if err := e.gw.SetDiscoveredPods([]PodConfig{{Name: "found", Address: "127.0.0.1:1", Pool: "llama-pool"}}); err != nil {
		t.Fatal(err)
	}
	if s := idx.Stats(); len(s) != 2 || !slices.ContainsFunc(s, func(p kvevents.PodStats) bool { return p.Pod == "found" }) {
		t.Errorf("index pods after discovery %+v, want the discovered pod too", s)
	}
}

// The exact tokens of each kind of request, hashed as the index hashes
// the token ids of events.
func TestExactTokens(t *testing.T) {
	tc := byteTokenizer(t)
	tok, err := tokenize.Load(tc)
	if err != nil {
		t.Fatal(err)
	}
	bytesOf := func(s string) []uint32 { return tok.Encode(s, false) }
	long := strings.Repeat("x", maxExactBytes-10) + "\n" + strings.Repeat("y", 100)
	tests := []struct {
		name      string
		ep        endpoint
		body      string
		want      []uint32
		wantWhole bool
		wantRes   exactResult
	}{
		{"completion ids", epCompletions, `{"model":"m","prompt":[ 1, 2, 3]}`, []uint32{1, 2, 3}, true, exactOK},
		{"completion text", epCompletions, `{"model":"m","prompt":"hi there"}`, bytesOf("hi there"), true, exactOK},
		{"completion one-text list", epCompletions, `{"model":"m","prompt":["hi"]}`, bytesOf("hi"), true, exactOK},
		{"completion batch", epCompletions, `{"model":"m","prompt":["a","b"]}`, nil, false, exactUnsupported},
		{"completion nested ids", epCompletions, `{"model":"m","prompt":[[1,2]]}`, nil, false, exactUnsupported},
		{"completion long text cut at a line", epCompletions, fmt.Sprintf(`{"model":"m","prompt":%q}`, long),
			bytesOf(long[:maxExactBytes-9]), false, exactOK},
		{"chat", epChat, `{"model":"m","messages":[{"role":"system","content":"be brief"},{"role":"user","content":"hi"}]}`,
			bytesOf("<system>be brief\n<user>hi\n<assistant>"), true, exactOK},
		{"chat without generation prompt", epChat, `{"model":"m","messages":[{"role":"user","content":"hi"}],"add_generation_prompt":false}`,
			bytesOf("<user>hi\n"), true, exactOK},
		{"chat keys are exact", epChat, `{"model":"m","messages":[{"role":"user","content":"hi"}],"Add_Generation_Prompt":false}`,
			bytesOf("<user>hi\n<assistant>"), true, exactOK},
		{"chat with tools", epChat, `{"model":"m","messages":[{"role":"user","content":"hi"}],"tools":[{"type":"function"}]}`, nil, false, exactUnsupported},
		{"chat with an image", epChat, `{"model":"m","messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"x"}}]}]}`, nil, false, exactUnsupported},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b, err := parseBody(tt.ep, []byte(tt.body))
			if err != nil {
				t.Fatal(err)
			}
			var ids []uint32
			var whole bool
			var res exactResult
			if tt.ep == epChat {
				ids, whole, res = chatTokens(tok, []byte(tt.body), nil)
			} else {
				ids, whole, res = completionTokens(tok, b.Prompt, []byte(tt.body), nil)
			}
			if res != tt.wantRes || (res == exactOK && (!slices.Equal(ids, tt.want) || whole != tt.wantWhole)) {
				t.Errorf("got %v (whole %v, %v), want %v (whole %v, %v)", short(ids), whole, res, short(tt.want), tt.wantWhole, tt.wantRes)
			}
		})
	}
	if _, whole := cutText(strings.Repeat("z", maxExactBytes+1)); whole {
		t.Error("a long text without a line break is whole")
	}
	if s, _ := cutText(strings.Repeat("z", maxExactBytes) + "\n z"); s != "" {
		t.Errorf("cut after a line break followed by a space: %d bytes", len(s))
	}
}

func short(ids []uint32) string {
	if len(ids) > 12 {
		return fmt.Sprintf("%v… (%d)", ids[:12], len(ids))
	}
	return fmt.Sprint(ids)
}

// With kv_events off nothing of it runs: no subscriber, no metrics, the
// tokenizer not loaded (so a missing file is no error).
func TestKVEventsOff(t *testing.T) {
	var cfg Config
	yml := fmt.Sprintf("auth: {tokens: [%s]}\npools: [{name: p, model: m, tokenizer: {file: /nonexistent/tokenizer.json}}]\n", testToken)
	if err := config.Decode("off.yaml", []byte(yml), &cfg); err != nil {
		t.Fatal(err)
	}
	gw, err := New(context.Background(), &cfg, Options{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer gw.Close()
	if gw.kv.on() || gw.kv.exact() != nil || gw.state.Load().tokenizers != nil {
		t.Error("kv routing on with kv_events off")
	}
	mfs, err := gw.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if strings.HasPrefix(mf.GetName(), "infergate_kv_") || mf.GetName() == "infergate_prefix_source_total" {
			t.Errorf("metric %s registered with kv_events off", mf.GetName())
		}
	}

	// On, the tokenizer is loaded, and a bad file is an error naming it.
	cfg.KVEvents.Enabled = true
	if _, err := New(context.Background(), &cfg, Options{Logger: slog.New(slog.DiscardHandler)}); err == nil ||
		!strings.Contains(err.Error(), "pools[0].tokenizer.file") || !strings.Contains(err.Error(), "/nonexistent/tokenizer.json") {
		t.Errorf("error %v, want it to name pools[0].tokenizer.file and the file", err)
	}
}

// A bind-mode listen address already in use fails at start.
func TestKVEventsBindInUse(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var cfg Config
	yml := fmt.Sprintf("auth: {tokens: [%s]}\nkv_events: {enabled: true, mode: bind, listen: 'tcp://%s'}\npools: [{name: p, model: m}]\n", testToken, ln.Addr())
	if err := config.Decode("bind.yaml", []byte(yml), &cfg); err != nil {
		t.Fatal(err)
	}
	gw, err := New(context.Background(), &cfg, Options{Logger: slog.New(slog.DiscardHandler)})
	if err == nil {
		gw.Close()
		t.Fatal("started on a port in use")
	}
	if !strings.Contains(err.Error(), "kv_events.listen") {
		t.Errorf("error %v does not name kv_events.listen", err)
	}
}

// /v1/models carries the engine's own model card: max_model_len,
// created, owned_by and root, as the pod lists them.
func TestModelsCarryEngineCard(t *testing.T) {
	se := newSimEnv(t, []simPod{{name: "a", gpu: "h100"}}, "")
	resp, err := http.Get(se.sims["a"].pod.URL + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	var direct struct{ Data []modelEntry }
	err = json.NewDecoder(resp.Body).Decode(&direct)
	resp.Body.Close()
	if err != nil || len(direct.Data) == 0 {
		t.Fatalf("pod's /v1/models: %v %+v", err, direct)
	}
	card := direct.Data[0]
	if card.MaxModelLen == 0 || card.Created == 0 || card.OwnedBy == "" {
		t.Fatalf("the simulated pod's card lacks fields: %+v", card)
	}
	r := se.do(t, "GET", "/v1/models", "", nil)
	var got struct{ Data []modelEntry }
	if err := json.Unmarshal([]byte(r.body), &got); err != nil {
		t.Fatal(err)
	}
	i := slices.IndexFunc(got.Data, func(m modelEntry) bool { return m.ID == card.ID })
	if i < 0 {
		t.Fatalf("%s not listed: %s", card.ID, r.body)
	}
	if m := got.Data[i]; m.MaxModelLen != card.MaxModelLen || m.Created != card.Created || m.OwnedBy != card.OwnedBy || m.Root != card.Root {
		t.Errorf("through Tier 1 %+v, the pod's %+v", m, card)
	}
	if !strings.Contains(r.body, `"max_model_len"`) {
		t.Errorf("no max_model_len key: %s", r.body)
	}
}
