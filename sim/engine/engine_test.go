package engine

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/infergate/infergate/sim/profile"
)

func mustConfig(t testing.TB, model, gpu string, tp int) Config {
	t.Helper()
	m, err := profile.Model(model)
	if err != nil {
		t.Fatal(err)
	}
	g, err := profile.GPU(gpu)
	if err != nil {
		t.Fatal(err)
	}
	return Config{Model: m, GPU: g, TensorParallel: tp}
}

func mustEngine(t testing.TB, cfg Config) *Engine {
	t.Helper()
	e, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// outcome records what the callbacks saw for one request.
type outcome struct {
	first, done time.Duration
	tokens      int
	res         Result
	finished    bool
}

// tracker builds requests whose callbacks fill outcomes.
type tracker struct {
	out map[uint64]*outcome
}

func newTracker() *tracker { return &tracker{out: make(map[uint64]*outcome)} }

func (tr *tracker) req(id uint64, prompt, maxTokens int, hashes []uint64) *Request {
	o := &outcome{}
	tr.out[id] = o
	return &Request{
		ID: id, PromptTokens: prompt, MaxTokens: maxTokens, BlockHashes: hashes,
		OnFirstToken: func(at time.Duration) { o.first = at },
		OnTokens:     func(_ time.Duration, n int) { o.tokens += n },
		OnDone: func(at time.Duration, r Result) {
			o.done, o.res, o.finished = at, r, true
		},
	}
}

// hashes returns n chained block hashes derived from seed.
func hashes(seed uint64, n int) []uint64 {
	out := make([]uint64, n)
	h := seed*0x9E3779B97F4A7C15 + 1
	for i := range out {
		h = (h ^ uint64(i+1)) * 0xBF58476D1CE4E5B9
		out[i] = h
	}
	return out
}

// drain runs e to idle, returning the time it went idle.
func drain(t testing.TB, e *Engine) time.Duration {
	t.Helper()
	var last time.Duration
	for i := 0; ; i++ {
		next, ok := e.NextEventTime()
		if !ok {
			return last
		}
		if i > 10_000_000 {
			t.Fatal("engine does not go idle")
		}
		e.Advance(next)
		last = next
	}
}

func TestProfileLookups(t *testing.T) {
	for _, name := range []string{"h100", "H200", "a100", "A10G", "l4", "nvidia/H100-SXM"} {
		if _, err := profile.GPU(name); err != nil {
			t.Errorf("GPU(%q): %v", name, err)
		}
	}
	for _, name := range []string{"llama-3.1-8b", "meta-llama/Llama-3.1-70B-Instruct", "Qwen/Qwen3-32B", "qwen3-235b-a22b"} {
		if _, err := profile.Model(name); err != nil {
			t.Errorf("Model(%q): %v", name, err)
		}
	}
	if _, err := profile.GPU("tpu"); err == nil || !strings.Contains(err.Error(), "h100") {
		t.Errorf("GPU(tpu) error should list valid names, got %v", err)
	}
	if _, err := profile.Model("gpt-5"); err == nil || !strings.Contains(err.Error(), "llama-3.1-8b") {
		t.Errorf("Model(gpt-5) error should list valid names, got %v", err)
	}
}

func TestConfigValidation(t *testing.T) {
	tests := []struct {
		model, gpu string
		tp         int
		mutate     func(*Config)
		wantErr    string // substring; "" means valid
	}{
		{"llama-3.1-8b", "h100", 1, nil, ""},
		{"llama-3.1-8b", "a10g", 1, nil, ""},
		{"llama-3.1-8b", "l4", 1, nil, ""},
		{"qwen3-32b", "a10g", 4, nil, ""},
		{"qwen3-32b", "a10g", 1, nil, "65.6 GB of weights"},
		{"llama-3.1-70b", "h100", 4, nil, ""},
		{"llama-3.1-70b", "h100", 1, nil, "per GPU at TP=1"},
		{"qwen3-235b-a22b", "h100", 8, nil, ""},
		{"qwen3-235b-a22b", "h200", 4, nil, ""},
		{"qwen3-235b-a22b", "h100", 4, nil, "per GPU at TP=4"},
		{"llama-3.1-8b", "h100", 3, nil, "must divide"},
		{"llama-3.1-8b", "h100", 1, func(c *Config) { c.MaxBatchedTokens = 100 }, "MaxBatchedTokens"},
		{"llama-3.1-8b", "a10g", 1, func(c *Config) { c.MaxModelLen = 131072 }, "exceeds the KV cache"},
		{"llama-3.1-8b", "h100", 1, func(c *Config) { c.GPUMemoryUtilization = 1.5 }, "GPUMemoryUtilization"},
		{"", "h100", 1, func(c *Config) { c.Model = profile.ModelSpec{} }, "Model not set"},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("%s/%s/tp%d", tt.model, tt.gpu, tt.tp), func(t *testing.T) {
			var cfg Config
			if tt.model != "" {
				cfg = mustConfig(t, tt.model, tt.gpu, tt.tp)
			} else {
				cfg = mustConfig(t, "llama-3.1-8b", tt.gpu, tt.tp)
			}
			if tt.mutate != nil {
				tt.mutate(&cfg)
			}
			e, err := New(cfg)
			if tt.wantErr == "" {
				if err != nil {
					t.Fatal(err)
				}
				c := e.Config()
				if c.NumBlocks <= 0 || c.MaxModelLen <= 0 || c.MaxModelLen > c.NumBlocks*BlockSize {
					t.Errorf("derived NumBlocks %d MaxModelLen %d inconsistent", c.NumBlocks, c.MaxModelLen)
				}
				return
			}
			if !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("err = %v, want ErrInvalidConfig containing %q", err, tt.wantErr)
			}
		})
	}
}

