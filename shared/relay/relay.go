// Package relay carries one upstream response to a client the way both
// tiers do: the response headers are held until the first body byte (an
// event stream's first whole event, or a configured amount of any other
// body), so an upstream that fails before then can be retried on the next
// target without the client noticing; then the response is committed and
// relayed, an event stream event by event. Every write to the client has
// its own deadline, the whole response an optional one, the upstream's
// silence an optional bound. A stream that breaks after it was committed
// ends with one error event in its API's shape, unless it had already
// reached its own end; any other body is aborted. Trailers are forwarded.
//
// Retryable is the one rule for which answers move a request on to the
// next target (pod or cluster).
package relay

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/infergate/infergate/shared/cluster"
	"github.com/infergate/infergate/shared/openai"
	"github.com/infergate/infergate/shared/sse"
)

// Retryable reports whether an upstream answer with this status, given
// before anything reached the client, moves the request on to the next
// target. The status says the target, not the request, is at fault or
// cannot serve it now: 5xx, 429 (overloaded), 404 (the target does not
// serve the model, e.g. a stale model list or an adapter not loaded
// there) and 401/403 (the target refused the router's own credentials: a
// misconfigured target; the client authenticated with the router). Any
// other status is the request's own answer and is relayed.
func Retryable(status int) bool {
	switch {
	case status >= 500, status == http.StatusTooManyRequests, status == http.StatusNotFound,
		status == http.StatusUnauthorized, status == http.StatusForbidden:
		return true
	}
	return false
}

// TargetFault reports whether a retryable status counts against the
// target's health (a circuit breaker): 5xx and 401/403 do; 429 (busy, not
// broken) and 404 (serves other models) do not.
func TargetFault(status int) bool {
	return status >= 500 || status == http.StatusUnauthorized || status == http.StatusForbidden
}

// StatusReason names a retryable status for metrics and logs:
// status_5xx, status_429, status_404 or status_auth.
func StatusReason(status int) string {
	switch {
	case status == http.StatusTooManyRequests:
		return "status_429"
	case status == http.StatusNotFound:
		return "status_404"
	case status == http.StatusUnauthorized, status == http.StatusForbidden:
		return "status_auth"
	}
	return "status_5xx"
}

// Errors of an attempt that failed before anything reached the client
// (Err wraps the cause with one of them).
var (
	ErrTimeout    = errors.New("no response in time")
	ErrClientGone = errors.New("the client went away")
	ErrNoEvent    = errors.New("the event stream ended before its first event")
)

// Codes of the error event that ends a broken stream.
const (
	CodeInterrupted    = "upstream_interrupted"
	CodeTooLong        = "stream_too_long"
	CodeEventTooLarge  = "upstream_event_too_large"
	discardLimit       = 64 << 10
	defaultCopyBufSize = 32 << 10
)

// Options are one attempt's bounds.
type Options struct {
	// FirstByte bounds the wait from Start to the commit point (Open's
	// return): headers and the first event, or the held bytes.
	FirstByte time.Duration
	// Idle bounds the upstream's silence after the commit point; 0: none.
	Idle time.Duration
	// Write bounds each write (with its flush) to the client; 0: none.
	Write time.Duration
	// Hold is how much of a body that is not an event stream is read
	// before the commit point: 0 reads until its first byte; more buffers
	// that much (or the whole body, if shorter) so that an upstream
	// failing while sending it can still be retried.
	Hold int64
	// MaxEvent bounds one event of a stream (0: sse.DefaultMaxEvent); a
	// longer one breaks the stream.
	MaxEvent int
	// API is the shape of the error event that ends a broken stream.
	API openai.API
	// Client is the client's request context: when it ends, the client is
	// gone (not the upstream broken). Default: Start's ctx.
	Client context.Context
}

