package bench

import (
	"testing"
	"time"

	"github.com/infergate/infergate/sim/engine"
)

func TestRealismScrapeAt(t *testing.T) {
	const every = 50 * time.Millisecond
	r := DefaultRealism()
	phases := map[time.Duration]bool{}
	late, total := 0, 0
	for pod := range 40 {
		p := r.ScrapeAt(7, pod, 0, every)
		if p < 0 || p >= 2*every {
			t.Fatalf("pod %d first scrape at %v", pod, p)
		}
		phases[p%every] = true
		for tick := range int64(500) {
			at := r.ScrapeAt(7, pod, tick, every)
			if at != r.ScrapeAt(7, pod, tick, every) {
				t.Fatal("not deterministic")
			}
			base := time.Duration(tick)*every + r.ScrapeAt(7, pod, 0, every)%every
			switch at - base {
			case 0:
			case every:
				late++
			default:
				if tick > 0 || at-base != every {
					t.Fatalf("pod %d tick %d at %v, base %v", pod, tick, at, base)
				}
			}
			total++
		}
	}
	if len(phases) < 35 {
		t.Errorf("only %d distinct phases over 40 pods: not staggered", len(phases))
	}
	if f := float64(late) / float64(total); f < 0.01 || f > 0.03 {
		t.Errorf("late fraction %.3f, want ≈ 0.02", f)
	}
	var off Realism
	if off.ScrapeAt(7, 3, 4, every) != 4*every {
		t.Error("zero Realism must scrape on the fleet-wide tick")
	}
}

func TestParseRealism(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want Realism
	}{
		{"", DefaultRealism()},
		{"default", DefaultRealism()},
		{"off", Realism{}},
		{"jitter", Realism{Engine: engine.Variation{StepJitter: 0.03}}},
		{"spread,late", Realism{Engine: engine.Variation{PodSpread: 0.03}, LateScrape: 0.02}},
		{"stagger", Realism{ScrapeStagger: true}},
		// noise keeps the larger step jitter whichever order it comes in.
		{"noise,jitter", Realism{Engine: engine.Variation{StepJitter: 0.15, StallProb: 0.002, StallMean: engine.DefaultStallMean, PrefillNoise: 0.25}}},
		{"jitter,noise", Realism{Engine: engine.Variation{StepJitter: 0.15, StallProb: 0.002, StallMean: engine.DefaultStallMean, PrefillNoise: 0.25}}},
	} {
		got, err := ParseRealism(tc.in)
		if err != nil || got != tc.want {
			t.Errorf("ParseRealism(%q) = %+v, %v; want %+v", tc.in, got, err, tc.want)
		}
	}
	if _, err := ParseRealism("jitter,wobble"); err == nil {
		t.Error("unknown knob accepted")
	}
	if got := (Options{}).Conditions(); got != "realism: step jitter σ 3%, pods ±3%, staggered scrapes, 2% late scrapes; production inputs (admission.Prompt on generated text)" {
		t.Errorf("default conditions %q", got)
	}
}