func TestSubmitErrors(t *testing.T) {
	cfg := mustConfig(t, "llama-3.1-8b", "h100", 1)
	cfg.Adapters = []string{"sql"}
	cfg.MaxModelLen = 4096
	e := mustEngine(t, cfg)
	tests := []struct {
		name string
		r    *Request
		want error
	}{
		{"nil", nil, ErrInvalidRequest},
		{"empty prompt", &Request{ID: 1}, ErrInvalidRequest},
		{"too long", &Request{ID: 2, PromptTokens: 4000, MaxTokens: 200}, ErrContextLength},
		{"prompt fills context", &Request{ID: 3, PromptTokens: 4096}, ErrContextLength},
		// prompt + max_tokens wraps negative: must not pass the check.
		{"max tokens overflows", &Request{ID: 7, PromptTokens: 10, MaxTokens: math.MaxInt}, ErrContextLength},
		{"max tokens overflows by one", &Request{ID: 8, PromptTokens: 1, MaxTokens: math.MaxInt}, ErrContextLength},
		{"max tokens 2^62", &Request{ID: 9, PromptTokens: 10, MaxTokens: 1 << 62}, ErrContextLength},
		{"prompt beyond context", &Request{ID: 10, PromptTokens: math.MaxInt, MaxTokens: 1}, ErrContextLength},
		{"unknown adapter", &Request{ID: 4, PromptTokens: 10, MaxTokens: 5, Adapter: "nope"}, ErrUnknownAdapter},
		{"ok adapter", &Request{ID: 5, PromptTokens: 10, MaxTokens: 5, Adapter: "sql"}, nil},
		{"duplicate", &Request{ID: 5, PromptTokens: 10, MaxTokens: 5}, ErrInvalidRequest},
		{"default max tokens", &Request{ID: 6, PromptTokens: 10}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := e.Submit(0, tt.r)
			if !errors.Is(err, tt.want) || (tt.want == nil) != (err == nil) {
				t.Fatalf("Submit = %v, want %v", err, tt.want)
			}
		})
	}
	small := cfg
	small.MaxModelLen = 0
	small.NumBlocks = 4
	e = mustEngine(t, small)
	if err := e.Submit(0, &Request{ID: 1, PromptTokens: 65, MaxTokens: 1}); !errors.Is(err, ErrContextLength) && !errors.Is(err, ErrKVCapacity) {
		t.Fatalf("prompt beyond KV capacity: %v", err)
	}
}

