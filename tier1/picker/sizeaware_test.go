package picker

import (
	"math"
	"os"
	"testing"
)

func TestSizeAwareScores(t *testing.T) {
	tests := []struct {
		name   string
		prompt int
		cached map[string]int // pod → blocks of the 16-block prompt recorded
		pods   []*Pod
		params map[string]float64
		want   []float64
	}{
		{
			name: "idle pods score 1", prompt: 500,
			pods: []*Pod{mkPod("a"), mkPod("b")},
			want: []float64{1, 1},
		},
		{
			name: "short prompt behind a long prefill scores its share", prompt: 500,
			pods: []*Pod{mkPod("a", queued(7500)), mkPod("b", queued(500)), mkPod("c")},
			want: []float64{500.0 / 8000, 0.5, 1},
		},
		{
			name: "long prompt pays less for the same queue", prompt: 7500,
			pods: []*Pod{mkPod("a", queued(7500)), mkPod("b")},
			want: []float64{0.5, 1},
		},
		{
			name: "scraped waiting requests count at this prompt's size", prompt: 1000,
			pods: []*Pod{mkPod("a", waiting(3)), mkPod("b")},
			want: []float64{0.25, 1},
		},
		{
			name: "assumed size of unseen waiting requests", prompt: 1000,
			pods:   []*Pod{mkPod("a", waiting(1))},
			params: map[string]float64{ParamQueuedPromptTok: 3000},
			want:   []float64{0.25},
		},
		{
			name: "cached overlap shrinks the prompt's own work", prompt: 1600,
			cached: map[string]int{"a": 8},
			pods:   []*Pod{mkPod("a", queued(800)), mkPod("b", queued(800))},
			want:   []float64{0.5, 1600.0 / 2400},
		},
		{
			name: "soft partition: long prompt prefers pods already prefilling long", prompt: 6000,
			pods:   []*Pod{mkPod("a", queued(5000)), mkPod("b", queued(100)), mkPod("c")},
			params: map[string]float64{ParamLongAffinity: 0.5, ParamLongTokens: 4096},
			want:   []float64{1, 0.5, 0.5},
		},
		{
			name: "soft partition leaves short prompts alone", prompt: 1000,
			pods:   []*Pod{mkPod("a", queued(5000)), mkPod("c")},
			params: map[string]float64{ParamLongAffinity: 0.5, ParamLongTokens: 4096},
			want:   []float64{1000.0 / 6000, 1},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tr := NewTracker(TrackerOptions{})
			req := &Request{PromptTokens: tt.prompt, BlockHashes: blocks(100, 16)}
			for pod, n := range tt.cached {
				tr.Index().Record(pod, req.BlockHashes[:n])
			}
			got := scoreOnly(t, ScorerSizeAware, tt.params, tr, req, tt.pods)
			for i, w := range tt.want {
				if math.Abs(got[i]-w) > 1e-9 {
					t.Fatalf("score[%s] = %v, want %v (all %v)", tt.pods[i].Name, got[i], w, got)
				}
			}
		})
	}
}

// A short request goes to the pod without a long prefill in flight even
// when that pod runs more requests, which the running scorer alone avoids.
func TestSizeAwareSteersShortPrompts(t *testing.T) {
	cfg := ProfileConfig{Base: BaseEmpty, Filters: []string{FilterModel}, Picker: PickerMaxScore,
		Scorers: []ScorerConfig{{Name: ScorerSizeAware, Weight: 2}, {Name: ScorerRunning, Weight: 1}}}
	tr := NewTracker(TrackerOptions{})
	s := mustScheduler(t, cfg, Options{Tracker: tr, Rand: seeded(1)})
	long := mkPod("long", func(p *Pod) { p.InFlightUncachedTokens, p.InFlightPrefill, p.InFlight = 8000, 1, 1 })
	busy := mkPod("busy", running(20))
	res, err := s.Schedule(&Request{ID: "r", PromptTokens: 300}, []*Pod{long, busy})
	if err != nil {
		t.Fatal(err)
	}
	if res.Ranked[0].Name != "busy" {
		t.Fatalf("picked %s, want busy", res.Ranked[0].Name)
	}
}

func TestSizeAwareExampleProfile(t *testing.T) {
	data, err := os.ReadFile("../../examples/picker-size-aware.yaml")
	if err != nil {
		t.Fatal(err)
	}
	c, err := ParseProfile("picker-size-aware.yaml", data)
	if err != nil {
		t.Fatal(err)
	}
	if c.Weight(ScorerSizeAware) != 2 || c.Weight(ScorerPredictedLatency) != 5 || c.Saturation.PrefillWait != DefaultPrefillWait {
		t.Fatalf("profile %+v", c)
	}
	if _, err := NewScheduler(c, Options{Tracker: NewTracker(TrackerOptions{})}); err != nil {
		t.Fatal(err)
	}
}
