package picker

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/infergate/infergate/tier1/prefix"
)

// TestTrackerRecordAsync checks that a tracker with RecordAsync ends up
// with the same index as a synchronous one: after Flush every dispatch is
// visible to Match, the caller may reuse its hash slice at once, and a
// removed pod's queued records do not come back.
func TestTrackerRecordAsync(t *testing.T) {
	tests := []struct {
		name  string
		async bool
		queue int
	}{
		{"sync", false, 0},
		{"async default queue", true, 0},
		{"async queue of one", true, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tr := NewTracker(TrackerOptions{RecordAsync: tt.async, RecordQueue: tt.queue})
			buf := make([]uint64, 0, 64)
			for i := range 20 {
				h := hashes(8, 8, fmt.Sprint(i))
				buf = append(buf[:0], h...)
				req := &Request{PromptTokens: 1024, BlockHashes: buf}
				tr.Dispatched(fmt.Sprintf("p%d", i%4), req)
				clear(buf) // the caller's buffer goes back to its pool
				tr.Done(fmt.Sprintf("p%d", i%4), req)
				if tt.queue == 1 {
					tr.Flush() // a queue of one must not drop sequential requests
				}
			}
			tr.Flush()
			if d := tr.RecordsDropped(); d != 0 {
				t.Fatalf("dropped %d records", d)
			}
			pods := []string{"p0", "p1", "p2", "p3"}
			for i := range 20 {
				got := tr.Index().Match(hashes(8, 8, fmt.Sprint(i)), pods, nil)
				for j, n := range got {
					want := 8 // the shared prefix, sent to every pod
					if j == i%4 {
						want = 16
					}
					if n != want {
						t.Fatalf("request %d, pod %s: matched %d blocks, want %d", i, pods[j], n, want)
					}
				}
			}
			tr.Dispatched("p0", &Request{PromptTokens: 64, BlockHashes: hashes(2, 2, "late")})
			tr.RemovePod("p0")
			if n := tr.Index().PodLen("p0"); n != 0 {
				t.Fatalf("removed pod holds %d blocks", n)
			}
		})
	}
}

// TestTrackerRecordQueueFull holds the recorder busy so its queue fills:
// dispatches beyond the bound are counted as dropped, not recorded, and
// the accounting of in-flight requests is unaffected.
func TestTrackerRecordQueueFull(t *testing.T) {
	tr := NewTracker(TrackerOptions{RecordAsync: true, RecordQueue: 3, Index: exactIndex})
	tr.rec.busy.Lock()
	for i := range 5 {
		tr.Dispatched(fmt.Sprintf("p%d", i), &Request{PromptTokens: 64, BlockHashes: hashes(1, 1, fmt.Sprint(i))})
	}
	if d := tr.RecordsDropped(); d != 2 {
		t.Fatalf("dropped %d, want 2", d)
	}
	tr.rec.busy.Unlock()
	tr.Flush()
	for i := range 5 {
		want := 0
		if i < 3 {
			want = 2
		}
		if n := tr.Index().PodLen(fmt.Sprintf("p%d", i)); n != want {
			t.Fatalf("pod p%d holds %d blocks, want %d", i, n, want)
		}
		if n := tr.InFlight(fmt.Sprintf("p%d", i)); n != 1 {
			t.Fatalf("pod p%d in flight %d, want 1", i, n)
		}
	}
}

// TestTrackerRecordAsyncConcurrent runs dispatches, matches, snapshots,
// flushes and pod removals at once (for -race).
func TestTrackerRecordAsyncConcurrent(t *testing.T) {
	tr := NewTracker(TrackerOptions{RecordAsync: true})
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 200 {
				pod := fmt.Sprintf("p%d", (w+i)%5)
				req := &Request{PromptTokens: 512, BlockHashes: hashes(4, 4, fmt.Sprint(w, i))}
				tr.Dispatched(pod, req)
				tr.Index().Match(req.BlockHashes, []string{"p0", "p1", "p2"}, nil)
				tr.Apply([]*Pod{mkPod("p0"), mkPod(pod)}) // shares the lock with other Applies
				tr.FirstToken(pod, req, time.Millisecond)
				tr.Done(pod, req)
				switch i % 50 {
				case 10:
					tr.Flush()
				case 30:
					tr.RemovePod(pod)
				}
			}
		}()
	}
	wg.Wait()
	tr.Flush()
	if tr.Index().Len() == 0 {
		t.Fatal("nothing recorded")
	}
}

// BenchmarkTrackerDispatched is the tracker's part of Tier 1's request
// path under issue 13's load: 8k-token requests (512 blocks, a shared
// 128-block system prompt, the rest new) dispatched round-robin to 100
// pods with a full default-sized index, so recording evicts. ns/op is what
// the request waits for; cpu-ns/op includes the background recorder's work
// (the async runs flush before the clock stops). "parallel" dispatches from
// every P at once, as concurrent requests do.
func BenchmarkTrackerDispatched(b *testing.B) {
	const pods = 100
	names := make([]string, pods)
	for i := range names {
		names[i] = fmt.Sprintf("pod-%d", i)
	}
	r := rand.New(rand.NewPCG(11, 12))
	sys := prefix.Hash("llama", bytes.Repeat([]byte("system prompt. "), 600), 64, 128, nil)
	reqs := make([]*Request, 256)
	for i := range reqs {
		h := append(make([]uint64, 0, 512), sys...)
		for len(h) < 512 {
			h = append(h, r.Uint64()) // a new tail's chained hashes: as good as random
		}
		reqs[i] = &Request{PromptTokens: 8192, BlockHashes: h}
	}
	for _, async := range []bool{false, true} {
		for _, par := range []bool{false, true} {
			name := map[bool]string{false: "sync", true: "async"}[async] + map[bool]string{false: "", true: "/parallel"}[par]
			b.Run(name, func(b *testing.B) {
				tr := NewTracker(TrackerOptions{RecordAsync: async, RecordQueue: 1 << 16})
				for i := range 4000 { // fill the index: recording evicts from here on
					tr.Index().Record(names[i%pods], reqs[i%len(reqs)].BlockHashes)
				}
				var next atomic.Uint64
				op := func() {
					i := next.Add(1)
					req := &Request{PromptTokens: 8192, BlockHashes: reqs[i%uint64(len(reqs))].BlockHashes}
					tr.Dispatched(names[i%pods], req)
					tr.Done(names[i%pods], req)
				}
				b.ResetTimer() // b.Loop does this itself; RunParallel does not
				cpu := startCPU()
				if par {
					b.RunParallel(func(pb *testing.PB) {
						for pb.Next() {
							op()
						}
					})
				} else {
					for b.Loop() {
						op()
					}
				}
				b.StopTimer() // the request path is done; the recorder may not be
				tr.Flush()
				cpu.report(b)
				if d := tr.RecordsDropped(); d > 0 {
					b.Fatalf("%d records dropped", d)
				}
			})
		}
	}
}
