package gateway

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/infergate/infergate/shared/openai"
	"github.com/infergate/infergate/tier1/admission"
	"github.com/infergate/infergate/tier1/picker"
	"github.com/infergate/infergate/tier1/scrape"
)

// cycleBuf is per-request scratch reused across requests: the pod
// snapshots handed to the scheduler and its result.
type cycleBuf struct {
	pods   []picker.Pod
	ptrs   []*picker.Pod
	res    picker.Result
	hashes []uint64
}

var cycleBufs = sync.Pool{New: func() any { return &cycleBuf{} }}

var copyBufs = sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}

// handleInference is the request path of /v1/chat/completions,
// /v1/completions and /v1/embeddings.
func (g *Gateway) handleInference(w http.ResponseWriter, r *http.Request, st *state, ep endpoint, trusted bool) {
	start := time.Now()
	cfg := st.cfg
	r = g.traceRequest(r, trusted)
	defer endRequest(r)
	// One ID for the request at the pod, in every log line and in the
	// answer (errors too): the caller's when well-formed, else a new one.
	id := openai.RequestID(r.Header.Get(openai.HeaderRequestID))
	w.Header().Set(openai.HeaderRequestID, id)
	if r.Method != http.MethodPost {
		closeAfter(w)
		w.Header().Set("Allow", http.MethodPost)
		g.fail(w, "", "", http.StatusMethodNotAllowed, "method_not_allowed", "use POST")
		return
	}
	// Internal headers are read here, before they are stripped, and only
	// trusted as documented: priority from authenticated clients when
	// configured, the TTFT objective from any client that passed auth.
	prioHdr := r.Header.Get(HeaderPriority)
	sloHdr := r.Header.Get(HeaderTTFTSLO)

	// A client trickling its body must not hold a handler forever. On
	// failure the deadline stays and the connection closes: clearing it
	// would let the server wait on the rest of the body after the answer.
	rc := http.NewResponseController(w)
	_ = rc.SetReadDeadline(time.Now().Add(cfg.Timeouts.ReadBody))
	data, err := readBody(w, r, cfg.MaxBodyBytes)
	if err != nil {
		closeAfter(w)
		if errors.Is(err, errBodyTooLarge) {
			g.fail(w, "", "", http.StatusRequestEntityTooLarge, "request_too_large",
				fmt.Sprintf("request body exceeds %d bytes", cfg.MaxBodyBytes))
			return
		}
		code, msg := bodyReadAnswer(err, cfg.Timeouts.ReadBody)
		g.log.Debug("request body not read", "request_id", id, "err", err)
		g.fail(w, "", "", http.StatusBadRequest, code, msg)
		return
	}
	_ = rc.SetReadDeadline(time.Time{})
	cb := cycleBufs.Get().(*cycleBuf)
	defer cycleBufs.Put(cb)
	ctx, cancel := context.WithTimeout(r.Context(), cfg.Timeouts.Request)
	defer cancel()
	req, pool, rf := g.route(ctx, st, routeInput{ep: ep, data: data, id: id,
		prioHdr: prioHdr, sloHdr: sloHdr, sessionHdr: r.Header.Get(HeaderSessionID), trusted: trusted}, cb)
	if rf != nil {
		if rf.status == admission.StatusClientClosed {
			// Nobody to answer: count it only.
			g.m.requests.WithLabelValues(rf.model, rf.pool, "", strconv.Itoa(rf.status)).Inc()
			return
		}
		if rf.retryAfter > 0 {
			w.Header().Set("Retry-After", strconv.Itoa(int(rf.retryAfter/time.Second)))
		}
		g.fail(w, rf.model, rf.pool, rf.status, rf.code, rf.reason)
		return
	}
	c := &proxyCall{w: w, r: r, st: st, pool: pool, req: req, data: data, start: start, id: id,
		header: upstreamHeaders(stripInternal(r.Header), clientIP(r), st.upstreamToken)}
	c.header.Set(openai.HeaderRequestID, id)
	g.dispatch(ctx, c, cb.res.Ranked)
}

