package picker

import (
	"math"
	"sort"
	"strings"
)

// Scorer parameter names.
const (
	// prefix
	ParamGuardAbs          = "guard_abs"           // load gap over the minimum that arms the guard
	ParamGuardRatio        = "guard_ratio"         // and load ratio over the minimum
	ParamGuardDiscount     = "guard_discount"      // prefix score multiplier when armed (1 = no guard)
	ParamShortPromptBlocks = "short_prompt_blocks" // prompts shorter than this score proportionally less (0 = off)
	// predicted-latency
	ParamDefaultPrefill  = "default_prefill_tokens_per_sec" // speed assumed when no candidate's is known
	ParamOverheadMs      = "overhead_ms"                    // fixed per-request TTFT floor
	ParamSLOMissScore    = "slo_miss_score"                 // score multiplier (0..1) of pods predicted to miss Request.TTFTSLO
	ParamQueuedPromptTok = "queued_prompt_tokens"           // tokens assumed per queued request the router did not send (0 = this request's)
	ParamKVFull          = "kv_full"                        // KV-cache usage at which a pod is memory-bound (0 = off)
	ParamKVFullWaitMs    = "kv_full_wait_ms"                // added to a memory-bound pod's predicted TTFT
)

type scorerSpec struct {
	params map[string]float64 // known parameters and their defaults
	build  func(buildContext) scorer
}

func (s scorerSpec) withDefaults(p map[string]float64) map[string]float64 {
	m := make(map[string]float64, len(s.params))
	for k, v := range s.params {
		m[k] = v
	}
	for k, v := range p {
		m[k] = v
	}
	return m
}

// defaultPrefillSpeed is the prefill speed in tokens/s assumed when no pod
// has learned its own.
const defaultPrefillSpeed = 8000

var scorerSpecs = map[string]scorerSpec{
	ScorerQueue:        {build: func(buildContext) scorer { return queueScorer{} }},
	ScorerKVCache:      {build: func(buildContext) scorer { return kvScorer{} }},
	ScorerRunning:      {build: func(buildContext) scorer { return runningScorer{} }},
	ScorerLoRAAffinity: {build: func(buildContext) scorer { return loraScorer{} }},
	ScorerPrefix: {
		params: map[string]float64{
			ParamGuardAbs:          8,
			ParamGuardRatio:        1.5,
			ParamGuardDiscount:     0,
			ParamShortPromptBlocks: 16,
		},
		build: func(bc buildContext) scorer {
			return &prefixScorer{
				tracker:    bc.tracker,
				guardAbs:   bc.params[ParamGuardAbs],
				guardRatio: bc.params[ParamGuardRatio],
				discount:   bc.params[ParamGuardDiscount],
				short:      bc.params[ParamShortPromptBlocks],
			}
		},
	},
	ScorerPredictedLatency: {
		params: map[string]float64{
			ParamDefaultPrefill:  defaultPrefillSpeed,
			ParamOverheadMs:      5,
			ParamSLOMissScore:    0,
			ParamQueuedPromptTok: 0,
			ParamKVFull:          0.95,
			ParamKVFullWaitMs:    1000,
		},
		build: func(bc buildContext) scorer {
			return &latencyScorer{
				tracker:        bc.tracker,
				defaultPrefill: bc.params[ParamDefaultPrefill],
				overhead:       bc.params[ParamOverheadMs] / 1000,
				missScore:      bc.params[ParamSLOMissScore],
				queuedTokens:   bc.params[ParamQueuedPromptTok],
				speedPool:      bc.cfg.SpeedPooling,
				kvFull:         bc.params[ParamKVFull],
				kvFullWait:     bc.params[ParamKVFullWaitMs] / 1000,
			}
		},
	},
	ScorerSessionBalance: sessionBalanceSpec,
	ScorerPrecisePrefix:  precisePrefixSpec,
}

func knownScorers() string {
	names := make([]string, 0, len(scorerSpecs))
	for n := range scorerSpecs {
		names = append(names, n)
	}
	sort.Strings(names)
	return strings.Join(names, ", ")
}

// minMax writes GIE's normalisation of x into out: (max − x)/(max − min),
// so the least loaded pod scores 1 and the most loaded 0; 1 for all when
// they are equal.
func minMax(out []float64, pods []*Pod, x func(*Pod) float64) {
	lo, hi := math.Inf(1), math.Inf(-1)
	for i, p := range pods {
		v := x(p)
		out[i] = v
		// Plain comparisons: the built-in min and max also order NaNs
		// and signed zeros, which costs a tenth of a cycle at 100 pods.
		if v < lo {
			lo = v
		}
		if v > hi {
			hi = v
		}
	}
	if hi <= lo {
		for i := range out {
			out[i] = 1
		}
		return
	}
	for i, v := range out {
		out[i] = (hi - v) / (hi - lo)
	}
}

// queueScorer prefers short effective queues (QueueDepth: scraped Waiting,
// or router in-flight beyond scraped Running when larger).
type queueScorer struct{}

func (queueScorer) Name() string { return ScorerQueue }