func TestSingleRequestLifecycle(t *testing.T) {
	e := mustEngine(t, mustConfig(t, "llama-3.1-8b", "h100", 1))
	tr := newTracker()
	if err := e.Submit(0, tr.req(1, 1000, 50, nil)); err != nil {
		t.Fatal(err)
	}
	drain(t, e)
	o := tr.out[1]
	if !o.finished || o.res.CompletionTokens != 50 || o.tokens != 50 || o.res.FinishReason != "length" {
		t.Fatalf("outcome %+v", o)
	}
	if o.first <= 0 || o.done <= o.first {
		t.Fatalf("first %v done %v", o.first, o.done)
	}
	// One 8B decode step on an H100 is memory bound: ~16 GB of weights over
	// ~2.7 TB/s is several ms; inter-token latency must be in that region.
	itl := (o.done - o.first) / 49
	if itl < 3*time.Millisecond || itl > 15*time.Millisecond {
		t.Errorf("ITL %v outside the plausible 3-15ms for 8B on H100", itl)
	}
	st := e.Stats()
	if st.FinishedRequests != 1 || st.PromptTokens != 1000 || st.GenerationTokens != 50 || st.UsedBlocks != 0 || st.Running != 0 {
		t.Errorf("stats %+v", st)
	}
	// Stop before max tokens.
	if err := e.Submit(o.done, &Request{ID: 2, PromptTokens: 10, MaxTokens: 100, OutputTokens: 7, OnDone: func(_ time.Duration, r Result) {
		if r.FinishReason != "stop" || r.CompletionTokens != 7 {
			t.Errorf("result %+v, want stop after 7", r)
		}
	}}); err != nil {
		t.Fatal(err)
	}
	drain(t, e)
}

func TestQueueAndRunningRiseWithLoad(t *testing.T) {
	tests := []struct {
		n                         int
		wantRunning, wantWaitingG int // running exactly; waiting at least
	}{
		{1, 1, 0},
		{8, 8, 0},
		{64, 16, 48},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprint(tt.n), func(t *testing.T) {
			cfg := mustConfig(t, "llama-3.1-8b", "h100", 1)
			cfg.MaxNumSeqs = 16
			e := mustEngine(t, cfg)
			tr := newTracker()
			for i := range tt.n {
				if err := e.Submit(0, tr.req(uint64(i), 200, 100, nil)); err != nil {
					t.Fatal(err)
				}
			}
			st := e.Stats()
			if st.Waiting != tt.n || st.Running != 0 {
				t.Fatalf("before scheduling: %+v", st)
			}
			e.Advance(0) // schedules the first step
			st = e.Stats()
			if st.Running != tt.wantRunning || st.Waiting < tt.wantWaitingG {
				t.Fatalf("running %d waiting %d, want %d and ≥ %d", st.Running, st.Waiting, tt.wantRunning, tt.wantWaitingG)
			}
			drain(t, e)
			for id, o := range tr.out {
				if !o.finished {
					t.Errorf("request %d did not finish", id)
				}
			}
		})
	}
}

func TestKVUsageRisesAndFalls(t *testing.T) {
	e := mustEngine(t, mustConfig(t, "llama-3.1-8b", "a10g", 1))
	tr := newTracker()
	for i := range 4 {
		if err := e.Submit(0, tr.req(uint64(i), 4000, 20, nil)); err != nil {
			t.Fatal(err)
		}
	}
	var peak float64
	for {
		next, ok := e.NextEventTime()
		if !ok {
			break
		}
		e.Advance(next)
		peak = max(peak, e.Stats().KVUsage)
	}
	st := e.Stats()
	want := float64(4*blocksFor(4000)) / float64(st.NumBlocks)
	if peak < want {
		t.Errorf("peak KV usage %.3f, want ≥ %.3f", peak, want)
	}
	if st.KVUsage != 0 || st.UsedBlocks != 0 {
		t.Errorf("after completion usage %.3f used %d, want 0", st.KVUsage, st.UsedBlocks)
	}
}

