package kvevents

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"sync"
	"testing"
	"time"
)

// fakeClock is a settable clock for states (no sleeping in unit tests).
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func newFakeClock() *fakeClock { return &fakeClock{t: time.Unix(1_750_000_000, 0)} }

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

func stored(hashes []uint64, parent uint64, tokens []uint32, bs int) Event {
	return Event{Kind: KindBlockStored, BlockHashes: hashes, ParentHash: parent, HasParent: parent != 0, TokenIDs: tokens, BlockSize: bs}
}

func apply(x *Index, pod string, evs ...Event) ApplyStats {
	return x.Apply(pod, &Batch{Events: evs})
}

func match1(x *Index, pod string, hashes []uint64, bs int) int {
	return x.Match(hashes, bs, []string{pod}, nil)[0]
}

func TestIndexMatchesRequestHashes(t *testing.T) {
	prompt := seqTokens(1000, 70) // four full blocks and a partial one
	hashes := HashTokens(prompt, 16, "")
	if len(hashes) != 4 {
		t.Fatalf("%d hashes for 70 tokens, want 4", len(hashes))
	}
	x := NewIndex(IndexOptions{})
	// The pod reports the first two blocks, then (another step) the next
	// two, chained to the second by the engine's parent hash.
	apply(x, "a", stored([]uint64{11, 12}, 0, prompt[:32], 16))
	apply(x, "b", stored([]uint64{11}, 0, prompt[:16], 16))
	if got := x.Match(hashes, 16, []string{"a", "b", "c"}, nil); !slices.Equal(got, []int{2, 1, 0}) {
		t.Fatalf("match = %v, want [2 1 0]", got)
	}
	apply(x, "a", stored([]uint64{13, 14}, 12, prompt[32:64], 16))
	if got := match1(x, "a", hashes, 16); got != 4 {
		t.Fatalf("after the chained event: match %d, want 4", got)
	}
	// Same tokens, another adapter or block size: nothing.
	if got := match1(x, "a", HashTokens(prompt, 16, "lora-x"), 16); got != 0 {
		t.Errorf("adapter lora-x matched %d blocks of base-model blocks", got)
	}
	if got := match1(x, "a", HashTokens(prompt, 32, ""), 32); got != 0 {
		t.Errorf("block size 32 matched %d", got)
	}
	// A prompt sharing two blocks then diverging.
	other := slices.Concat(prompt[:32], seqTokens(5, 32))
	if got := match1(x, "a", HashTokens(other, 16, ""), 16); got != 2 {
		t.Errorf("diverging prompt matched %d, want 2", got)
	}
	// Evicting the second block cuts the prefix there.
	apply(x, "a", Event{Kind: KindBlockRemoved, BlockHashes: []uint64{12}})
	if got := match1(x, "a", hashes, 16); got != 1 {
		t.Errorf("after removing block 2: match %d, want 1", got)
	}
	apply(x, "a", Event{Kind: KindAllBlocksCleared})
	if got := match1(x, "a", hashes, 16); got != 0 {
		t.Errorf("after AllBlocksCleared: match %d", got)
	}
	if got := match1(x, "b", hashes, 16); got != 1 {
		t.Errorf("clearing pod a touched pod b: %d", got)
	}
}

func TestIndexLoRA(t *testing.T) {
	prompt := seqTokens(0, 32)
	x := NewIndex(IndexOptions{})
	named := stored([]uint64{1, 2}, 0, prompt, 16)
	named.LoRAName, named.HasLoRAName = "sql", true
	named.extra = []extraKey{{kind: extraString, s: "sql"}, {kind: extraString, s: "sql"}}
	apply(x, "named", named)
	idOnly := stored([]uint64{1, 2}, 0, prompt, 16)
	idOnly.LoRAID, idOnly.HasLoRAID = 3, true
	apply(x, "id-only", idOnly)
	salted := stored([]uint64{1, 2}, 0, prompt, 16)
	salted.extra = []extraKey{{kind: extraOpaque, h: 42}}
	apply(x, "salted", salted)

	pods := []string{"named", "id-only", "salted"}
	if got := x.Match(HashTokens(prompt, 16, "sql"), 16, pods, nil); !slices.Equal(got, []int{2, 0, 0}) {
		t.Errorf("adapter sql: %v, want [2 0 0]", got)
	}
	// An adapter known only by its integer id matches no request (a
	// request names its adapter), and neither does a block whose engine
	// hash had extra keys (multimodal input, cache salt): never credited
	// for the wrong content.
	if got := x.Match(HashTokens(prompt, 16, ""), 16, pods, nil); !slices.Equal(got, []int{0, 0, 0}) {
		t.Errorf("base model: %v, want [0 0 0]", got)
	}
}

