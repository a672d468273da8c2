package picker

import "bytes"

// gpuPeaks are vendor datasheet dense BF16 (FP16 for the T4) tensor peaks
// in TFLOPS, most specific name first: "a100" before "a10", "l40s" before
// "l4". The A10G's peak is not published; it is taken as the A10's.
var gpuPeaks = []struct {
	name []byte
	tf   float64
}{
	{[]byte("gh200"), 989}, {[]byte("h200"), 989}, {[]byte("h100-pcie"), 756}, {[]byte("h100"), 989}, {[]byte("h800"), 989},
	{[]byte("b200"), 2250}, {[]byte("a100"), 312}, {[]byte("a10g"), 125}, {[]byte("a10"), 125},
	{[]byte("l40s"), 362}, {[]byte("l40"), 181}, {[]byte("l4"), 121}, {[]byte("t4"), 65},
}

// gpuPeak is the peak of the GPU a pod reports (infergate.io/gpu, or the
// node's nvidia.com/gpu.product such as "NVIDIA-H100-80GB-HBM3"), 0 if
// unknown. It does not allocate: it runs for every candidate of a cycle.
func gpuPeak(gpu string) float64 {
	var buf [64]byte
	b := buf[:copy(buf[:], gpu)]
	for i, c := range b {
		if 'A' <= c && c <= 'Z' {
			b[i] = c + 'a' - 'A'
		}
	}
	for _, p := range gpuPeaks {
		if bytes.Contains(b, p.name) {
			return p.tf
		}
	}
	return 0
}

// peakCache remembers the peaks of a cycle's few distinct GPU names.
type peakCache struct {
	names [4]string
	peaks [4]float64
	n     int
}

func (c *peakCache) peak(gpu string) float64 {
	if gpu == "" {
		return 0
	}
	for i := range c.n {
		if c.names[i] == gpu {
			return c.peaks[i]
		}
	}
	v := gpuPeak(gpu)
	if c.n < len(c.names) {
		c.names[c.n], c.peaks[c.n] = gpu, v
		c.n++
	}
	return v
}

// speedPrior is the prefill speed assumed for a pod that has not learned
// its own yet (Tracker learns it from its first TTFTs). Without a GPU
// type that is the candidates' mean learned speed, else the default. With
// one, the learned speeds are scaled by the GPU's peak: a new A10G pod in a
// pool of learned H100s is assumed about an eighth as fast, not as fast
// as they are, and before anything is learned the default is scaled by the
// GPU's peak over the fastest candidate's, so the first long prompts of a
// mixed pool do not land on its slowest pods by chance. Peaks only rank
// GPUs until the pods' own speeds are known; a pod's tensor parallelism
// is not known here, so a pool mixing TP degrees on one GPU type is
// ranked as if it did not.
type speedPrior struct {
	mean    float64 // learned mean, or the default when none is learned
	perPeak float64 // learned tokens/s per peak TFLOPS over pods with a known GPU; 0 if none
	learned bool
	maxPeak float64 // the largest known peak among the candidates
	peaks   peakCache
}

func newSpeedPrior(pods []*Pod, def float64) speedPrior {
	var sum, perPeak float64
	var known, knownPeak int
	var s speedPrior
	for _, p := range pods {
		peak := s.peaks.peak(p.GPU)
		s.maxPeak = max(s.maxPeak, peak)
		if v := p.PrefillTokensPerSec; v > 0 {
			sum += v
			known++
			if peak > 0 {
				perPeak += v / peak
				knownPeak++
			}
		}
	}
	s.mean, s.learned = def, known > 0
	if known > 0 {
		s.mean = sum / float64(known)
	}
	if knownPeak > 0 {
		s.perPeak = perPeak / float64(knownPeak)
	}
	return s
}

// of is p's learned speed, or the prior's guess for it.
func (s *speedPrior) of(p *Pod) float64 {
	if v := p.PrefillTokensPerSec; v > 0 {
		return v
	}
	peak := s.peaks.peak(p.GPU)
	switch {
	case peak <= 0:
		return s.mean
	case s.perPeak > 0:
		return s.perPeak * peak
	case !s.learned && s.maxPeak > 0:
		return s.mean * peak / s.maxPeak
	}
	return s.mean
}
