package peers

import (
	"math"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/infergate/infergate/tier1/peers/meshpb"
	"github.com/infergate/infergate/tier1/picker"
	"github.com/infergate/infergate/tier1/prefix"
)

// TestCheckBounds: each limit on what a peer may say, at and past it.
func TestCheckBounds(t *testing.T) {
	load := func(l *meshpb.Load) *meshpb.Batch {
		if l.Pod == "" {
			l.Pod = "p"
		}
		return &meshpb.Batch{Loads: []*meshpb.Load{l}}
	}
	long := string(make([]byte, maxString+1))
	tests := []struct {
		name string
		b    *meshpb.Batch
		top  uint64
		ok   bool
	}{
		{"empty", &meshpb.Batch{}, 0, true},
		{"plausible", load(&meshpb.Load{Version: 9, InFlight: 3, Prefill: 2, PromptTokens: 5000, UncachedTokens: 1000}), 0, true},
		{"most in flight", load(&meshpb.Load{Version: 1, InFlight: maxInFlight}), 0, true},
		{"2^31 in flight", load(&meshpb.Load{Version: 1, InFlight: 1 << 31}), 0, false},
		{"more in prefill than in flight", load(&meshpb.Load{Version: 1, InFlight: 1, Prefill: 2}), 0, false},
		{"more uncached than prompt", load(&meshpb.Load{Version: 1, PromptTokens: 1, UncachedTokens: 2}), 0, false},
		{"too many tokens", load(&meshpb.Load{Version: 1, PromptTokens: maxTokens + 1}), 0, false},
		{"version 2^64-1", load(&meshpb.Load{Version: math.MaxUint64}), 0, false},
		{"version jump", load(&meshpb.Load{Version: 100 + maxVersionJump + 1}), 100, false},
		{"version within the jump", load(&meshpb.Load{Version: 100 + maxVersionJump}), 100, true},
		{"no pod name", &meshpb.Batch{Loads: []*meshpb.Load{{Version: 1}}}, 0, false},
		{"long pod name", load(&meshpb.Load{Pod: long}), 0, false},
		{"too many hashes", &meshpb.Batch{Dispatches: []*meshpb.Dispatch{{Pod: "p", BlockHashes: make([]uint64, maxHashes+1)}}}, 0, false},
		{"most hashes", &meshpb.Batch{Dispatches: []*meshpb.Dispatch{{Pod: "p", BlockHashes: make([]uint64, maxHashes)}}}, 0, true},
		{"sample of an hour and more", &meshpb.Batch{Samples: []*meshpb.Sample{{Pod: "p", Tokens: 10, Micros: maxMicros + 1}}}, 0, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := check(tt.b, tt.top); (err == nil) != tt.ok {
				t.Fatalf("check = %v, want ok %v", err, tt.ok)
			}
		})
	}
}

// FuzzApply: any message a peer can send (the bytes gRPC hands to the
// generated decoder) decodes and applies within bounds, or is refused
// whole: never a panic, never more than MaxPods pods, never anything left
// once the stream's state is dropped.
func FuzzApply(f *testing.F) {
	seed := func(fr *meshpb.Frame) {
		b, err := proto.Marshal(fr)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	seed(batchFrame(&meshpb.Batch{
		Loads:      []*meshpb.Load{{Pod: "p", Version: 3, InFlight: 2, Prefill: 1, PromptTokens: 900, UncachedTokens: 400}},
		Dispatches: []*meshpb.Dispatch{{Pod: "p", BlockHashes: []uint64{1, 2, 3}}},
		Samples:    []*meshpb.Sample{{Pod: "q", Tokens: 2048, Micros: 150000}},
	}))
	seed(poison("p0"))
	seed(helloFrame("replica-1"))
	seed(floodBatch(0, 20, true))
	f.Add([]byte{})
	const maxPods = 8
	f.Fuzz(func(t *testing.T, p []byte) {
		var fr meshpb.Frame
		if proto.Unmarshal(p, &fr) != nil {
			return
		}
		b := fr.GetBatch()
		if b == nil {
			return
		}
		tr := picker.NewTracker(picker.TrackerOptions{Index: prefix.IndexOptions{MaxBlocks: 1 << 14, MaxBlocksPerPod: 1 << 12}})
		n, err := New(tr, Options{InsecurePlaintext: true, MaxPods: maxPods})
		if err != nil {
			t.Fatal(err)
		}
		o := n.open("peer", "fuzz")
		err = n.apply(o, b)
		if err != nil && (tr.PodStates() != 0 || tr.Index().Len() != 0) {
			t.Fatalf("a refused batch was partly applied: %v", err)
		}
		if tr.PodStates() > maxPods {
			t.Fatalf("%d pods from one stream, limit %d", tr.PodStates(), maxPods)
		}
		for _, l := range b.Loads {
			if got := tr.InFlight(l.Pod); got < 0 || got > maxInFlight {
				t.Fatalf("pod %q counts %d in flight", l.Pod, got)
			}
		}
		n.forget(o)
		if tr.PodStates() != 0 {
			t.Fatalf("%d pods left after the stream was dropped", tr.PodStates())
		}
	})
}
