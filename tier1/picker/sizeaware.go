package picker

import "math"

// ScorerSizeAware is the size-aware placement scorer.
const ScorerSizeAware = "size-aware"

// size-aware parameter names.
const (
	ParamLongTokens   = "long_tokens"   // an uncached prompt this long (or a pod's queued prefill) counts as long
	ParamLongAffinity = "long_affinity" // 0..1: how much a long prompt prefers pods already prefilling long work
)

var sizeAwareSpec = scorerSpec{
	params: map[string]float64{
		ParamQueuedPromptTok: 0,
		ParamLongTokens:      4096,
		ParamLongAffinity:    0,
	},
	build: func(bc buildContext) scorer {
		return &sizeAwareScorer{
			tracker:      bc.tracker,
			queuedTokens: bc.params[ParamQueuedPromptTok],
			longTokens:   bc.params[ParamLongTokens],
			affinity:     clamp01(bc.params[ParamLongAffinity]),
		}
	},
}

// sizeAwareScorer keeps short prompts off pods that are prefilling long
// work. The engine serves prefill FCFS in chunked steps, so a prompt that
// lands behind q uncached tokens waits q/speed before its own u/speed;
// what that wait costs a request depends on its size. The score is the
// request's share of its own time to first token,
//
//	own / (wait + own) = u/speed_i / (q_i/speed_i + u/speed_i)
//
// not normalised across pods: a 300-token prompt behind an 8,000-token
// prefill scores 0.04 everywhere it would queue, while a 6,000-token
// prompt behind the same prefill scores 0.43, so the other scorers
// decide long prompts' placement and short ones are steered to pods with
// little prefill in flight. q_i is the router's in-flight uncached prompt
// tokens plus, for scraped waiting requests it did not send, an assumed
// size each (queued_prompt_tokens, 0 = this prompt's), as in
// predicted-latency.
//
// Soft partition (long_affinity > 0): a long prompt (uncached at least
// long_tokens) scores pods whose queued prefill is already at least
// long_tokens 1 and the others 1 − long_affinity, so long prompts stack on
// pods that are already slow and leave the others to short ones.
type sizeAwareScorer struct {
	tracker      *Tracker
	queuedTokens float64
	longTokens   float64
	affinity     float64
}

func (*sizeAwareScorer) Name() string { return ScorerSizeAware }

func (s *sizeAwareScorer) Score(cs *cycleState, req *Request, pods []*Pod, out []float64) {
	n := len(req.BlockHashes)
	var matched []int
	if n > 0 && s.tracker != nil {
		matched = cs.prefixMatch(s.tracker, req, pods)
	}
	prompt := float64(max(req.PromptTokens, 0))
	perQueued := s.queuedTokens
	if perQueued <= 0 {
		perQueued = max(prompt, 1)
	}
	long := s.affinity > 0 && s.longTokens > 0
	for i, p := range pods {
		uncached := max(uncachedTokens(req, matched, i), 1) // a fully cached prompt still takes a step
		queued := queuedPrefillTokens(p, perQueued)
		// Both terms run at the pod's one speed, so it cancels.
		if long && uncached >= s.longTokens {
			out[i] = 1 - s.affinity
			if queued >= s.longTokens {
				out[i] = 1
			}
			continue
		}
		out[i] = uncached / (queued + uncached)
		if math.IsNaN(out[i]) {
			out[i] = 1
		}
	}
}
