package gateway

// This file is the gateway's routing decision without the proxy: an
// external data plane (Envoy through ext_proc, see tier1/extproc) hands in
// a request's path, headers and body, gets a pod back, forwards the request
// itself and reports the response's progress so the tracker's in-flight
// accounting stays right. It reuses the proxy's parser, model resolution,
// queue and scheduler; nothing here changes the HTTP path.

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/infergate/infergate/tier1/picker"
)

// PickRequest is one inference request routed by an external data plane.
type PickRequest struct {
	// Path is the request path (a query string is ignored); it selects the
	// prompt field the body must carry, as on the HTTP listener.
	Path string
	// Method is the HTTP method; "" is taken as POST.
	Method string
	// Header holds the client's request headers (canonical keys).
	Header http.Header
	// Body is the whole request body. It is read, never modified.
	Body []byte
	// AuthDone tells the gateway the data plane authenticated the client:
	// the bearer-token check is skipped and the client is not trusted with
	// X-Infergate-Priority (the gateway cannot tell who was authenticated).
	// When false, the configured tokens are checked exactly as on the HTTP
	// listener.
	AuthDone bool
}

// PickError is a request the gateway refuses; the data plane answers the
// client with Status and an OpenAI-style error (Code, Message).
type PickError struct {
	Status  int
	Code    string
	Message string
	// RetryAfter is set for 429 (shed): the client may retry after it.
	RetryAfter time.Duration
}

func (e *PickError) Error() string {
	return fmt.Sprintf("%d %s: %s", e.Status, e.Code, e.Message)
}

// Pick is the routing decision for one request. The caller forwards the
// request to Address (or, if that fails, to Fallbacks in order) and
// reports what happens: Served if another pod than the pick served it,
// Response and Body as the response arrives, and Done exactly once when the
// request ends in any way (including the client going away). Methods are
// safe for concurrent use; all are no-ops after Done.
type Pick struct {
	Pod       string   // chosen pod's name
	Address   string   // chosen pod's host:port
	Fallbacks []string // next-ranked pods' host:port, best first
	Model     string   // model as the client named it
	Pool      string   // the model's pool
	// UpstreamToken, if not empty, is the bearer token pods expect
	// (upstream.token_*); the client's Authorization must be replaced by
	// it. When empty, the client's Authorization must be removed.
	UpstreamToken string
	// PodHeader is the response header naming the serving pod ("" when
	// disabled with pod_header: "-").
	PodHeader string

	g          *Gateway
	pool       *poolState
	req        *picker.Request
	cb         *cycleBuf
	start      time.Time
	addrs      map[string]string // address -> pod name, for Served
	mu         sync.Mutex
	pod        string // pod the tracker has the request on
	dispatched time.Time
	status     int
	ft         firstToken
	done       bool
}

// inferenceEndpoint maps a request path to its endpoint kind.
func inferenceEndpoint(path string) (endpoint, bool) {
	path, _, _ = strings.Cut(path, "?")
	for _, ep := range inferenceEndpoints {
		if path == ep.path {
			return ep, true
		}
	}
	return endpoint{}, false
}