func TestIndexDropsAndCounts(t *testing.T) {
	toks := seqTokens(0, 16)
	t.Run("orphan", func(t *testing.T) {
		x := NewIndex(IndexOptions{})
		st := apply(x, "p", stored([]uint64{2}, 1, toks, 16))
		if st.DroppedOrphan != 1 || st.Stored != 0 {
			t.Errorf("%+v", st)
		}
	})
	t.Run("cap", func(t *testing.T) {
		x := NewIndex(IndexOptions{MaxBlocksPerPod: 10})
		hashes := make([]uint64, 100)
		for i := range hashes {
			hashes[i] = uint64(i + 1)
		}
		st := apply(x, "p", stored(hashes, 0, seqTokens(0, 1600), 16))
		if st.Stored != 10 || st.DroppedCap != 90 || x.Stats()[0].Blocks != 10 {
			t.Errorf("%+v, stats %+v", st, x.Stats())
		}
		// Removals make room again.
		apply(x, "p", Event{Kind: KindBlockRemoved, BlockHashes: hashes[:5]})
		if st := apply(x, "p", stored([]uint64{500}, 0, toks, 16)); st.Stored != 1 {
			t.Errorf("after removals: %+v", st)
		}
	})
	t.Run("medium", func(t *testing.T) {
		x := NewIndex(IndexOptions{})
		e := stored([]uint64{1}, 0, toks, 16)
		e.Medium = "CPU"
		if st := apply(x, "p", e); st.DroppedMedium != 1 {
			t.Errorf("%+v", st)
		}
		x = NewIndex(IndexOptions{Media: []string{"GPU", "CPU"}})
		if st := apply(x, "p", e); st.Stored != 1 {
			t.Errorf("with CPU indexed: %+v", st)
		}
	})
	t.Run("block size", func(t *testing.T) {
		x := NewIndex(IndexOptions{})
		apply(x, "p", stored([]uint64{1}, 0, toks, 16))
		if st := apply(x, "p", stored([]uint64{2}, 0, toks[:8], 8)); st.DroppedBlockSize != 1 {
			t.Errorf("%+v", st)
		}
		if st := apply(x, "p", stored([]uint64{3, 4}, 0, toks, 16)); st.Inconsistent != 1 {
			t.Errorf("32 tokens expected for 2 blocks: %+v", st)
		}
	})
	t.Run("duplicates", func(t *testing.T) {
		x := NewIndex(IndexOptions{})
		h := HashTokens(toks, 16, "")
		// The same engine hash cached twice (two physical blocks), and a
		// second engine hash for the same tokens.
		apply(x, "p", stored([]uint64{1}, 0, toks, 16), stored([]uint64{1}, 0, toks, 16), stored([]uint64{2}, 0, toks, 16))
		for i, rm := range []uint64{1, 2, 1} {
			if got := match1(x, "p", h, 16); got != 1 {
				t.Fatalf("before removal %d: match %d", i, got)
			}
			apply(x, "p", Event{Kind: KindBlockRemoved, BlockHashes: []uint64{rm}})
		}
		if got := match1(x, "p", h, 16); got != 0 || x.Stats()[0].Blocks != 0 {
			t.Errorf("after the last removal: match %d, stats %+v", got, x.Stats())
		}
	})
}

func TestIndexStates(t *testing.T) {
	clk := newFakeClock()
	x := NewIndex(IndexOptions{StaleAfter: time.Minute, RebuildWindow: 2 * time.Minute, Now: clk.Now})
	toks := seqTokens(0, 16)
	if s := x.State("p"); s != StateAbsent {
		t.Fatalf("unknown pod: %v", s)
	}
	apply(x, "p", stored([]uint64{1}, 0, toks, 16))
	if s := x.State("p"); s != StateFresh {
		t.Fatalf("after an event: %v", s)
	}
	clk.Advance(61 * time.Second)
	if s := x.State("p"); s != StateStale {
		t.Fatalf("a minute without events: %v", s)
	}
	apply(x, "p", Event{Kind: KindBlockRemoved, BlockHashes: []uint64{9}})
	if s := x.State("p"); s != StateFresh {
		t.Fatalf("events again: %v", s)
	}
	x.Clear("p", true)
	if s := x.State("p"); s != StateStale || match1(x, "p", HashTokens(toks, 16, ""), 16) != 0 {
		t.Fatalf("after lost history: %v", s)
	}
	clk.Advance(time.Minute)
	apply(x, "p", stored([]uint64{1}, 0, toks, 16))
	if s := x.State("p"); s != StateStale {
		t.Fatalf("within the rebuild window: %v", s)
	}
	clk.Advance(61 * time.Second)
	apply(x, "p", stored([]uint64{2}, 0, toks, 16))
	if s := x.State("p"); s != StateFresh {
		t.Fatalf("after the rebuild window: %v", s)
	}
	x.Forget("p")
	if s := x.State("p"); s != StateAbsent {
		t.Fatalf("after Forget: %v", s)
	}
	x.Remove("p")
	if len(x.Stats()) != 0 {
		t.Fatal("Remove left the pod")
	}
}

