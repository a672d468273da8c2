// Package scenario defines the routing benchmark's named scenarios: a
// simulated fleet plus a seeded request-stream generator. Six are modelled
// on the workloads AWS reported for its GIE-based gateway; three more cover
// multi-turn chat, many LoRA adapters and a 1,000-pod pool. docs/benchmarks.md
// explains why each is shaped as it is.
package scenario

import (
	"cmp"
	"fmt"
	"hash/fnv"
	"math"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/infergate/infergate/bench/workload"
)

// Scenario is one named benchmark setup.
type Scenario struct {
	Name    string
	Summary string // one line, for --help and the report
	AWS     string // the AWS workload it is modelled on, "" if none
	Fleet   Fleet
	// Duration is how long requests arrive; the run continues until every
	// request has finished (or Drain has passed).
	Duration time.Duration
	Drain    time.Duration
	Gen      Generator
}

// Stream returns the scenario's request stream for seed. The same (scenario,
// seed) always gives the same stream.
func (s Scenario) Stream(seed uint64) workload.Stream {
	h := fnv.New64a()
	h.Write([]byte(s.Name))
	r := rand.New(rand.NewPCG(seed, h.Sum64()))
	reqs := s.Gen.Generate(r, s.Duration, s.Fleet.Adapters)
	return workload.Stream{Requests: reqs, Duration: s.Duration}
}

// Generator produces a scenario's requests.
type Generator interface {
	Generate(r *rand.Rand, dur time.Duration, adapters []string) []workload.Request
}

// Independent generates independent requests: arrivals from a process,
// lognormal lengths, optionally a shared system prompt drawn from a Zipf
// over Prefixes of them, optionally a LoRA adapter drawn from a Zipf over
// the fleet's adapters.
type Independent struct {
	Arrivals workload.Arrivals
	Prompt   workload.LogNormal // the request's own tokens (after any shared prefix)
	Output   workload.LogNormal
	// Prefixes > 0 gives each request one of that many shared system prompts
	// of PrefixTokens (rounded to whole blocks), with Zipf(PrefixZipf)
	// popularity; PrefixFraction of requests carry one.
	Prefixes       int
	PrefixTokens   workload.LogNormal
	PrefixZipf     float64
	PrefixFraction float64
	// AdapterZipf is the popularity exponent over the fleet's adapters;
	// AdapterFraction of requests name one (0 means all when adapters exist).
	AdapterZipf     float64
	AdapterFraction float64
	// Sheddable is the fraction of requests marked sheddable.
	Sheddable float64
}

// Generate implements Generator.
func (g Independent) Generate(r *rand.Rand, dur time.Duration, adapters []string) []workload.Request {
	times := g.Arrivals.Times(r, dur)
	prefixLen := make([]int, g.Prefixes)
	for i := range prefixLen {
		prefixLen[i] = g.PrefixTokens.Draw(r) / workload.BlockSize * workload.BlockSize
	}
	var pz, az *workload.Zipf
	if g.Prefixes > 0 {
		pz = workload.NewZipf(g.Prefixes, g.PrefixZipf)
	}
	if len(adapters) > 0 {
		az = workload.NewZipf(len(adapters), g.AdapterZipf)
	}
	pfrac := g.PrefixFraction
	if pfrac == 0 {
		pfrac = 1
	}
	afrac := g.AdapterFraction
	if afrac == 0 {
		afrac = 1
	}
	reqs := make([]workload.Request, len(times))
	for i, t := range times {
		own := g.Prompt.Draw(r)
		segs := make([]workload.Segment, 0, 2)
		if pz != nil && r.Float64() < pfrac {
			p := pz.Draw(r)
			segs = append(segs, workload.Segment{Key: uint64(p) + 1, Tokens: prefixLen[p]})
		}
		// High bit set keeps per-request keys apart from prefix keys.
		segs = append(segs, workload.Segment{Key: 1<<63 | uint64(i), Tokens: own})
		prompt := 0
		for _, s := range segs {
			prompt += s.Tokens
		}
		req := workload.Request{
			ID:           uint64(i),
			Arrival:      t,
			PromptTokens: prompt,
			OutputTokens: g.Output.Draw(r),
			BlockHashes:  workload.HashSegments(segs),
			Session:      -1,
			Sheddable:    r.Float64() < g.Sheddable,
		}
		if az != nil && r.Float64() < afrac {
			req.Adapter = adapters[az.Draw(r)]
		}
		reqs[i] = req
	}
	return reqs
}