func (queueScorer) Consumes() MetricSet { return queueDepthMetrics }

func (queueScorer) Score(_ *cycleState, _ *Request, pods []*Pod, out []float64) {
	minMax(out, pods, func(p *Pod) float64 { return float64(QueueDepth(p)) })
}

// runningScorer prefers small running batches (GIE's running-requests).
type runningScorer struct{}

func (runningScorer) Name() string { return ScorerRunning }

func (runningScorer) Consumes() MetricSet { return MetricRunning }

func (runningScorer) Score(_ *cycleState, _ *Request, pods []*Pod, out []float64) {
	minMax(out, pods, func(p *Pod) float64 { return float64(p.Metrics.Running) })
}

// kvScorer prefers free KV cache: 1 − usage. Pods whose engine does not
// export usage get the mean of the others (neutral) rather than a
// flattering 1; the scraper lists the metric in Metrics.Missing.
type kvScorer struct{}

func (kvScorer) Name() string { return ScorerKVCache }

func (kvScorer) Consumes() MetricSet { return MetricKVUsage }

func (kvScorer) Score(_ *cycleState, _ *Request, pods []*Pod, out []float64) {
	var sum float64
	var n int
	for i, p := range pods {
		if p.Metrics.HasKV {
			out[i] = clamp01(1 - p.Metrics.KVUsage)
			sum += out[i]
			n++
		}
	}
	neutral := 0.5
	if n > 0 {
		neutral = sum / float64(n)
	}
	for i, p := range pods {
		if !p.Metrics.HasKV {
			out[i] = neutral
		}
	}
}

// loraScorer ranks adapter locality: loaded 1 > loading 0.8 > free slot
// 0.6 > unknown 0.5 > swap needed 0. When no candidate has the adapter
// loaded or loading, it instead prefers capacity: half for a free slot,
// half for low load (min-max of Load), as "the pod with the most
// available capacity". Requests without an adapter score 1 everywhere.
type loraScorer struct{}

func (loraScorer) Name() string { return ScorerLoRAAffinity }

func (loraScorer) Consumes() MetricSet { return MetricLoRA | loadMetrics }

func (loraScorer) Score(_ *cycleState, req *Request, pods []*Pod, out []float64) {
	if req.Adapter == "" {
		for i := range out {
			out[i] = 1
		}
		return
	}
	local := false
	for i, p := range pods {
		st := loraStateOf(p, req.Adapter)
		out[i] = float64(st)
		local = local || st >= loraWaiting
	}
	if local {
		for i, v := range out {
			switch loraState(v) {
			case loraActive:
				out[i] = 1
			case loraWaiting:
				out[i] = 0.8
			case loraFreeSlot:
				out[i] = 0.6
			case loraUnknown:
				out[i] = 0.5
			default:
				out[i] = 0
			}
		}
		return
	}
	// No pod has it: most available capacity. minMax needs its own
	// buffer, so fold the slot state in afterwards from a second pass.
	slot := func(p *Pod) float64 {
		switch loraStateOf(p, req.Adapter) {
		case loraFreeSlot:
			return 1
		case loraUnknown:
			return 0.5
		}
		return 0
	}
	minMax(out, pods, func(p *Pod) float64 { return float64(Load(p)) })
	for i, p := range pods {
		out[i] = 0.5*slot(p) + 0.5*out[i]
	}
}

// prefixScorer scores the fraction of the request's prefix blocks each pod
// is believed to hold (the Tracker's index). Two corrections:
//   - short prompts: a 2-block prompt matching fully saves little prefill,
//     so the ratio is scaled by min(1, blocks/short_prompt_blocks);
//   - hot-prefix guard (after SGLang's gateway): on a pod whose Load
//     exceeds the candidates' minimum by more than guard_abs and by more
//     than guard_ratio×, the score is multiplied by guard_discount, so one
//     popular prefix cannot pile all traffic onto one pod.
type prefixScorer struct {
	tracker    *Tracker
	guardAbs   float64
	guardRatio float64
	discount   float64
	short      float64
}

func (*prefixScorer) Name() string { return ScorerPrefix }

// Consumes: the guard compares Load; the match itself is the router's index.
func (*prefixScorer) Consumes() MetricSet { return loadMetrics }

func (s *prefixScorer) Score(cs *cycleState, req *Request, pods []*Pod, out []float64) {
	n := len(req.BlockHashes)
	if n == 0 || s.tracker == nil {
		return // all 0: no signal
	}
	frac := cs.cachedFractions(s.tracker, req, pods)
	conf := 1.0
	if s.short > 0 {
		conf = math.Min(1, float64(n)/s.short)
	}
	minLoad := math.Inf(1)
	for _, p := range pods {
		minLoad = min(minLoad, float64(Load(p)))
	}
	for i, p := range pods {
		v := conf * frac[i]
		if l := float64(Load(p)); v > 0 && l-minLoad > s.guardAbs && l > s.guardRatio*minLoad {
			v *= s.discount
		}
		out[i] = v
	}
}