// TestIndexMemory measures the heap the index takes at a realistic load,
// checks the estimate the metric reports against it, and logs the figure
// for 1,000 pods. A pod serving Llama-3.1-8B on an 80 GB H100 holds about
// 26,000 blocks of 16 tokens. Fewer pods are built
// than reported (memory is linear in pods); the benchmark below builds
// all 1,000.
func TestIndexMemory(t *testing.T) {
	const pods, blocks = 16, 26000
	bytesPerPod := measureIndex(t, pods, blocks)
	perBlock := bytesPerPod / blocks
	t.Logf("exact KV index: %.1f bytes/block, %.1f MiB per pod at %d blocks, %.2f GiB per 1,000 pods",
		perBlock, bytesPerPod/(1<<20), blocks, bytesPerPod*1000/(1<<30))
	// Two map entries of 16 bytes per block, in tables 7/16 to 7/8 full.
	if perBlock > 96 {
		t.Errorf("%.1f bytes per block; two 16-byte map entries should stay under 96", perBlock)
	}
}

// measureIndex builds pods × blocks (each pod its own chains of 64
// blocks) and returns heap bytes per pod, checking Stats' estimate.
func measureIndex(t testing.TB, pods, blocks int) float64 {
	x := NewIndex(IndexOptions{MaxBlocksPerPod: blocks})
	rng := rand.New(rand.NewPCG(1, 2))
	const chain = 64
	toks := make([]uint32, chain*16)
	hashes := make([]uint64, chain)
	runtime.GC()
	var before runtime.MemStats
	runtime.ReadMemStats(&before)
	for p := range pods {
		name := fmt.Sprintf("pod-%04d", p)
		for n := 0; n < blocks; n += chain {
			for i := range toks {
				toks[i] = rng.Uint32()
			}
			for i := range hashes {
				hashes[i] = rng.Uint64()
			}
			apply(x, name, stored(hashes, 0, toks, 16))
		}
	}
	runtime.GC()
	var after runtime.MemStats
	runtime.ReadMemStats(&after)
	measured := float64(after.HeapAlloc) - float64(before.HeapAlloc)
	for _, st := range x.Stats() {
		if st.Blocks != blocks {
			t.Fatalf("pod %s holds %d blocks, want %d", st.Pod, st.Blocks, blocks)
		}
	}
	estimated := float64(x.Bytes())
	if r := estimated / measured; r < 0.6 || r > 1.4 {
		t.Errorf("estimated %.0f bytes, measured %.0f (ratio %.2f)", estimated, measured, r)
	}
	runtime.KeepAlive(x)
	return measured / float64(pods)
}

// BenchmarkIndexMemory1000Pods builds the whole 1,000-pod index at 26,000
// blocks per pod (about 1.2 GiB: run it alone) and reports bytes per
// 1,000 pods:
//
//	go test -run '^$' -bench IndexMemory1000Pods -benchtime 1x ./tier1/kvevents/
func BenchmarkIndexMemory1000Pods(b *testing.B) {
	for range b.N {
		perPod := measureIndex(b, 1000, 26000)
		b.ReportMetric(perPod*1000, "bytes/1000pods")
		b.ReportMetric(perPod/26000, "bytes/block")
	}
}

// matchFixture is BenchmarkMatch's index, built once for all its rounds.
var matchFixture = sync.OnceValues(func() (*Index, []string) {
	x := NewIndex(IndexOptions{})
	prompt := seqTokens(0, 128*16)
	pods := make([]string, 1000)
	rng := rand.New(rand.NewPCG(3, 4))
	filler := make([]uint32, 64*16)
	fh := make([]uint64, 64)
	for p := range pods {
		pods[p] = fmt.Sprintf("pod-%04d", p)
		hashes := make([]uint64, 32)
		for i := range hashes {
			hashes[i] = rng.Uint64()
		}
		apply(x, pods[p], stored(hashes, 0, prompt[:32*16], 16))
		for n := 32; n < 26000; n += 64 {
			for i := range filler {
				filler[i] = rng.Uint32()
			}
			for i := range fh {
				fh[i] = rng.Uint64()
			}
			apply(x, pods[p], stored(fh, 0, filler, 16))
		}
	}
	return x, pods
})