// resolve maps a model name to its pool: a pool's base model, an adapter
// named in config, or an adapter a pod lists in /v1/models with the pool's
// model as parent.
func (g *Gateway) resolve(st *state, model string) (route, bool) {
	if rt, ok := st.routes[model]; ok {
		return rt, true
	}
	idx := g.adapterIndex(st)
	if pool, ok := idx.byName[model]; ok {
		return route{pool: pool, adapter: model}, true
	}
	return route{}, false
}

// adapterIndex is the adapters discovered from pods' /v1/models.
type adapterIndex struct {
	at     time.Time
	st     *state
	byName map[string]*poolState
}

// adapterIndex returns the discovered adapters, rebuilt at most every
// 250ms (it scans every pod's model list).
func (g *Gateway) adapterIndex(st *state) *adapterIndex {
	idx := g.adapters.Load()
	if idx != nil && idx.st == st && time.Since(idx.at) < 250*time.Millisecond {
		return idx
	}
	g.adaptMu.Lock()
	defer g.adaptMu.Unlock()
	if idx = g.adapters.Load(); idx != nil && idx.st == st && time.Since(idx.at) < 250*time.Millisecond {
		return idx
	}
	idx = &adapterIndex{at: time.Now(), st: st, byName: map[string]*poolState{}}
	for _, ps := range st.poolList {
		for _, rt := range ps.pods {
			ps0, ok := g.scraper.Get(rt.cfg.Name)
			if !ok {
				continue
			}
			for _, m := range ps0.Models {
				if m.Parent == ps.cfg.Model && m.ID != ps.cfg.Model {
					if _, static := st.routes[m.ID]; !static {
						idx.byName[m.ID] = ps
					}
				}
			}
		}
	}
	g.adapters.Store(idx)
	return idx
}

// snapshot fills cb with the current state of the pool's pods.
func (g *Gateway) snapshot(st *state, pool *poolState, req *picker.Request, cb *cycleBuf) {
	n := len(pool.pods)
	if cap(cb.pods) < n {
		cb.pods = make([]picker.Pod, n)
	}
	cb.pods = cb.pods[:n]
	cb.ptrs = cb.ptrs[:0]
	now := time.Now()
	// A pod listing its models but not this adapter cannot serve it; only
	// filter on that when some pod does list it (adapters may also be
	// loaded on demand).
	adapterListed := false
	if req.Adapter != "" {
		for _, rt := range pool.pods {
			if ps, ok := g.scraper.Get(rt.cfg.Name); ok && ps.Serves(req.Adapter) {
				adapterListed = true
				break
			}
		}
	}
	for i, rt := range pool.pods {
		p := &cb.pods[i]
		ps := g.fillPod(p, st, pool, rt, now)
		if ps == nil || (adapterListed && ps.Models != nil && !ps.Serves(req.Adapter)) {
			continue
		}
		cb.ptrs = append(cb.ptrs, p)
	}
	g.tracker.Apply(cb.ptrs)
}

// fillPod sets p to the router's view of one pod and returns its scraped
// state (nil if the scraper does not know it yet).
func (g *Gateway) fillPod(p *picker.Pod, st *state, pool *poolState, rt *podRT, now time.Time) *scrape.PodState {
	*p = picker.Pod{
		Name:       rt.cfg.Name,
		Address:    rt.cfg.Address,
		Pool:       pool.cfg.Name,
		BaseModel:  pool.cfg.Model,
		Engine:     rt.cfg.Engine,
		GPU:        rt.cfg.GPU,
		GPUs:       rt.cfg.GPUs,
		Labels:     rt.cfg.Labels,
		MetricsAge: time.Hour, // never scraped
	}
	ps, ok := g.scraper.Get(rt.cfg.Name)
	if !ok {
		return nil
	}
	p.Engine = ps.Engine
	p.Metrics = ps.Metrics
	if !ps.LastSuccess.IsZero() {
		p.MetricsAge = ps.MetricsAge(now) // an idle pod scraped on its slower schedule is not stale
		p.Ready = ps.ConsecutiveFailures < st.cfg.Scrape.UnreadyAfter && now.UnixNano() >= rt.downUntil.Load()
	}
	return ps
}

