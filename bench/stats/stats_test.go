package stats

import (
	"math"
	"testing"
)

func near(a, b, tol float64) bool {
	if math.IsNaN(a) || math.IsNaN(b) {
		return math.IsNaN(a) && math.IsNaN(b)
	}
	return math.Abs(a-b) <= tol
}

func TestPercentile(t *testing.T) {
	tests := []struct {
		name string
		xs   []float64
		p    float64
		want float64
	}{
		{"empty", nil, 50, math.NaN()},
		{"single", []float64{7}, 99, 7},
		{"median odd", []float64{3, 1, 2}, 50, 2},
		{"median even interpolates", []float64{1, 2, 3, 4}, 50, 2.5},
		{"min", []float64{5, 1, 9}, 0, 1},
		{"max", []float64{5, 1, 9}, 100, 9},
		{"p90 of 1..11", []float64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}, 90, 10},
		{"p99 of 0..100", seq(101), 99, 99},
		{"p95 interpolates", []float64{0, 10}, 95, 9.5},
		{"clamped above", []float64{1, 2}, 150, 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := Percentile(tt.xs, tt.p); !near(got, tt.want, 1e-9) {
				t.Errorf("Percentile(%v, %v) = %v, want %v", tt.xs, tt.p, got, tt.want)
			}
		})
	}
}

func seq(n int) []float64 {
	out := make([]float64, n)
	for i := range out {
		out[i] = float64(i)
	}
	return out
}

func TestPercentileDoesNotModify(t *testing.T) {
	xs := []float64{3, 1, 2}
	Percentile(xs, 50)
	if xs[0] != 3 || xs[1] != 1 || xs[2] != 2 {
		t.Fatalf("input modified: %v", xs)
	}
}

func TestMeanStdDev(t *testing.T) {
	tests := []struct {
		xs       []float64
		mean, sd float64
	}{
		{nil, math.NaN(), 0},
		{[]float64{4}, 4, 0},
		{[]float64{2, 4, 4, 4, 5, 5, 7, 9}, 5, 2.138089935299395},
		{[]float64{1, 1, 1}, 1, 0},
	}
	for _, tt := range tests {
		if got := Mean(tt.xs); !near(got, tt.mean, 1e-12) {
			t.Errorf("Mean(%v) = %v, want %v", tt.xs, got, tt.mean)
		}
		if got := StdDev(tt.xs); !near(got, tt.sd, 1e-12) {
			t.Errorf("StdDev(%v) = %v, want %v", tt.xs, got, tt.sd)
		}
	}
}

func TestTQuantile975(t *testing.T) {
	tests := []struct {
		df   int
		want float64
		tol  float64
	}{
		{0, math.Inf(1), 0},
		{1, 12.706, 1e-9},
		{4, 2.776, 1e-9},
		{30, 2.042, 1e-9},
		{40, 2.021, 0.002},
		{120, 1.980, 0.002},
		{100000, 1.960, 0.001},
	}
	for _, tt := range tests {
		got := TQuantile975(tt.df)
		if math.IsInf(tt.want, 1) {
			if !math.IsInf(got, 1) {
				t.Errorf("df=%d: got %v, want +Inf", tt.df, got)
			}
			continue
		}
		if !near(got, tt.want, tt.tol) {
			t.Errorf("df=%d: got %v, want %v±%v", tt.df, got, tt.want, tt.tol)
		}
	}
}

func TestCI95(t *testing.T) {
	tests := []struct {
		name     string
		xs       []float64
		mean, hw float64
	}{
		{"one value has unknown width", []float64{3}, 3, math.NaN()},
		{"constant has zero width", []float64{2, 2, 2, 2, 2}, 2, 0},
		// mean 3, sd sqrt(2.5), t(4)=2.776: 2.776*1.5811/sqrt(5)
		{"five seeds", []float64{1, 2, 3, 4, 5}, 3, 2.776 * math.Sqrt(2.5) / math.Sqrt(5)},
		// two values 0 and 2: sd sqrt(2), t(1)=12.706
		{"two seeds", []float64{0, 2}, 1, 12.706 * math.Sqrt(2) / math.Sqrt(2)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := CI95(tt.xs)
			if !near(c.Mean, tt.mean, 1e-9) || !near(c.HalfWidth, tt.hw, 1e-9) || c.N != len(tt.xs) {
				t.Errorf("CI95(%v) = %+v, want mean %v ± %v", tt.xs, c, tt.mean, tt.hw)
			}
		})
	}
}
