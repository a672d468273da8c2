package bench

import (
	"container/list"
	"math/rand/v2"
	"time"

	"github.com/infergate/infergate/tier1/picker"
	"github.com/infergate/infergate/tier1/prefix"
)

// EPPConfig is the default scheduling profile of an upstream endpoint
// picker (GIE v1.5.0, llm-d router v0.10.0), reproduced from its source
// rather than through Tier 1's picker: the upstream scorers read only
// scraped metrics, never the router's own in-flight requests, and there are
// no filters. docs/benchmarks.md cites the files each field comes from.
type EPPConfig struct {
	// Weights of queue-scorer, kv-cache-utilization-scorer and
	// prefix-cache-scorer (2, 2, 3 in both defaults).
	QueueWeight, KVWeight, PrefixWeight float64
	// MaxPrefixBlocks caps the prompt blocks hashed and matched (GIE's
	// maxPrefixBlocksToMatch 256; llm-d's maxPrefixTokensToMatch 131072 /
	// 16-token blocks = 8192).
	MaxPrefixBlocks int
	// LRUCapacityPerServer is the prefix index's entries per pod when the
	// pod reports no KV block count (autoTune uses the reported count).
	LRUCapacityPerServer int
	// Saturation detector (utilization-detector) thresholds, consulted only
	// by the legacy admission controller for sheddable requests.
	QueueDepthThreshold  int
	KVCacheUtilThreshold float64
	MetricsStaleness     time.Duration
	// Precise swaps the prefix-cache-scorer for llm-d's
	// precise-prefix-cache-scorer: each pod's longest run of leading
	// blocks it holds by its KV events (the request's engine block keys
	// against the exact index), min-max normalised over the pods that hold any (1 when
	// they hold equally many, 0 for pods that hold none), and no
	// approximate index.
	Precise bool
}

// GIEv15Config is GIE v1.5.0's default (pkg/epp/config/loader/defaults.go).
func GIEv15Config() EPPConfig {
	return EPPConfig{
		QueueWeight: 2, KVWeight: 2, PrefixWeight: 3,
		MaxPrefixBlocks:      256,
		LRUCapacityPerServer: 31250,
		QueueDepthThreshold:  5,
		KVCacheUtilThreshold: 0.8,
		MetricsStaleness:     200 * time.Millisecond,
	}
}

// LLMDv010Config is llm-d router v0.10.0's default (same loader defaults and
// Helm chart profile as GIE, a token-capped prefix window of 131072 tokens).
func LLMDv010Config() EPPConfig {
	c := GIEv15Config()
	c.MaxPrefixBlocks = 131072 / 16
	return c
}

// Router picks pods for a policy that keeps its own state across one run
// (an upstream picker's prefix index). A Router serves one run only.
type Router interface {
	// Pick returns the index into pods of the pod the request goes to, and
	// records the dispatch (the upstream PreRequest hook).
	Pick(r *rand.Rand, req *picker.Request, pods []*picker.Pod) int
}

// Admitter is implemented by routers with an admission step: Admit reports
// whether the request may be dispatched now; false means it is rejected
// (GIE's legacy admission drops sheddable requests when the pool is
// saturated, and never queues).
type Admitter interface {
	Admit(req *picker.Request, pods []*picker.Pod) bool
}

// Prompter is implemented by routers that compute their own view of a
// prompt from the request text, as upstream endpoint pickers do (GIE and
// llm-d hash 64-byte blocks of it and never see Tier 1's estimate). Prompt
// sets req's PromptTokens and BlockHashes from text, reusing
// req.BlockHashes' storage.
type Prompter interface {
	Prompt(req *picker.Request, text []byte)
}

// NewEPPRouter returns a per-run router for cfg.
func NewEPPRouter(cfg EPPConfig) Router {
	return &eppRouter{cfg: cfg, idx: newPrefixIndex()}
}

