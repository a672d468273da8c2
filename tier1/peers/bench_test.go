package peers

import (
	"context"
	"strconv"
	"testing"

	"github.com/infergate/infergate/tier1/picker"
)

// BenchmarkTrackerDispatch is the request path's cost of sharing: a
// dispatch, first token and completion on a tracker, with and without a
// node observing it (flusher running, no peers connected).
func BenchmarkTrackerDispatch(b *testing.B) {
	hashes := make([]uint64, 128)
	for i := range hashes {
		hashes[i] = uint64(i)*0x9e3779b97f4a7c15 + 1
	}
	for _, shared := range []bool{false, true} {
		b.Run("shared="+strconv.FormatBool(shared), func(b *testing.B) {
			tr := picker.NewTracker(picker.TrackerOptions{})
			if shared {
				n, err := New(tr, Options{InsecurePlaintext: true})
				if err != nil {
					b.Fatal(err)
				}
				ctx, cancel := context.WithCancel(context.Background())
				done := make(chan struct{})
				go func() { defer close(done); _ = n.Run(ctx, nil) }()
				defer func() { cancel(); <-done }()
			}
			pods := []string{"pod-0", "pod-1", "pod-2", "pod-3"}
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; b.Loop(); i++ {
				req := &picker.Request{PromptTokens: 2048, BlockHashes: hashes}
				pod := pods[i%len(pods)]
				tr.Dispatched(pod, req)
				tr.FirstToken(pod, req, 0)
				tr.Done(pod, req)
			}
		})
	}
}