// BenchmarkMatch: one request's 128-block prompt against 1,000 pods that
// each hold its first 32 blocks among 26,000.
func BenchmarkMatch(b *testing.B) {
	x, pods := matchFixture()
	hashes := HashTokens(seqTokens(0, 128*16), 16, "")
	dst := make([]int, len(pods))
	b.ResetTimer()
	for range b.N {
		dst = x.Match(hashes, 16, pods, dst)
	}
	if dst[0] != 32 {
		b.Fatalf("match %d", dst[0])
	}
}

// TestIndexSharedBlocks: many pods holding the same blocks share one
// holders list; removing blocks, clearing and removing pods (whose ids
// are then reused) leave the other pods' matches intact and credit the
// newcomer with nothing.
func TestIndexSharedBlocks(t *testing.T) {
	x := NewIndex(IndexOptions{})
	prompt := seqTokens(0, 64)
	hashes := HashTokens(prompt, 16, "")
	pods := []string{"p0", "p1", "p2", "p3", "p4"}
	for i, p := range pods {
		apply(x, p, stored([]uint64{1, 2, 3, 4}[:i%4+1], 0, prompt[:(i%4+1)*16], 16))
	}
	if got := x.Match(hashes, 16, pods, nil); !slices.Equal(got, []int{1, 2, 3, 4, 1}) {
		t.Fatalf("match %v", got)
	}
	apply(x, "p3", Event{Kind: KindBlockRemoved, BlockHashes: []uint64{2}})
	apply(x, "p1", Event{Kind: KindAllBlocksCleared})
	x.Remove("p2")
	apply(x, "new", Event{Kind: KindBlockRemoved, BlockHashes: []uint64{1}}) // reuses p2's id
	got := x.Match(hashes, 16, append(pods, "new"), nil)
	if want := []int{1, 0, 0, 1, 1, 0}; !slices.Equal(got, want) {
		t.Fatalf("after changes: %v, want %v", got, want)
	}
	// Asking twice about one pod, or about unknown pods, is harmless.
	if got := x.Match(hashes, 16, []string{"p0", "p0", "nobody"}, nil); !slices.Equal(got, []int{1, 1, 0}) {
		t.Fatalf("repeated pods: %v", got)
	}
}

// TestIndexConcurrent runs events, matches and pod churn at once (for
// the race detector) and checks the index is consistent after.
func TestIndexConcurrent(t *testing.T) {
	x := NewIndex(IndexOptions{MaxBlocksPerPod: 512})
	prompt := seqTokens(0, 32*16)
	hashes := HashTokens(prompt, 16, "")
	pods := []string{"a", "b", "c", "d"}
	var wg sync.WaitGroup
	for w, p := range pods {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for r := range 200 {
				base := uint64(w*1_000_000 + r*100)
				apply(x, p, stored([]uint64{base + 1, base + 2}, 0, prompt[:32], 16))
				apply(x, p, Event{Kind: KindBlockRemoved, BlockHashes: []uint64{base + 1}})
				if r%50 == 49 {
					apply(x, p, Event{Kind: KindAllBlocksCleared})
				}
			}
		}()
	}
	wg.Add(2)
	go func() {
		defer wg.Done()
		var dst []int
		for range 2000 {
			dst = x.Match(hashes, 16, pods, dst)
		}
	}()
	go func() {
		defer wg.Done()
		for i := range 200 {
			name := fmt.Sprintf("churn-%d", i%3)
			apply(x, name, stored([]uint64{9}, 0, prompt[:16], 16))
			x.Remove(name)
		}
	}()
	wg.Wait()
	for _, p := range pods {
		apply(x, p, Event{Kind: KindAllBlocksCleared})
	}
	if got := x.Match(hashes, 16, pods, nil); !slices.Equal(got, []int{0, 0, 0, 0}) {
		t.Fatalf("after clearing every pod: %v", got)
	}
	for i := range x.shards {
		if n := len(x.shards[i].m); n != 0 {
			t.Fatalf("shard %d still holds %d hashes", i, n)
		}
	}
}

// BenchmarkApply: one pod storing 64-block chains and evicting them, as a
// busy pod reports (per block stored and removed).
func BenchmarkApply(b *testing.B) {
	x := NewIndex(IndexOptions{MaxBlocksPerPod: 1 << 20})
	rng := rand.New(rand.NewPCG(5, 6))
	toks := make([]uint32, 64*16)
	for i := range toks {
		toks[i] = rng.Uint32()
	}
	hashes := make([]uint64, 64)
	b.ResetTimer()
	for n := range b.N {
		for i := range hashes {
			hashes[i] = uint64(n)<<8 | uint64(i)
		}
		apply(x, "p", stored(hashes, 0, toks, 16))
		apply(x, "p", Event{Kind: KindBlockRemoved, BlockHashes: hashes})
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*64), "ns/block")
}