type eppRouter struct {
	cfg    EPPConfig
	idx    *prefixIndex
	match  map[string]int
	scores []float64
	exact  *exactIndex // KV-event index of a Precise config
	keys   []uint64    // the next request's engine block keys (Precise)
	held   []int       // per pod, leading blocks held (Precise)
}

// exactUser is a Router that reads the engines' KV events: useExact
// gives it the index, exactKeys the engine block keys of the request it
// picks for next (what llm-d computes from the exact tokens).
type exactUser interface {
	useExact(x *exactIndex)
	exactKeys(keys []uint64)
}

func (e *eppRouter) useExact(x *exactIndex) {
	if e.cfg.Precise {
		e.exact = x
	}
}

func (e *eppRouter) exactKeys(keys []uint64) { e.keys = keys }

// precise fills e.held with each pod's leading blocks of the request
// (e.keys) held by its KV events and returns the
// precise-prefix-cache-scorer's per-pod score function; ok false without
// an index or keys.
func (e *eppRouter) precise(pods []*picker.Pod) (score func(i int) float64, ok bool) {
	if e.exact == nil || len(e.keys) == 0 {
		return nil, false
	}
	hashes := e.keys
	if len(hashes) > e.cfg.MaxPrefixBlocks {
		hashes = hashes[:e.cfg.MaxPrefixBlocks]
	}
	e.held = e.held[:0]
	lo, hi := -1, -1
	for _, p := range pods {
		n := e.exact.matchOne(p.Name, hashes)
		e.held = append(e.held, n)
		if n > 0 {
			if lo < 0 || n < lo {
				lo = n
			}
			hi = max(hi, n)
		}
	}
	return func(i int) float64 {
		n := e.held[i]
		switch {
		case n == 0:
			return 0
		case hi == lo:
			return 1
		}
		return float64(n-lo) / float64(hi-lo)
	}, true
}

// Admit is requestcontrol/admission.go's LegacyAdmissionController: a
// sheddable request (priority < 0) is rejected when the
// utilization-detector's pool saturation is ≥ 1; everything else is
// dispatched at once (flow control is off by default).
func (e *eppRouter) Admit(req *picker.Request, pods []*picker.Pod) bool {
	if req.Priority >= 0 && !req.Sheddable {
		return true
	}
	return e.saturation(pods) < 1
}

// saturation is the utilization detector's Saturation: the mean over pods
// of max(waiting/queueThreshold, kv/kvThreshold), a stale pod counting 1.
func (e *eppRouter) saturation(pods []*picker.Pod) float64 {
	if len(pods) == 0 {
		return 1
	}
	var sum float64
	for _, p := range pods {
		if p.MetricsAge > e.cfg.MetricsStaleness {
			sum++
			continue
		}
		q := float64(p.Metrics.Waiting) / float64(e.cfg.QueueDepthThreshold)
		kv := p.Metrics.KVUsage / e.cfg.KVCacheUtilThreshold
		sum += max(q, kv)
	}
	return sum / float64(len(pods))
}

// blockBytes is the upstream prefix block in bytes of request text:
// blockSizeTokens 16 × 4 characters per token (GIE's hashing.go; llm-d's
// estimate tokenizer gives the same 64 bytes).
const blockBytes = 64

// Prompt hashes text as the upstream approximate-prefix producer does:
// chained hashes of full 64-byte blocks, seeded by the model name, up to
// the window of MaxPrefixBlocks; 4 bytes a token for the length.
func (e *eppRouter) Prompt(req *picker.Request, text []byte) {
	req.BlockHashes = prefix.Hash(req.Model, text, blockBytes, e.cfg.MaxPrefixBlocks, req.BlockHashes[:0])
	req.PromptTokens = max(1, len(text)/4)
}

