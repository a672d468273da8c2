package engine

import (
	"maps"
	"math/rand/v2"
	"testing"
	"time"
)

// kvRecorder replays KV events into the cache contents they describe.
type kvRecorder struct {
	t       *testing.T
	cached  map[uint64]int
	stored  int
	removed int
	cleared int
}

func (k *kvRecorder) BlockStored(r *Request, i int, hash, parent uint64, hasParent bool) {
	if hasParent != (i > 0) || (hasParent && k.cached[parent] == 0) {
		k.t.Errorf("block %d of request %d stored with parent %x (has %v), which is not cached", i, r.ID, parent, hasParent)
	}
	k.cached[hash]++
	k.stored++
}

func (k *kvRecorder) BlockRemoved(hash uint64) {
	if k.cached[hash] == 0 {
		k.t.Errorf("removed %x, which was never stored", hash)
	}
	if k.cached[hash]--; k.cached[hash] == 0 {
		delete(k.cached, hash)
	}
	k.removed++
}

func (k *kvRecorder) AllBlocksCleared() {
	clear(k.cached)
	k.cleared++
}

// cacheContents is what the prefix cache holds, by hash.
func cacheContents(e *Engine) map[uint64]int {
	out := map[uint64]int{}
	for _, s := range e.kv.cache.slots {
		if s.val >= 0 {
			out[s.key]++
		}
	}
	return out
}

// TestKVEventsFollowTheCache runs the churn workload (adapters, shared
// prefixes, cancellations, preemptions, evictions) and checks at every
// step that the events heard so far describe exactly the cached blocks.
func TestKVEventsFollowTheCache(t *testing.T) {
	e := mustEngine(t, churnConfig(t))
	rec := &kvRecorder{t: t, cached: map[uint64]int{}}
	e.SetKVEvents(rec)
	l := NewLoop()
	l.Add(e)
	rng := rand.New(rand.NewPCG(7, 8))
	adapters := []string{"", "", "a", "b"}
	var at time.Duration
	for i := range 400 {
		at += time.Duration(rng.ExpFloat64() * float64(40*time.Millisecond))
		prompt := 20 + rng.IntN(1500)
		r := &Request{ID: uint64(i), PromptTokens: prompt, MaxTokens: 1 + rng.IntN(200),
			Adapter: adapters[rng.IntN(len(adapters))], BlockHashes: hashes(uint64(rng.IntN(5)), prompt/BlockSize)}
		l.At(at, func(now time.Duration) {
			if err := e.Submit(now, r); err != nil {
				t.Error(err)
			}
		})
		if rng.IntN(10) == 0 {
			l.At(at+time.Duration(rng.IntN(3000))*time.Millisecond, func(now time.Duration) { e.Cancel(now, r.ID) })
		}
	}
	for l.Run(l.Now() + 50*time.Millisecond); ; l.Run(l.Now() + 50*time.Millisecond) {
		if got := cacheContents(e); !maps.Equal(got, rec.cached) {
			t.Fatalf("at %v: the events describe %d cached blocks, the cache holds %d", l.Now(), len(rec.cached), len(got))
		}
		if _, busy := e.NextEventTime(); !busy && l.Now() > at {
			break
		}
	}
	if rec.stored == 0 || rec.removed == 0 {
		t.Fatalf("workload stored %d and evicted %d blocks; want both", rec.stored, rec.removed)
	}
	t.Logf("%d stored, %d removed", rec.stored, rec.removed)
}

func TestResetPrefixCache(t *testing.T) {
	cfg := mustConfig(t, "llama-3.1-8b", "h100", 1)
	cfg.NumBlocks = 64
	e := mustEngine(t, cfg)
	rec := &kvRecorder{t: t, cached: map[uint64]int{}}
	e.SetKVEvents(rec)
	tr := newTracker()
	h := hashes(1, 8)
	if err := e.Submit(0, tr.req(1, 8*BlockSize+1, 50, h)); err != nil {
		t.Fatal(err)
	}
	e.Advance(0)
	if e.ResetPrefixCache() {
		t.Fatal("reset while a request holds blocks")
	}
	end := drain(t, e)
	if len(rec.cached) != 8 {
		t.Fatalf("%d blocks cached after the request, want 8", len(rec.cached))
	}
	if !e.ResetPrefixCache() {
		t.Fatal("reset refused on an idle engine")
	}
	if rec.cleared != 1 || len(rec.cached) != 0 || len(cacheContents(e)) != 0 {
		t.Fatalf("after reset: cleared %d, recorded %d, cache %d", rec.cleared, len(rec.cached), len(cacheContents(e)))
	}
	if err := e.Submit(end, tr.req(2, 8*BlockSize+1, 1, h)); err != nil {
		t.Fatal(err)
	}
	drain(t, e)
	if got := tr.out[2].res.CachedTokens; got != 0 {
		t.Errorf("the same prompt after a reset had %d cached tokens", got)
	}
	if len(rec.cached) != 8 {
		t.Errorf("recached %d blocks, want 8", len(rec.cached))
	}
}
