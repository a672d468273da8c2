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
	"github.com/infergate/infergate/tier1/picker"
	"github.com/infergate/infergate/tier1/prefix"
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
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		g.fail(w, "", "", http.StatusMethodNotAllowed, "method_not_allowed", "use POST")
		return
	}
	// Internal headers are read here, before they are stripped, and only
	// trusted as documented: priority from authenticated clients when
	// configured, the TTFT objective from any client that passed auth.
	prioHdr := r.Header.Get(HeaderPriority)
	sloHdr := r.Header.Get(HeaderTTFTSLO)

	// A client trickling its body must not hold a handler forever.
	rc := http.NewResponseController(w)
	_ = rc.SetReadDeadline(time.Now().Add(cfg.Timeouts.ReadBody))
	data, err := readBody(w, r, cfg.MaxBodyBytes)
	_ = rc.SetReadDeadline(time.Time{})
	if err != nil {
		if errors.Is(err, errBodyTooLarge) {
			g.fail(w, "", "", http.StatusRequestEntityTooLarge, "request_too_large",
				fmt.Sprintf("request body exceeds %d bytes", cfg.MaxBodyBytes))
			return
		}
		g.fail(w, "", "", http.StatusBadRequest, "invalid_body", err.Error())
		return
	}
	req, body, rt, rf := g.schedRequest(st, ep, data, r.Header.Get("X-Request-Id"), prioHdr, sloHdr, trusted)
	if rf != nil {
		g.fail(w, rf.model, rf.pool, rf.status, rf.code, rf.reason)
		return
	}
	pool := rt.pool
	model := body.Model

	cb := cycleBufs.Get().(*cycleBuf)
	defer cycleBufs.Put(cb)
	text := body.promptBytes(ep)
	seed := model
	if body.CacheSalt != "" {
		seed = model + "\x00" + body.CacheSalt
	}
	cb.hashes = prefix.Hash(seed, text, prefix.DefaultBlockBytes, prefix.DefaultPromptBlocks, cb.hashes)
	req.BlockHashes = cb.hashes
	req.PromptTokens = max(1, len(text)/4) // ~4 bytes per token

	ctx, cancel := context.WithTimeout(r.Context(), cfg.Timeouts.Request)
	defer cancel()

	g.snapshot(st, pool, req, cb)
	err = g.sched.ScheduleInto(&cb.res, req, cb.ptrs)
	if errors.Is(err, picker.ErrSaturated) {
		if req.Sheddable {
			g.m.shed.WithLabelValues(model, pool.cfg.Name).Inc()
			w.Header().Set("Retry-After", "1")
			g.fail(w, model, pool.cfg.Name, http.StatusTooManyRequests, "pool_saturated",
				"every model server of this model is saturated; retry later")
			return
		}
		err = g.waitForCapacity(ctx, st, pool, req, cb)
	}
	switch {
	case errors.Is(err, picker.ErrNoCandidates):
		g.fail(w, model, pool.cfg.Name, http.StatusServiceUnavailable, "no_ready_pod",
			fmt.Sprintf("no ready model server for model %q", model))
		return
	case ctx.Err() != nil:
		g.m.requests.WithLabelValues(model, pool.cfg.Name, "", statusLabel(r.Context(), http.StatusGatewayTimeout)).Inc()
		if r.Context().Err() == nil {
			openai.Errorf(w, http.StatusGatewayTimeout, "timeout", "request timed out waiting for capacity")
		}
		return
	case err != nil:
		g.fail(w, model, pool.cfg.Name, http.StatusServiceUnavailable, "scheduling_failed", err.Error())
		return
	}
	g.recordScores(st, &cb.res)
	g.dispatch(ctx, w, r, st, pool, req, cb.res.Ranked, data, start)
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
		p.MetricsAge = now.Sub(ps.LastSuccess)
		p.Ready = ps.ConsecutiveFailures < st.cfg.Scrape.UnreadyAfter && now.UnixNano() >= rt.downUntil.Load()
	}
	return ps
}