// Hooks is what the caller adds to a relay.
type Hooks interface {
	// Header fills the client's response header (dst) from the
	// upstream's (src) before the response is committed.
	Header(dst, src http.Header)
	// FirstToken is called once, when the first token is about to reach
	// the client: the first event that carries one (sse.IsToken) or the
	// first byte of any other body.
	FirstToken()
	// Event is shown each event of a stream before it is written and
	// returns what to write instead: the event itself, other bytes, or
	// nothing to drop it.
	Event(ev []byte) []byte
}

// Result is how a relay ended.
type Result struct {
	Status int  // the upstream's status, sent to the client
	Events int  // stream events written
	Ended  bool // the whole body, or a stream up to its own end (sse.IsEnd), was relayed
	// ClientGone is set when the client left (a write failed, or its
	// context ended) before the response did.
	ClientGone bool
	// Code, with CutStatus, is the error event a broken stream was ended
	// with (CodeInterrupted, CodeTooLong, CodeEventTooLarge); "" when it
	// was not broken. A broken body other than a stream sets Abort too.
	Code      string
	CutStatus int
	// Abort asks the caller to abort the response (panic with
	// http.ErrAbortHandler once its bookkeeping is done): a body that is
	// not an event stream broke, and ending it normally would let the
	// client take it for whole.
	Abort bool
	// TimedOut is set when the upstream was cut for its silence (Idle);
	// TooLong when the Deadline passed.
	TimedOut, TooLong bool
	Err               error // the upstream error that broke the response
}

var copyBufs = sync.Pool{New: func() any { b := make([]byte, defaultCopyBufSize); return &b }}

// Attempt is one request to an upstream and the relay of its response.
// Start it before sending the request (its context bounds the request),
// Open the response, Relay it; Stop ends it in any case.
type Attempt struct {
	opts     Options
	ctx      context.Context
	cancel   context.CancelFunc
	watchdog *time.Timer
	timedOut atomic.Bool
	tooLong  atomic.Bool
	limit    *time.Timer

	resp      *http.Response
	stream    bool
	committed bool
	rd        sse.Reader
	first     []byte  // a stream's first event
	held      []byte  // the bytes of another body read before commit
	bufp      *[]byte // held's pooled buffer, when it is one
	rerr      error   // the read error after held (io.EOF: held is the whole body)

	w     http.ResponseWriter
	rc    *http.ResponseController
	dirty bool // written and not flushed
	werr  error
	ender openai.StreamEnder
}

// Start begins an attempt under ctx; its Context, cancelled when the
// attempt times out or is stopped, is the upstream request's.
func Start(ctx context.Context, opts Options) *Attempt {
	a := &Attempt{opts: opts}
	if a.opts.Client == nil {
		a.opts.Client = ctx
	}
	a.ctx, a.cancel = context.WithCancel(ctx)
	a.watchdog = time.AfterFunc(opts.FirstByte, a.timeout)
	return a
}

func (a *Attempt) timeout() {
	a.timedOut.Store(true)
	a.cancel()
}

// Context is the attempt's context: send the upstream request with it.
func (a *Attempt) Context() context.Context { return a.ctx }

// Stop ends the attempt: timers, the upstream request, buffers.
func (a *Attempt) Stop() {
	a.watchdog.Stop()
	if a.limit != nil {
		a.limit.Stop()
	}
	a.cancel()
	if a.stream {
		a.rd.Release()
	}
	if a.bufp != nil {
		copyBufs.Put(a.bufp)
		a.bufp = nil
	}
}

// Err is why the attempt failed before anything reached the client, for a
// request or read error err: wrapped with ErrClientGone or ErrTimeout when
// one of them is the cause.
func (a *Attempt) Err(err error) error {
	switch {
	case a.opts.Client.Err() != nil:
		return fmt.Errorf("%w: %w", ErrClientGone, err)
	case a.timedOut.Load():
		return fmt.Errorf("%w (%v): %w", ErrTimeout, a.opts.FirstByte, err)
	}
	return err
}

