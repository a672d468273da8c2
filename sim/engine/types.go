package engine

import (
	"errors"
	"time"

	"github.com/infergate/infergate/sim/profile"
)

// Submit errors. They are distinct so a server can map them to status codes:
// ErrContextLength, ErrKVCapacity and ErrInvalidRequest to 400,
// ErrUnknownAdapter to 404.
var (
	// ErrContextLength: prompt plus max_tokens exceed the max model length.
	ErrContextLength = errors.New("engine: prompt and max_tokens exceed the maximum model length")
	// ErrKVCapacity: the request could never fit in the KV cache.
	ErrKVCapacity = errors.New("engine: request can never fit in the KV cache")
	// ErrUnknownAdapter: the LoRA adapter is not registered.
	ErrUnknownAdapter = errors.New("engine: unknown LoRA adapter")
	// ErrAdapterExists: LoadAdapter of an already registered adapter.
	ErrAdapterExists = errors.New("engine: LoRA adapter already loaded")
	// ErrInvalidRequest: malformed request (non-positive prompt, duplicate ID, nil).
	ErrInvalidRequest = errors.New("engine: invalid request")
	// ErrInvalidConfig wraps every New validation failure.
	ErrInvalidConfig = errors.New("engine: invalid config")
)

// Defaults, as vLLM's (see docs/simulator.md for the sources).
const (
	DefaultMaxNumSeqs = 256
	// DefaultMaxBatchedTokens is vLLM V1's max_num_batched_tokens for the
	// OpenAI server on GPUs with at least 70 GiB other than the A100; the
	// rest get DefaultMaxBatchedTokensSmallGPU.
	DefaultMaxBatchedTokens         = 8192
	DefaultMaxBatchedTokensSmallGPU = 2048
	// DefaultMaxLoras is vLLM's --max-loras default.
	DefaultMaxLoras             = 1
	DefaultGPUMemoryUtilization = 0.9
	// DefaultLoRALoadTime is the stall of the step that first uses an
	// adapter not resident in a GPU slot.
	DefaultLoRALoadTime = 25 * time.Millisecond
	// DefaultMFU is the fraction of peak bf16 FLOPS reached by prefill.
	DefaultMFU = 0.5
	// DefaultBandwidthEfficiency is the fraction of peak memory bandwidth
	// reached by decode.
	DefaultBandwidthEfficiency = 0.85
	// DefaultStepOverhead is the fixed CPU/launch cost of one engine step.
	DefaultStepOverhead = 800 * time.Microsecond
	// DefaultPerSeqOverhead is the per-scheduled-request CPU cost of a step
	// (scheduling, sampling, detokenisation).
	DefaultPerSeqOverhead = 4 * time.Microsecond
)

// Config configures one simulated pod. The zero value of every field other
// than Model and GPU picks vLLM's default.
type Config struct {
	Model profile.ModelSpec
	GPU   profile.GPUSpec
	// TensorParallel is the number of GPUs the model is sharded over (1).
	TensorParallel int
	// MaxNumSeqs caps running requests (256; recent vLLM uses 1024 on
	// ≥70 GiB GPUs other than the A100, set it to match).
	MaxNumSeqs int
	// MaxBatchedTokens is the per-step token budget of chunked prefill
	// (8192 on H100/H200, 2048 otherwise). Must be ≥ MaxNumSeqs.
	MaxBatchedTokens int
	// MaxModelLen caps prompt+output tokens. Zero: the model's context,
	// lowered to what the KV cache holds (vLLM refuses to start instead).
	MaxModelLen int
	// MaxLoras is the number of GPU LoRA slots (1).
	MaxLoras int
	// Adapters are registered at start (not yet resident in a slot).
	Adapters []string
	// LoRALoadTime is the cost of bringing an adapter into a slot (25ms).
	LoRALoadTime time.Duration
	// DisablePrefixCaching turns automatic prefix caching off (on by default).
	DisablePrefixCaching bool
	// GPUMemoryUtilization is the fraction of device memory vLLM uses (0.9).
	GPUMemoryUtilization float64
	// ActivationReserveBytes is per-GPU memory kept for activations, CUDA
	// graphs and the sampler. Zero: 1 GiB + 16 KiB per batched token.
	ActivationReserveBytes int64
	// NumBlocks overrides the KV capacity computed from memory (tests).
	NumBlocks int
	// MFU, BandwidthEfficiency, StepOverhead, PerSeqOverhead tune the cost
	// model; see the Default constants. MFU is the plateau a large step
	// reaches.
	MFU                 float64
	BandwidthEfficiency float64
	StepOverhead        time.Duration
	PerSeqOverhead      time.Duration
	// MFUHalfTokens makes compute efficiency depend on the tokens n in a
	// step, MFU × n/(n + MFUHalfTokens). Zero takes the GPU profile's
	// (GPUSpec.PrefillHalfTokens); negative is a flat MFU.
	MFUHalfTokens float64

	// SpeedFactor multiplies every step's duration (0 = 1): 1.03 is a pod
	// 3% slower than its GPU type's nominal speed. Real pods of one type
	// differ by clocks, thermals and neighbours; see PodSpeedFactor.
	SpeedFactor float64
	// StepJitter is σ of a mean-one lognormal factor drawn for each engine
	// step (0 = off): kernel timing, host scheduling and GC noise. Draws
	// are a pure function of JitterSeed and the step's index, so a run is
	// deterministic and a coalesced run of decode steps costs what the
	// same steps one by one would.
	StepJitter float64
	JitterSeed uint64
	// StallProb is the probability that a step also stalls (0 = off): a
	// GC pause, host preemption or slow collective. Stall lengths are
	// heavy-tailed (Pareto, shape 1.5) with mean StallMean (0 =
	// DefaultStallMean). PrefillNoise is σ of a mean-one lognormal factor
	// on the compute of each request's prompt tokens, drawn per request
	// (0 = off). Both draw from JitterSeed (noise.go).
	StallProb    float64
	StallMean    time.Duration
	PrefillNoise float64
}