func (e *eppRouter) Pick(r *rand.Rand, req *picker.Request, pods []*picker.Pod) int {
	if len(pods) == 0 {
		return -1
	}
	hashes := req.BlockHashes
	if len(hashes) > e.cfg.MaxPrefixBlocks {
		hashes = hashes[:e.cfg.MaxPrefixBlocks]
	}
	preciseScore, precise := e.precise(pods)
	// approximateprefix.matchLongestPrefix: walk the blocks until none of
	// the pods holds one, counting each pod's blocks along the way.
	if e.match == nil {
		e.match = map[string]int{}
	}
	clear(e.match)
	for _, h := range hashes {
		if precise {
			break
		}
		servers := e.idx.get(h)
		if len(servers) == 0 {
			break
		}
		for s := range servers {
			e.match[s]++
		}
	}
	// queue-scorer: min-max of the scraped waiting queue only.
	lo, hi := pods[0].Metrics.Waiting, pods[0].Metrics.Waiting
	for _, p := range pods {
		lo, hi = min(lo, p.Metrics.Waiting), max(hi, p.Metrics.Waiting)
	}
	e.scores = e.scores[:0]
	best := -1
	ties := 0
	for i, p := range pods {
		q := 1.0
		if hi > lo {
			q = float64(hi-p.Metrics.Waiting) / float64(hi-lo)
		}
		kv := 1 - p.Metrics.KVUsage // kv-cache-utilization-scorer
		var pre float64             // prefix-cache-scorer: matched / total
		switch {
		case precise:
			pre = preciseScore(i)
		case len(hashes) > 0:
			pre = float64(e.match[p.Name]) / float64(len(hashes))
		}
		s := e.cfg.QueueWeight*q + e.cfg.KVWeight*kv + e.cfg.PrefixWeight*pre
		e.scores = append(e.scores, s)
		// max-score-picker shuffles, then stable-sorts by score: a uniform
		// choice among the top scores, here by reservoir sampling.
		switch {
		case best < 0 || s > e.scores[best]:
			best, ties = i, 1
		case s == e.scores[best]:
			ties++
			if r.IntN(ties) == 0 {
				best = i
			}
		}
	}
	if precise {
		return best // the pods' own events will say what they hold
	}
	// PreRequest: the chosen pod is assumed to now hold every hashed block.
	capacity := e.cfg.LRUCapacityPerServer
	if n := pods[best].Metrics.NumBlocks; n > 0 {
		capacity = n
	}
	e.idx.add(hashes, pods[best].Name, capacity)
	return best
}

// prefixIndex is the approximate prefix index: per pod an LRU of block
// hashes of bounded capacity, and for each hash the pods holding it.
type prefixIndex struct {
	pods   map[string]*podLRU
	holder map[uint64]map[string]struct{}
}

type podLRU struct {
	cap   int
	order *list.List // front = most recent; values are uint64 hashes
	at    map[uint64]*list.Element
}

func newPrefixIndex() *prefixIndex {
	return &prefixIndex{pods: map[string]*podLRU{}, holder: map[uint64]map[string]struct{}{}}
}

func (x *prefixIndex) get(h uint64) map[string]struct{} { return x.holder[h] }

func (x *prefixIndex) add(hashes []uint64, pod string, capacity int) {
	l := x.pods[pod]
	if l == nil {
		// The capacity is fixed when the pod's LRU is created, as upstream.
		l = &podLRU{cap: max(capacity, 1), order: list.New(), at: map[uint64]*list.Element{}}
		x.pods[pod] = l
	}
	for _, h := range hashes {
		if el, ok := l.at[h]; ok {
			l.order.MoveToFront(el)
		} else {
			l.at[h] = l.order.PushFront(h)
			if l.order.Len() > l.cap {
				old := l.order.Back()
				l.order.Remove(old)
				oh := old.Value.(uint64)
				delete(l.at, oh)
				if s := x.holder[oh]; s != nil {
					delete(s, pod)
					if len(s) == 0 {
						delete(x.holder, oh)
					}
				}
			}
		}
		s := x.holder[h]
		if s == nil {
			s = map[string]struct{}{}
			x.holder[h] = s
		}
		s[pod] = struct{}{}
	}
}