func TestPrefixCacheHit(t *testing.T) {
	e := mustEngine(t, mustConfig(t, "llama-3.1-8b", "a10g", 1))
	tr := newTracker()
	h := hashes(7, 4000/BlockSize)
	if err := e.Submit(0, tr.req(1, 4000, 10, h)); err != nil {
		t.Fatal(err)
	}
	t1 := drain(t, e)
	if err := e.Submit(t1, tr.req(2, 4000, 10, h)); err != nil {
		t.Fatal(err)
	}
	drain(t, e)
	a, b := tr.out[1], tr.out[2]
	if a.res.CachedTokens != 0 {
		t.Errorf("first request cached %d tokens", a.res.CachedTokens)
	}
	// 4000 tokens = 250 full blocks; all but the last are reused because
	// the last prompt token is always recomputed.
	if want := 249 * BlockSize; b.res.CachedTokens != want {
		t.Errorf("second request cached %d tokens, want %d", b.res.CachedTokens, want)
	}
	ttft1, ttft2 := a.first, b.first-t1
	if ttft2*3 > ttft1 {
		t.Errorf("cached TTFT %v not well below uncached %v", ttft2, ttft1)
	}
	st := e.Stats()
	if st.PrefixCacheQueries != 8000 || st.PrefixCacheHits != int64(b.res.CachedTokens) {
		t.Errorf("prefix stats queries %d hits %d", st.PrefixCacheQueries, st.PrefixCacheHits)
	}
}

func TestPrefixCacheLastTokenRecomputedAndNamespaced(t *testing.T) {
	cfg := mustConfig(t, "llama-3.1-8b", "h100", 1)
	cfg.Adapters = []string{"a"}
	tests := []struct {
		name        string
		prompt      int
		adapter2    string
		wantCached2 int
	}{
		{"exact multiple keeps one block to compute", 64, "", 48},
		{"partial tail", 70, "", 64},
		{"other adapter misses", 70, "a", 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := mustEngine(t, cfg)
			tr := newTracker()
			h := hashes(3, tt.prompt/BlockSize)
			_ = e.Submit(0, tr.req(1, tt.prompt, 2, h))
			end := drain(t, e)
			r := tr.req(2, tt.prompt, 2, h)
			r.Adapter = tt.adapter2
			if err := e.Submit(end, r); err != nil {
				t.Fatal(err)
			}
			drain(t, e)
			if got := tr.out[2].res.CachedTokens; got != tt.wantCached2 {
				t.Errorf("cached %d, want %d", got, tt.wantCached2)
			}
		})
	}
}

