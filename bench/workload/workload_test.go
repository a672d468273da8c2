package workload

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

func TestHashSegments(t *testing.T) {
	tests := []struct {
		name       string
		a, b       []Segment
		wantBlocks [2]int
		shared     int // leading equal hashes
	}{
		{"same prefix, different tails", []Segment{{1, 64}, {100, 40}}, []Segment{{1, 64}, {200, 40}}, [2]int{6, 6}, 4},
		{"different prefixes", []Segment{{1, 64}}, []Segment{{2, 64}}, [2]int{4, 4}, 0},
		{"unaligned shared prefix stops at the straddling block", []Segment{{1, 40}, {100, 40}}, []Segment{{1, 40}, {200, 40}}, [2]int{5, 5}, 2},
		{"growing stream shares everything before", []Segment{{7, 100}}, []Segment{{7, 300}}, [2]int{6, 18}, 6},
		{"partial block not hashed", []Segment{{1, 15}}, []Segment{{1, 31}}, [2]int{0, 1}, 0},
		{"empty", nil, nil, [2]int{0, 0}, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ha, hb := HashSegments(tt.a), HashSegments(tt.b)
			if len(ha) != tt.wantBlocks[0] || len(hb) != tt.wantBlocks[1] {
				t.Fatalf("blocks = %d, %d; want %v", len(ha), len(hb), tt.wantBlocks)
			}
			n := 0
			for n < len(ha) && n < len(hb) && ha[n] == hb[n] {
				n++
			}
			if n != tt.shared {
				t.Errorf("shared blocks = %d, want %d", n, tt.shared)
			}
		})
	}
}

func TestChainIsChained(t *testing.T) {
	a := Chain([]uint64{1, 2, 3})
	b := Chain([]uint64{9, 2, 3})
	for i := range a {
		if a[i] == b[i] {
			t.Errorf("block %d equal though block 0 differs", i)
		}
	}
}

func TestLogNormal(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	d := LogNormal{Median: 1000, P90Ratio: 3, Min: 10, Max: 8000}
	xs := make([]float64, 20000)
	for i := range xs {
		v := d.Draw(r)
		if v < 10 || v > 8000 {
			t.Fatalf("draw %d outside [10, 8000]", v)
		}
		xs[i] = float64(v)
	}
	slices.Sort(xs)
	med, p90 := xs[len(xs)/2], xs[len(xs)*9/10]
	if math.Abs(med-1000) > 50 || math.Abs(p90/med-3) > 0.2 {
		t.Errorf("median %v, p90/median %v; want 1000, 3", med, p90/med)
	}
	if got := (LogNormal{Median: 5}).Draw(r); got != 5 {
		t.Errorf("constant distribution drew %d", got)
	}
}

func TestArrivalRates(t *testing.T) {
	tests := []struct {
		name string
		a    Arrivals
		rate float64
	}{
		{"poisson", Poisson{Rate: 20}, 20},
		{"on/off", OnOff{OnRate: 30, OffRate: 3, On: 10 * time.Second, Off: 20 * time.Second}, 12},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := rand.New(rand.NewPCG(3, 4))
			dur := 600 * time.Second
			ts := tt.a.Times(r, dur)
			if !slices.IsSorted(ts) {
				t.Fatal("arrivals not sorted")
			}
			if ts[len(ts)-1] >= dur || ts[0] < 0 {
				t.Fatalf("arrivals outside [0, %v)", dur)
			}
			got := float64(len(ts)) / dur.Seconds()
			if math.Abs(got-tt.rate)/tt.rate > 0.1 {
				t.Errorf("rate %v, want ≈ %v", got, tt.rate)
			}
		})
	}
	if got := (OnOff{OnRate: 30, OffRate: 3, On: 10 * time.Second, Off: 20 * time.Second}).MeanRate(); got != 12 {
		t.Errorf("MeanRate = %v, want 12", got)
	}
}

func TestZipf(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	z := NewZipf(10, 1)
	counts := make([]int, 10)
	for range 100000 {
		counts[z.Draw(r)]++
	}
	// P(0)/P(1) = 2 for s = 1.
	if ratio := float64(counts[0]) / float64(counts[1]); math.Abs(ratio-2) > 0.1 {
		t.Errorf("P(0)/P(1) = %v, want 2", ratio)
	}
}

func TestSummarize(t *testing.T) {
	s := Stream{Duration: 2 * time.Second, Requests: []Request{
		{PromptTokens: 32, OutputTokens: 10, BlockHashes: Chain([]uint64{1, 2})},
		{PromptTokens: 32, OutputTokens: 30, BlockHashes: Chain([]uint64{1, 3})},
	}}
	st := Summarize(s)
	if st.Requests != 2 || st.Rate != 1 || st.MeanOutput != 20 || st.RepeatedBlockFraction != 0.25 {
		t.Errorf("Summarize = %+v", st)
	}
}
