package gateway

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/infergate/infergate/shared/cluster"
	"github.com/infergate/infergate/shared/openai"
	"github.com/infergate/infergate/shared/sse"
	"github.com/infergate/infergate/tier1/picker"
)

// Internal headers (shared/cluster): set by infergate (or a GIE-style
// gateway) between its own hops, trusted from clients only as documented.
const (
	HeaderPriority = cluster.HeaderPriority // request priority, trusted clients only
	HeaderTTFTSLO  = cluster.HeaderTTFTSLO  // per-request TTFT objective in ms
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

// HeaderSessionID is the client's conversation key (AIBrix's and
// production-stack's x-session-id). It is an ordinary client header,
// forwarded as is; the router reads it only as a session-affinity hint.
const HeaderSessionID = "X-Session-Id"

// maxSessionKey bounds the session key kept per request; longer keys are
// cut (the picker hashes it anyway).
const maxSessionKey = 256

// sessionKey is the request's session key for the session-affinity score:
// the x-session-id header, else the body's prompt_cache_key, else its
// user. Client-supplied, so it only ever feeds a soft score.
func sessionKey(hdr string, b *inferenceBody) string {
	k := hdr
	if k == "" {
		k = b.PromptCacheKey
	}
	if k == "" {
		k = b.User
	}
	if len(k) > maxSessionKey {
		k = k[:maxSessionKey]
	}
	return k
}

// errBodyTooLarge is returned by readBody when the body exceeds the limit.
var errBodyTooLarge = errors.New("request body too large")

// readBody reads the whole request body, at most limit bytes. With a known
// Content-Length it makes exactly one allocation and one copy (kernel to
// buffer); the returned slice is then shared read-only by the JSON decoder,
// the prefix hasher and every upstream attempt.
func readBody(w http.ResponseWriter, r *http.Request, limit int64) ([]byte, error) {
	if r.ContentLength > limit {
		return nil, errBodyTooLarge
	}
	body := http.MaxBytesReader(w, r.Body, limit)
	var buf []byte
	if r.ContentLength >= 0 {
		buf = make([]byte, r.ContentLength)
		if _, err := io.ReadFull(body, buf); err != nil {
			return nil, classifyReadErr(err)
		}
		return buf, nil
	}
	buf, err := io.ReadAll(body)
	if err != nil {
		return nil, classifyReadErr(err)
	}
	return buf, nil
}

func classifyReadErr(err error) error {
	var mbe *http.MaxBytesError
	if errors.As(err, &mbe) {
		return errBodyTooLarge
	}
	return fmt.Errorf("read request body: %w", err)
}

// bodyReadAnswer is the error code and message a client gets for a body
// that could not be read. The cause is a net.OpError that names both
// sockets ("read tcp 10.0.3.7:8000->...: i/o timeout"): it goes to the log,
// the client gets the plain reason.
func bodyReadAnswer(err error, timeout time.Duration) (code, msg string) {
	var ne net.Error
	if errors.Is(err, os.ErrDeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout()) {
		return "body_timeout", fmt.Sprintf("request body not received within %v", timeout)
	}
	return "invalid_body", "the request body could not be read in full"
}

// inferenceBody holds the only request fields the router reads; the rest of
// the body is forwarded untouched. The prompt-carrying fields alias the
// body: the prefix hasher reads them without a copy.
type inferenceBody struct {
	openai.Request
}

// endpoint kinds and the field each requires.
type endpoint struct {
	path  string
	field string // required prompt-carrying field
}

var (
	epChat        = endpoint{"/v1/chat/completions", "messages"}
	epCompletions = endpoint{"/v1/completions", "prompt"}
	epEmbeddings  = endpoint{"/v1/embeddings", "input"}
	epResponses   = endpoint{"/v1/responses", "input"}   // OpenAI Responses
	epMessages    = endpoint{"/v1/messages", "messages"} // Anthropic Messages
	epCountTokens = endpoint{"/v1/messages/count_tokens", "messages"}
)

// inferenceEndpoints are every endpoint the router proxies.
var inferenceEndpoints = []endpoint{epChat, epCompletions, epEmbeddings, epResponses, epMessages, epCountTokens}

// parseBody decodes the routing fields of an OpenAI request body with
// openai.ParseRequest: exact keys, one spelling of each field the router
// reads (a body the engine would read differently is refused), counts
// within openai.MaxTokensLimit and openai.MaxN. Errors are
// *openai.RequestError; see requestErrorCode.
func parseBody(ep endpoint, data []byte) (*inferenceBody, error) {
	r, err := openai.ParseRequest(data)
	if err != nil {
		return nil, err
	}
	b := &inferenceBody{Request: *r}
	if b.Model == "" {
		return nil, &openai.RequestError{Code: "missing_model", Param: "model", Message: `field "model" is required`}
	}
	if len(b.promptBytes(ep)) == 0 {
		return nil, &openai.RequestError{Code: "missing_" + ep.field, Param: ep.field, Message: fmt.Sprintf("field %q is required", ep.field)}
	}
	return b, nil
}

// requestErrorCode is the OpenAI error code for a parseBody error.
func requestErrorCode(err error) string {
	var re *openai.RequestError
	if errors.As(err, &re) && re.Code != "" {
		return re.Code
	}
	return "invalid_request"
}

// promptBytes is the text the prefix hash and token estimate cover: the
// raw messages JSON (as GIE hashes it), or the prompt / input; for the
// Responses and Anthropic APIs the system text (instructions, system)
// comes first, as the engine's chat template puts it.
func (b *inferenceBody) promptBytes(ep endpoint) []byte {
	var sys, main []byte
	switch ep.field {
	case "messages":
		main = b.Messages
	case "prompt":
		main = b.Prompt
	default:
		main = b.Input
	}
	switch ep {
	case epResponses:
		sys = b.Instructions
	case epMessages, epCountTokens:
		sys = b.System
	}
	if len(sys) == 0 || len(main) == 0 {
		return main
	}
	return append(append(append(make([]byte, 0, len(sys)+1+len(main)), sys...), '\n'), main...)
}

// maxTokens is the most completion tokens the request may generate over
// its n choices (0 if it names no limit): openai.Request.OutputTokens, the
// rule Tier 2 applies too.
func (b *inferenceBody) maxTokens(ep endpoint) int {
	return b.OutputTokens(openai.APIForPath(ep.path), 0)
}

// hopHeaders are hop-by-hop headers (RFC 9110 §7.6.1), never forwarded.
var hopHeaders = []string{
	"Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authenticate",
	"Proxy-Authorization", "Te", "Trailer", "Transfer-Encoding", "Upgrade",
}

// copyResponseHeaders copies a pod's response headers minus hop-by-hop and
// internal ones (a pod must not be able to spoof the router's headers).
func copyResponseHeaders(dst, src http.Header) {
	for k, v := range src {
		if IsInternalHeader(k) {
			continue
		}
		dst[k] = v
	}
	removeHopHeaders(dst, src)
}

// removeHopHeaders deletes hop-by-hop headers from h, including those named
// in connSrc's Connection header.
func removeHopHeaders(h, connSrc http.Header) {
	for _, f := range connSrc["Connection"] {
		for _, name := range strings.Split(f, ",") {
			if name = strings.TrimSpace(name); name != "" {
				h.Del(name)
			}
		}
	}
	for _, k := range hopHeaders {
		delete(h, k)
	}
}

func clientIP(r *http.Request) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return ""
	}
	return host
}

// tokenSet holds SHA-256 digests of the accepted tokens, so comparison is
// constant-time and independent of token length.
type tokenSet [][sha256.Size]byte

func newTokenSet(tokens []string) tokenSet {
	s := make(tokenSet, len(tokens))
	for i, t := range tokens {
		s[i] = sha256.Sum256([]byte(t))
	}
	return s
}

// check reports whether the request carries an accepted bearer token. It
// compares against every token without an early exit.
func (s tokenSet) check(r *http.Request) bool {
	h := r.Header.Get("Authorization")
	const prefix = "Bearer "
	if len(h) <= len(prefix) || !strings.EqualFold(h[:len(prefix)], prefix) {
		return false
	}
	got := sha256.Sum256([]byte(strings.TrimSpace(h[len(prefix):])))
	ok := 0
	for i := range s {
		ok |= subtle.ConstantTimeCompare(got[:], s[i][:])
	}
	return ok == 1
}
