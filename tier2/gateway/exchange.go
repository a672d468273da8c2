package gateway

import (
	"bytes"
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

	"github.com/infergate/infergate/shared/openai"
	"github.com/infergate/infergate/tier2/discovery"
	"github.com/infergate/infergate/tier2/route"
	"github.com/infergate/infergate/tier2/tenant"
)

// exchange is one client request and its attempts.
type exchange struct {
	g         *Gateway
	w         *statusWriter
	r         *http.Request
	t         *tenant.Tenant
	body      []byte
	model     string
	stream    bool
	injected  bool
	requestID string
	log       *slog.Logger // carries request_id

	usage   *usage
	relayed int                // stream events relayed to the client, for cancelledTokens
	broken  bool               // the stream was cut after bytes reached the client
	served  *discovery.Cluster // the cluster whose answer reached the client
	span    trace.Span         // the current attempt's, when tracing (trace.go)
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
func (x *exchange) run(plan []route.Candidate, start time.Time) *usage {
	g := x.g
	attempts := 0
	all429, all404 := true, true
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
		res, err := x.attempt(cand, a)
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
		x.log.Warn("tier1 attempt failed", "cluster", cand.Cluster.Name, "region", cand.Cluster.Region,
			"model", x.model, "attempt", attempts, "err", err)
	}
	x.answerFailure(attempts, all429, all404)
	return nil
}

// answerFailure answers a request no cluster took.
func (x *exchange) answerFailure(attempts int, all429, all404 bool) {
	// The error is Tier 2's, not a cluster's.
	x.w.Header().Del("X-Infergate-Cluster")
	x.w.Header().Del("X-Infergate-Region")
	switch {
	case x.r.Context().Err() != nil:
	case attempts == 0:
		openai.Errorf(x.w, http.StatusServiceUnavailable, "no_capacity", fmt.Sprintf("no cluster can take %q requests right now", x.model))
	case all404:
		openai.Errorf(x.w, http.StatusNotFound, "model_not_found", fmt.Sprintf("no cluster serves the model %q", x.model))
	case all429:
		x.w.Header().Set("Retry-After", "1")
		openai.Errorf(x.w, http.StatusTooManyRequests, "upstream_overloaded", "every cluster serving this model is overloaded; retry shortly")
	default:
		// Details (addresses, errors) stay in the log, under the request ID.
		openai.Errorf(x.w, http.StatusBadGateway, "upstream_unavailable",
			fmt.Sprintf("%d cluster(s) tried, none answered; request id %s", attempts, x.requestID))
	}
}

// try is one attempt at one cluster: its context, cancelled by timer when
// the first byte (streams) or the whole answer does not come in timeout.
type try struct {
	cand    route.Candidate
	a       *route.Attempt
	ctx     context.Context
	cancel  context.CancelFunc
	timer   *time.Timer
	timeout time.Duration
	sent    time.Time
}

func (x *exchange) newTry(cand route.Candidate, a *route.Attempt) *try {
	tr := &try{cand: cand, a: a, timeout: x.g.opts.ResponseTimeout}
	if x.stream {
		tr.timeout = x.g.opts.FirstByteTimeout
	}
	tr.ctx, tr.cancel = context.WithCancel(x.r.Context())
	tr.timer = time.AfterFunc(tr.timeout, tr.cancel)
	return tr
}

func (tr *try) stop() {
	tr.timer.Stop()
	tr.cancel()
}

// cause names why an attempt's I/O failed: the client left
// (route.ErrClientCanceled), the attempt timed out, or err itself.
func (x *exchange) cause(tr *try, err error) error {
	if x.r.Context().Err() != nil {
		return route.ErrClientCanceled
	}
	if tr.ctx.Err() != nil {
		return fmt.Errorf("no response within %v: %w", tr.timeout, err)
	}
	return err
}

// retryOrDone: a client that left ends the exchange; other failures
// before any byte reached the client move on to the next cluster.
func retryOrDone(err error) (attemptResult, error) {
	if errors.Is(err, route.ErrClientCanceled) {
		return resultDone, err
	}
	return resultRetry, err
}

