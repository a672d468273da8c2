package prefix

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"unsafe"

	"github.com/cespare/xxhash/v2"
)

func TestHash(t *testing.T) {
	a := bytes.Repeat([]byte("abcdefgh"), 64) // 512 bytes = 8 blocks
	b := slices.Clone(a)
	b[200] = 'X' // inside block 3
	tests := []struct {
		name      string
		seed      string
		data      []byte
		block     int
		maxBlocks int
		wantLen   int
	}{
		{"full blocks", "m", a, 64, 0, 8},
		{"partial block dropped", "m", a[:100], 64, 0, 1},
		{"too short", "m", a[:63], 64, 0, 0},
		{"capped", "m", a, 64, 3, 3},
		{"default block", "m", a, 0, 0, 8},
		{"small blocks", "m", a, 16, 0, 32},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := Hash(tt.seed, tt.data, tt.block, tt.maxBlocks, nil)
			if len(got) != tt.wantLen {
				t.Fatalf("len = %d, want %d", len(got), tt.wantLen)
			}
		})
	}
	ha := Hash("m", a, 64, 0, nil)
	hb := Hash("m", b, 64, 0, nil)
	if !slices.Equal(ha[:3], hb[:3]) {
		t.Error("blocks before the change differ")
	}
	for i := 3; i < 8; i++ {
		if ha[i] == hb[i] {
			t.Errorf("block %d equal after a change in block 3: hashes must chain", i)
		}
	}
	if hm := Hash("other-model", a, 64, 0, nil); hm[0] == ha[0] {
		t.Error("seed does not change the first hash")
	}
	if hs := HashString("m", string(a), 64, 0, nil); !slices.Equal(hs, ha) {
		t.Error("HashString differs from Hash")
	}
	// Same block content at a different position must hash differently.
	if ha[0] == ha[1] {
		t.Error("repeated block content gives equal hashes; chaining broken")
	}
}

func TestHashNoAlloc(t *testing.T) {
	data := bytes.Repeat([]byte("x"), 32<<10)
	dst := make([]uint64, 0, 512)
	if n := testing.AllocsPerRun(10, func() { dst = Hash("m", data, 64, 512, dst) }); n != 0 {
		t.Fatalf("allocs = %v, want 0", n)
	}
}

func prompt(shared string, unique int) []byte {
	var b strings.Builder
	b.WriteString(shared)
	fmt.Fprintf(&b, "%-200d", unique)
	return []byte(b.String())
}

func TestIndexMatch(t *testing.T) {
	sys := strings.Repeat("You are a helpful assistant. ", 20) // 580 bytes = 9 blocks
	h1 := Hash("m", prompt(sys, 1), 64, 0, nil)                // 12 blocks
	h2 := Hash("m", prompt(sys, 2), 64, 0, nil)
	x := NewIndex(IndexOptions{Stride: 1})
	x.Record("a", h1)
	x.Record("b", h1[:5])
	tests := []struct {
		name   string
		hashes []uint64
		pods   []string
		want   []int
	}{
		{"exact", h1, []string{"a", "b", "c"}, []int{len(h1), 5, 0}},
		{"shared system prompt", h2, []string{"a", "b", "c"}, []int{9, 5, 0}},
		{"order and duplicates", h1, []string{"c", "b", "a"}, []int{0, 5, len(h1)}},
		{"no pods", h1, nil, []int{}},
		{"no hashes", nil, []string{"a"}, []int{0}},
		{"unknown hash", []uint64{1, 2, 3}, []string{"a", "b"}, []int{0, 0}},
		{"one block", h1[:1], []string{"a", "b"}, []int{1, 1}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := x.Match(tt.hashes, tt.pods, nil)
			if !slices.Equal(got, tt.want) {
				t.Fatalf("Match = %v, want %v", got, tt.want)
			}
		})
	}
}