// Variation is the realism the routing benchmark turns on: steps jitter
// and pods of one GPU type differ slightly. The zero value is off (exact,
// identical pods), as unit tests want.
type Variation struct {
	StepJitter float64 // σ of the per-step lognormal factor
	PodSpread  float64 // pods' speed factors are uniform in [1−spread, 1+spread]
	// Heavy tails, off unless set (Config's fields of the same names).
	StallProb    float64       // per-step stall probability
	StallMean    time.Duration // mean stall
	PrefillNoise float64       // σ of the per-request prefill factor
}

// NoisyVariation is engine noise the router did not write its estimates
// for: 15% per-step jitter, a stall in one step of 500 (mean 20 ms,
// Pareto tail), 25% per-request prefill noise, pods of one type within ±3%.
func NoisyVariation() Variation {
	return Variation{StepJitter: 0.15, PodSpread: 0.03, StallProb: 0.002, StallMean: DefaultStallMean, PrefillNoise: 0.25}
}

// DefaultVariation is the benchmark's: 3% per-step jitter, ±3% per pod.
func DefaultVariation() Variation { return Variation{StepJitter: 0.03, PodSpread: 0.03} }

// Apply returns cfg for pod number pod of a run seeded with seed: its own
// speed factor and its own jitter stream, both fixed by (seed, pod).
func (v Variation) Apply(cfg Config, seed uint64, pod int) Config {
	cfg.SpeedFactor = PodSpeedFactor(seed, pod, v.PodSpread)
	cfg.StepJitter = v.StepJitter
	cfg.JitterSeed = mix64(seed ^ mix64(uint64(pod)+0x9e3779b97f4a7c15))
	cfg.StallProb, cfg.StallMean, cfg.PrefillNoise = v.StallProb, v.StallMean, v.PrefillNoise
	return cfg
}

// PodSpeedFactor is pod's speed factor in a run seeded with seed: uniform
// in [1−spread, 1+spread], deterministic.
func PodSpeedFactor(seed uint64, pod int, spread float64) float64 {
	if spread <= 0 {
		return 1
	}
	u := unit(mix64(seed*0xbf58476d1ce4e5b9 + uint64(pod) + 1))
	return 1 + spread*(2*u-1)
}

// Request is one generation request. The engine owns it from Submit until
// OnDone (or Cancel) and does not modify it.
//
// Callbacks run on the driver's goroutine (inside Advance; under the
// Realtime's lock) and must not block: hand results off through a buffered
// channel or a non-blocking send. They may call Submit and Cancel on the same
// engine (not through Realtime, whose lock they already hold). Nil callbacks
// are skipped; leave OnTokens nil when per-token timing is not needed, it is
// the only per-step-per-request call.
type Request struct {
	ID      uint64
	Adapter string // "" for the base model
	// PromptTokens is the prompt length in tokens (> 0).
	PromptTokens int
	// BlockHashes are the chained hashes of the prompt's full 16-token
	// blocks; the prefix cache is keyed on them (namespaced by Adapter).
	BlockHashes []uint64
	// MaxTokens caps generated tokens (finish reason "length"); zero means
	// up to MaxModelLen, as vLLM.
	MaxTokens int
	// OutputTokens, if positive and below MaxTokens, is where the simulated
	// model emits EOS (finish reason "stop").
	OutputTokens int
	// Pooling marks a prefill-only request (an embedding, as vLLM's
	// pooling runner serves it): it finishes when its prompt is computed,
	// generating nothing; MaxTokens and OutputTokens are ignored.
	// OnFirstToken and OnTokens (with n = 0) then mark the end of prefill.
	Pooling bool
	// TokenIDs are the prompt's token ids, optional: the engine only hands
	// them on to a KVEvents listener (KV-cache events carry each stored
	// block's tokens).
	TokenIDs []uint32

	OnFirstToken func(at time.Duration)
	OnTokens     func(at time.Duration, n int) // n new tokens, the first included
	OnDone       func(at time.Duration, res Result)
}

// Result describes a finished request.
type Result struct {
	PromptTokens     int
	CachedTokens     int // prompt tokens served from the prefix cache at first admission
	CompletionTokens int
	FinishReason     string // "length" or "stop"
	Err              error
	// FirstTokenAt is when the first token was produced; Preemptions how
	// many times the request was preempted (recomputed).
	FirstTokenAt time.Duration
	Preemptions  int
}

// Stats is a snapshot of the engine, shaped after vLLM's /metrics.
type Stats struct {
	Waiting, Running int
	// KVUsage is the fraction of KV blocks held by requests, in [0,1];
	// cached-but-unreferenced blocks count as free, as vLLM.
	KVUsage               float64
	NumBlocks, UsedBlocks int
	BlockSize             int
	// RunningAdapters/WaitingAdapters are the sorted adapter names with a
	// running/waiting request (vllm:lora_requests_info).
	RunningAdapters, WaitingAdapters []string
	// LoadedAdapters are the adapters resident in GPU slots.
	LoadedAdapters []string
	MaxLoras       int
	// PrefixCacheQueries/Hits count tokens, as vllm:prefix_cache_{queries,hits}.
	PrefixCacheQueries, PrefixCacheHits int64
	Preemptions                         int64
	PromptTokens, GenerationTokens      int64
	FinishedRequests                    int64
	LoraLoads                           int64
	// Steps counts engine steps (a coalesced run of decode steps counts
	// each step).
	Steps int64
}
