package gateway

// Precise prefix routing (docs/kv-events.md): the subscriber that follows
// the pods' KV-cache events into an exact per-pod block index, the pools'
// tokenizers, and each request's exact token hashes (picker.Request's
// ExactHashes), which the prefix scorers match against that index for the
// pods whose events are fresh. All of it is off unless kv_events.enabled;
// then a request costs nothing more unless its tokens can be known
// exactly (its pool has a tokenizer, or its prompt is token ids).

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"strconv"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/infergate/infergate/shared/jsonkeys"
	"github.com/infergate/infergate/shared/metric"
	"github.com/infergate/infergate/tier1/kvevents"
	"github.com/infergate/infergate/tier1/picker"
	"github.com/infergate/infergate/tier1/tokenize"
)

const (
	// defaultKVBlockSize is vLLM's --block-size default, used until a
	// pod's events tell its own.
	defaultKVBlockSize = 16
	// maxExactBytes bounds the prompt text tokenized per request (about
	// 64k tokens, a few ms): a longer prompt is tokenized up to a line
	// break before it, and only that part is matched exactly.
	maxExactBytes = 256 << 10
	// maxExactTokens bounds the token ids hashed per request.
	maxExactTokens = 64 << 10
)

// kvRouting is the gateway's part of precise prefix routing. Its zero
// fields (kv_events off) make every method a no-op.
type kvRouting struct {
	cfg kvevents.Config // as at start, defaults applied
	log *slog.Logger
	idx *kvevents.Index      // nil when off
	sub *kvevents.Subscriber // nil when off

	cancel context.CancelFunc
	done   chan struct{}

	// loaded are the tokenizers in use, by their files; guarded by
	// Gateway.applyMu.
	loaded map[tokenize.Config]*tokenize.Tokenizer

	// exactTokens counts requests by exactResult.
	exactTokens [nExactResults]prometheus.Counter
}

// newKVRouting builds the subscriber and its index for cfg.KVEvents and
// registers their metrics; nothing runs until start.
func newKVRouting(cfg *Config, reg prometheus.Registerer, log *slog.Logger) (*kvRouting, error) {
	kc := cfg.KVEvents
	kc.SetDefaults()
	k := &kvRouting{cfg: kc, log: log.With("component", "kv-events")}
	if !kc.Enabled {
		for _, p := range cfg.Pools {
			if !p.Tokenizer.IsZero() {
				k.log.Info("tokenizer not loaded: it serves precise prefix routing, and kv_events is off", "pool", p.Name)
			}
		}
		return k, nil
	}
	k.idx = kvevents.NewIndex(kc.IndexOptions())
	m, err := kvevents.NewMetrics(reg, k.idx)
	if err != nil {
		return nil, err
	}
	if k.sub, err = kvevents.New(kc, k.idx, kvevents.Options{Logger: log, Metrics: m}); err != nil {
		return nil, fmt.Errorf("kv_events: %w", err)
	}
	exact := metric.Counter("infergate_tier1_exact_tokens_total",
		"Requests by whether their exact prompt tokens were known for precise prefix routing: exact, truncated (the first part of a long prompt), no_tokenizer, unsupported (tools, images, batches, other APIs), error (the chat template failed), cache_salt, no_fresh_pod (no pod of the pool has fresh KV events).",
		"result")
	for r := range nExactResults {
		k.exactTokens[r] = exact.WithLabelValues(exactResult(r).String())
	}
	if err := reg.Register(exact); err != nil {
		return nil, fmt.Errorf("register exact-token metrics: %w", err)
	}
	return k, nil
}

func (k *kvRouting) on() bool { return k != nil && k.sub != nil }

// exactIndex adapts the index to the picker.
type exactIndex struct{ *kvevents.Index }

func (x exactIndex) Fresh(pod string) bool { return x.State(pod) == kvevents.StateFresh }

// exact is the tracker's exact index, nil when off.
func (k *kvRouting) exact() picker.ExactIndex {
	if !k.on() {
		return nil
	}
	return exactIndex{k.idx}
}