// waitForCapacity queues req until a pod of its pool leaves saturation,
// the wait bound for its priority passes (then the scheduler's best pick
// stands: the server queues it) or ctx ends. cb.res holds the pick.
func (g *Gateway) waitForCapacity(ctx context.Context, st *state, pool *poolState, req *picker.Request, cb *cycleBuf) error {
	maxWait := st.cfg.Queue.MaxWait
	if req.Priority > 0 {
		maxWait = st.cfg.Queue.CriticalMaxWait
	}
	q := pool.queue
	w, ok := q.enter(req.Priority, st.cfg.Queue.MaxLen)
	if !ok {
		return nil // queue full: dispatch to the best pod now
	}
	start := time.Now()
	g.m.queueLen.WithLabelValues(pool.cfg.Name).Set(float64(q.len()))
	defer func() {
		q.leave(w)
		g.m.queueLen.WithLabelValues(pool.cfg.Name).Set(float64(q.len()))
		g.m.queueWait.WithLabelValues(pool.cfg.Name).Observe(time.Since(start).Seconds())
	}()
	deadline := time.NewTimer(maxWait)
	defer deadline.Stop()
	// Scrapes wake the queue too, but poll in case a pod stops reporting.
	tick := time.NewTicker(max(st.cfg.Scrape.Interval, 10*time.Millisecond))
	defer tick.Stop()
	for {
		head, wake := q.isHead(w)
		if head {
			g.snapshot(st, pool, req, cb)
			err := g.sched.ScheduleInto(&cb.res, req, cb.ptrs)
			if !errors.Is(err, picker.ErrSaturated) {
				return err
			}
		}
		select {
		case <-wake:
		case <-tick.C:
		case <-deadline.C:
			if len(cb.res.Ranked) == 0 {
				return picker.ErrNoCandidates
			}
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
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

// dispatch sends the request to ranked[0], moving to the next pod when one
// fails before its first response byte, within Retry bounds.
func (g *Gateway) dispatch(ctx context.Context, w http.ResponseWriter, r *http.Request, st *state, pool *poolState,
	req *picker.Request, ranked []*picker.Pod, data []byte, start time.Time) {
	cfg := st.cfg
	header := upstreamHeaders(r.Header, clientIP(r), st.upstreamToken)
	attempts := min(cfg.Retry.MaxAttempts, len(ranked))
	budgetEnd := start.Add(cfg.Retry.Budget)
	var last *attemptError
	for i := 0; i < attempts; i++ {
		pod := ranked[i]
		if i > 0 {
			if time.Now().After(budgetEnd) {
				break
			}
			g.m.retries.WithLabelValues(pool.cfg.Name, last.reason).Inc()
			g.log.Debug("retrying on next pod", "pool", pool.cfg.Name, "failed", ranked[i-1].Name, "reason", last.reason, "err", last.err, "next", pod.Name)
		}
		// Whether a failure may be retried is decided when it happens: an
		// attempt that outlives the budget relays its pod's error instead.
		hasNext := i+1 < attempts
		canRetry := func() bool { return hasNext && time.Now().Before(budgetEnd) }
		last = g.attempt(ctx, w, r, st, pool, req, pod, header, data, start, canRetry)
		if last == nil {
			return
		}
		if r.Context().Err() != nil {
			g.m.requests.WithLabelValues(req.Model, pool.cfg.Name, pod.Name, "499").Inc()
			return // client gone
		}
	}
	status, code := http.StatusServiceUnavailable, "upstream_unavailable"
	if last != nil && last.reason == "timeout" {
		status, code = http.StatusGatewayTimeout, "upstream_timeout"
	}
	g.fail(w, req.Model, pool.cfg.Name, status, code, "no model server could take the request")
}

// attempt runs one upstream attempt. It returns nil once a response has
// been relayed (successfully or not); an error means nothing was written to
// the client and the caller may try another pod.
func (g *Gateway) attempt(ctx context.Context, w http.ResponseWriter, r *http.Request, st *state, pool *poolState,
	req *picker.Request, pod *picker.Pod, header http.Header, data []byte, start time.Time, canRetry func() bool) *attemptError {
	cfg := st.cfg
	actx, cancel := context.WithCancel(ctx)
	defer cancel()
	var timedOut atomic.Bool
	// One timer serves as the first-byte deadline, then as the idle
	// watchdog between reads of the response.
	watchdog := time.AfterFunc(cfg.Timeouts.FirstByte, func() { timedOut.Store(true); cancel() })
	defer watchdog.Stop()

	out, err := http.NewRequestWithContext(actx, http.MethodPost, "http://"+pod.Address+r.URL.RequestURI(), bytes.NewReader(data))
	if err != nil {
		return &attemptError{"connect", err}
	}
	out.Header = header
	out.ContentLength = int64(len(data))

	dispatched := time.Now()
	g.tracker.Dispatched(pod.Name, req)
	defer func() {
		g.tracker.Done(pod.Name, req)
		pool.queue.signal()
	}()
	resp, err := g.transport.RoundTrip(out)
	if err != nil {
		if timedOut.Load() {
			return &attemptError{"timeout", err}
		}
		if errors.Is(err, syscall.ECONNREFUSED) || isDialError(err) {
			// Keep the scheduler off this pod until the scraper can tell.
			if rt := st.pods[pod.Name]; rt != nil {
				rt.downUntil.Store(time.Now().Add(max(4*cfg.Scrape.Interval, 250*time.Millisecond)).UnixNano())
			}
		}
		return &attemptError{"connect", err}
	}
	defer resp.Body.Close()
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
		if r.Context().Err() != nil {
			return &attemptError{"client_gone", rerr}
		}
		reason := "reset"
		if timedOut.Load() {
			reason = "timeout"
		}
		return &attemptError{reason, rerr}
	}
	watchdog.Reset(cfg.Timeouts.Idle)
	sse := isEventStream(resp.Header)
	// The first token is the first byte, except in a chat stream that opens
	// with a role-only event before prefill ends (some servers send it at
	// once): then it is the first event carrying text.
	firstToken := false
	noteToken := func(chunk []byte) {
		if firstToken || (sse && !hasToken(chunk)) {
			return
		}
		firstToken = true
		g.tracker.FirstToken(pod.Name, req, time.Since(dispatched))
		g.m.ttft.WithLabelValues(req.Model, pool.cfg.Name).Observe(time.Since(start).Seconds())
	}
	noteToken(buf[:n])

	h := w.Header()
	copyResponseHeaders(h, resp.Header)
	if cfg.PodHeader != "-" {
		h.Set(cfg.PodHeader, pod.Name)
	}
	w.WriteHeader(resp.StatusCode)
	rc := http.NewResponseController(w)
	status := strconv.Itoa(resp.StatusCode)
	for n > 0 || rerr == nil {
		if n > 0 {
			if _, werr := w.Write(buf[:n]); werr != nil {
				status = "499"
				break
			}
			// Flush every chunk: tokens must reach the client as produced.
			if ferr := rc.Flush(); ferr != nil {
				status = "499"
				break
			}
		}
		if rerr != nil {
			break
		}
		watchdog.Reset(cfg.Timeouts.Idle)
		n, rerr = resp.Body.Read(buf)
		noteToken(buf[:n])
	}
	if rerr != nil && !errors.Is(rerr, io.EOF) && status != "499" {
		status = statusLabel(r.Context(), 502)
		g.log.Warn("upstream response broke off", "pod", pod.Name, "err", rerr, "timed_out", timedOut.Load())
		if sse && r.Context().Err() == nil {
			// Tell a streaming client in-band; the connection then ends
			// with a proper terminator rather than hanging.
			_, _ = fmt.Fprintf(w, "data: {\"error\":{\"message\":\"upstream stream interrupted\",\"type\":\"server_error\",\"code\":\"upstream_interrupted\"}}\n\n")
			_ = rc.Flush()
		} else if r.Context().Err() == nil {
			// The body is incomplete: abort the connection so the client
			// cannot mistake it for a whole response.
			panic(http.ErrAbortHandler)
		}
	}
	g.m.requests.WithLabelValues(req.Model, pool.cfg.Name, pod.Name, status).Inc()
	g.m.e2e.WithLabelValues(req.Model, pool.cfg.Name).Observe(time.Since(start).Seconds())
	return nil
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

// hasToken reports whether a chunk of an OpenAI event stream carries
// generated text (or the end of the stream).
func hasToken(chunk []byte) bool {
	for _, key := range [][]byte{[]byte(`"content":"`), []byte(`"text":"`)} {
		rest := chunk
		for {
			i := bytes.Index(rest, key)
			if i < 0 {
				break
			}
			rest = rest[i+len(key):]
			if len(rest) > 0 && rest[0] != '"' {
				return true
			}
		}
	}
	return bytes.Contains(chunk, []byte("[DONE]")) || bytes.Contains(chunk, []byte(`"finish_reason":"`))
}

func isEventStream(h http.Header) bool {
	ct := h.Get("Content-Type")
	return len(ct) >= 17 && ct[:17] == "text/event-stream"
}

func statusClass(code int) string {
	if code == http.StatusTooManyRequests {
		return "429"
	}
	return "5xx"
}

// statusLabel reports 499 (client closed request) when the client is gone.
func statusLabel(clientCtx context.Context, status int) string {
	if clientCtx.Err() != nil {
		return "499"
	}
	return strconv.Itoa(status)
}

// fail writes an OpenAI JSON error and counts it.
func (g *Gateway) fail(w http.ResponseWriter, model, pool string, status int, code, msg string) {
	g.m.requests.WithLabelValues(model, pool, "", strconv.Itoa(status)).Inc()
	openai.Errorf(w, status, code, msg)
}
