// Package admission is Tier 1's routing step between parsing a request and
// sending it to a pod, written once for every caller: the HTTP proxy and
// the ext_proc endpoint picker (tier1/gateway) and the routing benchmark
// (bench), which replays it in virtual time.
//
// The step is:
//
//  1. Prompt fills a picker.Request's scheduling input from the prompt
//     text: prefix block hashes (tier1/prefix, seeded by the model and any
//     cache_salt) and the prompt-token estimate (bytes/4).
//  2. Arrive decides whether the request may be scheduled now or must join
//     the wait queue behind requests of equal or higher priority that were
//     held (a sheddable one is shed instead); see Pass.
//  3. The caller runs picker.Scheduler.ScheduleInto.
//  4. Decide maps the scheduler's answer to a Decision: dispatch, wait
//     (every pod saturated, or busy with queued prefill when the profile
//     holds; sheddable requests are never held), shed (sheddable requests
//     are refused at once when every pod is saturated or busy) or fail, with the
//     HTTP status and OpenAI error code. Expired is the decision when a
//     waiter's bounded wait runs out.
//
// Queue is the wait queue's order (priority descending, then arrival)
// and Pass the order
// in which waiters re-run the scheduler after a wake (every waiter in
// turn, skipping those that one held earlier in the pass stands for),
// without any locking or clock, so the gateway wraps them with a mutex
// and wake-ups and the benchmark drives them from virtual time.
//
// Nothing here does I/O or reads a clock or a lock, so the same inputs
// give the same Decision in the proxy, in Pick and in the benchmark.
package admission

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/infergate/infergate/tier1/picker"
	"github.com/infergate/infergate/tier1/prefix"
)

// Prompt sets req's scheduling input from the prompt text as the engine
// will see it: BlockHashes are the chained prefix hashes of text, seeded
// with req.Model (and cacheSalt when set, so salted prompts never share
// cache with others), and PromptTokens is the ~4 bytes per token estimate.
// The hashes are written into req.BlockHashes' backing array when it is
// large enough, so a caller may pass a reused buffer there.
func Prompt(req *picker.Request, cacheSalt string, text []byte) {
	seed := req.Model
	if cacheSalt != "" {
		seed = req.Model + "\x00" + cacheSalt
	}
	req.BlockHashes = prefix.Hash(seed, text, prefix.DefaultBlockBytes, prefix.DefaultPromptBlocks, req.BlockHashes[:0])
	req.PromptBlocks = 0
	if n := len(text) / prefix.DefaultBlockBytes; n > len(req.BlockHashes) {
		req.PromptBlocks = n
	}
	req.PromptTokens = max(1, len(text)/4)
}

// Action is what happens to a request after a scheduling attempt.
type Action uint8

// Actions of a Decision.
const (
	// Schedule: run the scheduler now and Decide on its answer (Arrive).
	Schedule Action = iota
	// Dispatch: send the request to the scheduler's Ranked[0] (Ranked[1:]
	// on retry).
	Dispatch
	// Wait: queue the request until a pod leaves saturation or its
	// bounded wait runs out (then see Expired).
	Wait
	// Shed: refuse the sheddable request with 429 and Retry-After.
	Shed
	// Fail: refuse the request with Status.
	Fail
)

func (a Action) String() string {
	switch a {
	case Schedule:
		return "schedule"
	case Dispatch:
		return "dispatch"
	case Wait:
		return "wait"
	case Shed:
		return "shed"
	case Fail:
		return "fail"
	}
	return fmt.Sprintf("Action(%d)", a)
}

// StatusClientClosed is the status logged when the client went away
// (nginx's 499); it is never written to a client.
const StatusClientClosed = 499

// ShedRetryAfter is the Retry-After given with a shed request.
const ShedRetryAfter = time.Second

// Decision is the admission decision for one request. For Shed and Fail,
// Status, Code and Message are the OpenAI-style error to answer with.
type Decision struct {
	Action     Action
	Status     int
	Code       string
	Message    string
	RetryAfter time.Duration // Shed only
}

// Decide maps one scheduling attempt's error to a decision. schedErr is
// what picker.Scheduler.ScheduleInto returned, or the context's error when
// the request's wait was cut short (deadline: 504, cancelled: 499).
func Decide(req *picker.Request, schedErr error) Decision {
	switch {
	case schedErr == nil:
		return Decision{Action: Dispatch}
	case errors.Is(schedErr, picker.ErrSaturated):
		if req.Sheddable {
			return shed("every model server of this model is saturated; retry later")
		}
		return Decision{Action: Wait}
	case errors.Is(schedErr, picker.ErrBusy):
		// Not saturated, only holding so that a held request goes to the
		// pod that drains first. Sheddable requests never wait in the
		// router, and sending one on would put batch work ahead of the
		// held and later standard and critical requests on those pods: it
		// is shed (the scheduler judged busy at saturation.sheddable_wait).
		if req.Sheddable {
			return shed("every model server of this model has a full prefill queue; retry later")
		}
		return Decision{Action: Wait}
	case errors.Is(schedErr, picker.ErrNoCandidates):
		return Decision{Action: Fail, Status: http.StatusServiceUnavailable, Code: "no_ready_pod",
			Message: fmt.Sprintf("no ready model server for model %q", req.Model)}
	case errors.Is(schedErr, context.Canceled):
		return Decision{Action: Fail, Status: StatusClientClosed, Code: "timeout",
			Message: "client went away while waiting for capacity"}
	case errors.Is(schedErr, context.DeadlineExceeded):
		return Decision{Action: Fail, Status: http.StatusGatewayTimeout, Code: "timeout",
			Message: "request timed out waiting for capacity"}
	}
	return Decision{Action: Fail, Status: http.StatusServiceUnavailable, Code: "scheduling_failed", Message: schedErr.Error()}
}

// shed refuses a sheddable request: 429 pool_saturated with Retry-After.
func shed(msg string) Decision {
	return Decision{Action: Shed, Status: http.StatusTooManyRequests, Code: "pool_saturated", Message: msg, RetryAfter: ShedRetryAfter}
}

// Arrive is the decision on arrival, before scheduling. blocked is
// Queue.Ahead(req.Priority) && Pass.Blocks(req, …): someone of equal or
// higher priority already waits, and a request like this one was held at
// the last look (or the waiters ahead have not had their turn since the
// pods changed, or this one is sheddable), so the newcomer queues behind
// them (or is shed, if sheddable) instead of jumping the line. Otherwise
// the Action is Schedule.
func Arrive(req *picker.Request, blocked bool) Decision {
	if !blocked {
		return Decision{Action: Schedule}
	}
	return Decide(req, picker.ErrSaturated)
}

// Expired is the decision for a waiter whose bounded wait ran out, given
// its last scheduling attempt: still saturated, it goes to the best pod
// anyway (the model server queues it) rather than failing.
func Expired(req *picker.Request, schedErr error) Decision {
	if errors.Is(schedErr, picker.ErrSaturated) || errors.Is(schedErr, picker.ErrBusy) {
		return Decision{Action: Dispatch}
	}
	return Decide(req, schedErr)
}

// MaxWait is the wait bound for req's priority: critical for priority > 0
// requests, standard otherwise.
func MaxWait(req *picker.Request, standard, critical time.Duration) time.Duration {
	if req.Priority > 0 {
		return critical
	}
	return standard
}
