// Package stats holds the small amount of statistics the benchmark needs:
// percentiles of per-request samples and Student-t confidence intervals of
// per-seed values.
package stats

import (
	"math"
	"slices"
)

// Percentile returns the p-th percentile (0..100) of xs by linear
// interpolation between closest ranks (NumPy's default). xs need not be
// sorted; it is not modified. It returns NaN for an empty slice.
func Percentile(xs []float64, p float64) float64 {
	if len(xs) == 0 {
		return math.NaN()
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	return PercentileSorted(s, p)
}

// PercentileSorted is Percentile for an already sorted slice.
func PercentileSorted(s []float64, p float64) float64 {
	if len(s) == 0 {
		return math.NaN()
	}
	p = math.Max(0, math.Min(100, p))
	pos := p / 100 * float64(len(s)-1)
	lo := int(math.Floor(pos))
	hi := int(math.Ceil(pos))
	if lo == hi {
		return s[lo]
	}
	f := pos - float64(lo)
	return s[lo]*(1-f) + s[hi]*f
}

// Mean returns the arithmetic mean, NaN for an empty slice.
func Mean(xs []float64) float64 {
	if len(xs) == 0 {
		return math.NaN()
	}
	sum := 0.0
	for _, x := range xs {
		sum += x
	}
	return sum / float64(len(xs))
}

// StdDev returns the sample standard deviation (n−1), 0 for fewer than two
// values.
func StdDev(xs []float64) float64 {
	if len(xs) < 2 {
		return 0
	}
	m := Mean(xs)
	ss := 0.0
	for _, x := range xs {
		ss += (x - m) * (x - m)
	}
	return math.Sqrt(ss / float64(len(xs)-1))
}

// t975 holds the 0.975 quantile of Student's t for 1..30 degrees of freedom.
var t975 = [...]float64{
	12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
	2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
	2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
}

// TQuantile975 returns the two-sided 95% critical value of Student's t with
// df degrees of freedom (tabulated to 30, then the normal-based
// approximation, which is within 0.5% there). It returns +Inf for df < 1.
func TQuantile975(df int) float64 {
	switch {
	case df < 1:
		return math.Inf(1)
	case df <= len(t975):
		return t975[df-1]
	default:
		// Cornish-Fisher expansion around z = 1.95996.
		z := 1.959963984540054
		d := float64(df)
		return z + (z*z*z+z)/(4*d) + (5*math.Pow(z, 5)+16*z*z*z+3*z)/(96*d*d)
	}
}

// CI is a mean with the half-width of its 95% confidence interval.
type CI struct {
	Mean, HalfWidth float64
	N               int
}

// CI95 returns the mean of per-seed values and the half-width of its 95%
// t-interval. With one value the half-width is NaN (unknown), not 0.
func CI95(xs []float64) CI {
	n := len(xs)
	c := CI{Mean: Mean(xs), N: n}
	if n < 2 {
		c.HalfWidth = math.NaN()
		return c
	}
	c.HalfWidth = TQuantile975(n-1) * StdDev(xs) / math.Sqrt(float64(n))
	return c
}
