package gateway

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/infergate/infergate/shared/cluster"
	"github.com/infergate/infergate/shared/openai"
	"github.com/infergate/infergate/shared/relay"
	"github.com/infergate/infergate/tier2/discovery"
	"github.com/infergate/infergate/tier2/route"
	"github.com/infergate/infergate/tier2/tenant"
)

// exchange is one client request and its attempts.
type exchange struct {
	g      *Gateway
	w      *statusWriter
	r      *http.Request
	t      *tenant.Tenant
	body   []byte // as sent to Tier 1: include_usage set when injected
	model  string
	stream bool
	api    openai.API
	// injected: body asks Tier 1 for usage on the client's behalf.
	injected  bool
	requestID string
	log       *slog.Logger // carries request_id
	start     time.Time    // the request's arrival, for the TTFT metric

	usage   *openai.Usage
	relayed int                // stream events relayed to the client, for cancelledTokens
	broken  bool               // the response was cut after bytes reached the client
	abort   bool               // ... and must be aborted (a body that is not a stream)
	served  *discovery.Cluster // the cluster whose answer reached the client
	span    trace.Span         // the current attempt's, when tracing (trace.go)

	// The current attempt, for the relay's hooks (stream.go).
	attempt *route.Attempt
	relay   *relay.Attempt
	sent    time.Time

	// refusals are the clusters that answered 429 or 503 and the error
	// code Tier 1 gave ("east-a: queue_full"), for the answer when none
	// took the request.
	refusals []string
}

// attemptResult says whether the exchange is over or may move on to the
// next candidate (nothing reached the client).
type attemptResult int

const (
	resultDone  attemptResult = iota // answered (successfully or not); stop
	resultRetry                      // failed before any byte reached the client
)

// run tries the plan's candidates in order until one answers, within
// MaxAttempts and FailoverBudget, and answers the client itself when none
// does. It returns the usage the served answer reported, if any.
func (x *exchange) run(plan []route.Candidate, start time.Time) *openai.Usage {
	g := x.g
	attempts := 0
	all429, all404, all503 := true, true, true
	for _, cand := range plan {
		if attempts >= g.opts.MaxAttempts {
			break
		}
		if attempts > 0 && time.Since(start) > g.opts.FailoverBudget {
			break
		}
		if x.r.Context().Err() != nil {
			return nil
		}
		if attempts > 0 {
			cand.Reason = route.ReasonFailover
		}
		a, err := g.opts.Router.Begin(cand, x.model)
		if err != nil {
			continue // breaker refused: not an attempt
		}
		if attempts > 0 {
			g.mFailovers.Inc()
		}
		attempts++
		sp := x.startAttempt(cand, attempts)
		res, err := x.try(cand, a)
		x.endAttempt(sp, res, err)
		a.Done(err)
		if res == resultDone {
			return x.usage
		}
		var se *route.StatusError
		if !errors.As(err, &se) || se.Code != http.StatusTooManyRequests {
			all429 = false
		}
		if se == nil || se.Code != http.StatusNotFound {
			all404 = false
		}
		if se == nil || se.Code != http.StatusServiceUnavailable {
			all503 = false
		}
		if se != nil && (se.Code == http.StatusTooManyRequests || se.Code == http.StatusServiceUnavailable) {
			x.refusals = append(x.refusals, cand.Cluster.Name+": "+cmp.Or(se.Reason, strconv.Itoa(se.Code)))
		}
		x.log.Warn("tier1 attempt failed", "cluster", cand.Cluster.Name, "region", cand.Cluster.Region,
			"model", x.model, "attempt", attempts, "err", err)
	}
	x.answerFailure(attempts, all429, all404, all503)
	return nil
}

// answerFailure answers a request no cluster took, naming the cause.
func (x *exchange) answerFailure(attempts int, all429, all404, all503 bool) {
	// The error is Tier 2's, not a cluster's.
	x.w.Header().Del(cluster.HeaderCluster)
	x.w.Header().Del(cluster.HeaderRegion)
	x.w.Header().Del(cluster.HeaderPod)
	switch {
	case x.r.Context().Err() != nil:
	case attempts == 0:
		// Planned clusters whose breakers refused at dispatch: open since
		// the plan, or half-open with their one probe already out.
		x.w.Header().Set("Retry-After", "1")
		openai.Errorf(x.w, http.StatusServiceUnavailable, route.CodeBreakerOpen,
			fmt.Sprintf("no cluster can take %q requests right now: every one has its circuit breaker open or a probe in flight; retry shortly", x.model))
	case all404:
		openai.Errorf(x.w, http.StatusNotFound, "model_not_found", fmt.Sprintf("no cluster serves the model %q", x.model))
	case all429:
		x.w.Header().Set("Retry-After", "1")
		openai.Errorf(x.w, http.StatusTooManyRequests, "upstream_overloaded",
			fmt.Sprintf("every cluster serving this model is overloaded (%s); retry shortly", strings.Join(x.refusals, ", ")))
	case all503:
		// Tier 1 said why (no_ready_pod, queue_full, pool_drained, ...).
		x.w.Header().Set("Retry-After", "1")
		openai.Errorf(x.w, http.StatusServiceUnavailable, route.CodeNoCapacity,
			fmt.Sprintf("no cluster can take %q requests right now: %d tried, each refused (%s)", x.model, attempts, strings.Join(x.refusals, ", ")))
	default:
		// Details (addresses, errors) stay in the log, under the request ID.
		openai.Errorf(x.w, http.StatusBadGateway, "upstream_unavailable",
			fmt.Sprintf("%d cluster(s) tried, none answered; request id %s", attempts, x.requestID))
	}
}