// Discard drains a little of a response that will not be relayed (so its
// connection can be reused) and closes it.
func Discard(resp *http.Response) {
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, discardLimit))
	_ = resp.Body.Close()
}

// Stream reports whether the opened response is an event stream.
func (a *Attempt) Stream() bool { return a.stream }

// Held is what Open read of a body that is not an event stream, and
// whether that is the whole body.
func (a *Attempt) Held() (b []byte, whole bool) { return a.held, a.rerr == io.EOF }

// Open reads resp up to the commit point: an event stream's first event,
// or Options.Hold bytes (at least one, if any) of any other body. An error
// (see Err) means nothing was written and the request may go to another
// target; resp is the caller's to close either way.
func (a *Attempt) Open(resp *http.Response) error {
	a.resp = resp
	a.stream = sse.IsEventStream(resp.Header)
	src := upstream{a}
	if a.stream {
		a.rd.Reset(src, a.opts.MaxEvent)
		ev, err := a.rd.Next()
		switch {
		case err == io.EOF:
			return a.Err(ErrNoEvent)
		case err != nil:
			return a.Err(err)
		}
		a.first = ev
		return nil
	}
	if a.opts.Hold > 0 {
		b, err := io.ReadAll(io.LimitReader(src, a.opts.Hold))
		if err != nil {
			return a.Err(err)
		}
		a.held = b
		if int64(len(b)) < a.opts.Hold {
			a.rerr = io.EOF
		}
		return nil
	}
	a.bufp = copyBufs.Get().(*[]byte)
	buf := *a.bufp
	for {
		n, err := src.Read(buf)
		if n > 0 || err != nil {
			if n == 0 && err != io.EOF {
				return a.Err(err)
			}
			a.held, a.rerr = buf[:n], err
			return nil
		}
	}
}

// Relay commits the response to w and relays the rest of it. deadline,
// when not zero, ends it then (CodeTooLong).
func (a *Attempt) Relay(w http.ResponseWriter, h Hooks, deadline time.Time) (res Result) {
	resp := a.resp
	res.Status = resp.StatusCode
	a.committed = true
	a.w, a.rc = w, http.NewResponseController(w)
	a.ender = openai.StreamEnder{API: a.opts.API}
	// The deadline is the connection's: clear it for its next request.
	defer func() { _ = a.rc.SetWriteDeadline(time.Time{}) }()
	if !deadline.IsZero() {
		a.limit = time.AfterFunc(time.Until(deadline), func() { a.tooLong.Store(true); a.cancel() })
	}
	if a.opts.Idle > 0 {
		a.watchdog.Reset(a.opts.Idle)
	} else {
		a.watchdog.Stop()
	}
	hdr := w.Header()
	h.Header(hdr, resp.Header)
	if b, whole := a.Held(); whole && !a.stream && len(resp.Trailer) == 0 && hdr.Get("Content-Length") == "" {
		hdr.Set("Content-Length", strconv.Itoa(len(b)))
	}
	a.beginWrite()
	w.WriteHeader(resp.StatusCode)
	var err error
	if a.stream {
		err = a.relayEvents(h, &res)
	} else {
		err = a.relayBody(h, &res)
	}
	a.flush()
	switch {
	case a.werr != nil:
		// A client that left after the stream's end has it all.
		res.ClientGone = !res.Ended
	case err == io.EOF:
		res.Ended = true
		a.trailers()
	case res.Ended:
		// Whatever happens after the stream's end (the client leaving,
		// the upstream closing late) does not break it.
	case a.opts.Client.Err() != nil:
		res.ClientGone = true
	default:
		a.cut(&res, err)
	}
	res.TimedOut, res.TooLong = a.timedOut.Load(), a.tooLong.Load()
	return res
}