// Pick parses, resolves and schedules pr exactly as the HTTP listener does
// before proxying (same parser, adapter resolution, queue and scheduler),
// and records the dispatch to the chosen pod with the tracker. A refused
// request returns a *PickError. ctx bounds queueing (the request timeout
// applies too): cancel it when the client goes away.
func (g *Gateway) Pick(ctx context.Context, pr PickRequest) (*Pick, error) {
	start := time.Now()
	st := g.state.Load()
	cfg := st.cfg
	h := pr.Header
	if h == nil {
		h = http.Header{}
	}
	trusted := false
	if !pr.AuthDone && !cfg.Auth.Disabled {
		if !st.tokens.check(&http.Request{Header: h}) {
			return nil, g.refuse("", "", http.StatusUnauthorized, "invalid_api_key", "missing or invalid bearer token")
		}
		trusted = true
	}
	ep, ok := inferenceEndpoint(pr.Path)
	if !ok {
		return nil, g.refuse("", "", http.StatusNotFound, "not_found", "no such endpoint: "+pr.Path)
	}
	if pr.Method != "" && pr.Method != http.MethodPost {
		return nil, g.refuse("", "", http.StatusMethodNotAllowed, "method_not_allowed", "use POST")
	}
	if int64(len(pr.Body)) > cfg.MaxBodyBytes {
		return nil, g.refuse("", "", http.StatusRequestEntityTooLarge, "request_too_large",
			fmt.Sprintf("request body exceeds %d bytes", cfg.MaxBodyBytes))
	}
	// The buffer goes back to the pool at Done: the request's block hashes
	// live in it until then.
	cb := cycleBufs.Get().(*cycleBuf)
	ctx, sp := g.tracePick(ctx, h, pr.Path, trusted)
	defer sp.End()
	wctx, cancel := context.WithTimeout(ctx, cfg.Timeouts.Request)
	defer cancel()
	req, pool, rf := g.route(wctx, st, routeInput{ep: ep, data: pr.Body, id: h.Get("X-Request-Id"),
		prioHdr: h.Get(HeaderPriority), sloHdr: h.Get(HeaderTTFTSLO), sessionHdr: h.Get(HeaderSessionID), trusted: trusted}, cb)
	if rf != nil {
		cycleBufs.Put(cb)
		e := g.refuse(rf.model, rf.pool, rf.status, rf.code, rf.reason)
		e.RetryAfter = rf.retryAfter
		return nil, e
	}
	model := req.Model

	ranked := cb.res.Ranked[:min(cfg.Retry.MaxAttempts, len(cb.res.Ranked))]
	p := &Pick{
		Pod:           ranked[0].Name,
		Address:       ranked[0].Address,
		Model:         model,
		Pool:          pool.cfg.Name,
		UpstreamToken: st.upstreamToken,
		g:             g,
		pool:          pool,
		req:           req,
		cb:            cb,
		start:         start,
		addrs:         make(map[string]string, len(ranked)),
		pod:           ranked[0].Name,
		dispatched:    time.Now(),
	}
	if cfg.PodHeader != "-" {
		p.PodHeader = cfg.PodHeader
	}
	for i, r := range ranked {
		p.addrs[r.Address] = r.Name
		if i > 0 {
			p.Fallbacks = append(p.Fallbacks, r.Address)
		}
	}
	p.ft = firstToken{g: g, req: req, pool: pool.cfg.Name, queue: pool.queue, start: start, dispatched: p.dispatched}
	g.tracker.Dispatched(p.pod, req)
	g.scraper.Active(p.pod)
	return p, nil
}

// refuse counts a refused request and returns its error.
func (g *Gateway) refuse(model, pool string, status int, code, msg string) *PickError {
	g.m.requests.WithLabelValues(model, pool, "", strconv.Itoa(status)).Inc()
	return &PickError{Status: status, Code: code, Message: msg}
}

// Served tells the gateway which address served the request, when the
// data plane fell back from Address to a pod of Fallbacks: the tracker
// moves the request there (Done on the first, Dispatched on the next, as
// a retry in the proxy does). Unknown or unchanged addresses are ignored.
func (p *Pick) Served(addr string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	name, ok := p.addrs[addr]
	if p.done || !ok || name == p.pod {
		return
	}
	p.g.tracker.Done(p.pod, p.req)
	p.pod = name
	p.dispatched = time.Now()
	p.ft.dispatched = p.dispatched
	p.g.tracker.Dispatched(p.pod, p.req)
	p.g.scraper.Active(p.pod)
}

// ServedPod returns the pod the request is on (the pick, or the one
// reported by Served).
func (p *Pick) ServedPod() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.pod
}

// Response reports the response's status and headers. A response with an
// error status or no body counts as the first token (the whole response).
func (p *Pick) Response(status int, header http.Header, endOfStream bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.done {
		return
	}
	p.status = status
	p.ft.sse = isEventStream(header)
	if endOfStream || status >= 300 {
		p.ft.observe(p.pod, nil, true)
	}
}

// Body reports one chunk of the response body as it passes through; the
// first chunk carrying generated text (the proxy's rule: a chat stream may
// open with a role-only event) is the first token.
func (p *Pick) Body(chunk []byte) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.done || len(chunk) == 0 {
		return
	}
	p.ft.observe(p.pod, chunk, false)
}

// Done ends the request: the tracker takes it off its pod's in-flight
// count and the pool's queue is woken. complete is false when the request
// ended before its response did (the client or the data plane went away);
// it is then counted with status 499. Calls after the first are no-ops.
func (p *Pick) Done(complete bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.done {
		return
	}
	p.done = true
	p.g.tracker.Done(p.pod, p.req)
	p.pool.queue.signal()
	status := "499"
	if complete && p.status != 0 {
		status = strconv.Itoa(p.status)
	}
	p.g.m.requests.WithLabelValues(p.Model, p.Pool, p.pod, status).Inc()
	p.g.m.e2e.WithLabelValues(p.Model, p.Pool).Observe(time.Since(p.start).Seconds())
	p.req.BlockHashes = nil
	cycleBufs.Put(p.cb)
	p.cb = nil
}

// MaxBodyBytes is the configured request body limit (max_body_bytes), so a
// data plane streaming the body in chunks can stop accumulating early.
func (g *Gateway) MaxBodyBytes() int64 { return g.state.Load().cfg.MaxBodyBytes }

// Timeouts are the configured timeouts (timeouts), for a data plane
// serving its own listener (ext_proc) with the same client-side bounds.
func (g *Gateway) Timeouts() TimeoutConfig { return g.state.Load().cfg.Timeouts }