func TestLoRA(t *testing.T) {
	const load = 200 * time.Millisecond
	newEngine := func(t *testing.T, slots int) *Engine {
		cfg := mustConfig(t, "llama-3.1-8b", "h100", 1)
		cfg.Adapters = []string{"a", "b"}
		cfg.MaxLoras = slots
		cfg.LoRALoadTime = load
		return mustEngine(t, cfg)
	}
	t.Run("load then run", func(t *testing.T) {
		e := newEngine(t, 1)
		tr := newTracker()
		base := tr.req(1, 100, 5, nil)
		_ = e.Submit(0, base)
		drain(t, e)
		baseTTFT := tr.out[1].first
		r := tr.req(2, 100, 5, nil)
		r.Adapter = "a"
		start := tr.out[1].done
		_ = e.Submit(start, r)
		drain(t, e)
		ttft := tr.out[2].first - start
		if ttft < load || ttft > load+2*baseTTFT {
			t.Errorf("adapter TTFT %v, want load %v + about %v", ttft, load, baseTTFT)
		}
		// Resident now: no second load.
		r3 := tr.req(3, 100, 5, nil)
		r3.Adapter = "a"
		start = tr.out[2].done
		_ = e.Submit(start, r3)
		drain(t, e)
		if ttft := tr.out[3].first - start; ttft >= load {
			t.Errorf("resident adapter TTFT %v includes a load", ttft)
		}
		if st := e.Stats(); st.LoraLoads != 1 || !slices.Equal(st.LoadedAdapters, []string{"a"}) {
			t.Errorf("loads %d loaded %v", st.LoraLoads, st.LoadedAdapters)
		}
	})
	t.Run("full slots wait", func(t *testing.T) {
		e := newEngine(t, 1)
		tr := newTracker()
		ra := tr.req(1, 100, 200, nil)
		ra.Adapter = "a"
		rb := tr.req(2, 100, 5, nil)
		rb.Adapter = "b"
		rbase := tr.req(3, 100, 5, nil)
		_ = e.Submit(0, ra)
		_ = e.Submit(0, rb)
		_ = e.Submit(0, rbase)
		e.Advance(0)
		st := e.Stats()
		if !slices.Equal(st.RunningAdapters, []string{"a"}) || !slices.Equal(st.WaitingAdapters, []string{"b"}) || st.Running != 2 {
			t.Fatalf("running %d adapters %v waiting %v", st.Running, st.RunningAdapters, st.WaitingAdapters)
		}
		drain(t, e)
		a, b, base := tr.out[1], tr.out[2], tr.out[3]
		if !b.finished || b.first < a.done {
			t.Errorf("b first token %v before a finished %v", b.first, a.done)
		}
		if base.done > a.done {
			t.Errorf("base request was held behind the adapter wait")
		}
	})
	t.Run("two slots run together", func(t *testing.T) {
		e := newEngine(t, 2)
		tr := newTracker()
		ra := tr.req(1, 100, 200, nil)
		ra.Adapter = "a"
		rb := tr.req(2, 100, 5, nil)
		rb.Adapter = "b"
		_ = e.Submit(0, ra)
		_ = e.Submit(0, rb)
		drain(t, e)
		if tr.out[2].done > tr.out[1].done {
			t.Errorf("b waited for a despite a free slot")
		}
	})
	t.Run("register and unregister", func(t *testing.T) {
		e := newEngine(t, 1)
		if err := e.LoadAdapter(0, "c"); err != nil {
			t.Fatal(err)
		}
		if err := e.LoadAdapter(0, "c"); !errors.Is(err, ErrAdapterExists) {
			t.Fatalf("double load: %v", err)
		}
		if got := e.Adapters(); !slices.Equal(got, []string{"a", "b", "c"}) {
			t.Fatalf("Adapters %v", got)
		}
		if err := e.UnloadAdapter("a"); err != nil {
			t.Fatal(err)
		}
		if err := e.UnloadAdapter("a"); !errors.Is(err, ErrUnknownAdapter) {
			t.Fatalf("double unload: %v", err)
		}
		if err := e.Submit(0, &Request{ID: 1, PromptTokens: 5, MaxTokens: 1, Adapter: "a"}); !errors.Is(err, ErrUnknownAdapter) {
			t.Fatalf("submit to unloaded adapter: %v", err)
		}
	})
}

func TestPreemption(t *testing.T) {
	cfg := mustConfig(t, "llama-3.1-8b", "h100", 1)
	cfg.NumBlocks = 64 // 1024 tokens
	e := mustEngine(t, cfg)
	tr := newTracker()
	// Four requests of 200 prompt tokens fit (52 blocks) but grow to
	// 4 × 500 tokens = 128 blocks: decode must preempt.
	for i := range 4 {
		if err := e.Submit(0, tr.req(uint64(i), 200, 300, nil)); err != nil {
			t.Fatal(err)
		}
	}
	drain(t, e)
	st := e.Stats()
	if st.Preemptions == 0 {
		t.Fatal("no preemption although KV ran out")
	}
	preempted := 0
	for id, o := range tr.out {
		if !o.finished || o.res.CompletionTokens != 300 || o.tokens != 300 {
			t.Errorf("request %d: %+v", id, o)
		}
		preempted += o.res.Preemptions
	}
	if int64(preempted) != st.Preemptions {
		t.Errorf("per-request preemptions %d, engine %d", preempted, st.Preemptions)
	}
	if st.UsedBlocks != 0 || st.FinishedRequests != 4 {
		t.Errorf("stats %+v", st)
	}
}

func TestPrefillFasterOnH100ThanA10G(t *testing.T) {
	ttft := func(gpu string) time.Duration {
		e := mustEngine(t, mustConfig(t, "llama-3.1-8b", gpu, 1))
		tr := newTracker()
		_ = e.Submit(0, tr.req(1, 8000, 1, nil))
		drain(t, e)
		return tr.out[1].first
	}
	h, a := ttft("h100"), ttft("a10g")
	if h*3 > a {
		t.Errorf("H100 TTFT %v not well below A10G %v for an 8000-token prompt", h, a)
	}
}

