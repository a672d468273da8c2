package gateway

// This file is the request lifecycle's second front end, for an external
// data plane (Envoy through ext_proc, see tier1/extproc): it hands in a
// request's path, headers and body, gets a pod back, forwards the request
// itself and reports the response's progress so the tracker's in-flight
// accounting stays right. Entry checks, routing, dispatch and the
// first-token rule are the call's (call.go, route.go), as on the HTTP
// listener.

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"
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
	// RequestID is the request's ID, as on the HTTP listener: the
	// client's X-Request-Id when well-formed, else a new one. The data
	// plane should send it to the pod and back to the client.
	RequestID string
	// UpstreamToken, if not empty, is the bearer token pods expect
	// (upstream.token_*); the client's Authorization must be replaced by
	// it. When empty, the client's Authorization must be removed.
	UpstreamToken string
	// PodHeader is the response header naming the serving pod ("" when
	// disabled with pod_header: "-").
	PodHeader string

	mu     sync.Mutex
	c      *call
	addrs  map[string]string // address -> pod name, for Served
	status int
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

// Pick is the ext_proc front end of the request lifecycle: it enters,
// routes and dispatches pr exactly as the HTTP listener does (same entry
// checks, parser, adapter resolution, queue and scheduler) and returns the
// pick; the data plane then reports the response's progress. A refused
// request returns a *PickError. ctx bounds queueing (the request timeout
// applies too): cancel it when the client goes away.
func (g *Gateway) Pick(ctx context.Context, pr PickRequest) (*Pick, error) {
	st := g.state.Load()
	cfg := st.cfg
	h := pr.Header
	if h == nil {
		h = http.Header{}
	}
	trusted := false
	if !pr.AuthDone && !cfg.Auth.Disabled {
		if !st.tokens.check(&http.Request{Header: h}) {
			return nil, g.refuse(&refusal{status: http.StatusUnauthorized, code: "invalid_api_key", reason: "missing or invalid bearer token"})
		}
		trusted = true
	}
	ep, ok := inferenceEndpoint(pr.Path)
	if !ok {
		return nil, g.refuse(&refusal{status: http.StatusNotFound, code: "not_found", reason: "no such endpoint: " + pr.Path})
	}
	c, rf := g.enter(st, ep, pr.Method, h, trusted)
	if rf == nil && int64(len(pr.Body)) > cfg.MaxBodyBytes {
		rf = c.bodyTooLarge()
	}
	if rf != nil {
		c.refuse(rf)
		return nil, pickError(rf)
	}
	c.data = pr.Body
	ctx, sp := g.tracePick(ctx, h, pr.Path, trusted, c.tenant)
	defer sp.End()
	wctx, cancel := context.WithTimeout(ctx, cfg.Timeouts.Request)
	defer cancel()
	if rf := c.route(wctx); rf != nil {
		c.refuse(rf)
		return nil, pickError(rf)
	}
	ranked := c.ranked()
	p := &Pick{
		Pod:           ranked[0].Name,
		Address:       ranked[0].Address,
		Model:         c.req.Model,
		Pool:          c.pool.cfg.Name,
		RequestID:     c.id,
		UpstreamToken: st.upstreamToken,
		c:             c,
		addrs:         make(map[string]string, len(ranked)),
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
	c.dispatch(p.Pod)
	return p, nil
}

// refuse counts a request refused before it became a call.
func (g *Gateway) refuse(rf *refusal) *PickError {
	g.m.requests.WithLabelValues(rf.model, rf.pool, "", strconv.Itoa(rf.status)).Inc()
	return pickError(rf)
}

func pickError(rf *refusal) *PickError {
	return &PickError{Status: rf.status, Code: rf.code, Message: rf.reason, RetryAfter: rf.retryAfter}
}

// Served tells the gateway which address served the request, when the
// data plane fell back from Address to a pod of Fallbacks: the tracker
// moves the request there, as a retry in the proxy does. Unknown or
// unchanged addresses are ignored.
func (p *Pick) Served(addr string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	name, ok := p.addrs[addr]
	if p.c.ended || !ok || name == p.c.pod {
		return
	}
	p.c.dispatch(name)
}

// ServedPod returns the pod the request is on (the pick, or the one
// reported by Served).
func (p *Pick) ServedPod() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.c.served
}

// Response reports the response's status and headers. A response with an
// error status or no body counts as the first token (the whole response).
func (p *Pick) Response(status int, header http.Header, endOfStream bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.c.ended {
		return
	}
	p.status = status
	p.c.respond(header, endOfStream || status >= 300)
}

// Body reports one chunk of the response body as it passes through; the
// first token is found as on the HTTP listener (shared/sse: a chat stream
// may open with a role-only event).
func (p *Pick) Body(chunk []byte) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.c.ended {
		p.c.observe(chunk)
	}
}

// Done ends the request: the tracker takes it off its pod's in-flight
// count and the pool's queue is woken. complete is false when the request
// ended before its response did (the client or the data plane went away);
// it is then counted with status 499. Calls after the first are no-ops.
func (p *Pick) Done(complete bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	status := "499"
	if complete && p.status != 0 {
		status = strconv.Itoa(p.status)
	}
	p.c.done(status)
}

// MaxBodyBytes is the configured request body limit (max_body_bytes), so a
// data plane streaming the body in chunks can stop accumulating early.
func (g *Gateway) MaxBodyBytes() int64 { return g.state.Load().cfg.MaxBodyBytes }

// Timeouts are the configured timeouts (timeouts), for a data plane
// serving its own listener (ext_proc) with the same client-side bounds.
func (g *Gateway) Timeouts() TimeoutConfig { return g.state.Load().cfg.Timeouts }
