package picker

import "math"

// Scorer names of the cost-model and session plugins.
const (
	ScorerCacheAwareTTFT  = "cache-aware-ttft"
	ScorerSessionAffinity = "session-affinity"
	ScorerSessionBalance  = "session-balance"
)

// cache-aware-ttft parameter names.
const (
	ParamDecodeChunkTokens = "chunk_tokens"            // per-step token budget shared by decodes and prefill chunks (0 = no decode interference)
	ParamHotQueueMs        = "hot_queue_ms"            // a holder whose predicted prefill wait reaches this is hot
	ParamMaxReplicas       = "max_replicas_per_prefix" // pods a hot prefix may occupy (0 = no bound, no deliberate replica)
	ParamSpillScore        = "spill_score"             // score multiplier of a non-holder once a hot prefix has max_replicas holders
	ParamMinPrefixBlocks   = "min_prefix_blocks"       // a shorter longest match is not treated as a prefix worth replicating
	ParamDecodeWeight      = "decode_token_weight"     // cost per active KV-cache token, in prefill tokens (Dynamo's decode blocks)
)

var cacheAwareSpec = scorerSpec{
	params: map[string]float64{
		ParamDefaultPrefill:    8000,
		ParamOverheadMs:        5,
		ParamQueuedPromptTok:   0,
		ParamDecodeChunkTokens: 2048,
		ParamHotQueueMs:        0,
		ParamMaxReplicas:       3,
		ParamSpillScore:        0.5,
		ParamMinPrefixBlocks:   4,
		ParamDecodeWeight:      0.1,
	},
	build: func(bc buildContext) scorer {
		return &cacheAwareScorer{
			tracker:        bc.tracker,
			defaultPrefill: bc.params[ParamDefaultPrefill],
			overheadMs:     bc.params[ParamOverheadMs],
			queuedTokens:   bc.params[ParamQueuedPromptTok],
			chunk:          bc.params[ParamDecodeChunkTokens],
			hotMs:          bc.params[ParamHotQueueMs],
			maxReplicas:    int(bc.params[ParamMaxReplicas]),
			spill:          clamp01(bc.params[ParamSpillScore]),
			minBlocks:      int(bc.params[ParamMinPrefixBlocks]),
			decodeWeight:   bc.params[ParamDecodeWeight],
			speedPool:      bc.cfg.SpeedPooling,
		}
	},
}

// cacheAwareScorer estimates each candidate's time to first token in ms as
// a cost in tokens over the pod's prefill speed, the way NVIDIA Dynamo's KV
// router costs a worker (prefill blocks left after the cached overlap plus
// the blocks already active there) rather than as a weighted sum of
// separately normalised signals:
//
//		ttft = overhead + (queued + uncached) / (speed × (1 − decode/chunk))
//
//	  - uncached: the prompt tokens after the pod's cached overlap (the
//	    prefix index match the prefix scorer computes, shared through the
//	    cycle state);
//	  - queued: prefill already waiting there: the router's in-flight
//	    uncached tokens plus, for scraped waiting requests it did not send,
//	    an assumed size each (queued_prompt_tokens, 0 = this prompt's);
//	  - speed: the pod's learned PrefillTokensPerSec (the Tracker's fit of
//	    TTFT samples), else a prior (speedPrior: learned speeds scaled by
//	    GPU peak, else their mean, else the default);
//	  - decode interference: under chunked prefill a step carries one token
//	    per running sequence plus a prefill chunk within chunk_tokens, so a
//	    running batch of d leaves (1 − d/chunk) of each step to prefill.
//
// The score is best/ttft: order-preserving, the fastest pod 1.
//
// Active decode load (Dynamo's decode blocks): decode_token_weight × the
// pod's KV-cache tokens in use (KVUsage × NumBlocks × BlockSize), added to
// the tokens to process, so a pod whose memory is full of running
// sequences (slower steps, preemption risk) costs more.
//
// Hot prefixes (after Preble and Mooncake's conductor), on the holders of
// the prompt's longest cached prefix (at least min_prefix_blocks):
//   - bound: once max_replicas_per_prefix candidates hold it, non-holders'
//     scores are multiplied by spill_score, so followers spread over the
//     holders instead of going cold on yet another pod;
//   - deliberate replica (hot_queue_ms > 0; off by default, see
//     docs/tier1-scheduling.md): when every holder's predicted prefill
//     wait is at least hot_queue_ms and fewer than max_replicas_per_prefix
//     pods hold it, the best non-holder (least predicted TTFT, first in
//     candidate order on a tie) is costed as the best holder: it is warmed
//     once, and the index makes it a holder for the followers.
//
// All of it is a function of the snapshot and the index.
type cacheAwareScorer struct {
	tracker        *Tracker
	defaultPrefill float64
	overheadMs     float64
	queuedTokens   float64
	chunk          float64
	hotMs          float64
	maxReplicas    int
	spill          float64
	minBlocks      int
	decodeWeight   float64
	speedPool      float64 // ProfileConfig.SpeedPooling
}

