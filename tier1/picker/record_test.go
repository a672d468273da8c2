package picker

import (
	"fmt"
	"sync"
	"testing"
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
	tr := NewTracker(TrackerOptions{RecordAsync: true, RecordQueue: 3})
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

// TestTrackerRecordAsyncConcurrent runs dispatches, matches, flushes and
// pod removals at once (for -race).
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