// attempt sends the request to one cluster. With resultRetry nothing was
// written to the client.
func (x *exchange) attempt(cand route.Candidate, a *route.Attempt) (attemptResult, error) {
	tr := x.newTry(cand, a)
	defer tr.stop()
	resp, err := x.send(tr)
	if err != nil {
		return retryOrDone(x.cause(tr, err))
	}
	defer resp.Body.Close()
	if err := failoverStatus(resp); err != nil {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
		return resultRetry, err
	}
	x.served = &tr.cand.Cluster
	h := x.w.Header()
	h.Set("X-Infergate-Cluster", cand.Cluster.Name)
	h.Set("X-Infergate-Region", cand.Cluster.Region)
	switch {
	case resp.StatusCode >= 400:
		return x.relayError(resp)
	case x.stream && strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream"):
		return x.relayStream(tr, resp)
	}
	return x.relayBuffered(tr, resp)
}

// send posts the body to the candidate with only the headers Tier 1 needs:
// client credentials and any client-supplied internal (X-Infergate-*)
// headers never go through.
func (x *exchange) send(tr *try) (*http.Response, error) {
	req, err := http.NewRequestWithContext(tr.ctx, http.MethodPost, tr.cand.Cluster.Address+x.r.URL.Path, bytes.NewReader(x.body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	if acc := x.r.Header.Get("Accept"); acc != "" {
		req.Header.Set("Accept", acc)
	}
	if x.g.opts.Tier1Token != "" {
		req.Header.Set("Authorization", "Bearer "+x.g.opts.Tier1Token)
	}
	req.Header.Set(openai.HeaderRequestID, x.requestID)
	req.Header.Set("X-Infergate-Tenant", x.t.ID)
	x.injectTrace(req.Header)
	tr.sent = time.Now()
	return x.g.opts.Transport.RoundTrip(req)
}

// failoverStatus returns the error for an answer another cluster should
// get a chance at, or nil when this answer is the client's.
func failoverStatus(resp *http.Response) error {
	switch code := resp.StatusCode; {
	case code >= 500, code == http.StatusTooManyRequests,
		// Stale model list: another cluster may serve it (not a fault).
		code == http.StatusNotFound:
		return &route.StatusError{Code: code}
	case code == http.StatusUnauthorized, code == http.StatusForbidden:
		// Tier 1 refused Tier 2's own token: a misconfigured cluster, not
		// the client's fault; it counts against the cluster.
		return fmt.Errorf("tier1 rejected tier2's token (HTTP %d)", code)
	}
	return nil
}

// relayError passes on a 4xx that is the request's own fault: Tier 1's
// answer is the answer.
func (x *exchange) relayError(resp *http.Response) (attemptResult, error) {
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	x.w.Header().Set("Content-Type", resp.Header.Get("Content-Type"))
	x.w.WriteHeader(resp.StatusCode)
	_, _ = x.w.Write(b)
	return resultDone, &route.StatusError{Code: resp.StatusCode}
}

// relayBuffered relays a non-streaming answer, buffered first so a failure
// while reading it can still fail over.
func (x *exchange) relayBuffered(tr *try, resp *http.Response) (attemptResult, error) {
	limit := x.g.opts.MaxBufferedResponse
	buf, err := io.ReadAll(io.LimitReader(resp.Body, limit))
	if err != nil {
		return retryOrDone(fmt.Errorf("reading response: %w", x.cause(tr, err)))
	}
	tr.timer.Stop()
	var u struct {
		Usage *usage `json:"usage"`
	}
	if json.Unmarshal(buf, &u) == nil && u.Usage != nil {
		x.usage = u.Usage.normalize()
	}
	h := x.w.Header()
	h.Set("Content-Type", resp.Header.Get("Content-Type"))
	if int64(len(buf)) < limit {
		h.Set("Content-Length", strconv.Itoa(len(buf)))
	}
	x.w.WriteHeader(resp.StatusCode)
	if _, err := x.w.Write(buf); err != nil {
		return resultDone, route.ErrClientCanceled
	}
	if int64(len(buf)) >= limit {
		// Too big to buffer: the rest streams through, committed.
		if _, err := io.Copy(x.w, resp.Body); err != nil {
			return resultDone, x.cause(tr, err)
		}
	}
	return resultDone, nil
}
