package bench

import (
	"github.com/infergate/infergate/sim/engine"
	"github.com/infergate/infergate/tier1/picker"
)

// exactIndex is a precise prefix index fed by the simulated engines' KV
// cache events (engine.KVEvents): per pod, the block keys it holds right
// now, stored when a block is computed and removed when it is evicted, as
// vLLM's BlockStored and BlockRemoved events report them. It is what a
// precise-prefix router (Tier 1 with kv_events, llm-d's
// precise-prefix-cache-scorer) knows, and unlike an approximate index it
// sees evictions. Events apply at once: the ZeroMQ transport's delay (a
// millisecond or so on a cluster network) is not modelled.
type exactIndex struct {
	held  map[string]map[uint64]struct{}
	order []string // pods in fleet order
}

func newExactIndex() *exactIndex {
	return &exactIndex{held: map[string]map[uint64]struct{}{}}
}

// attach makes e publish pod's cache events into x.
func (x *exactIndex) attach(e *engine.Engine, pod string) {
	set := map[uint64]struct{}{}
	x.held[pod] = set
	x.order = append(x.order, pod)
	e.SetKVEvents(podEvents{set})
}

// Match implements picker.ExactIndex: per pod, how many leading hashes it
// holds. Keys are the engine's, of engine.BlockSize tokens; another block
// size matches nothing.
func (x *exactIndex) Match(hashes []uint64, blockSize int, pods []string, dst []int) []int {
	dst = append(dst[:0], make([]int, len(pods))...)
	if blockSize != engine.BlockSize {
		return dst
	}
	for i, p := range pods {
		dst[i] = x.matchOne(p, hashes)
	}
	return dst
}

// Fresh implements picker.ExactIndex: every simulated pod publishes its
// events and none is lost.
func (x *exactIndex) Fresh(pod string) bool {
	_, ok := x.held[pod]
	return ok
}

// matchOne is how many leading hashes pod holds.
func (x *exactIndex) matchOne(pod string, hashes []uint64) int {
	set := x.held[pod]
	n := 0
	for _, h := range hashes {
		if _, ok := set[h]; !ok {
			break
		}
		n++
	}
	return n
}

var _ picker.ExactIndex = (*exactIndex)(nil)

// podEvents is one pod's engine.KVEvents listener.
type podEvents struct{ set map[uint64]struct{} }

func (p podEvents) BlockStored(_ *engine.Request, _ int, hash, _ uint64, _ bool) {
	p.set[hash] = struct{}{}
}

func (p podEvents) BlockRemoved(hash uint64) { delete(p.set, hash) }

func (p podEvents) AllBlocksCleared() { clear(p.set) }