// recordScores keeps each candidate's scores for /debug/pods and exports
// the chosen pod's.
func (g *Gateway) recordScores(st *state, res *picker.Result) {
	if len(res.Ranked) == 0 {
		return
	}
	now := time.Now()
	chosen := res.Ranked[0]
	for i, p := range res.Candidates {
		rt := st.pods[p.Name]
		if rt == nil {
			continue
		}
		rt.mu.Lock()
		ls := &rt.scores
		ls.At, ls.Picked, ls.Total, ls.Scorers = now, p == chosen, res.Total[i], res.Scorers
		ls.Scores = ls.Scores[:0]
		for s := range res.Scorers {
			ls.Scores = append(ls.Scores, res.Scores[s][i])
		}
		rt.mu.Unlock()
		if p == chosen {
			for s, name := range res.Scorers {
				g.m.scores.WithLabelValues(p.Pool, name).Observe(res.Scores[s][i])
			}
		}
	}
}

// attemptError is why one attempt failed before its first response byte.
type attemptError struct {
	reason string // metric label: connect, status_5xx, status_429, reset, timeout
	err    error
}

// proxyCall is one client request on its way through the proxy: what
// every upstream attempt needs.
type proxyCall struct {
	w      http.ResponseWriter
	r      *http.Request
	st     *state
	pool   *poolState
	req    *picker.Request
	header http.Header // upstream request headers
	data   []byte      // request body
	start  time.Time   // the request arrived
	id     string      // X-Request-Id, validated; every log line carries it
}

// dispatch sends the request to ranked[0], moving to the next pod when one
// fails before its first response byte, within Retry bounds.
func (g *Gateway) dispatch(ctx context.Context, c *proxyCall, ranked []*picker.Pod) {
	cfg := c.st.cfg
	pool := c.pool.cfg.Name
	attempts := min(cfg.Retry.MaxAttempts, len(ranked))
	budgetEnd := c.start.Add(cfg.Retry.Budget)
	var last *attemptError
	for i := 0; i < attempts; i++ {
		pod := ranked[i]
		if i > 0 {
			if time.Now().After(budgetEnd) {
				break
			}
			g.m.retries.WithLabelValues(pool, last.reason).Inc()
			g.log.Debug("retrying on next pod", "request_id", c.id, "pool", pool, "failed", ranked[i-1].Name, "reason", last.reason, "err", last.err, "next", pod.Name)
		}
		// Whether a failure may be retried is decided when it happens: an
		// attempt that outlives the budget relays its pod's error instead.
		hasNext := i+1 < attempts
		canRetry := func() bool { return hasNext && time.Now().Before(budgetEnd) }
		last = g.tracedAttempt(ctx, c, pod, i+1, canRetry)
		if last == nil {
			return
		}
		if c.r.Context().Err() != nil {
			g.m.requests.WithLabelValues(c.req.Model, pool, pod.Name, "499").Inc()
			return // client gone
		}
	}
	status, code := http.StatusServiceUnavailable, "upstream_unavailable"
	if last != nil && last.reason == "timeout" {
		status, code = http.StatusGatewayTimeout, "upstream_timeout"
	}
	g.fail(c.w, c.req.Model, pool, status, code, "no model server could take the request")
}

// upstream is one attempt's connection to a pod: its cancel and the
// watchdog that is first the first-byte deadline, then the idle timeout
// between reads of the response.
type upstream struct {
	cancel   context.CancelFunc
	watchdog *time.Timer
	timedOut atomic.Bool
}

func (u *upstream) reason() string {
	if u.timedOut.Load() {
		return "timeout"
	}
	return "reset"
}