// start runs the subscriber until ctx ends or close, and registers the
// prefix-source metric. In bind mode it returns once the socket listens,
// or with the error that stopped it.
func (k *kvRouting) start(ctx context.Context, reg prometheus.Registerer, tr *picker.Tracker) error {
	if !k.on() {
		return nil
	}
	if err := reg.Register(prefixSourceCollector{tr}); err != nil {
		return fmt.Errorf("register prefix-source metric: %w", err)
	}
	ctx, k.cancel = context.WithCancel(ctx)
	k.done = make(chan struct{})
	errc := make(chan error, 1)
	go func() {
		defer close(k.done)
		err := k.sub.Run(ctx)
		if err != nil && ctx.Err() == nil {
			k.log.Error("kv events: subscriber stopped; prefix evidence is approximate from now on", "err", err)
		}
		errc <- err
	}()
	select {
	case <-k.sub.Ready():
	case err := <-errc:
		k.cancel()
		if err == nil {
			err = errors.New("stopped before it started")
		}
		return fmt.Errorf("kv events: %w", err)
	}
	k.log.Info("following the pods' KV-cache events", "mode", k.cfg.Mode, "port", k.cfg.Port,
		"replay_port", k.cfg.ReplayPort, "listen", k.cfg.Listen)
	return nil
}

// close stops the subscriber and waits for it.
func (k *kvRouting) close() {
	if k == nil || k.cancel == nil {
		return
	}
	k.cancel()
	<-k.done
}

// tokenizers loads the tokenizer of every pool that names one, reusing
// those already loaded, and returns them by pool name. With kv_events off
// none is loaded. An error names the key and the file.
func (k *kvRouting) tokenizers(cfg *Config) (map[string]*tokenize.Tokenizer, error) {
	if !k.on() {
		return nil, nil
	}
	out := map[string]*tokenize.Tokenizer{}
	keep := map[tokenize.Config]*tokenize.Tokenizer{}
	for i, p := range cfg.Pools {
		if p.Tokenizer.IsZero() {
			continue
		}
		t := keep[p.Tokenizer]
		if t == nil {
			t = k.loaded[p.Tokenizer]
		}
		if t == nil {
			var err error
			if t, err = tokenize.Load(p.Tokenizer); err != nil {
				return nil, fmt.Errorf("pools[%d].%w", i, err)
			}
			k.log.Info("tokenizer loaded", "pool", p.Name, "file", p.Tokenizer.File, "chat_template", t.HasChatTemplate())
		}
		keep[p.Tokenizer] = t
		out[p.Name] = t
	}
	k.loaded = keep
	return out, nil
}

// follow points the subscriber at the pods of st (static and discovered):
// connect mode dials each pod's host at kv_events.port (or the pod's own
// kv_events_port), bind mode accepts events whose topic names the pod's
// address. Pods that left are dropped from the index.
func (k *kvRouting) follow(st *state) {
	if k == nil {
		return
	}
	if want := st.base.KVEvents; !reflect.DeepEqual(want, k.cfg) {
		k.log.Warn("kv_events changed in the configuration; restart to apply it", "enabled", want.Enabled)
	}
	if !k.on() {
		return
	}
	targets := make([]kvevents.Target, 0, len(st.cfg.Pods))
	for _, pc := range st.cfg.Pods {
		var ann map[string]string
		if pc.KVEventsPort != 0 || pc.KVEventsReplayPort != 0 {
			ann = map[string]string{}
			if pc.KVEventsPort != 0 {
				ann[kvevents.AnnotationPort] = strconv.Itoa(pc.KVEventsPort)
			}
			if pc.KVEventsReplayPort != 0 {
				ann[kvevents.AnnotationReplayPort] = strconv.Itoa(max(pc.KVEventsReplayPort, 0))
			}
		}
		t, err := k.cfg.TargetFor(pc.Name, pc.Address, ann)
		if err != nil {
			k.log.Warn("kv events: pod not followed", "pod", pc.Name, "err", err)
			continue
		}
		targets = append(targets, t)
	}
	k.sub.SetTargets(targets)
}

// blockSize is the block size to hash pool's requests with: that of the
// first pod whose events are fresh (vLLM's default until one reported
// it), or 0 when no pod of the pool is fresh, so there is nothing to
// match exactly.
func (k *kvRouting) blockSize(pool *poolState) int {
	fresh := false
	for _, rt := range pool.pods {
		if k.idx.State(rt.cfg.Name) != kvevents.StateFresh {
			continue
		}
		if bs := k.idx.BlockSize(rt.cfg.Name); bs > 0 {
			return bs
		}
		fresh = true
	}
	if fresh {
		return defaultKVBlockSize
	}
	return 0
}

// exactResult is what became of a request's exact tokens.
type exactResult uint8

const (
	exactOK exactResult = iota
	exactTruncated
	exactNoTokenizer
	exactUnsupported
	exactError
	exactCacheSalt
	exactNoFreshPod
	nExactResults
)

var exactResultNames = [nExactResults]string{"exact", "truncated", "no_tokenizer", "unsupported", "error", "cache_salt", "no_fresh_pod"}

func (r exactResult) String() string { return exactResultNames[r] }

var tokenBufs = sync.Pool{New: func() any { return new([]uint32) }}

