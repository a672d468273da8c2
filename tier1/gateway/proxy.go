package gateway

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"time"

	"github.com/infergate/infergate/shared/cluster"
	"github.com/infergate/infergate/shared/openai"
	"github.com/infergate/infergate/shared/relay"
	"github.com/infergate/infergate/tier1/admission"
	"github.com/infergate/infergate/tier1/picker"
)

// handleInference is the HTTP front end of the request lifecycle, for
// every inference endpoint: enter, read the body, route, then try the
// ranked pods in turn, relaying the first answer (shared/relay).
func (g *Gateway) handleInference(w http.ResponseWriter, r *http.Request, st *state, ep endpoint, trusted bool) {
	r = g.traceRequest(r, trusted)
	defer endRequest(r)
	c, rf := g.enter(st, ep, r.Method, r.Header, trusted)
	// One ID for the request at the pod, in every log line and in the
	// answer (errors too).
	w.Header().Set(cluster.HeaderRequestID, c.id)
	traceTenant(r.Context(), c.tenant)
	if rf != nil {
		closeAfter(w)
		w.Header().Set("Allow", http.MethodPost)
		c.answer(w, rf)
		return
	}
	// A client trickling its body must not hold a handler forever. On
	// failure the deadline stays and the connection closes: clearing it
	// would let the server wait on the rest of the body after the answer.
	cfg := st.cfg
	rc := http.NewResponseController(w)
	_ = rc.SetReadDeadline(time.Now().Add(cfg.Timeouts.ReadBody))
	data, err := readBody(w, r, cfg.MaxBodyBytes)
	if err != nil {
		closeAfter(w)
		if errors.Is(err, errBodyTooLarge) {
			c.answer(w, c.bodyTooLarge())
			return
		}
		code, msg := bodyReadAnswer(err, cfg.Timeouts.ReadBody)
		c.log(slog.LevelDebug, "request body not read", "err", err)
		c.answer(w, &refusal{status: http.StatusBadRequest, code: code, reason: msg})
		return
	}
	_ = rc.SetReadDeadline(time.Time{})
	c.data = data
	ctx, cancel := context.WithTimeout(r.Context(), cfg.Timeouts.Request)
	defer cancel()
	if rf := c.route(ctx); rf != nil {
		if rf.status == admission.StatusClientClosed {
			c.refuse(rf) // nobody to answer: count it only
			return
		}
		if rf.retryAfter > 0 {
			w.Header().Set("Retry-After", strconv.Itoa(int(rf.retryAfter/time.Second)))
		}
		c.answer(w, rf)
		return
	}
	header := upstreamHeaders(stripInternal(r.Header), clientIP(r), st.upstreamToken)
	header.Set(cluster.HeaderRequestID, c.id)
	c.up = upstreamCall{w: w, r: r, header: header}
	c.proxy(ctx, &c.up)
}

// answer refuses the request with an OpenAI error.
func (c *call) answer(w http.ResponseWriter, rf *refusal) {
	c.refuse(rf)
	openai.Errorf(w, rf.status, rf.code, rf.reason)
}

// upstreamCall is what every upstream attempt of a proxied request needs
// besides the call.
type upstreamCall struct {
	w      http.ResponseWriter
	r      *http.Request
	header http.Header // upstream request headers
}

// attemptError is why one attempt failed before its first response byte.
type attemptError struct {
	reason string // metric label: connect, status_5xx, status_429, status_404, status_auth, reset, timeout, client_gone
	err    error
}

// proxy sends the request to the ranked pods in turn, moving to the next
// when one fails before its first response byte (connection, timeout, or
// a status relay.Retryable names), within the retry bounds.
func (c *call) proxy(ctx context.Context, u *upstreamCall) {
	cfg := c.st.cfg
	pool := c.pool.cfg.Name
	ranked := c.ranked()
	budgetEnd := c.start.Add(cfg.Retry.Budget)
	var last *attemptError
	for i, pod := range ranked {
		if i > 0 {
			if time.Now().After(budgetEnd) {
				break
			}
			c.g.m.retries.WithLabelValues(pool, last.reason).Inc()
			c.log(slog.LevelDebug, "retrying on next pod", "pool", pool, "failed", ranked[i-1].Name,
				"reason", last.reason, "err", last.err, "next", pod.Name)
		}
		// Whether a failure may be retried is decided when it happens: an
		// attempt that outlives the budget relays its pod's answer instead.
		hasNext := i+1 < len(ranked)
		canRetry := func() bool { return hasNext && time.Now().Before(budgetEnd) }
		c.dispatch(pod.Name)
		if last = c.g.tracedAttempt(ctx, c, u, pod, i+1, canRetry); last == nil {
			return // relayed, and done
		}
		c.release()
		if u.r.Context().Err() != nil {
			c.done("499") // client gone
			return
		}
	}
	status, code := http.StatusServiceUnavailable, "upstream_unavailable"
	if last != nil && last.reason == "timeout" {
		status, code = http.StatusGatewayTimeout, "upstream_timeout"
	}
	c.served = "" // no pod answered
	c.done(strconv.Itoa(status))
	openai.Errorf(u.w, status, code, noAnswer(ranked, c.attempts, last))
}