// TestIndexStride: with a stride the index keeps every stride-th block and
// a prompt's last, so a match is what the every-block index finds rounded
// down to a multiple of the stride, or the whole prompt.
func TestIndexStride(t *testing.T) {
	sys := strings.Repeat("You are a helpful assistant. ", 20) // 580 bytes = 9 blocks
	h1 := Hash("m", prompt(sys, 1), 64, 0, nil)                // 12 blocks
	h2 := Hash("m", prompt(sys, 2), 64, 0, nil)
	x := NewIndex(IndexOptions{Stride: 4})
	x.Record("a", h1[:10])
	x.Record("b", h1[:5])
	x.Record("c", h1[:1])                           // one hash, as a session marker
	if got, want := x.PodLen("a"), 3; got != want { // blocks 3, 7 and the last, 9
		t.Errorf("PodLen(a) = %d, want %d", got, want)
	}
	pods := []string{"a", "b", "c", "d"}
	tests := []struct {
		name   string
		hashes []uint64
		want   []int
	}{
		{"a's whole prompt", h1[:10], []int{10, 4, 0, 0}}, // b holds 5 blocks, c 1: below a kept block
		{"a longer prompt", h1, []int{8, 4, 0, 0}},
		{"shared system prompt", h2, []int{8, 4, 0, 0}},
		{"b's whole prompt", h1[:5], []int{4, 5, 0, 0}},
		{"one block", h1[:1], []int{0, 0, 1, 0}}, // only c kept block 0 (its last)
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := x.Match(tt.hashes, pods, nil); !slices.Equal(got, tt.want) {
				t.Fatalf("Match = %v, want %v", got, tt.want)
			}
		})
	}

	// Against the every-block index over random prefixes: never more, at
	// most stride−1 blocks fewer.
	r := rand.New(rand.NewPCG(5, 6))
	base := Hash("m", bytes.Repeat([]byte("0123456789abcdef"), 4*200), 64, 0, nil) // 200 blocks
	for _, stride := range []int{2, 4, 8} {
		exact, kept := NewIndex(IndexOptions{Stride: 1}), NewIndex(IndexOptions{Stride: stride})
		for i := range 50 {
			h := slices.Clone(base[:1+r.IntN(len(base))])
			if cut := r.IntN(len(h)); cut > 0 {
				h[cut] ^= uint64(i + 1) // diverge after cut blocks (chaining is the caller's; a mismatch is a mismatch)
				h = h[:cut+1]
			}
			pod := fmt.Sprintf("p%d", i%5)
			exact.Record(pod, h)
			kept.Record(pod, h)
		}
		all := []string{"p0", "p1", "p2", "p3", "p4"}
		for range 100 {
			q := base[:1+r.IntN(len(base))]
			want, got := exact.Match(q, all, nil), kept.Match(q, all, nil)
			for j := range all {
				if got[j] > want[j] || got[j] < want[j]-(stride-1) {
					t.Fatalf("stride %d, %d-block query, %s: %d blocks, every-block index %d", stride, len(q), all[j], got[j], want[j])
				}
			}
		}
	}
}

// TestIndexMatchManyLengths checks the galloping search against a brute
// force scan, with pods holding every prefix length.
func TestIndexMatchManyLengths(t *testing.T) {
	h := Hash("m", bytes.Repeat([]byte("0123456789abcdef"), 4*300), 64, 0, nil) // 300 blocks
	x := NewIndex(IndexOptions{Stride: 1})
	r := rand.New(rand.NewPCG(1, 2))
	var pods []string
	var want []int
	for i := range 60 {
		name := fmt.Sprintf("p%d", i)
		n := r.IntN(len(h) + 1)
		if i%7 == 0 {
			n = len(h)
		}
		x.Record(name, h[:n])
		pods = append(pods, name)
		want = append(want, n)
	}
	for trial := range 40 {
		q := h[:r.IntN(len(h))+1]
		// Half the trials ask about a random subset: non-candidate holders
		// must not confuse the search.
		var sub []string
		var subWant []int
		for i := range pods {
			if trial%2 == 0 || r.IntN(3) == 0 {
				sub = append(sub, pods[i])
				subWant = append(subWant, want[i])
			}
		}
		got := x.Match(q, sub, nil)
		for i := range sub {
			if w := min(subWant[i], len(q)); got[i] != w {
				t.Fatalf("trial %d pod %s: got %d, want %d", trial, sub[i], got[i], w)
			}
		}
	}
}