func TestCancelFreesBlocks(t *testing.T) {
	tests := []struct {
		name    string
		advance bool // let it start running before cancelling
	}{
		{"waiting", false},
		{"running", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := mustEngine(t, mustConfig(t, "llama-3.1-8b", "h100", 1))
			tr := newTracker()
			_ = e.Submit(0, tr.req(1, 3000, 1000, nil))
			if tt.advance {
				next, _ := e.NextEventTime()
				e.Advance(next)
				next, _ = e.NextEventTime()
				e.Advance(next)
				if st := e.Stats(); st.UsedBlocks == 0 || st.Running != 1 {
					t.Fatalf("not running: %+v", st)
				}
			}
			e.Cancel(e.now, 1)
			st := e.Stats()
			if st.UsedBlocks != 0 || st.Running != 0 || st.Waiting != 0 {
				t.Fatalf("after cancel %+v", st)
			}
			if _, ok := e.NextEventTime(); ok {
				drain(t, e)
			}
			if tr.out[1].finished {
				t.Error("OnDone ran for a cancelled request")
			}
			e.Cancel(e.now, 1) // idempotent
		})
	}
}

// workload submits n random requests through a Loop and returns a
// transcript of every callback.
func workload(t testing.TB, cfg Config, n int, seed uint64, maxCoalesce time.Duration) ([]string, *Engine) {
	e := mustEngine(t, cfg)
	e.maxCoalesce = maxCoalesce
	l := NewLoop()
	l.Add(e)
	rng := rand.New(rand.NewPCG(seed, 1))
	var log []string
	var at time.Duration
	for i := range n {
		at += time.Duration(rng.ExpFloat64() * float64(30*time.Millisecond))
		id := uint64(i)
		prompt := 50 + rng.IntN(2000)
		shared := rng.IntN(4)
		r := &Request{
			ID: id, PromptTokens: prompt, MaxTokens: 10 + rng.IntN(400),
			BlockHashes:  hashes(uint64(shared), prompt/BlockSize),
			OnFirstToken: func(at time.Duration) { log = append(log, fmt.Sprintf("%d first %d", id, at)) },
			OnDone: func(at time.Duration, r Result) {
				log = append(log, fmt.Sprintf("%d done %d %+v", id, at, r))
			},
		}
		l.At(at, func(now time.Duration) {
			if err := e.Submit(now, r); err != nil {
				t.Error(err)
			}
		})
		if rng.IntN(20) == 0 {
			l.At(at+time.Duration(rng.IntN(2000))*time.Millisecond, func(now time.Duration) { e.Cancel(now, id) })
		}
	}
	l.Run(time.Hour)
	st := e.Stats()
	log = append(log, fmt.Sprintf("stats %+v", st))
	return log, e
}

func TestDeterminism(t *testing.T) {
	cfg := mustConfig(t, "llama-3.1-8b", "a10g", 1)
	a, _ := workload(t, cfg, 300, 42, 0)
	b, _ := workload(t, cfg, 300, 42, 0)
	if !slices.Equal(a, b) {
		t.Fatal("same inputs gave different transcripts")
	}
	c, _ := workload(t, cfg, 300, 43, 0)
	if slices.Equal(a, c) {
		t.Fatal("different seeds gave identical transcripts")
	}
}

// Coalescing decode steps must not change any observable time: a run
// with a cap smaller than one step (no coalescing) gives the same
// transcript, with arrivals and cancellations landing mid-run.
func TestCoalescingIsExact(t *testing.T) {
	cfg := mustConfig(t, "llama-3.1-8b", "h100", 1)
	coalesced, ec := workload(t, cfg, 200, 9, 0)
	stepwise, es := workload(t, cfg, 200, 9, time.Nanosecond)
	if ec.coalesced == 0 || es.coalesced != 0 {
		t.Fatalf("coalesced runs: %d with coalescing, %d without", ec.coalesced, es.coalesced)
	}
	if len(coalesced) != len(stepwise) {
		t.Fatalf("transcripts differ in length: %d vs %d", len(coalesced), len(stepwise))
	}
	for i := range coalesced {
		if coalesced[i] != stepwise[i] {
			t.Fatalf("line %d differs:\ncoalesced %s\nstepwise  %s", i, coalesced[i], stepwise[i])
		}
	}
}

