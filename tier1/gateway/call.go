package gateway

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"sync"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/infergate/infergate/shared/cluster"
	"github.com/infergate/infergate/shared/openai"
	"github.com/infergate/infergate/shared/sse"
	"github.com/infergate/infergate/tier1/picker"
)

// call is one inference request on its way through Tier 1, whichever
// front end it came in on (the HTTP proxy, proxy.go, or an external data
// plane through Pick, pick.go). Its lifecycle is the same for both:
//
//	enter → route (parse, resolve, admission) → dispatch to a pod →
//	observe the response (first token) → done
//
// and the tracker's bookkeeping, first-token wiring and entry checks exist
// only here. A call is used by one goroutine at a time (Pick locks).
type call struct {
	g       *Gateway
	st      *state // the configuration the request started under
	ep      endpoint
	start   time.Time
	id      string // X-Request-Id, validated; every log line carries it
	tenant  string // Tier 2's tenant, from an authenticated caller: logs and traces only
	trusted bool   // the caller authenticated with a configured token

	// Internal headers, read before they are stripped.
	prioHdr, sloHdr, sessionHdr string

	data []byte // the request body, shared read-only by every attempt
	req  *picker.Request
	pool *poolState
	cb   *cycleBuf // scheduling scratch; holds req's block hashes until done

	pod        string    // the pod the tracker has the request on ("" none)
	served     string    // the last pod dispatched to, for the request's metrics
	dispatched time.Time // when it went to pod
	sse        bool      // the response is an event stream
	watch      sse.TokenWatch
	token      bool       // the first token was seen
	span       trace.Span // the attempt's, when tracing (trace.go)
	ended      bool

	// For the decision log (decisions.go): how admission went, and how
	// many pods the request was dispatched to.
	wait     waitNote
	cycles   uint16 // scheduling cycles run
	attempts int
	decided  bool // recorded as decision decSeq
	decSeq   uint64

	up upstreamCall // the HTTP front end's (proxy.go)
}

// cycleBuf is per-request scratch reused across requests: the pod
// snapshots handed to the scheduler and its result.
type cycleBuf struct {
	pods   []picker.Pod
	ptrs   []*picker.Pod
	res    picker.Result
	hashes []uint64
}

var cycleBufs = sync.Pool{New: func() any { return &cycleBuf{} }}

// enter starts a call: the checks both front ends make before reading the
// body, on the request's method and headers. The request ID is the
// caller's when well-formed (openai.RequestID), else a new one; the
// tenant (cluster.HeaderTenant) is read from an authenticated caller only.
func (g *Gateway) enter(st *state, ep endpoint, method string, h http.Header, trusted bool) (*call, *refusal) {
	c := &call{g: g, st: st, ep: ep, start: time.Now(), trusted: trusted,
		id:      openai.RequestID(h.Get(cluster.HeaderRequestID)),
		prioHdr: h.Get(HeaderPriority), sloHdr: h.Get(HeaderTTFTSLO), sessionHdr: h.Get(HeaderSessionID)}
	if t := h.Get(cluster.HeaderTenant); trusted && openai.ValidRequestID(t) {
		c.tenant = t
	}
	if method != "" && method != http.MethodPost {
		return c, &refusal{status: http.StatusMethodNotAllowed, code: "method_not_allowed", reason: "use POST"}
	}
	return c, nil
}

// bodyTooLarge is the refusal of a body over max_body_bytes.
func (c *call) bodyTooLarge() *refusal {
	return &refusal{status: http.StatusRequestEntityTooLarge, code: "request_too_large",
		reason: fmt.Sprintf("request body exceeds %d bytes", c.st.cfg.MaxBodyBytes)}
}

// refuse ends a refused request: counted (the front end answers it), its
// scratch returned.
func (c *call) refuse(rf *refusal) {
	c.ended = true
	c.g.m.requests.WithLabelValues(rf.model, rf.pool, "", strconv.Itoa(rf.status)).Inc()
	if c.cb != nil {
		cycleBufs.Put(c.cb)
		c.cb = nil
	}
}

// dispatch puts the request on pod: the tracker counts it in flight there
// (moving it from the pod it was on, if any), and the scraper keeps the
// pod on its fast schedule.
func (c *call) dispatch(pod string) {
	c.release()
	c.attempts++
	c.pod, c.served, c.dispatched = pod, pod, time.Now()
	c.g.tracker.Dispatched(pod, c.req)
	c.g.scraper.Active(pod)
}

// release takes the request off its pod (an attempt ended) and wakes the
// pool's queue: a slot is free.
func (c *call) release() {
	if c.pod == "" {
		return
	}
	c.g.tracker.Done(c.pod, c.req)
	c.pod = ""
	c.pool.queue.signal()
}

// respond notes the response's kind before its body: an event stream's
// first token is the first event carrying one, any other body's its first
// byte; a response without a body (or, with force, one whose status says
// it is not the answer) counts as its first token at once.
func (c *call) respond(h http.Header, force bool) {
	c.sse = sse.IsEventStream(h)
	if force {
		c.firstToken()
	}
}

// observe looks at the next chunk of the response body as a data plane
// that relays it itself sees it (chunks split anywhere).
func (c *call) observe(chunk []byte) {
	if c.token || len(chunk) == 0 {
		return
	}
	if !c.sse || c.watch.Feed(chunk) {
		c.firstToken()
	}
}

// firstToken records the request's time to first token, once: the
// tracker learns the pod's prefill is over, the queue is woken (a request
// held for that pod's prefill may go now), the metric and the trace.
func (c *call) firstToken() {
	if c.token || c.pod == "" {
		return
	}
	c.token = true
	c.watch.Reset()
	c.g.tracker.FirstToken(c.pod, c.req, time.Since(c.dispatched))
	c.pool.queue.signal()
	c.g.m.ttft.WithLabelValues(c.req.Model, c.pool.cfg.Name).Observe(time.Since(c.start).Seconds())
	traceFirstToken(c.span, c.start)
}

// done ends a routed request with its status label: off its pod, counted,
// its scratch returned. Later calls are no-ops.
func (c *call) done(status string) {
	if c.ended {
		return
	}
	c.ended = true
	c.release()
	c.endDecision(status)
	pool := c.pool.cfg.Name
	c.g.m.requests.WithLabelValues(c.req.Model, pool, c.served, status).Inc()
	c.g.m.e2e.WithLabelValues(c.req.Model, pool).Observe(time.Since(c.start).Seconds())
	c.req.BlockHashes = nil
	if c.cb != nil {
		cycleBufs.Put(c.cb)
		c.cb = nil
	}
}

// log writes a log line about the call: its request ID first, its tenant
// when known.
func (c *call) log(level slog.Level, msg string, args ...any) {
	ctx := context.Background()
	if !c.g.log.Enabled(ctx, level) {
		return
	}
	attrs := make([]any, 0, 4+len(args))
	attrs = append(attrs, "request_id", c.id)
	if c.tenant != "" {
		attrs = append(attrs, "tenant", c.tenant)
	}
	c.g.log.Log(ctx, level, msg, append(attrs, args...)...)
}
