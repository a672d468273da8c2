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
// GPUs until the pods' own speeds are known; the peak is per GPU (not
// scaled by Pod.GPUs), so a pool mixing TP degrees on one GPU type is
// ranked as if it did not.
//
// A learned speed is also pooled with its hardware class (ProfileConfig's
// speed_pooling): the learned speeds of identical pods (same GPU, same
// GPUs per pod) differ by up to 2x in the routing benchmark, where the
// pods differ by 3%, because each is a regression on few, noisy TTFTs, and
// the scorers then pile work on the pod that happens to look fastest.
type speedPrior struct {
	mean    float64 // learned mean, or the default when none is learned
	perPeak float64 // learned tokens/s per peak TFLOPS over pods with a known GPU; 0 if none
	learned bool
	maxPeak float64 // the largest known peak among the candidates
	peaks   peakCache
	pool    float64 // weight of the class mean in a learned speed, 0..1
	classes speedClasses
}

// speedClasses sums one cycle's learned speeds per hardware class (GPU
// name and GPUs per pod, both known), for its first few classes; pods of
// further classes keep their own speeds.
type speedClasses struct {
	gpu  [8]string
	gpus [8]int
	sum  [8]float64
	n    [8]int
	len  int
}

// find returns p's class slot, adding it when add is set and there is
// room; -1 if p has no class or no slot.
func (c *speedClasses) find(p *Pod, add bool) int {
	if p.GPU == "" || p.GPUs <= 0 {
		return -1
	}
	for i := range c.len {
		if c.gpus[i] == p.GPUs && c.gpu[i] == p.GPU {
			return i
		}
	}
	if !add || c.len == len(c.gpu) {
		return -1
	}
	i := c.len
	c.gpu[i], c.gpus[i] = p.GPU, p.GPUs
	c.len++
	return i
}

// add counts speed v for p's class (nothing when p has no class or no
// slot is left).
func (c *speedClasses) add(p *Pod, v float64) {
	if k := c.find(p, true); k >= 0 {
		c.sum[k] += v
		c.n[k]++
	}
}

// mean is class k's mean speed; k must have a speed counted.
func (c *speedClasses) mean(k int) float64 { return c.sum[k] / float64(c.n[k]) }

// newSpeedPrior is the prior over one cycle's candidates, def the speed
// assumed when nothing is learned and pool the class-pooling weight.
func newSpeedPrior(pods []*Pod, def, pool float64) speedPrior {
	var sum, perPeak float64
	var known, knownPeak int
	s := speedPrior{pool: clamp01(pool)}
	for _, p := range pods {
		peak := s.peaks.peak(p.GPU)
		s.maxPeak = max(s.maxPeak, peak)
		if v := p.PrefillTokensPerSec; v > 0 {
			if s.pool > 0 {
				s.classes.add(p, v)
			}
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

// of is p's learned speed (pooled with its class's mean when at least two
// of the class have learned one), or the prior's guess for it.
func (s *speedPrior) of(p *Pod) float64 {
	if v := p.PrefillTokensPerSec; v > 0 {
		if s.pool > 0 {
			if k := s.classes.find(p, false); k >= 0 && s.classes.n[k] >= 2 {
				return (1-s.pool)*v + s.pool*s.classes.mean(k)
			}
		}
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