// attempt runs one upstream attempt. It returns nil once a response has
// been relayed (successfully or not); an error means nothing was written to
// the client and the caller may try another pod.
func (g *Gateway) attempt(ctx context.Context, c *proxyCall, pod *picker.Pod, canRetry func() bool) *attemptError {
	cfg := c.st.cfg
	actx, cancel := context.WithCancel(ctx)
	defer cancel()
	u := &upstream{cancel: cancel}
	u.watchdog = time.AfterFunc(cfg.Timeouts.FirstByte, func() { u.timedOut.Store(true); cancel() })
	defer u.watchdog.Stop()

	out, err := http.NewRequestWithContext(actx, http.MethodPost, g.upstreamScheme+"://"+pod.Address+c.r.URL.RequestURI(), bytes.NewReader(c.data))
	if err != nil {
		return &attemptError{"connect", err}
	}
	out.Header = g.upstreamHeader(actx, c.header)
	out.ContentLength = int64(len(c.data))

	ft := firstToken{g: g, req: c.req, pool: c.pool.cfg.Name, queue: c.pool.queue, start: c.start, dispatched: time.Now(),
		end: openai.StreamEnder{API: openai.APIForPath(c.r.URL.Path)}, span: g.traceSpan(ctx)}
	g.tracker.Dispatched(pod.Name, c.req)
	g.scraper.Active(pod.Name)
	defer func() {
		g.tracker.Done(pod.Name, c.req)
		c.pool.queue.signal()
	}()
	resp, err := g.transport.RoundTrip(out)
	if err != nil {
		if u.timedOut.Load() {
			return &attemptError{"timeout", err}
		}
		if errors.Is(err, syscall.ECONNREFUSED) || isDialError(err) {
			// Keep the scheduler off this pod until the scraper can tell.
			if rt := c.st.pods[pod.Name]; rt != nil {
				rt.downUntil.Store(time.Now().Add(max(4*cfg.Scrape.Interval, 250*time.Millisecond)).UnixNano())
			}
		}
		return &attemptError{"connect", err}
	}
	defer resp.Body.Close()
	traceStatus(ctx, resp.StatusCode)
	if (resp.StatusCode >= 500 || resp.StatusCode == http.StatusTooManyRequests) && canRetry() {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
		return &attemptError{"status_" + statusClass(resp.StatusCode), fmt.Errorf("status %d", resp.StatusCode)}
	}

	bufp := copyBufs.Get().(*[]byte)
	defer copyBufs.Put(bufp)
	buf := *bufp
	// Hold the headers back until the first body byte: a pod that dies
	// before it can still be retried without the client noticing.
	n, rerr := readSome(resp.Body, buf)
	if n == 0 && rerr != nil && !errors.Is(rerr, io.EOF) {
		if c.r.Context().Err() != nil {
			return &attemptError{"client_gone", rerr}
		}
		return &attemptError{u.reason(), rerr}
	}
	u.watchdog.Reset(cfg.Timeouts.Idle)
	ft.sse = isEventStream(resp.Header)
	ft.observe(pod.Name, buf[:n], n == 0)
	g.relay(c, pod, resp, u, &ft, buf, n, rerr)
	return nil
}