func (*cacheAwareScorer) Name() string { return ScorerCacheAwareTTFT }

// ttftMs is the model above for one pod; waitMs is its queued part alone.
func (s *cacheAwareScorer) ttftMs(p *Pod, uncached, perQueued float64, prior *speedPrior) (ttft, waitMs float64) {
	speed := prior.of(p)
	if s.chunk > 0 {
		decode := float64(max(p.Metrics.Running, p.InFlight-p.InFlightPrefill, 0))
		speed *= math.Max(0.05, 1-decode/s.chunk)
	}
	waitMs = 1000 * queuedPrefillTokens(p, perQueued) / speed
	var active float64
	if m := &p.Metrics; s.decodeWeight > 0 && m.HasKV && m.NumBlocks > 0 && m.BlockSize > 0 {
		active = s.decodeWeight * clamp01(m.KVUsage) * float64(m.NumBlocks) * float64(m.BlockSize)
	}
	return s.overheadMs + waitMs + 1000*(uncached+active)/speed, waitMs
}

func (s *cacheAwareScorer) Score(cs *cycleState, req *Request, pods []*Pod, out []float64) {
	n := len(req.BlockHashes)
	var matched []int
	if n > 0 && s.tracker != nil {
		matched = cs.prefixMatch(s.tracker, req, pods)
	}
	def := s.defaultPrefill
	if def <= 0 {
		def = defaultPrefillSpeed
	}
	prior := newSpeedPrior(pods, def, s.speedPool)
	prompt := float64(max(req.PromptTokens, 0))
	perQueued := s.queuedTokens
	if perQueued <= 0 {
		perQueued = max(prompt, 1)
	}

	// Longest cached prefix among the candidates, and its holders.
	longest := 0
	for _, m := range matched {
		longest = max(longest, m)
	}
	hot := longest > 0 && longest >= s.minBlocks && s.maxReplicas > 0
	holders := 0
	bestHolder := math.Inf(1)
	for i, p := range pods {
		est, wait := s.ttftMs(p, uncachedTokens(req, matched, i), perQueued, &prior)
		out[i] = est
		if matched != nil && matched[i] == longest && longest > 0 {
			holders++
			bestHolder = min(bestHolder, est)
			if wait < s.hotMs {
				hot = false
			}
		}
	}
	// The bound holds whether or not the prefix is hot: with K holders, a
	// non-holder wins only when it is cheaper even after the discount.
	spill := s.maxReplicas > 0 && longest >= max(s.minBlocks, 1) && holders >= s.maxReplicas
	if hot && s.hotMs > 0 && holders < s.maxReplicas {
		// Warm one more pod: the best non-holder competes as a holder.
		r := -1
		for i := range pods {
			if matched[i] != longest && (r < 0 || out[i] < out[r]) {
				r = i
			}
		}
		if r >= 0 {
			out[r] = min(out[r], bestHolder)
		}
	}
	best := math.Inf(1)
	for _, est := range out {
		best = min(best, est)
	}
	for i, est := range out {
		v := 1.0
		if est > 0 && best > 0 {
			v = best / est
		}
		if spill && matched[i] != longest {
			v *= s.spill
		}
		out[i] = v
	}
}