// Chat generates multi-turn conversations: sessions start as a Poisson
// process; each turn's prompt is the whole conversation so far (one of a few
// shared system prompts, then every earlier user message and reply), so a
// session's prompts grow turn by turn and share their prefix with the
// previous turn's.
type Chat struct {
	SessionRate  float64 // new sessions per second
	Turns        workload.LogNormal
	User         workload.LogNormal // tokens per user message
	Output       workload.LogNormal // tokens per reply
	Think        time.Duration      // mean pause between a reply and the next message
	SystemPrompt workload.LogNormal
	Systems      int
	MaxPrompt    int // conversations stop growing past this many tokens
}

// Generate implements Generator. Turn k+1 arrives Think (exponential) after
// turn k's arrival plus a nominal reply time, independent of the routing
// policy so every policy sees the same stream.
func (g Chat) Generate(r *rand.Rand, dur time.Duration, _ []string) []workload.Request {
	starts := workload.Poisson{Rate: g.SessionRate}.Times(r, dur)
	sys := make([]int, max(g.Systems, 1))
	for i := range sys {
		sys[i] = g.SystemPrompt.Draw(r) / workload.BlockSize * workload.BlockSize
	}
	var reqs []workload.Request
	for s, t0 := range starts {
		si := r.IntN(len(sys))
		// The conversation is one growing token stream keyed by the
		// session after the shared system prompt.
		segs := []workload.Segment{{Key: uint64(si) + 1, Tokens: sys[si]}, {Key: 1<<62 | uint64(s), Tokens: 0}}
		turns := g.Turns.Draw(r)
		t := t0
		for k := 0; k < turns && t < dur; k++ {
			segs[1].Tokens += g.User.Draw(r)
			prompt := segs[0].Tokens + segs[1].Tokens
			if g.MaxPrompt > 0 && prompt > g.MaxPrompt {
				break
			}
			out := g.Output.Draw(r)
			reqs = append(reqs, workload.Request{
				Arrival:      t,
				PromptTokens: prompt,
				OutputTokens: out,
				BlockHashes:  workload.HashSegments(segs),
				Session:      s,
			})
			segs[1].Tokens += out
			// Nominal 30 ms per output token stands in for reading the reply.
			t += time.Duration(float64(out)*30*float64(time.Millisecond)) +
				time.Duration(r.ExpFloat64()*float64(g.Think))
		}
	}
	slices.SortStableFunc(reqs, func(a, b workload.Request) int { return cmp.Compare(a.Arrival, b.Arrival) })
	for i := range reqs {
		reqs[i].ID = uint64(i)
	}
	return reqs
}

// Adapters returns n adapter names.
func Adapters(n int) []string {
	out := make([]string, n)
	w := int(math.Log10(float64(max(n, 1)))) + 1
	for i := range out {
		out[i] = fmt.Sprintf("lora-%0*d", w, i)
	}
	return out
}

// ScaleRate returns a copy of s whose arrival rate is multiplied by k
// (k ≤ 0 or 1 leaves it unchanged): for load sweeps and --rate-scale.
func (s Scenario) ScaleRate(k float64) Scenario {
	if k <= 0 || k == 1 {
		return s
	}
	switch g := s.Gen.(type) {
	case Independent:
		switch a := g.Arrivals.(type) {
		case workload.Poisson:
			a.Rate *= k
			g.Arrivals = a
		case workload.OnOff:
			a.OnRate *= k
			a.OffRate *= k
			g.Arrivals = a
		}
		s.Gen = g
	case Chat:
		g.SessionRate *= k
		s.Gen = g
	}
	return s
}
