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
}

// Built-in policy names.
const (
	PolicyRoundRobin   = "round-robin"
	PolicyRandom       = "random"
	PolicyLeastRequest = "least-request"
	PolicyGIEDefault   = "gie-default"
	PolicyInfergate    = "infergate"
)

// BuiltinPolicies lists the built-in policy names.
func BuiltinPolicies() []string {
	return []string{PolicyRoundRobin, PolicyRandom, PolicyLeastRequest, PolicyGIEDefault, PolicyInfergate}
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
	case PolicyGIEDefault:
		return Policy{Name: name, Profile: prof(picker.GIEDefaultProfile()), Queue: true}, nil
	case PolicyInfergate:
		return Policy{Name: name, Profile: prof(picker.DefaultProfile()), Queue: true}, nil
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

// pick chooses a pod for policies that are not picker profiles:
// least-request takes the pod with the fewest router-side in-flight
// requests (Envoy's LEAST_REQUEST with full scan), ties at random.
func (p Policy) pick(r *rand.Rand, _ *picker.Request, pods []*picker.Pod) int {
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
