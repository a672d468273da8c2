package picker

// Precise prefix routing: the engines' KV-cache events (tier1/kvevents)
// tell which blocks each pod really holds, keyed by the request's exact
// token ids. Where a request carries those hashes and a pod's events are
// fresh, the prefix evidence for that pod is the exact index's; for every
// other pod it stays the approximate index's (what the router sent where).
// Both the prefix scorers and predicted-latency's uncached tokens read the
// same per-pod evidence (cycleState.cachedFractions), so with KV events off
// or a request without exact tokens nothing changes.

// ScorerPrecisePrefix is the prefix scorer under the name that states
// exact evidence (llm-d's precise-prefix-cache-scorer): it scores exactly
// as ScorerPrefix does, which already uses the exact index where it can.
// A configuration lists one or the other; Tier 1 refuses precise-prefix
// without kv_events.enabled, where it would be the approximate scorer under
// a name that says otherwise.
const ScorerPrecisePrefix = "precise-prefix"

// ExactIndex is an exact per-pod index of the KV blocks pods hold, fed by
// their KV-cache events (tier1/kvevents.Index behind an adapter).
type ExactIndex interface {
	// Match writes into dst (resized to len(pods)) how many leading
	// hashes each pod holds; hashes are Request.ExactHashes, computed
	// with blockSize tokens per block.
	Match(hashes []uint64, blockSize int, pods []string, dst []int) []int
	// Fresh reports whether pod's entries follow its cache event by
	// event. Other pods (no events, events stopped, history lost) are
	// judged by the approximate index.
	Fresh(pod string) bool
}

// PrefixSource is where a pod's prefix evidence came from.
type PrefixSource uint8

// Prefix sources.
const (
	// PrefixApproximate: the router's own index of where it sent each
	// prefix (tier1/prefix).
	PrefixApproximate PrefixSource = iota
	// PrefixExact: the pod's KV-cache events, matched on the request's
	// exact token ids.
	PrefixExact

	numPrefixSources
)

func (s PrefixSource) String() string {
	if s == PrefixExact {
		return "exact"
	}
	return "approximate"
}

// PrefixSources lists every source, for metrics.
var PrefixSources = []PrefixSource{PrefixExact, PrefixApproximate}

// precisePrefixSpec is ScorerPrecisePrefix's: ScorerPrefix's parameters
// and scorer (TestPrecisePrefixSpec keeps the defaults equal).
var precisePrefixSpec = scorerSpec{
	params: map[string]float64{
		ParamGuardAbs:          8,
		ParamGuardRatio:        1.5,
		ParamGuardDiscount:     0,
		ParamShortPromptBlocks: 16,
	},
	build: func(bc buildContext) scorer {
		return precisePrefixScorer{&prefixScorer{
			tracker:    bc.tracker,
			guardAbs:   bc.params[ParamGuardAbs],
			guardRatio: bc.params[ParamGuardRatio],
			discount:   bc.params[ParamGuardDiscount],
			short:      bc.params[ParamShortPromptBlocks],
		}}
	},
}

// precisePrefixScorer is prefixScorer under its own name.
type precisePrefixScorer struct{ *prefixScorer }

func (precisePrefixScorer) Name() string { return ScorerPrecisePrefix }

// exactScratch is cachedFractions' memory, kept with a pooled cycle across
// cycles (cycleState.reset keeps it).
type exactScratch struct {
	frac  []float64
	names []string
	match []int
}

// exactFraction is the share of r's prompt that matched leading exact
// blocks cover (cachedFraction's counterpart for ExactHashes).
func (r *Request) exactFraction(matched int) float64 {
	n := max(len(r.ExactHashes), r.ExactPromptBlocks)
	if n == 0 {
		return 0
	}
	return min(1, float64(matched)/float64(n))
}

// exactIndex is the tracker's exact index, nil when there is none.
func (t *Tracker) exactIndex() ExactIndex {
	if t == nil {
		return nil
	}
	return t.opts.Exact
}

// cachedFractions returns, per candidate, the share of req's prompt the
// pod is believed to hold in its prefix cache: from the exact index where
// req carries ExactHashes and the pod's events are fresh, else from the
// approximate index (0 where req has no hashes). Computed once per cycle
// for every scorer that needs it.
func (cs *cycleState) cachedFractions(t *Tracker, req *Request, pods []*Pod) []float64 {
	if cs.fracValid && len(cs.frac) == len(pods) {
		return cs.frac
	}
	if cs.ex == nil {
		cs.ex = &exactScratch{}
	}
	ex := cs.ex
	frac := grow(ex.frac, len(pods))
	clear(frac)
	if t != nil && len(req.BlockHashes) > 0 {
		matched := cs.prefixMatch(t, req, pods)
		for i := range pods {
			frac[i] = req.cachedFraction(matched[i])
		}
	}
	if x := t.exactIndex(); x != nil && len(req.ExactHashes) > 0 {
		names := ex.names[:0]
		for _, p := range pods {
			names = append(names, p.Name)
		}
		ex.match = x.Match(req.ExactHashes, req.ExactBlockSize, names, ex.match)
		for i, p := range pods {
			if x.Fresh(p.Name) {
				frac[i] = req.exactFraction(ex.match[i])
			}
		}
		clear(names) // drop string references
		ex.names = names[:0]
	}
	ex.frac = frac
	cs.frac, cs.fracValid = frac, true
	return frac
}

// dispatchFraction is the share of req's prompt pod is believed to hold
// when req is dispatched to it (approx: the approximate index's match),
// by the same rule as cachedFractions; it counts the source used.
func (t *Tracker) dispatchFraction(pod string, req *Request, approx int) float64 {
	if x := t.opts.Exact; x != nil && len(req.ExactHashes) > 0 && x.Fresh(pod) {
		t.prefixSources[PrefixExact].Add(1)
		var names [1]string
		var got [1]int
		names[0] = pod
		return req.exactFraction(x.Match(req.ExactHashes, req.ExactBlockSize, names[:], got[:0])[0])
	}
	t.prefixSources[PrefixApproximate].Add(1)
	return req.cachedFraction(approx)
}

// PrefixSourceCount is how many requests with prefix hashes were
// dispatched with their pod's prefix evidence from src (retries count
// again). For metrics.
func (t *Tracker) PrefixSourceCount(src PrefixSource) uint64 {
	if src >= numPrefixSources {
		return 0
	}
	return t.prefixSources[src].Load()
}