func TestIndexEviction(t *testing.T) {
	h := Hash("m", bytes.Repeat([]byte("z"), 64*40), 64, 0, nil) // 40 blocks
	t.Run("per pod keeps the prefix", func(t *testing.T) {
		x := NewIndex(IndexOptions{Stride: 1, MaxBlocks: 1000, MaxBlocksPerPod: 10})
		x.Record("a", h)
		if got := x.PodLen("a"); got != 10 {
			t.Fatalf("PodLen = %d, want 10", got)
		}
		if got := x.Match(h, []string{"a"}, nil)[0]; got != 10 {
			t.Fatalf("match = %d, want the first 10 blocks", got)
		}
	})
	t.Run("lru", func(t *testing.T) {
		x := NewIndex(IndexOptions{Stride: 1, MaxBlocks: 1000, MaxBlocksPerPod: 10})
		old := Hash("old", bytes.Repeat([]byte("y"), 64*8), 64, 0, nil)
		x.Record("a", old)
		x.Record("a", h[:8]) // evicts 6 of old's tail blocks
		if got := x.Match(old, []string{"a"}, nil)[0]; got != 2 {
			t.Fatalf("old match = %d, want 2", got)
		}
		x.Record("a", old[:2]) // touch: old head now recent
		x.Record("a", h[8:10])
		if got := x.Match(old, []string{"a"}, nil)[0]; got != 2 {
			t.Fatalf("touched old match = %d, want 2", got)
		}
	})
	t.Run("global", func(t *testing.T) {
		x := NewIndex(IndexOptions{Stride: 1, MaxBlocks: 50, MaxBlocksPerPod: 40})
		x.Record("big", h)
		x.Record("small", h[:20])
		if n := x.Len(); n != 50 {
			t.Fatalf("Len = %d, want 50", n)
		}
		if a, b := x.PodLen("big"), x.PodLen("small"); a != 30 || b != 20 {
			t.Fatalf("PodLen big=%d small=%d, want 30, 20 (largest pod gives way)", a, b)
		}
	})
	t.Run("remove pod", func(t *testing.T) {
		x := NewIndex(IndexOptions{Stride: 1})
		x.Record("a", h)
		x.Record("b", h)
		x.RemovePod("a")
		if x.Len() != len(h) {
			t.Fatalf("Len = %d, want %d", x.Len(), len(h))
		}
		if got := x.Match(h, []string{"a", "b"}, nil); got[0] != 0 || got[1] != len(h) {
			t.Fatalf("Match = %v", got)
		}
		x.Record("c", h[:3]) // reuses a's id
		if got := x.Match(h, []string{"a", "c"}, nil); got[0] != 0 || got[1] != 3 {
			t.Fatalf("Match after reuse = %v", got)
		}
	})
}

func TestIndexConcurrent(t *testing.T) {
	x := NewIndex(IndexOptions{Stride: 1, MaxBlocks: 5000, MaxBlocksPerPod: 1000})
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			pods := []string{"a", "b", "c", "d"}
			var dst []int
			for i := range 200 {
				h := Hash("m", prompt("shared prefix text ", g*1000+i%20), 64, 0, nil)
				x.Record(pods[(g+i)%4], h)
				dst = x.Match(h, pods, dst)
				if i%50 == 0 {
					x.RemovePod(pods[i%4])
				}
			}
		}()
	}
	wg.Wait()
}

