// Package picker is infergate's endpoint-picking core, shaped like the
// Gateway API Inference Extension's scheduling framework: filters narrow
// the candidate pods, weighted scorers rate each survivor in [0,1], a
// picker ranks them. The plugins are built in; a ProfileConfig names them
// and sets their weights (docs/tier1-scheduling.md), and each plugin
// declares the scraped pod metrics it reads (Scheduler.Consumes).
// Scheduling is a function of (request, snapshot of pod state, router-side
// Tracker state), so the same code runs in the Tier 1 proxy and in the
// routing benchmark's virtual time. What the caller does with the answer
// (dispatch, wait, shed) is tier1/admission's.
//
// Per request the caller builds pod snapshots, calls Tracker.Apply, then
// Scheduler.Schedule (or ScheduleInto, reusing a Result); it dispatches to
// Result.Ranked[0] (Ranked[1:] on retry) and reports Dispatched, FirstToken
// and Done to the Tracker. Schedule does not modify the caller's pods
// (TestScheduleLeavesPodsAlone). Schedule, ScheduleInto, Update and the
// Tracker's methods are safe for concurrent use (TestConcurrent, under
// -race); Update swaps the profile atomically, and cycles already running
// finish on the old one.
package picker

import "time"

// Request is what the scheduler knows about one inference request.
type Request struct {
	ID           string
	Model        string        // as the client named it (may be an adapter)
	BaseModel    string        // resolved base model
	Adapter      string        // LoRA adapter name, "" for the base model
	PromptTokens int           // estimated prompt tokens
	MaxTokens    int           // requested completion tokens, 0 if unknown
	BlockHashes  []uint64      // chained prefix block hashes (tier1/prefix)
	PromptBlocks int           // blocks the whole prompt spans when only the first len(BlockHashes) were hashed; 0: all were
	Priority     int           // higher is more important; < 0 is sheddable
	Sheddable    bool          // may be rejected with 429 under saturation
	TTFTSLO      time.Duration // optional per-request TTFT objective, 0 = none
	Pool         string        // if set, only pods of this pool qualify
	// Session is the client's conversation key (x-session-id header, else
	// prompt_cache_key, else user), "" for none. Untrusted: it only feeds
	// the session-balance score.
	Session string
	// ExactHashes are the prompt's exact token ids hashed in blocks of
	// ExactBlockSize tokens under Adapter (kvevents.HashTokens), the keys
	// of the exact index the engines' KV-cache events feed
	// (TrackerOptions.Exact); ExactPromptBlocks is the blocks the whole
	// prompt spans when only the first len(ExactHashes) were hashed (0:
	// all were). Nil when the exact tokens are unknown: the prefix
	// evidence is then the approximate index's alone.
	ExactHashes       []uint64
	ExactBlockSize    int
	ExactPromptBlocks int
}

// Metrics is the state scraped from one pod's /metrics.
type Metrics struct {
	Waiting         int     // requests queued on the server
	Running         int     // requests in the running batch
	KVUsage         float64 // KV-cache utilization in [0,1]
	HasKV           bool    // false when the engine does not export KV usage
	ActiveAdapters  []string
	WaitingAdapters []string
	MaxLoras        int  // adapter slots, 0 if unknown
	HasLoRA         bool // LoRA state was exported
	BlockSize       int  // KV block size in tokens, 0 if unknown
	NumBlocks       int  // KV blocks on the GPU, 0 if unknown
	// Missing lists metric names an enabled scorer needs but the pod's engine
	// did not export.
	Missing []string
}

// Pod is a snapshot of one model-server pod as the scheduler sees it.
type Pod struct {
	Name       string
	Address    string // host:port
	Pool       string
	BaseModel  string
	Engine     string // vllm, vllm-legacy, sglang, tgi
	GPU        string // h100, a10g, ...
	GPUs       int    // GPUs per pod (tensor × pipeline parallel); 0 = unknown
	Labels     map[string]string
	Ready      bool
	MetricsAge time.Duration // time since the last successful scrape
	Metrics    Metrics

	// Router-side state, filled by Tracker.Apply.
	InFlight             int     // requests dispatched and not yet finished
	InFlightPromptTokens int     // prompt tokens of requests not yet past first token
	PrefillTokensPerSec  float64 // learned online from TTFTs; 0 = unknown
	// InFlightPrefill counts requests not yet past first token, and
	// InFlightUncachedTokens their prompt tokens not expected to hit the
	// pod's prefix cache: the prefill work queued ahead of a new request.
	InFlightPrefill        int
	InFlightUncachedTokens int
}

// cycleState is per-request scratch shared by the plugins of one
// scheduling cycle (GIE's CycleState), typed so a cycle does not allocate.
type cycleState struct {
	cyc         *cycle
	seed        uint64 // per-cycle random source for tie-breaks
	maxRanked   int    // ranker output cap, <0 = all
	out         []*Pod // ranker output buffer (Result.Ranked)
	prefixValid bool   // prefixLen holds Match results for the candidates
	prefixLen   []int
	total       []float64 // the weighted sum of the scorers run so far (Result.Total)
	fracValid   bool      // frac holds cachedFractions for the candidates
	frac        []float64
	ex          *exactScratch // cachedFractions' buffers, kept across cycles
}

func (c *cycleState) reset() { *c = cycleState{ex: c.ex} }

// The plugin interfaces are unexported: profiles are built from the
// plugins named in ProfileConfig only, and there is no registry to add
// others to. Out-of-tree plugins would need a public registry first.

// filter drops pods that cannot serve the request.
type filter interface {
	Name() string
	consumer
	Filter(cs *cycleState, req *Request, pods []*Pod) []*Pod
}

// scorer rates each pod in [0,1]; out has len(pods) and is written in place.
type scorer interface {
	Name() string
	consumer
	Score(cs *cycleState, req *Request, pods []*Pod, out []float64)
}

// afterOthers marks a scorer that reads the weighted sum of the other
// scorers (cycleState.total); the profile runs it after them.
type afterOthers interface {
	afterOthers()
}

// ranker orders the scored pods best first.
type ranker interface {
	Name() string
	Pick(cs *cycleState, req *Request, pods []*Pod, total []float64) []*Pod
}

// cachedFraction is the share of r's prompt that matched leading blocks
// cover. Tier 1 hashes at most prefix.DefaultPromptBlocks blocks, so for a
// longer prompt (PromptBlocks set) holding the whole hashed window is
// holding only that part of the prompt: the rest is unknown and counted as
// uncached, or a pod that cached the first 8k tokens of a 30k-token prompt
// would look as if it held all of it.
func (r *Request) cachedFraction(matched int) float64 {
	n := max(len(r.BlockHashes), r.PromptBlocks)
	if n == 0 {
		return 0
	}
	return min(1, float64(matched)/float64(n))
}
