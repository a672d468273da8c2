package picker

import (
	"slices"
	"sync/atomic"
)

var pickerFactories = map[string]func(buildContext) ranker{
	PickerMaxScore:   func(buildContext) ranker { return maxScorePicker{} },
	PickerRandom:     func(buildContext) ranker { return randomPicker{} },
	PickerRoundRobin: func(buildContext) ranker { return &roundRobinPicker{} },
}

// splitmix64 turns the cycle seed and a position into an independent
// tie-break key: cheap, and reproducible from a seeded Options.Rand.
func splitmix64(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}

// rankTop appends to out the best maxRanked pods by key (desc), ties
// broken by the random key; keys nil ranks purely at random.
func rankTop(cs *cycleState, pods []*Pod, keys []float64) []*Pod {
	n := len(pods)
	k := cs.maxRanked
	if k <= 0 || k > n {
		k = n
	}
	seed := cs.seed
	tb := func(i int32) uint64 { return splitmix64(seed ^ (uint64(i) * 0x9e3779b97f4a7c15)) }
	better := func(i, j int32) bool {
		if keys != nil && keys[i] != keys[j] {
			return keys[i] > keys[j]
		}
		return tb(i) > tb(j)
	}
	var idx []int32
	if cs.cyc != nil {
		idx = cs.cyc.idx[:0]
	}
	if k > 16 {
		for i := range n {
			idx = append(idx, int32(i))
		}
		slices.SortFunc(idx, func(a, b int32) int {
			if better(a, b) {
				return -1
			}
			if better(b, a) {
				return 1
			}
			return 0
		})
		idx = idx[:k]
	} else {
		// Insertion into a short sorted list: O(n·k) with k small, and
		// no sort of all n candidates.
		for i := range int32(n) {
			if len(idx) == k && !better(i, idx[k-1]) {
				continue
			}
			if len(idx) < k {
				idx = append(idx, i)
			} else {
				idx[k-1] = i
			}
			for j := len(idx) - 1; j > 0 && better(idx[j], idx[j-1]); j-- {
				idx[j], idx[j-1] = idx[j-1], idx[j]
			}
		}
	}
	out := cs.out[:0]
	for _, i := range idx {
		out = append(out, pods[i])
	}
	if cs.cyc != nil {
		cs.cyc.idx = idx[:0]
	}
	return out
}

// maxScorePicker ranks by total score, ties shuffled (GIE's max-score).
type maxScorePicker struct{}

func (maxScorePicker) Name() string { return PickerMaxScore }

func (maxScorePicker) Pick(cs *cycleState, _ *Request, pods []*Pod, total []float64) []*Pod {
	return rankTop(cs, pods, total)
}

// randomPicker ignores scores: a uniformly random order.
type randomPicker struct{}

func (randomPicker) Name() string { return PickerRandom }

func (randomPicker) Pick(cs *cycleState, _ *Request, pods []*Pod, _ []float64) []*Pod {
	return rankTop(cs, pods, nil)
}

// roundRobinPicker rotates through the candidates in the order given,
// ignoring scores: the Kubernetes Service baseline.
type roundRobinPicker struct{ next atomic.Uint64 }

func (*roundRobinPicker) Name() string { return PickerRoundRobin }

func (r *roundRobinPicker) Pick(cs *cycleState, _ *Request, pods []*Pod, _ []float64) []*Pod {
	n := len(pods)
	k := cs.maxRanked
	if k <= 0 || k > n {
		k = n
	}
	start := int((r.next.Add(1) - 1) % uint64(n))
	out := cs.out[:0]
	for i := range k {
		out = append(out, pods[(start+i)%n])
	}
	return out
}