// TestIndexMemory fills 1M (block, pod) entries over 100 pods and reports
// the heap bytes per entry.
func TestIndexMemory(t *testing.T) {
	if testing.Short() {
		t.Skip("allocates ~60 MB")
	}
	const pods, perPod = 100, 10_000
	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	x := NewIndex(IndexOptions{Stride: 1, MaxBlocks: pods * perPod, MaxBlocksPerPod: perPod})
	r := rand.New(rand.NewPCG(3, 4))
	h := make([]uint64, 500)
	for p := range pods {
		name := fmt.Sprintf("pod-%d", p)
		for x.PodLen(name) < perPod {
			for i := range h {
				h[i] = r.Uint64()
			}
			x.Record(name, h)
		}
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	n := x.Len()
	per := float64(after.HeapAlloc-before.HeapAlloc) / float64(n)
	t.Logf("%d entries, %.1f heap bytes per (block, pod) entry", n, per)
	if n != pods*perPod {
		t.Fatalf("Len = %d", n)
	}
	if per > 100 {
		t.Errorf("%.1f bytes per entry, want ≤ 100", per)
	}
	runtime.KeepAlive(x)
}

func TestHashBlock64(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	b := make([]byte, 64)
	for range 1000 {
		for i := range b {
			b[i] = byte(r.Uint32())
		}
		seed := r.Uint64()
		d := xxhash.NewWithSeed(seed)
		_, _ = d.Write(b)
		if got, want := sum64Block64(seed, b), d.Sum64(); got != want {
			t.Fatalf("sum64Block64 = %x, xxhash = %x", got, want)
		}
	}
	// Hash with 64-byte blocks (fast path) equals the generic path's chain.
	data := bytes.Repeat([]byte("0123456789"), 100)
	fast := Hash("m", data, 64, 0, nil)
	prev := xxhash.Sum64String("m")
	for i, h := range fast {
		d := xxhash.NewWithSeed(prev)
		_, _ = d.Write(data[i*64 : i*64+64])
		if prev = d.Sum64(); h != prev {
			t.Fatalf("block %d differs", i)
		}
	}
}

// Under churn (per-pod and global eviction, shared prefixes, repeats) the
// blocks of every request that a pod holds stay prefix-closed within each
// shard: Record only marks blocks it finds, and second-chance eviction must
// still trim prefixes from the tail. With one shard that is the whole
// property Match relies on.
func TestIndexStaysPrefixClosed(t *testing.T) {
	for _, tc := range []struct {
		name        string
		opts        IndexOptions
		shared, own int // repeats of the shared and own text
		wantShards  int
	}{
		{"one shard", IndexOptions{Stride: 1, MaxBlocks: 300, MaxBlocksPerPod: 120}, 20, 1, 1},
		{"sharded", IndexOptions{Stride: 1, MaxBlocks: 5000, MaxBlocksPerPod: minShardPodBlocks}, 60, 800, numShards},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := rand.New(rand.NewPCG(11, 12))
			x := NewIndex(tc.opts)
			if len(x.shards) != tc.wantShards {
				t.Fatalf("%d shards, want %d", len(x.shards), tc.wantShards)
			}
			pods := []string{"a", "b", "c"}
			var reqs [][]uint64
			for i := range 40 {
				base := prompt(strings.Repeat("shared system prompt ", tc.shared), i%4)
				reqs = append(reqs, Hash("m", append(base, prompt(strings.Repeat("turn ", tc.own), i)...), 64, 0, nil))
			}
			for step := range 3000 {
				h := reqs[r.IntN(len(reqs))]
				h = h[:1+r.IntN(len(h))]
				x.Record(pods[r.IntN(len(pods))], h)
				if step%100 != 99 {
					continue
				}
				for _, req := range reqs {
					for _, p := range pods {
						id, ok := x.podIDs[p]
						if !ok {
							continue
						}
						gap := make([]bool, len(x.shards))
						for j, b := range req {
							si := b & x.mask
							if !holds(x, id, b) {
								gap[si] = true
							} else if gap[si] {
								t.Fatalf("step %d: pod %s holds block %d of a request but not an earlier one of its shard", step, p, j)
							}
						}
					}
				}
			}
			if x.Len() > tc.opts.MaxBlocks {
				t.Fatalf("Len = %d over MaxBlocks", x.Len())
			}
			for _, p := range pods {
				if n := x.PodLen(p); n > tc.opts.MaxBlocksPerPod {
					t.Fatalf("PodLen(%s) = %d over MaxBlocksPerPod", p, n)
				}
			}
		})
	}
}