// relayEvents relays the stream's events, the first one (read by Open)
// included, until an error (io.EOF at its end).
func (a *Attempt) relayEvents(h Hooks, res *Result) error {
	token := false
	ev := a.first
	for {
		if !token && sse.IsToken(ev) {
			token = true
			h.FirstToken()
		}
		end := sse.IsEnd(ev)
		if out := h.Event(ev); len(out) > 0 {
			if !a.write(out) {
				return a.werr
			}
			a.ender.Observe(out)
			res.Events++
		}
		res.Ended = res.Ended || end
		var err error
		if ev, err = a.rd.Next(); err != nil {
			return err
		}
	}
}

// relayBody relays a body that is not an event stream, flushed as it
// arrives.
func (a *Attempt) relayBody(h Hooks, res *Result) error {
	h.FirstToken()
	if len(a.held) > 0 && !a.write(a.held) {
		return a.werr
	}
	if a.rerr != nil {
		return a.rerr
	}
	if a.bufp == nil {
		a.bufp = copyBufs.Get().(*[]byte)
	}
	buf := *a.bufp
	src := upstream{a}
	for {
		n, err := src.Read(buf)
		if n > 0 && !a.write(buf[:n]) {
			return a.werr
		}
		if err != nil {
			return err
		}
	}
}

// cut ends a response whose upstream broke (err) after it was committed.
func (a *Attempt) cut(res *Result, err error) {
	res.Err = err
	res.Code, res.CutStatus = CodeInterrupted, http.StatusBadGateway
	switch {
	case a.tooLong.Load():
		res.Code, res.CutStatus = CodeTooLong, http.StatusGatewayTimeout
	case errors.Is(err, sse.ErrEventTooLarge):
		res.Code = CodeEventTooLarge
	}
	if !a.stream {
		res.Abort = true
		return
	}
	msg := "upstream stream interrupted"
	switch res.Code {
	case CodeTooLong:
		msg = "the response exceeded its maximum duration"
	case CodeEventTooLarge:
		msg = fmt.Sprintf("upstream sent an event over %d bytes", a.rd.Max())
	}
	a.write(a.ender.ErrorEvent(res.CutStatus, res.Code, msg))
	a.flush()
}

// trailers forwards the upstream's trailers, but internal ones
// (cluster.IsInternalHeader): an upstream must not speak for the router.
func (a *Attempt) trailers() {
	dst := a.w.Header()
	for k, v := range a.resp.Trailer {
		if len(v) > 0 && !cluster.IsInternalHeader(k) {
			dst[http.TrailerPrefix+k] = v
		}
	}
}

// beginWrite starts a batch of writes: their deadline.
func (a *Attempt) beginWrite() {
	if !a.dirty && a.opts.Write > 0 {
		_ = a.rc.SetWriteDeadline(time.Now().Add(a.opts.Write))
	}
	a.dirty = true
}

func (a *Attempt) write(b []byte) bool {
	if a.werr != nil {
		return false
	}
	a.beginWrite()
	if _, err := a.w.Write(b); err != nil {
		a.werr = err
		return false
	}
	return true
}

// flush sends what was written. The relay flushes whenever it is about to
// wait for the upstream (and at the end), so every event reaches the
// client as soon as the upstream stops sending, and a burst of events
// that arrived together goes out in one write.
func (a *Attempt) flush() {
	if !a.dirty || a.werr != nil {
		return
	}
	a.dirty = false
	if err := a.rc.Flush(); err != nil {
		a.werr = err
	}
}

// upstream reads the response body for the relay: it flushes the client
// before each read that may wait, and after the commit point each read
// restarts the idle bound.
type upstream struct{ a *Attempt }

func (u upstream) Read(p []byte) (int, error) {
	a := u.a
	if a.committed {
		a.flush()
		if a.werr != nil {
			return 0, a.werr
		}
	}
	n, err := a.resp.Body.Read(p)
	if a.committed && a.opts.Idle > 0 {
		a.watchdog.Reset(a.opts.Idle)
	}
	return n, err
}