// exactPrompt sets the request's exact token hashes when kv_events is on
// and its tokens can be known exactly: a chat completion rendered with its
// pool's chat template and tokenized, a completion's text prompt
// tokenized, or a completion's prompt of token ids as sent. The hashes
// are kvevents.HashTokens of the ids in the block size the pool's pods
// report, under the request's LoRA adapter; PromptTokens becomes the
// exact count. Any other request keeps the approximate evidence alone.
func (c *call) exactPrompt(body *inferenceBody) {
	k := c.g.kv
	if !k.on() {
		return
	}
	r := c.exactPromptResult(k, body)
	k.exactTokens[r].Inc()
}

func (c *call) exactPromptResult(k *kvRouting, body *inferenceBody) exactResult {
	tok := c.st.tokenizers[c.pool.cfg.Name]
	var prompt []byte // a completion's prompt, as JSON
	switch c.ep {
	case epChat:
		if tok == nil {
			return exactNoTokenizer
		}
		if !tok.HasChatTemplate() {
			return exactUnsupported
		}
	case epCompletions:
		prompt = bytes.TrimSpace(body.Prompt)
		if tok == nil && !isTokenIDs(prompt) {
			return exactNoTokenizer
		}
	default:
		return exactUnsupported
	}
	if body.CacheSalt != "" {
		// vLLM salts the first block: those blocks match only salted
		// requests, which the approximate index keys by salt already.
		return exactCacheSalt
	}
	bs := k.blockSize(c.pool)
	if bs == 0 {
		return exactNoFreshPod
	}
	buf := tokenBufs.Get().(*[]uint32)
	defer tokenBufs.Put(buf)
	var ids []uint32
	var whole bool
	var res exactResult
	if c.ep == epChat {
		ids, whole, res = chatTokens(tok, c.data, (*buf)[:0])
	} else {
		ids, whole, res = completionTokens(tok, prompt, c.data, (*buf)[:0])
	}
	*buf = ids[:0]
	if res != exactOK {
		return res
	}
	req := c.req
	hashed := ids[:min(len(ids), maxExactTokens)]
	req.ExactHashes = kvevents.AppendHashTokens(req.ExactHashes[:0], hashed, bs, req.Adapter)
	req.ExactBlockSize = bs
	req.ExactPromptBlocks = 0
	switch {
	case !whole:
		// ids cover the first part of the text; the rest is estimated at
		// their tokens per byte.
		req.ExactPromptBlocks = req.PromptTokens / bs
		return exactTruncated
	case len(hashed) < len(ids):
		req.ExactPromptBlocks = len(ids) / bs
		req.PromptTokens = len(ids)
		return exactTruncated
	}
	req.PromptTokens = max(1, len(ids))
	return exactOK
}

// isTokenIDs reports whether a completion's prompt (JSON) is a list of
// token ids.
func isTokenIDs(prompt []byte) bool {
	if len(prompt) < 2 || prompt[0] != '[' {
		return false
	}
	rest := bytes.TrimLeft(prompt[1:], " \t\r\n")
	return len(rest) > 0 && rest[0] >= '0' && rest[0] <= '9'
}

// completionTokens are a /v1/completions prompt's token ids: the ids sent,
// or the text (a string, or a list of one) tokenized with the special
// tokens vLLM adds unless add_special_tokens is false. whole is false when
// only the first part of a long text was tokenized.
func completionTokens(tok *tokenize.Tokenizer, prompt, body []byte, dst []uint32) (ids []uint32, whole bool, res exactResult) {
	if isTokenIDs(prompt) {
		ids = dst
		if err := json.Unmarshal(prompt, &ids); err != nil {
			return dst, false, exactUnsupported
		}
		return ids, true, exactOK
	}
	var text string
	if err := json.Unmarshal(prompt, &text); err != nil {
		var list []string
		if json.Unmarshal(prompt, &list) != nil || len(list) != 1 {
			return dst, false, exactUnsupported // a batch, or ids nested in a list
		}
		text = list[0]
	}
	addSpecial := true // vLLM's default for completions
	err := jsonkeys.Members(body, func(name, value []byte) error {
		if string(name) == "add_special_tokens" {
			return json.Unmarshal(value, &addSpecial)
		}
		return nil
	})
	if err != nil {
		return dst, false, exactUnsupported
	}
	text, whole = cutText(text)
	if text == "" {
		return dst, false, exactUnsupported
	}
	return tok.AppendEncode(dst, text, addSpecial), whole, exactOK
}