// A queue held back by KV capacity (not by MaxNumSeqs) admits its head as
// soon as running requests free their blocks, and everything finishes.
func TestKVBoundQueue(t *testing.T) {
	cfg := mustConfig(t, "llama-3.1-8b", "h100", 1)
	cfg.NumBlocks = 100 // 1600 tokens: three 500-token requests at a time
	e := mustEngine(t, cfg)
	tr := newTracker()
	for i := range 10 {
		if err := e.Submit(0, tr.req(uint64(i), 480, 20, nil)); err != nil {
			t.Fatal(err)
		}
	}
	e.Advance(0)
	if st := e.Stats(); st.Running != 3 || st.Waiting != 7 {
		t.Fatalf("running %d waiting %d, want 3 and 7", st.Running, st.Waiting)
	}
	maxRunning := 0
	for {
		next, ok := e.NextEventTime()
		if !ok {
			break
		}
		e.Advance(next)
		maxRunning = max(maxRunning, e.Stats().Running)
	}
	if maxRunning > 3 {
		t.Errorf("%d running at once with KV for 3", maxRunning)
	}
	for id, o := range tr.out {
		if !o.finished {
			t.Errorf("request %d did not finish", id)
		}
	}
	// FCFS: first tokens come in submission order.
	for i := uint64(1); i < 10; i++ {
		if tr.out[i].first < tr.out[i-1].first {
			t.Errorf("request %d got its first token before request %d", i, i-1)
		}
	}
}

// TestPooling: a pooling (embedding) request costs its prefill and
// nothing more: it ends with the step that computes its last prompt token,
// generates no token, frees its blocks, and a prompt that alone exceeds
// the model length is refused.
func TestPooling(t *testing.T) {
	e := mustEngine(t, mustConfig(t, "llama-3.1-8b", "h100", 1))
	tr := newTracker()
	pool := tr.req(1, 3000, 0, nil)
	pool.Pooling = true
	if err := e.Submit(0, pool); err != nil {
		t.Fatal(err)
	}
	pooledAt := drain(t, e)
	o := tr.out[1]
	if !o.finished || o.res.CompletionTokens != 0 || o.tokens != 0 || o.res.PromptTokens != 3000 || o.done != o.first {
		t.Fatalf("pooling outcome %+v", o)
	}
	st := e.Stats()
	if st.GenerationTokens != 0 || st.PromptTokens != 3000 || st.FinishedRequests != 1 || st.UsedBlocks != 0 || st.Running != 0 {
		t.Errorf("stats %+v", st)
	}
	// The same prompt generating one token takes the same prefill: the
	// pooling request's time is the prefill (a fresh engine, no cache).
	e2 := mustEngine(t, mustConfig(t, "llama-3.1-8b", "h100", 1))
	tr2 := newTracker()
	if err := e2.Submit(0, tr2.req(1, 3000, 1, nil)); err != nil {
		t.Fatal(err)
	}
	drain(t, e2)
	if ttft := tr2.out[1].first; pooledAt != ttft || pooledAt <= 0 {
		t.Errorf("pooling took %v, the same prefill to a first token %v", pooledAt, ttft)
	}
	// A prompt as long as the model allows fits (no room for output is
	// needed); one token more does not.
	long := &Request{ID: 2, PromptTokens: e.MaxModelLen(), Pooling: true}
	if err := e.Submit(pooledAt, long); err != nil {
		t.Errorf("prompt of max_model_len: %v", err)
	}
	if err := e.Submit(pooledAt, &Request{ID: 3, PromptTokens: e.MaxModelLen() + 1, Pooling: true}); !errors.Is(err, ErrContextLength) {
		t.Errorf("prompt over max_model_len: %v, want ErrContextLength", err)
	}
	drain(t, e)
}