// relay writes the response to the client: its headers, the first chunk
// already read (buf[:n], rerr) and the rest as it arrives, flushed chunk
// by chunk so tokens reach the client as produced. Every write has its own
// deadline (timeouts.write): a client that stops reading is dropped, and
// the attempt ends so the tracker frees the pod's slot. The whole relay is
// bounded by timeouts.max_stream.
func (g *Gateway) relay(c *proxyCall, pod *picker.Pod, resp *http.Response, u *upstream, ft *firstToken, buf []byte, n int, rerr error) {
	cfg := c.st.cfg
	w := c.w
	h := w.Header()
	copyResponseHeaders(h, stripInternal(resp.Header))
	h.Set(openai.HeaderRequestID, c.id) // the pod's own, if any, is not ours
	if cfg.PodHeader != "-" {
		h.Set(cfg.PodHeader, pod.Name)
	}
	rc := http.NewResponseController(w)
	// The deadline is the connection's: clear it for the next request.
	defer func() { _ = rc.SetWriteDeadline(time.Time{}) }()
	var tooLong atomic.Bool
	limit := time.AfterFunc(max(cfg.Timeouts.MaxStream-time.Since(c.start), 0), func() { tooLong.Store(true); u.cancel() })
	defer limit.Stop()

	_ = rc.SetWriteDeadline(time.Now().Add(cfg.Timeouts.Write))
	w.WriteHeader(resp.StatusCode)
	status := strconv.Itoa(resp.StatusCode)
	ended := false // an event stream sent its [DONE]
	for n > 0 || rerr == nil {
		if n > 0 {
			last := ft.sse && endsStream(buf[:n])
			_ = rc.SetWriteDeadline(time.Now().Add(cfg.Timeouts.Write))
			if _, werr := w.Write(buf[:n]); werr != nil {
				status = "499"
				break
			}
			if ferr := rc.Flush(); ferr != nil {
				status = "499"
				break
			}
			ended = ended || last
		}
		if rerr != nil {
			break
		}
		u.watchdog.Reset(cfg.Timeouts.Idle)
		n, rerr = resp.Body.Read(buf)
		ft.observe(pod.Name, buf[:n], false)
	}
	switch {
	case status == "499" && ended:
		// The client hung up after [DONE]: it has the whole stream.
		status = strconv.Itoa(resp.StatusCode)
	case rerr == nil || errors.Is(rerr, io.EOF) || status == "499":
	case ended:
		// Whatever happens after [DONE] (the client leaving, the pod
		// closing late) does not break the response.
	default:
		status = g.brokeOff(c, pod, u, ft, rc, rerr, tooLong.Load())
	}
	pool := c.pool.cfg.Name
	g.m.requests.WithLabelValues(c.req.Model, pool, pod.Name, status).Inc()
	g.m.e2e.WithLabelValues(c.req.Model, pool).Observe(time.Since(c.start).Seconds())
}

// brokeOff ends a response whose upstream read failed midway and returns
// its status label. A streaming client is told in-band, so its connection
// ends with a proper terminator rather than hanging; any other response is
// aborted so the client cannot mistake it for a whole one.
func (g *Gateway) brokeOff(c *proxyCall, pod *picker.Pod, u *upstream, ft *firstToken, rc *http.ResponseController, rerr error, tooLong bool) string {
	if c.r.Context().Err() != nil {
		return "499"
	}
	code, msg := "upstream_interrupted", "upstream stream interrupted"
	if tooLong {
		code, msg = "stream_too_long", "response exceeded the maximum stream duration"
		g.log.Info("response cut at timeouts.max_stream", "request_id", c.id, "pod", pod.Name)
	} else {
		g.log.Warn("upstream response broke off", "request_id", c.id, "pod", pod.Name, "err", rerr, "timed_out", u.timedOut.Load())
	}
	if !ft.sse {
		panic(http.ErrAbortHandler)
	}
	_ = rc.SetWriteDeadline(time.Now().Add(c.st.cfg.Timeouts.Write))
	status := http.StatusBadGateway
	if tooLong {
		status = http.StatusGatewayTimeout
	}
	_, _ = c.w.Write(ft.end.ErrorEvent(status, code, msg)) // in the stream's API's shape
	_ = rc.Flush()
	return strconv.Itoa(status)
}

// readSome reads until it gets at least one byte or an error.
func readSome(r io.Reader, buf []byte) (int, error) {
	for {
		n, err := r.Read(buf)
		if n > 0 || err != nil {
			return n, err
		}
	}
}

// isDialError reports a failure to connect (the pod is down or gone).
func isDialError(err error) bool {
	var oe *net.OpError
	return errors.As(err, &oe) && oe.Op == "dial"
}

func statusClass(code int) string {
	if code == http.StatusTooManyRequests {
		return "429"
	}
	return "5xx"
}

// fail writes an OpenAI JSON error and counts it.
func (g *Gateway) fail(w http.ResponseWriter, model, pool string, status int, code, msg string) {
	g.m.requests.WithLabelValues(model, pool, "", strconv.Itoa(status)).Inc()
	openai.Errorf(w, status, code, msg)
}