// try is one attempt at one cluster, relayed by shared/relay: until the
// first event of a stream, or the whole of any other answer (buffered up
// to MaxBufferedResponse), nothing reaches the client and a failure moves
// on to the next cluster (resultRetry); after that the answer is the
// client's.
func (x *exchange) try(cand route.Candidate, a *route.Attempt) (attemptResult, error) {
	o := &x.g.opts
	first := o.ResponseTimeout // Tier 1 answers a non-streamed request when generation ends
	if x.stream {
		first = o.FirstByteTimeout
	}
	at := relay.Start(x.r.Context(), relay.Options{
		FirstByte: first, Write: o.StreamWriteTimeout, Hold: o.MaxBufferedResponse,
		MaxEvent: o.MaxEventBytes, API: x.api,
	})
	defer at.Stop()
	x.attempt, x.relay = a, at
	resp, err := x.send(at.Context(), cand)
	if err != nil {
		return retryOrDone(at.Err(err))
	}
	defer resp.Body.Close()
	if relay.Retryable(resp.StatusCode) {
		err := statusError(resp.StatusCode)
		var se *route.StatusError
		if errors.As(err, &se) && (se.Code == http.StatusTooManyRequests || se.Code == http.StatusServiceUnavailable) {
			se.Reason = errorCode(resp.Body)
		}
		relay.Discard(resp)
		return resultRetry, err
	}
	if err := at.Open(resp); err != nil {
		return retryOrDone(err)
	}
	x.served = &cand.Cluster
	x.w.lab.cluster, x.w.lab.region = cand.Cluster.Name, cand.Cluster.Region
	h := x.w.Header()
	h.Set(cluster.HeaderCluster, cand.Cluster.Name)
	h.Set(cluster.HeaderRegion, cand.Cluster.Region)
	var deadline time.Time
	if at.Stream() {
		deadline = time.Now().Add(o.MaxStreamDuration)
	} else if b, whole := at.Held(); whole {
		if u := openai.BodyUsage(b); u != nil {
			x.usage = u
		}
	}
	res := at.Relay(x.w, x, deadline)
	x.relayed += res.Events
	switch {
	case res.ClientGone:
		return resultDone, route.ErrClientCanceled
	case res.Code == relay.CodeTooLong:
		// The client's doing, not the cluster's: not held against it.
		x.broken = true
		return resultDone, nil
	case res.Code != "":
		// Bytes already reached the client: no retry; the stream ended with
		// an error event (or the answer is aborted) and the cluster is
		// charged with the failure.
		x.broken, x.abort = true, res.Abort
		return resultDone, fmt.Errorf("%s: %w", res.Code, res.Err)
	case res.Status >= 400:
		// A 4xx that is the request's own fault: Tier 1's answer is the
		// answer, and it does not count against the cluster.
		return resultDone, &route.StatusError{Code: res.Status}
	}
	return resultDone, nil
}

// statusError is the error of an answer another cluster gets a chance at
// (relay.Retryable): a *route.StatusError, which the cluster's breaker
// counts only for 5xx; a refusal of Tier 2's own token (401/403) is a
// misconfigured cluster, not the client's fault, and counts against it.
func statusError(code int) error {
	if code < 500 && relay.TargetFault(code) {
		return fmt.Errorf("tier1 rejected tier2's token (HTTP %d)", code)
	}
	return &route.StatusError{Code: code}
}

// errorCode reads the OpenAI error code of a refusal from Tier 1 (at most
// 4 KiB of its body), or "" when the body has none a client may be shown
// (a short lower-case token).
func errorCode(body io.Reader) string {
	var e struct {
		Error struct {
			Code string `json:"code"`
		} `json:"error"`
	}
	b, _ := io.ReadAll(io.LimitReader(body, 4<<10))
	if json.Unmarshal(b, &e) != nil {
		return ""
	}
	c := e.Error.Code
	if len(c) == 0 || len(c) > 64 {
		return ""
	}
	for i := 0; i < len(c); i++ {
		if ch := c[i]; !(ch >= 'a' && ch <= 'z' || ch >= '0' && ch <= '9' || ch == '_') {
			return ""
		}
	}
	return c
}

// retryOrDone: a client that left ends the exchange; other failures
// before any byte reached the client move on to the next cluster.
func retryOrDone(err error) (attemptResult, error) {
	if errors.Is(err, relay.ErrClientGone) {
		return resultDone, route.ErrClientCanceled
	}
	return resultRetry, err
}

// send posts the body to the candidate with only the headers Tier 1 needs:
// client credentials and any client-supplied internal (X-Infergate-*)
// headers never go through.
func (x *exchange) send(ctx context.Context, cand route.Candidate) (*http.Response, error) {
	// A *bytes.Reader: net/http writes the headers and a body it knows
	// to be in memory together, without a flush between them.
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, cand.Cluster.Address+x.r.URL.Path, bytes.NewReader(x.body))
	if err != nil {
		return nil, err
	}
	req.ContentLength = int64(len(x.body))
	req.Header.Set("Content-Type", "application/json")
	if acc := x.r.Header.Get("Accept"); acc != "" {
		req.Header.Set("Accept", acc)
	}
	if x.g.opts.Tier1Token != "" {
		req.Header.Set("Authorization", "Bearer "+x.g.opts.Tier1Token)
	}
	req.Header.Set(cluster.HeaderRequestID, x.requestID)
	req.Header.Set(cluster.HeaderTenant, x.t.ID)
	x.injectTrace(req.Header)
	x.sent = time.Now()
	return x.g.opts.Transport.RoundTrip(req)
}

// sentLen is the length of the body Tier 1 got.
func (x *exchange) sentLen() int {
	return len(x.body)
}