// Concurrent Record, Match and RemovePod on a sharded index (run with
// -race).
func TestIndexConcurrentSharded(t *testing.T) {
	x := NewIndex(IndexOptions{Stride: 1, MaxBlocks: 20_000, MaxBlocksPerPod: minShardPodBlocks})
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			pods := []string{"a", "b", "c", "d"}
			var dst []int
			for i := range 300 {
				h := Hash("m", prompt(strings.Repeat("shared prefix text ", 50), g*1000+i%20), 64, 0, nil)
				x.Record(pods[(g+i)%4], h)
				if dst = x.Match(h, pods, dst); len(dst) != len(pods) {
					t.Errorf("Match returned %d results", len(dst))
				}
				if i%50 == 0 {
					x.RemovePod(pods[i%4])
				}
			}
		}()
	}
	wg.Wait()
	if x.Len() > 20_000 {
		t.Fatalf("Len = %d", x.Len())
	}
}

func holds(x *Index, id int32, h uint64) bool {
	return x.shardOf(h).find(id, h) != nilNode
}

// checkFingerprints fails unless every node's fp is the sum of podMix over
// it and the rest of its chain, and every chain's length is its head's n.
func checkFingerprints(t *testing.T, x *Index) {
	t.Helper()
	for si := range x.shards {
		s := &x.shards[si]
		for _, sl := range s.heads.slots {
			if sl.n == 0 {
				continue
			}
			var ids []int32
			for j := sl.first; j != nilNode; j = s.nodes[j].chain {
				ids = append(ids, s.nodes[j].pod)
			}
			if len(ids) != int(sl.n) {
				t.Fatalf("chain of %x has %d nodes, head says %d", sl.key, len(ids), sl.n)
			}
			var fp uint32
			j := sl.first
			for k := range ids {
				fp = 0
				for _, id := range ids[k:] {
					fp += podMix(id)
				}
				if s.nodes[j].fp != fp {
					t.Fatalf("chain of %x, node %d: fp %x, want %x", sl.key, k, s.nodes[j].fp, fp)
				}
				j = s.nodes[j].chain
			}
		}
	}
}

// The fingerprint lives in the node's padding: the node stays 32 bytes, two
// to a cache line.
func TestNodeSize(t *testing.T) {
	if n := unsafe.Sizeof(node{}); n != 32 {
		t.Fatalf("node is %d bytes, want 32", n)
	}
}

// TestIndexFingerprints churns an index (records that evict, pods removed
// and re-added, so ids are reused) and checks the chain fingerprints and
// Match against a brute-force scan, on candidate sets that leave out
// holders: that is when a chain and the active pods have the same size but
// not the same members, and only the fingerprint tells them apart.
func TestIndexFingerprints(t *testing.T) {
	r := rand.New(rand.NewPCG(21, 22))
	x := NewIndex(IndexOptions{Stride: 1, MaxBlocks: 3000, MaxBlocksPerPod: 400})
	var reqs [][]uint64
	for i := range 24 {
		reqs = append(reqs, Hash("m", append(prompt(strings.Repeat("system ", 40), i%3), prompt(strings.Repeat("user ", 30), i)...), 64, 0, nil))
	}
	pods := make([]string, 12)
	for i := range pods {
		pods[i] = fmt.Sprintf("p%d", i)
	}
	for step := range 4000 {
		switch r.IntN(20) {
		case 0:
			x.RemovePod(pods[r.IntN(len(pods))])
		default:
			h := reqs[r.IntN(len(reqs))]
			x.Record(pods[r.IntN(len(pods))], h[:1+r.IntN(len(h))])
		}
		if step%50 != 49 {
			continue
		}
		checkFingerprints(t, x)
		var sub []string
		for _, p := range pods {
			if r.IntN(4) != 0 {
				sub = append(sub, p)
			}
		}
		q := reqs[r.IntN(len(reqs))]
		got := x.Match(q, sub, nil)
		for i, p := range sub {
			id, ok := x.podIDs[p]
			want := 0
			for ok && want < len(q) && holds(x, id, q[want]) {
				want++
			}
			if got[i] != want {
				t.Fatalf("step %d pod %s: Match %d, brute force %d", step, p, got[i], want)
			}
		}
	}
}
