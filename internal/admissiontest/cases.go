// Package admissiontest holds the admission cases that Tier 1's gateway
// and the routing benchmark both test against, so the two are shown to
// take the same decision for the same snapshot of pod state.
package admissiontest

import (
	"time"

	"github.com/infergate/infergate/tier1/admission"
	"github.com/infergate/infergate/tier1/picker"
)

// Case is one snapshot: every pod of a two-pod pool reports Waiting queued
// requests and KV-cache usage KV; one request of Priority (sheddable if
// Sheddable) arrives; if Ahead is set, a request of priority AheadPrio is
// already waiting in the router's queue. The profile holds requests while
// every pod has PrefillWait of prefill queued (saturation.prefill_wait, 0 =
// off), and the router has QueuedPrefill of prefill in flight on each pod
// (see Prime).
type Case struct {
	Name      string
	Waiting   int
	KV        float64
	Priority  int
	Sheddable bool
	Ahead     bool
	AheadPrio int
	// PrefillWait is the profile's saturation.prefill_wait.
	PrefillWait time.Duration
	// SheddableWait is the profile's saturation.sheddable_wait.
	SheddableWait time.Duration
	// QueuedPrefill is the router's in-flight prefill on every pod, at
	// Speed.
	QueuedPrefill time.Duration
	Want          admission.Action
}

// Speed is the prefill speed (tokens/s) Prime teaches the router for
// every pod.
const Speed = 10000

// Prime gives the router's tracker the case's own state for pods: each
// has learned Speed from one first token, and has QueuedPrefill of
// uncached prompt in flight. undo ends the in-flight requests.
func (c Case) Prime(tr *picker.Tracker, pods []string) (undo func()) {
	var flights []*picker.Request
	for _, pod := range pods {
		teach := &picker.Request{ID: "teach", PromptTokens: Speed}
		tr.Dispatched(pod, teach)
		tr.FirstToken(pod, teach, time.Second)
		tr.Done(pod, teach)
		if c.QueuedPrefill > 0 {
			r := &picker.Request{ID: "queued-" + pod, PromptTokens: int(c.QueuedPrefill.Seconds() * Speed)}
			tr.Dispatched(pod, r)
			flights = append(flights, r)
		}
	}
	return func() {
		for i, r := range flights {
			tr.Done(pods[i], r)
		}
	}
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
		// Holding (saturation.prefill_wait 400 ms).
		{Name: "prefill queued, holding off", QueuedPrefill: 600 * time.Millisecond, Want: admission.Dispatch},
		{Name: "prefill under the wait", PrefillWait: 400 * time.Millisecond, QueuedPrefill: 300 * time.Millisecond, Want: admission.Dispatch},
		{Name: "every pod busy: standard held", PrefillWait: 400 * time.Millisecond, QueuedPrefill: 600 * time.Millisecond, Want: admission.Wait},
		{Name: "every pod busy: critical held", PrefillWait: 400 * time.Millisecond, QueuedPrefill: 600 * time.Millisecond, Priority: 1, Want: admission.Wait},
		// A sheddable request is never held; sent on, it would go ahead of
		// the held standard and critical ones.
		{Name: "every pod busy: sheddable shed, not held", PrefillWait: 400 * time.Millisecond, QueuedPrefill: 600 * time.Millisecond, Sheddable: true, Priority: -1, Want: admission.Shed},
		{Name: "busy and queued: sheddable shed", PrefillWait: 400 * time.Millisecond, QueuedPrefill: 600 * time.Millisecond, Waiting: 8, Sheddable: true, Priority: -1, Want: admission.Shed},
		{Name: "holding: busy, sheddable behind a held waiter shed", PrefillWait: 400 * time.Millisecond, QueuedPrefill: 600 * time.Millisecond, Ahead: true, Sheddable: true, Priority: -1, Want: admission.Shed},
		{Name: "holding: idle, standard behind waiter waits", PrefillWait: 400 * time.Millisecond, Ahead: true, Want: admission.Wait},
		// saturation.sheddable_wait: sheddable requests judged busy at their own wait.
		{Name: "sheddable wait under the queue: sheddable shed", PrefillWait: 800 * time.Millisecond, SheddableWait: 400 * time.Millisecond, QueuedPrefill: 600 * time.Millisecond, Sheddable: true, Priority: -1, Want: admission.Shed},
		{Name: "sheddable wait under the queue: standard sent", PrefillWait: 800 * time.Millisecond, SheddableWait: 400 * time.Millisecond, QueuedPrefill: 600 * time.Millisecond, Want: admission.Dispatch},
		{Name: "sheddable wait over the queue: sheddable sent", PrefillWait: 400 * time.Millisecond, SheddableWait: 800 * time.Millisecond, QueuedPrefill: 600 * time.Millisecond, Sheddable: true, Priority: -1, Want: admission.Dispatch},
		{Name: "sheddable wait over the queue: standard held", PrefillWait: 400 * time.Millisecond, SheddableWait: 800 * time.Millisecond, QueuedPrefill: 600 * time.Millisecond, Want: admission.Wait},
		{Name: "holding off, sheddable wait on: sheddable shed", SheddableWait: 400 * time.Millisecond, QueuedPrefill: 600 * time.Millisecond, Sheddable: true, Priority: -1, Want: admission.Shed},
		{Name: "holding off, sheddable wait on: standard sent", SheddableWait: 400 * time.Millisecond, QueuedPrefill: 600 * time.Millisecond, Want: admission.Dispatch},
	}
}
