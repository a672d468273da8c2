package picker

import (
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/infergate/infergate/tier1/prefix"
)

func TestTrackerAccounting(t *testing.T) {
	tr := NewTracker(TrackerOptions{Index: exactIndex})
	h := hashes(16, 0, "")
	r1 := &Request{PromptTokens: 1000, BlockHashes: h}
	r2 := &Request{PromptTokens: 1000, BlockHashes: h}
	r3 := &Request{PromptTokens: 300}
	tr.Dispatched("a", r1)
	tr.Dispatched("a", r2) // same prefix as r1: fully cached
	tr.Dispatched("b", r3)

	type want struct{ inFlight, prefill, prompt, uncached int }
	check := func(step string, w map[string]want) {
		t.Helper()
		pods := []*Pod{mkPod("a"), mkPod("b"), mkPod("c", inflight(9))}
		tr.Apply(pods)
		for _, p := range pods {
			g := want{p.InFlight, p.InFlightPrefill, p.InFlightPromptTokens, p.InFlightUncachedTokens}
			if g != w[p.Name] {
				t.Fatalf("%s: pod %s = %+v, want %+v", step, p.Name, g, w[p.Name])
			}
		}
	}
	check("dispatched", map[string]want{"a": {2, 2, 2000, 1000}, "b": {1, 1, 300, 300}})
	tr.FirstToken("a", r1, 100*time.Millisecond)
	tr.FirstToken("a", r1, 100*time.Millisecond) // duplicate ignored
	tr.FirstToken("b", r2, 100*time.Millisecond) // wrong pod ignored
	check("first token", map[string]want{"a": {2, 1, 1000, 0}, "b": {1, 1, 300, 300}})
	tr.Done("a", r1)
	tr.Done("a", r2) // failed before its first token
	tr.Done("a", r2) // duplicate ignored
	check("done", map[string]want{"b": {1, 1, 300, 300}})
	tr.Dispatched("b", r3) // re-dispatch without Done replaces
	check("re-dispatch", map[string]want{"b": {1, 1, 300, 300}})
	tr.RemovePod("b")
	tr.Done("b", r3) // pod gone: ignored
	check("removed", map[string]want{})
	if tr.Index().PodLen("a") != 16 || tr.Index().PodLen("b") != 0 {
		t.Fatal("index not recorded / not removed")
	}
}

func TestTrackerKeepsPrior(t *testing.T) {
	tr := NewTracker(TrackerOptions{})
	p := mkPod("a", prefill(12345))
	tr.Apply([]*Pod{p})
	if p.PrefillTokensPerSec != 12345 {
		t.Fatalf("prior overwritten: %v", p.PrefillTokensPerSec)
	}
}

// TestSpeedEstimator feeds TTFT = overhead + queue/speed + noise and checks
// the estimate lands near the true speed despite overhead, noise and
// outliers.
func TestSpeedEstimator(t *testing.T) {
	tests := []struct {
		name     string
		speed    float64
		overhead time.Duration
		noise    float64 // relative
		outliers float64 // fraction of samples 10× slow
		sizes    [2]int  // uniform prompt sizes
		tol      float64 // relative
	}{
		{"exact", 10000, 0, 0, 0, [2]int{500, 8000}, 0.01},
		{"overhead removed by the fit", 10000, 40 * time.Millisecond, 0, 0, [2]int{100, 4000}, 0.05},
		{"noise", 20000, 10 * time.Millisecond, 0.2, 0, [2]int{500, 8000}, 0.15},
		{"outliers clipped", 5000, 10 * time.Millisecond, 0.1, 0.05, [2]int{500, 8000}, 0.25},
		{"equal sizes: ratio", 8000, 0, 0.05, 0, [2]int{2000, 2000}, 0.1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := rand.New(rand.NewPCG(1, 2))
			tr := NewTracker(TrackerOptions{})
			for range 400 {
				req := &Request{PromptTokens: tt.sizes[0] + r.IntN(tt.sizes[1]-tt.sizes[0]+1)}
				tr.Dispatched("p", req)
				secs := tt.overhead.Seconds() + float64(req.PromptTokens)/tt.speed
				secs *= 1 + tt.noise*(2*r.Float64()-1)
				if r.Float64() < tt.outliers {
					secs *= 10
				}
				tr.FirstToken("p", req, time.Duration(secs*float64(time.Second)))
				tr.Done("p", req)
			}
			got := tr.PrefillTokensPerSec("p")
			t.Logf("speed %.0f, true %.0f", got, tt.speed)
			if math.Abs(got-tt.speed)/tt.speed > tt.tol {
				t.Fatalf("speed = %.0f, want %.0f ± %.0f%%", got, tt.speed, 100*tt.tol)
			}
		})
	}
}

// TestSpeedQueueAhead checks that tokens queued ahead count in the sample:
// a request waiting behind another must not make the pod look slow.
func TestSpeedQueueAhead(t *testing.T) {
	tr := NewTracker(TrackerOptions{})
	const speed = 10000.0
	for range 50 {
		a := &Request{PromptTokens: 3000}
		b := &Request{PromptTokens: 1000}
		tr.Dispatched("p", a)
		tr.Dispatched("p", b) // queued behind a's 3000 tokens
		tr.FirstToken("p", a, time.Duration(3000/speed*float64(time.Second)))
		tr.FirstToken("p", b, time.Duration(4000/speed*float64(time.Second)))
		tr.Done("p", a)
		tr.Done("p", b)
	}
	if got := tr.PrefillTokensPerSec("p"); math.Abs(got-speed)/speed > 0.05 {
		t.Fatalf("speed = %.0f, want %.0f", got, speed)
	}
}

// TestSpeedAdapts checks a lasting change (the pod got slower) is learned
// despite the outlier clipping.
func TestSpeedAdapts(t *testing.T) {
	tr := NewTracker(TrackerOptions{})
	feed := func(speed float64, n int) {
		for i := range n {
			req := &Request{PromptTokens: 500 + 100*(i%40)}
			tr.Dispatched("p", req)
			tr.FirstToken("p", req, time.Duration(float64(req.PromptTokens)/speed*float64(time.Second)))
			tr.Done("p", req)
		}
	}
	feed(20000, 200)
	feed(4000, 200)
	if got := tr.PrefillTokensPerSec("p"); math.Abs(got-4000)/4000 > 0.1 {
		t.Fatalf("speed = %.0f after slowing to 4000", got)
	}
}

// TestTrackerLongPromptUncached: a long prompt whose hashed window a pod
// already holds still counts its unhashed rest as uncached prefill there.
func TestTrackerLongPromptUncached(t *testing.T) {
	tr := NewTracker(TrackerOptions{})
	h := hashes(16, 0, "")
	tr.Dispatched("a", &Request{PromptTokens: 1000, BlockHashes: h})
	long := &Request{PromptTokens: 4000, BlockHashes: h, PromptBlocks: 64} // 16 of 64 blocks hashed
	tr.Dispatched("a", long)
	pods := []*Pod{mkPod("a")}
	tr.Apply(pods)
	if got, want := pods[0].InFlightUncachedTokens, 1000+3000; got != want {
		t.Fatalf("uncached in flight %d, want %d", got, want)
	}
}

// exactIndex keeps every block, for tests that count blocks exactly.
var exactIndex = prefix.IndexOptions{Stride: 1}