// prefixMatch returns the candidates' matched block counts, computing them
// once per cycle for every scorer that needs them.
func (cs *cycleState) prefixMatch(t *Tracker, req *Request, pods []*Pod) []int {
	if cs.prefixValid && len(cs.prefixLen) == len(pods) {
		return cs.prefixLen
	}
	var buf []int
	if cs.cyc != nil {
		buf = cs.cyc.match
	}
	buf = cs.match(t, req.BlockHashes, pods, buf)
	if cs.cyc != nil {
		cs.cyc.match = buf
	}
	cs.prefixLen, cs.prefixValid = buf, true
	return buf
}

// match runs the index's Match of hashes over pods into buf, with the
// cycle's buffer of pod names when there is a cycle.
func (cs *cycleState) match(t *Tracker, hashes []uint64, pods []*Pod, buf []int) []int {
	var names []string
	if cs.cyc != nil {
		names = cs.cyc.names[:0]
	}
	for _, p := range pods {
		names = append(names, p.Name)
	}
	buf = t.idx.Match(hashes, names, buf)
	if cs.cyc != nil {
		clear(names) // drop string references
		cs.cyc.names = names[:0]
	}
	return buf
}

// latencyScorer predicts TTFT on each pod:
//
//	(queued prefill tokens + uncached prompt tokens) / prefill speed + overhead
//
// where queued tokens are the router's in-flight uncached prompt tokens
// plus, for requests the pod reports waiting beyond those, an assumed size
// each, and the speed is the pod's learned PrefillTokensPerSec (else
// speedPrior's guess from the learned speeds, the pods' GPU peaks and
// default_prefill_tokens_per_sec). The score is
// best/predicted, so the fastest pod scores 1 and one twice as slow 0.5.
// With Request.TTFTSLO set, pods predicted to miss it have their score
// multiplied by slo_miss_score (0..1, default 0), unless every pod misses.
//
// A pod whose scraped KV-cache usage is at least kv_full (default 0.95) is
// memory-bound, and kv_full_wait_ms (default 1 s) is added to its
// estimate. vLLM admits a request only when its blocks are free and, when
// running requests need blocks, preempts the newest: on a full cache a new
// request waits for running ones to finish, which prefill arithmetic does
// not see. Without this a conversation's turn follows its cached history
// onto a full pod and waits there 3-12 s (docs/benchmarks.md, "Memory-bound
// pods").
type latencyScorer struct {
	tracker        *Tracker
	defaultPrefill float64
	overhead       float64 // seconds
	missScore      float64
	queuedTokens   float64
	speedPool      float64 // ProfileConfig.SpeedPooling
	kvFull         float64 // KV usage from which a pod is memory-bound; 0 = off
	kvFullWait     float64 // seconds added to a memory-bound pod's estimate
}

func (*latencyScorer) Name() string { return ScorerPredictedLatency }

// Consumes: waiting requests the router did not send, and KV usage for
// kv_full; queued tokens and speeds are the router's own.
func (*latencyScorer) Consumes() MetricSet { return MetricWaiting | MetricKVUsage }

func (s *latencyScorer) Score(cs *cycleState, req *Request, pods []*Pod, out []float64) {
	var frac []float64
	if n := len(req.BlockHashes); n > 0 && s.tracker != nil {
		frac = cs.cachedFractions(s.tracker, req, pods)
	}
	prior := newSpeedPrior(pods, s.defaultPrefill, s.speedPool)
	perQueued := s.queuedTokens
	if perQueued <= 0 {
		perQueued = float64(max(req.PromptTokens, 1))
	}
	best := math.Inf(1)
	for i, p := range pods {
		speed := prior.of(p)
		uncached := uncachedTokens(req, frac, i)
		unseen := max(p.Metrics.Waiting-p.InFlightPrefill, 0)
		queued := float64(p.InFlightUncachedTokens) + float64(unseen)*perQueued
		est := s.overhead + (queued+uncached)/speed
		if s.kvFull > 0 && p.Metrics.HasKV && p.Metrics.KVUsage >= s.kvFull {
			est += s.kvFullWait
		}
		out[i] = est
		best = min(best, est)
	}
	slo := req.TTFTSLO.Seconds()
	anyMeets := slo > 0 && best <= slo
	// A pod predicted to miss scores slo_miss_score × best/est. As est >
	// slo ≥ est' of any pod that meets it, best/est < best/est', and the
	// multiplier is at most 1: every pod that meets the SLO outranks every
	// pod that misses it, whatever the weight, and misses keep their order
	// among themselves (unless the multiplier is 0).
	miss := clamp01(s.missScore)
	for i, est := range out {
		switch {
		case est <= 0:
			out[i] = 1
		case anyMeets && est > slo:
			out[i] = miss * best / est
		default:
			out[i] = best / est
		}
	}
}

// uncachedTokens is req's prompt estimate less the part of it pod i holds
// as frac says (cycleState.cachedFractions; nil: none).
func uncachedTokens(req *Request, frac []float64, i int) float64 {
	prompt := float64(max(req.PromptTokens, 0))
	if frac == nil {
		return prompt
	}
	return prompt - prompt*frac[i]
}
