// Package picker is infergate's endpoint-picking core, shaped like the
// Gateway API Inference Extension's scheduling framework: Filters narrow the
// candidate pods, weighted Scorers rate each survivor in [0,1], a Picker
// chooses. Scheduling is a pure function of (request, snapshot of pod state)
// so the same code runs in the Tier 1 proxy, the ext_proc server and the
// routing benchmark.
//
// API CONTRACT (used by tier1/gateway, bench and tests; keep these names and
// signatures stable, add freely):
//
//	type Request, Pod, Metrics (below)
//	type Filter, Scorer, Picker interfaces (below)
//	type ProfileConfig (YAML: filters, scorers with weights, picker)
//	DefaultProfile() ProfileConfig          // infergate's default
//	GIEDefaultProfile() ProfileConfig       // queue 2, kv 2, prefix 3
//	NewScheduler(cfg ProfileConfig, opts Options) (*Scheduler, error)
//	(*Scheduler).Schedule(req *Request, pods []*Pod) (Result, error)
//	ErrNoCandidates, ErrSaturated            // sentinel errors
//	NewTracker(opts TrackerOptions) *Tracker // router-side state
//	(*Tracker).Dispatched(pod string, req *Request)        // at dispatch
//	(*Tracker).FirstToken(pod string, req *Request, ttft time.Duration)
//	(*Tracker).Done(pod string, req *Request)              // at completion/failure
//	(*Tracker).Apply(pods []*Pod)           // fills InFlight*, PrefillTokensPerSec
//	prefix index (tier1/prefix) recorded by the Scheduler after a pick
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
	Priority     int           // higher is more important; < 0 is sheddable
	Sheddable    bool          // may be rejected with 429 under saturation
	TTFTSLO      time.Duration // optional per-request TTFT objective, 0 = none
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
	Labels     map[string]string
	Ready      bool
	MetricsAge time.Duration // time since the last successful scrape
	Metrics    Metrics

	// Router-side state, filled by Tracker.Apply.
	InFlight             int     // requests dispatched and not yet finished
	InFlightPromptTokens int     // prompt tokens of requests not yet past first token
	PrefillTokensPerSec  float64 // learned online from TTFTs; 0 = unknown
}

// CycleState is per-request scratch space shared by the plugins of one
// scheduling cycle (GIE's CycleState). Plugins store values under their own
// keys.
type CycleState struct {
	values map[string]any
}

// Read returns the value stored under key.
func (c *CycleState) Read(key string) (any, bool) {
	v, ok := c.values[key]
	return v, ok
}

// Write stores a value under key.
func (c *CycleState) Write(key string, v any) {
	if c.values == nil {
		c.values = make(map[string]any, 4)
	}
	c.values[key] = v
}

// Filter drops pods that cannot serve the request.
type Filter interface {
	Name() string
	Filter(cs *CycleState, req *Request, pods []*Pod) []*Pod
}

// Scorer rates each pod in [0,1]; out has len(pods) and is written in place.
type Scorer interface {
	Name() string
	Score(cs *CycleState, req *Request, pods []*Pod, out []float64)
}

// Picker orders the scored pods best first.
type Picker interface {
	Name() string
	Pick(cs *CycleState, req *Request, pods []*Pod, total []float64) []*Pod
}