// chatTokens renders a chat completion's messages with the pool's chat
// template and tokenizes the prompt, as vLLM does. The request fields the
// template reads are taken by their exact names.
func chatTokens(tok *tokenize.Tokenizer, body []byte, dst []uint32) (ids []uint32, whole bool, res exactResult) {
	var cr tokenize.ChatRequest
	err := jsonkeys.Members(body, func(name, value []byte) error {
		var v any
		switch string(name) {
		case "messages":
			v = &cr.Messages
		case "tools":
			v = &cr.Tools
		case "add_generation_prompt":
			v = &cr.AddGenerationPrompt
		case "continue_final_message":
			v = &cr.ContinueFinalMessage
		case "add_special_tokens":
			v = &cr.AddSpecialTokens
		case "chat_template_kwargs":
			v = &cr.ChatTemplateKwargs
		case "chat_template":
			v = &cr.ChatTemplate
		default:
			return nil
		}
		return json.Unmarshal(value, v)
	})
	if err != nil {
		return dst, false, exactUnsupported
	}
	text, err := tok.RenderChat(&cr)
	switch {
	case errors.Is(err, tokenize.ErrUnsupported):
		return dst, false, exactUnsupported
	case err != nil:
		return dst, false, exactError
	}
	text, whole = cutText(text)
	if text == "" {
		return dst, false, exactUnsupported
	}
	return tok.AppendEncode(dst, text, cr.AddSpecialTokens), whole, exactOK
}

// cutText returns text, or for one longer than maxExactBytes its part up
// to the last line break before that followed by a character that is not
// whitespace: no pre-tokenizer piece of the Llama-3 or Qwen patterns
// spans such a break, so the tokens of the part are exactly the first
// tokens of the whole. "" when there is no such break.
func cutText(text string) (string, bool) {
	if len(text) <= maxExactBytes {
		return text, true
	}
	for i := maxExactBytes - 1; i > 0; i-- {
		if text[i-1] == '\n' {
			switch text[i] {
			case ' ', '\t', '\r', '\n', '\v', '\f':
			default:
				return text[:i], false
			}
		}
	}
	return "", false
}

// prefixSourceCollector exports the tracker's dispatch counts by prefix
// evidence.
type prefixSourceCollector struct{ tr *picker.Tracker }

var prefixSourceDesc = prometheus.NewDesc("infergate_tier1_prefix_source_total",
	"Requests with a prompt dispatched, by where the chosen pod's prefix evidence came from: exact (its KV-cache events, matched on the request's exact tokens) or approximate (the router's prefix index). Retries count again.",
	[]string{"source"}, nil)

func (c prefixSourceCollector) Describe(ch chan<- *prometheus.Desc) { ch <- prefixSourceDesc }

func (c prefixSourceCollector) Collect(ch chan<- prometheus.Metric) {
	for _, src := range picker.PrefixSources {
		ch <- prometheus.MustNewConstMetric(prefixSourceDesc, prometheus.CounterValue, float64(c.tr.PrefixSourceCount(src)), src.String())
	}
}

// kvPodDebug is a pod's KV-events view in /debug/pods.
type kvPodDebug struct {
	// State is the pod's event state (fresh, stale, absent); Blocks and
	// BlockSize what its index holds.
	State     string `json:"state"`
	Blocks    int    `json:"blocks"`
	BlockSize int    `json:"block_size,omitempty"`
	// PrefixSource is the evidence the prefix scorers use for this pod
	// now: exact (fresh events, for requests with exact tokens) or
	// approximate; ExactTokens says which of the pool's requests have
	// exact tokens.
	PrefixSource string `json:"prefix_source"`
	ExactTokens  string `json:"exact_tokens"`
}

// podStats returns the index's per-pod stats by pod (nil when off).
func (k *kvRouting) podStats() map[string]kvevents.PodStats {
	if !k.on() {
		return nil
	}
	out := map[string]kvevents.PodStats{}
	for _, s := range k.idx.Stats() {
		out[s.Pod] = s
	}
	return out
}

// podDebug describes pod's KV-event state for /debug/pods (nil when off).
func (k *kvRouting) podDebug(stats map[string]kvevents.PodStats, st *state, pool, pod string) *kvPodDebug {
	if !k.on() {
		return nil
	}
	s, ok := stats[pod]
	if !ok {
		s.State = kvevents.StateAbsent
	}
	d := &kvPodDebug{State: s.State.String(), Blocks: s.Blocks, BlockSize: s.BlockSize, PrefixSource: picker.PrefixApproximate.String(),
		ExactTokens: "chat and completions (the pool's tokenizer)"}
	if s.State == kvevents.StateFresh {
		d.PrefixSource = picker.PrefixExact.String()
	}
	if st.tokenizers[pool] == nil {
		d.ExactTokens = "completions sent as token ids only (the pool has no tokenizer)"
	}
	return d
}
