// Package admissiontest holds the admission cases that Tier 1's gateway
// and the routing benchmark both test against, so the two are shown to
// take the same decision for the same snapshot of pod state.
package admissiontest

import "github.com/infergate/infergate/tier1/admission"

// Case is one snapshot: every pod of a two-pod pool reports Waiting queued
// requests and KV-cache usage KV; one request of Priority (sheddable if
// Sheddable) arrives; if Ahead is set, a request of priority AheadPrio is
// already waiting in the router's queue.
type Case struct {
	Name      string
	Waiting   int
	KV        float64
	Priority  int
	Sheddable bool
	Ahead     bool
	AheadPrio int
	Want      admission.Action
}

// Cases returns the shared table. Saturation uses the default profile's
// thresholds (queue 5, KV 0.8).
func Cases() []Case {
	return []Case{
		{Name: "idle standard", Want: admission.Dispatch},
		{Name: "idle sheddable", Sheddable: true, Priority: -1, Want: admission.Dispatch},
		{Name: "idle critical", Priority: 1, Want: admission.Dispatch},
		{Name: "queued standard", Waiting: 8, Want: admission.Wait},
		{Name: "queued critical", Waiting: 8, Priority: 1, Want: admission.Wait},
		{Name: "queued sheddable shed at once", Waiting: 8, Sheddable: true, Priority: -1, Want: admission.Shed},
		{Name: "kv full sheddable", KV: 0.95, Sheddable: true, Priority: -1, Want: admission.Shed},
		{Name: "kv full standard", KV: 0.95, Want: admission.Wait},
		{Name: "idle but standard waiter ahead", Ahead: true, Want: admission.Wait},
		{Name: "idle, sheddable behind waiter", Ahead: true, Sheddable: true, Priority: -1, Want: admission.Shed},
		{Name: "idle, critical passes standard waiter", Ahead: true, Priority: 1, Want: admission.Dispatch},
		{Name: "idle, critical behind critical waiter", Ahead: true, AheadPrio: 1, Priority: 1, Want: admission.Wait},
	}
}