// noAnswer says why no pod answered: how many of the ranked pods were
// tried and how the last one failed (the reason's label, never the error,
// which names sockets).
func noAnswer(ranked []*picker.Pod, tried int, last *attemptError) string {
	tried = min(max(tried, 1), len(ranked))
	if last == nil || tried == 0 {
		return "no model server could take the request"
	}
	return fmt.Sprintf("no model server could take the request: tried %d of %d ranked pods, the last (%s) failed: %s",
		tried, len(ranked), ranked[tried-1].Name, last.reason)
}

// attempt runs one upstream attempt on pod. It returns nil once a
// response has been relayed (whole or not) and the call is done; an error
// means nothing was written to the client and the caller may try another
// pod.
func (c *call) attempt(ctx context.Context, u *upstreamCall, pod *picker.Pod, canRetry func() bool) *attemptError {
	cfg := c.st.cfg
	at := relay.Start(ctx, relay.Options{FirstByte: cfg.Timeouts.FirstByte, Idle: cfg.Timeouts.Idle,
		Write: cfg.Timeouts.Write, API: openai.APIForPath(u.r.URL.Path), Client: u.r.Context()})
	defer at.Stop()
	out, err := http.NewRequestWithContext(at.Context(), http.MethodPost, c.g.upstreamScheme+"://"+pod.Address+u.r.URL.RequestURI(), bytes.NewReader(c.data))
	if err != nil {
		return &attemptError{"connect", err}
	}
	out.Header = c.g.upstreamHeader(ctx, u.header)
	out.ContentLength = int64(len(c.data))
	resp, err := c.g.transport.RoundTrip(out)
	if err != nil {
		if err = at.Err(err); errors.Is(err, relay.ErrTimeout) {
			return &attemptError{"timeout", err}
		}
		c.connectFailed(pod.Name, err)
		return &attemptError{"connect", err}
	}
	defer resp.Body.Close()
	traceStatus(ctx, resp.StatusCode)
	if relay.Retryable(resp.StatusCode) && canRetry() {
		relay.Discard(resp)
		return &attemptError{relay.StatusReason(resp.StatusCode), fmt.Errorf("status %d", resp.StatusCode)}
	}
	// Held back until the first body byte (an event stream's first
	// event): a pod that dies before it can still be retried without the
	// client noticing.
	if err := at.Open(resp); err != nil {
		reason := "reset"
		switch {
		case errors.Is(err, relay.ErrClientGone):
			reason = "client_gone"
		case errors.Is(err, relay.ErrTimeout):
			reason = "timeout"
		}
		return &attemptError{reason, err}
	}
	res := at.Relay(u.w, (*proxyHooks)(c), c.start.Add(cfg.Timeouts.MaxStream))
	status := strconv.Itoa(res.Status)
	switch {
	case res.ClientGone:
		status = "499"
	case res.Code != "":
		status = strconv.Itoa(res.CutStatus)
		if res.TooLong {
			c.log(slog.LevelInfo, "response cut at timeouts.max_stream", "pod", pod.Name)
		} else {
			c.log(slog.LevelWarn, "upstream response broke off", "pod", pod.Name, "err", res.Err, "timed_out", res.TimedOut)
		}
	}
	c.done(status)
	if res.Abort {
		// A body that is not an event stream broke off: cut the
		// connection so the client cannot mistake it for a whole one.
		panic(http.ErrAbortHandler)
	}
	return nil
}

// proxyHooks is the HTTP front end's part in the relay (relay.Hooks).
type proxyHooks call

// Header copies the pod's response headers minus hop-by-hop and internal
// ones (a pod must not be able to spoof the router's headers), then sets
// the request ID (the pod's own, if any, is not ours) and the pod header.
func (h *proxyHooks) Header(dst, src http.Header) {
	copyResponseHeaders(dst, stripInternal(src))
	dst.Set(cluster.HeaderRequestID, h.id)
	if ph := h.st.cfg.PodHeader; ph != "-" {
		dst.Set(ph, h.pod)
	}
}

// FirstToken is the call's first token (the tracker, the queue, the
// metric).
func (h *proxyHooks) FirstToken() { (*call)(h).firstToken() }

// Event relays every event as it came.
func (h *proxyHooks) Event(ev []byte) []byte { return ev }
