package picker

import (
	"maps"
	"testing"
)

// fakeExact is an exact index by hand: the blocks each pod holds, and
// which pods' events are fresh.
type fakeExact struct {
	held  map[string][]uint64
	fresh map[string]bool
	bs    int
}

func (f *fakeExact) Match(hashes []uint64, blockSize int, pods []string, dst []int) []int {
	dst = append(dst[:0], make([]int, len(pods))...)
	if blockSize != f.bs {
		return dst
	}
	for i, p := range pods {
		held := f.held[p]
		for k, h := range hashes {
			if k >= len(held) || held[k] != h {
				break
			}
			dst[i]++
		}
	}
	return dst
}

func (f *fakeExact) Fresh(pod string) bool { return f.fresh[pod] }

func TestPrecisePrefixSpec(t *testing.T) {
	if !maps.Equal(precisePrefixSpec.params, scorerSpecs[ScorerPrefix].params) {
		t.Errorf("precise-prefix parameters %v, prefix's %v: they are one scorer", precisePrefixSpec.params, scorerSpecs[ScorerPrefix].params)
	}
	s := precisePrefixSpec.build(buildContext{params: precisePrefixSpec.withDefaults(nil)})
	if s.Name() != ScorerPrecisePrefix || s.Consumes() != loadMetrics {
		t.Errorf("name %q consumes %v", s.Name(), s.Consumes())
	}
}

// exactSetup: pod a is where the router sent the prompt (the approximate
// index holds all of it) but its cache was cleared (fresh, exact 0); b
// holds it all by its events; c's events are stale, so the approximate
// index (half) stands for it; d has neither.
func exactSetup() (*Tracker, *fakeExact, []uint64, []uint64, []*Pod) {
	ah := hashes(0, 40, "p")
	exact := []uint64{11, 12, 13, 14, 15, 16, 17, 18}
	x := &fakeExact{
		held:  map[string][]uint64{"b": exact, "c": exact},
		fresh: map[string]bool{"a": true, "b": true},
		bs:    16,
	}
	tr := NewTracker(TrackerOptions{Exact: x})
	tr.Index().Record("a", ah)
	tr.Index().Record("c", ah[:20])
	pods := []*Pod{mkPod("a"), mkPod("b"), mkPod("c"), mkPod("d")}
	return tr, x, ah, exact, pods
}

func TestPrecisePrefixScores(t *testing.T) {
	tr, _, ah, exact, pods := exactSetup()
	tests := []struct {
		name string
		req  Request
		want []float64
	}{
		{"exact where fresh, approximate elsewhere", Request{BlockHashes: ah, ExactHashes: exact, ExactBlockSize: 16}, []float64{0, 1, 0.5, 0}},
		{"no exact hashes: approximate only", Request{BlockHashes: ah}, []float64{1, 0, 0.5, 0}},
		{"another block size matches nothing exactly", Request{BlockHashes: ah, ExactHashes: exact, ExactBlockSize: 32}, []float64{0, 0, 0.5, 0}},
		{"exact hashes of part of a long prompt", Request{BlockHashes: ah, ExactHashes: exact, ExactBlockSize: 16, ExactPromptBlocks: 16}, []float64{0, 0.5, 0.5, 0}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for _, name := range []string{ScorerPrefix, ScorerPrecisePrefix} {
				if got := scoreOnly(t, name, nil, tr, &tt.req, pods); !approx(got, tt.want) {
					t.Errorf("%s: got %v, want %v", name, got, tt.want)
				}
			}
		})
	}
	t.Run("without an exact index the hashes are ignored", func(t *testing.T) {
		plain := NewTracker(TrackerOptions{})
		plain.Index().Record("a", ah)
		req := Request{BlockHashes: ah, ExactHashes: exact, ExactBlockSize: 16}
		if got := scoreOnly(t, ScorerPrefix, nil, plain, &req, pods); !approx(got, []float64{1, 0, 0, 0}) {
			t.Errorf("got %v", got)
		}
	})
}

// Predicted latency reads the same evidence: the uncached prompt on a
// fresh pod is what its events say it lacks.
func TestPrecisePrefixUncachedTokens(t *testing.T) {
	tr, _, ah, exact, pods := exactSetup()
	req := &Request{PromptTokens: 8000, BlockHashes: ah, ExactHashes: exact, ExactBlockSize: 16}
	got := scoreOnly(t, ScorerPredictedLatency, nil, tr, req, pods)
	// b holds everything (estimate 0: best); a, d hold nothing; c half.
	if !(got[1] == 1 && got[2] > got[0] && got[0] == got[3]) {
		t.Errorf("scores %v: want b best, then c, then a = d", got)
	}
}

// The default profile follows the exact evidence: the prompt goes to the
// pod that holds it, not to where the router last sent it.
func TestPrecisePrefixDefaultProfile(t *testing.T) {
	tr, _, ah, exact, pods := exactSetup()
	s := mustScheduler(t, DefaultProfile(), Options{Tracker: tr, Rand: seeded(1)})
	for _, tt := range []struct {
		name string
		req  Request
		want string
	}{
		{"exact", Request{Model: "llama", BaseModel: "llama", PromptTokens: 2600, BlockHashes: ah, ExactHashes: exact, ExactBlockSize: 16}, "b"},
		{"approximate", Request{Model: "llama", BaseModel: "llama", PromptTokens: 2600, BlockHashes: ah}, "a"},
	} {
		res, err := s.Schedule(&tt.req, pods)
		if err != nil {
			t.Fatal(err)
		}
		if got := res.Ranked[0].Name; got != tt.want {
			t.Errorf("%s: picked %s, want %s", tt.name, got, tt.want)
		}
	}
}

// Dispatched estimates the uncached prompt from the same evidence and
// counts which source it used.
func TestPrecisePrefixDispatched(t *testing.T) {
	tr, _, ah, exact, _ := exactSetup()
	for _, tt := range []struct {
		pod          string
		req          Request
		wantUncached int
		wantSrc      PrefixSource
	}{
		{"a", Request{PromptTokens: 1000, BlockHashes: ah, ExactHashes: exact, ExactBlockSize: 16}, 1000, PrefixExact},
		{"b", Request{PromptTokens: 1000, BlockHashes: ah, ExactHashes: exact, ExactBlockSize: 16}, 0, PrefixExact},
		{"c", Request{PromptTokens: 1000, BlockHashes: ah, ExactHashes: exact, ExactBlockSize: 16}, 500, PrefixApproximate},
		{"a", Request{PromptTokens: 1000, BlockHashes: ah}, 0, PrefixApproximate},
	} {
		before := tr.PrefixSourceCount(tt.wantSrc)
		tr.Dispatched(tt.pod, &tt.req)
		p := mkPod(tt.pod)
		tr.Apply([]*Pod{p})
		if p.InFlightUncachedTokens != tt.wantUncached {
			t.Errorf("%s: uncached %d, want %d", tt.pod, p.InFlightUncachedTokens, tt.wantUncached)
		}
		if got := tr.PrefixSourceCount(tt.wantSrc); got != before+1 {
			t.Errorf("%s: %v count %d, want %d", tt.pod, tt.wantSrc, got, before+1)
		}
		tr.Done(tt.pod, &tt.req)
	}
	if tr.PrefixSourceCount(numPrefixSources) != 0 {
		t.Error("out-of-range source counted")
	}
}
