package bench

import (
	"fmt"
	"math/rand/v2"
	"os"
	"strings"

	"github.com/infergate/infergate/shared/config"
	"github.com/infergate/infergate/tier1/picker"
)

// Policy is one routing policy under test.
type Policy struct {
	Name string
	// Profile is the picker profile the policy runs through Tier 1's
	// scheduler; nil for least-request, which is a baseline and not a
	// picker profile.
	Profile *picker.ProfileConfig
	// Queue enables Tier 1's saturation handling: when every pod is
	// saturated the request waits in the router (retried at each scrape)
	// for up to Options.MaxQueueWait, then is shed if sheddable or sent to
	// the best pod anyway. Baselines that model a plain load balancer
	// never queue.
	Queue bool
	// NewRouter, when set (and Profile is nil), builds the per-run Router
	// of a policy that keeps state across a run: the upstream endpoint
	// pickers (gie-v1.5, llm-d), whose prefix index is their own. Run calls
	// it once per run.
	NewRouter func() Router
	// Precise policies read the engines' KV-cache events: the harness
	// feeds an exact per-pod index of the blocks each pod holds
	// (bench/kvexact.go) to the policy's tracker or router, and gives
	// requests the engine's block keys.
	Precise bool
}

// Built-in policy names.
const (
	PolicyRoundRobin   = "round-robin"
	PolicyRandom       = "random"
	PolicyLeastRequest = "least-request"
	// PolicyGIEv15 is GIE v1.5.0's default endpoint picker, reproduced
	// from its source (bench/upstream.go, docs/benchmarks.md).
	PolicyGIEv15 = "gie-v1.5"
	// PolicyLLMD is llm-d router v0.10.0's default profile.
	PolicyLLMD = "llm-d"
	// PolicyGIEStrengthened is GIE's scorers and weights run through Tier
	// 1's picker: the queue scorer and saturation check also count the
	// router's own in-flight requests, a LoRA filter, a 512-block prefix
	// window and a 2 s router queue. Stronger than GIE as shipped.
	PolicyGIEStrengthened = "gie-strengthened"
	// PolicyGIEDefault is the old name of gie-strengthened, kept so older
	// commands in docs and BENCHMARKS.md still run.
	PolicyGIEDefault = "gie-default"
	PolicyInfergate  = "infergate"
	// PolicyInfergatePrecise is infergate with KV events on: the
	// precise-prefix scorer in place of the prefix scorer, judging pods by
	// the blocks their events say they hold.
	PolicyInfergatePrecise = "infergate-precise"
	// PolicyLLMDPrecise is llm-d with its precise-prefix-cache-scorer in
	// place of the approximate prefix-cache-scorer (llm-d's "precise
	// prefix cache aware" guide): same weights, scores from the engines'
	// KV events.
	PolicyLLMDPrecise = "llm-d-precise"
)

// BuiltinPolicies lists the built-in policy names (the alias gie-default
// is accepted but not listed).
func BuiltinPolicies() []string {
	return []string{PolicyRoundRobin, PolicyRandom, PolicyLeastRequest, PolicyGIEv15, PolicyLLMD, PolicyGIEStrengthened, PolicyInfergate, PolicyInfergatePrecise, PolicyLLMDPrecise}
}

// ParsePolicy resolves a built-in policy name or the path of a YAML
// picker profile (ProfileConfig), which is named by its path.
func ParsePolicy(name string) (Policy, error) {
	prof := func(c picker.ProfileConfig) *picker.ProfileConfig { return &c }
	switch name {
	case PolicyRoundRobin:
		// A Kubernetes Service: no metrics, no queue.
		return Policy{Name: name, Profile: prof(picker.RoundRobinProfile())}, nil
	case PolicyRandom:
		c := picker.RoundRobinProfile()
		c.Picker = picker.PickerRandom
		return Policy{Name: name, Profile: prof(c)}, nil
	case PolicyLeastRequest:
		return Policy{Name: name}, nil
	case PolicyGIEv15:
		return upstreamPolicy(name, GIEv15Config()), nil
	case PolicyLLMD:
		return upstreamPolicy(name, LLMDv010Config()), nil
	case PolicyGIEStrengthened, PolicyGIEDefault:
		return Policy{Name: name, Profile: prof(picker.GIEDefaultProfile()), Queue: true}, nil
	case PolicyInfergate:
		return Policy{Name: name, Profile: prof(picker.DefaultProfile()), Queue: true}, nil
	case PolicyInfergatePrecise:
		c := picker.DefaultProfile()
		found := false
		for i := range c.Scorers {
			if c.Scorers[i].Name == picker.ScorerPrefix {
				c.Scorers[i].Name, found = picker.ScorerPrecisePrefix, true
			}
		}
		if !found {
			return Policy{}, fmt.Errorf("policy %s: the default profile has no %s scorer to make precise", name, picker.ScorerPrefix)
		}
		return Policy{Name: name, Profile: prof(c), Queue: true, Precise: true}, nil
	case PolicyLLMDPrecise:
		c := LLMDv010Config()
		c.Precise = true
		p := upstreamPolicy(name, c)
		p.Precise = true
		return p, nil
	}
	if _, err := os.Stat(name); err != nil {
		return Policy{}, fmt.Errorf("unknown policy %q: not one of %s, nor a readable profile file", name, strings.Join(BuiltinPolicies(), ", "))
	}
	var c picker.ProfileConfig
	if err := config.Load(name, &c); err != nil {
		return Policy{}, fmt.Errorf("policy %s: %w", name, err)
	}
	return Policy{Name: name, Profile: &c, Queue: true}, nil
}

// upstreamPolicy runs an upstream endpoint picker's default profile: no
// Tier 1 profile, no router queue (dispatch at once).
func upstreamPolicy(name string, cfg EPPConfig) Policy {
	return Policy{Name: name, NewRouter: func() Router { return NewEPPRouter(cfg) }}
}

// pick chooses a pod for least-request: the pod with the fewest
// router-side in-flight requests (Envoy's LEAST_REQUEST with full scan),
// ties at random.
func (p Policy) pick(r *rand.Rand, req *picker.Request, pods []*picker.Pod) int {
	best, ties := -1, 0
	for i, v := range pods {
		switch {
		case best < 0 || v.InFlight < pods[best].InFlight:
			best, ties = i, 1
		case v.InFlight == pods[best].InFlight:
			// Reservoir sampling keeps the tie-break uniform.
			ties++
			if r.IntN(ties) == 0 {
				best = i
			}
		}
	}
	return best
}
