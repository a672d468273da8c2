// Package gateway is Tier 2's HTTP front door: the OpenAI API Tier 1
// speaks, in front of every Tier 1 cluster. A request is authenticated to a
// tenant, admitted by the rate limiter, planned by tier2/route, and sent to
// the planned clusters in order until one answers: a connect error, a 5xx, a
// 429 or a timeout before the first response byte moves on to the next
// candidate within a bounded budget of attempts and time. Nothing is retried
// once a byte has reached the client. Streams are relayed event by event.
package gateway

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/infergate/infergate/shared/cluster"
	"github.com/infergate/infergate/shared/openai"
	"github.com/infergate/infergate/tier2/discovery"
	"github.com/infergate/infergate/tier2/route"
	"github.com/infergate/infergate/tier2/tenant"
)

// Authenticator resolves a request to its tenant; *tenant.Authenticator
// implements it. Errors wrapping tenant.ErrDisabled answer 403, others 401.
type Authenticator interface {
	Authenticate(ctx context.Context, r *http.Request) (*tenant.Tenant, error)
}

// Admission is a rate limiter's answer for one request.
type Admission struct {
	Allowed    bool
	Reason     string        // why not, for the 429 message
	RetryAfter time.Duration // for Retry-After when not allowed
	// SetHeaders writes the x-ratelimit-* headers; may be nil.
	SetHeaders func(h http.Header)
	// Finish reconciles the reservation with the tokens actually used;
	// may be nil. Called once, after the response.
	Finish func(ctx context.Context, actualTokens int)
}

// Limiter admits requests (a thin adapter over tier2/ratelimit).
// An error with Allowed false answers 503; with Allowed true the request
// goes ahead (the limiter chose to fail open).
type Limiter interface {
	Admit(ctx context.Context, t *tenant.Tenant, model string, estTokens int) (Admission, error)
}

// LimiterFunc adapts a function to Limiter.
type LimiterFunc func(ctx context.Context, t *tenant.Tenant, model string, estTokens int) (Admission, error)

// Admit calls f.
func (f LimiterFunc) Admit(ctx context.Context, t *tenant.Tenant, model string, estTokens int) (Admission, error) {
	return f(ctx, t, model, estTokens)
}

// Options configures a Gateway. Zero values take the defaults noted.
type Options struct {
	Router  *route.Router // required
	Auth    Authenticator // required
	Limiter Limiter       // nil: no limits
	// Ready reports readiness for /ready; nil means ready when some model
	// is routable.
	Ready func() bool

	Tier1Token string            // bearer token sent to Tier 1 (never the client's)
	Transport  http.RoundTripper // default: keep-alive transport, 2s connect timeout

	MaxAttempts    int           // clusters tried per request; default 3
	FailoverBudget time.Duration // no new attempt starts later than this after the request began; default 30s
	// FirstByteTimeout bounds the wait for a stream's first event (and its
	// headers); after it the attempt fails over. Default 30s.
	FirstByteTimeout time.Duration
	// ResponseTimeout bounds the wait for a whole non-streaming response
	// (Tier 1 answers only when generation ends). Default 5m.
	ResponseTimeout time.Duration

	MaxBodyBytes        int64 // request body limit; default 8 MiB
	MaxBufferedResponse int64 // non-streaming responses are buffered (so they can fail over) up to this; default 32 MiB
	DefaultMaxTokens    int   // completion tokens assumed for admission when the request names none; default 256

	Registry prometheus.Registerer // default: a private registry
	Gatherer prometheus.Gatherer   // for /metrics; default: Registry if it is a Gatherer
	Logger   *slog.Logger
}

func (o *Options) setDefaults() {
	if o.Transport == nil {
		o.Transport = NewTransport()
	}
	if o.MaxAttempts <= 0 {
		o.MaxAttempts = 3
	}
	if o.FailoverBudget <= 0 {
		o.FailoverBudget = 30 * time.Second
	}
	if o.FirstByteTimeout <= 0 {
		o.FirstByteTimeout = 30 * time.Second
	}
	if o.ResponseTimeout <= 0 {
		o.ResponseTimeout = 5 * time.Minute
	}
	if o.MaxBodyBytes <= 0 {
		o.MaxBodyBytes = 8 << 20
	}
	if o.MaxBufferedResponse <= 0 {
		o.MaxBufferedResponse = 32 << 20
	}
	if o.DefaultMaxTokens <= 0 {
		o.DefaultMaxTokens = 256
	}
	if o.Registry == nil {
		reg := prometheus.NewRegistry()
		o.Registry = reg
	}
	if o.Gatherer == nil {
		if g, ok := o.Registry.(prometheus.Gatherer); ok {
			o.Gatherer = g
		}
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
}

// NewTransport returns the transport used towards Tier 1: connections are
// kept alive and dialled with a short timeout so a dead cluster fails over
// fast; bodies are passed through uncompressed.
func NewTransport() *http.Transport {
	return &http.Transport{
		Proxy:                 nil,
		DialContext:           (&net.Dialer{Timeout: 2 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConns:          1024,
		MaxIdleConnsPerHost:   256,
		IdleConnTimeout:       90 * time.Second,
		TLSHandshakeTimeout:   5 * time.Second,
		ExpectContinueTimeout: time.Second,
		DisableCompression:    true,
	}
}

// Gateway is the Tier 2 HTTP handler.
type Gateway struct {
	opts Options
	log  *slog.Logger
	mux  *http.ServeMux

	mRequests  *prometheus.CounterVec
	mDuration  *prometheus.HistogramVec
	mFailovers prometheus.Counter
	mLimited   *prometheus.CounterVec
	mTokens    *prometheus.CounterVec
	mCost      *prometheus.CounterVec
}

// New builds a Gateway.
func New(opts Options) (*Gateway, error) {
	if opts.Router == nil {
		return nil, errors.New("gateway: Router is required")
	}
	if opts.Auth == nil {
		return nil, errors.New("gateway: Auth is required")
	}
	opts.setDefaults()
	g := &Gateway{
		opts: opts,
		log:  opts.Logger.With("component", "gateway"),
		mRequests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "infergate_tier2_requests_total",
			Help: "Requests answered by Tier 2, by endpoint and HTTP status.",
		}, []string{"endpoint", "code"}),
		mDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "infergate_tier2_request_duration_seconds",
			Help:    "Time from request to the end of the response, by endpoint.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2.5, 14),
		}, []string{"endpoint"}),
		mFailovers: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "infergate_tier2_failovers_total",
			Help: "Attempts that failed before any byte reached the client and moved on to another cluster.",
		}),
		mLimited: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "infergate_tier2_ratelimited_total",
			Help: "Requests refused with 429 by the tenant's limits, by the limit that tripped (rpm, tpm, concurrency, budget).",
		}, []string{"tenant", "limit"}),
		mTokens: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "infergate_tier2_tokens_total",
			Help: "Tokens served, from the responses' usage, by tenant, cluster and type (prompt, completion).",
		}, []string{"tenant", "cluster", "type"}),
		mCost: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "infergate_tier2_cost_total",
			Help: "Estimated spend from each cluster's advertised per-million-token cost (clusters priced per GPU-hour are not counted).",
		}, []string{"tenant", "cluster"}),
	}
	for _, c := range []prometheus.Collector{g.mRequests, g.mDuration, g.mFailovers, g.mLimited, g.mTokens, g.mCost} {
		if err := opts.Registry.Register(c); err != nil {
			return nil, fmt.Errorf("gateway: register metrics: %w", err)
		}
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/v1/chat/completions", g.inference)
	mux.HandleFunc("/v1/completions", g.inference)
	mux.HandleFunc("/v1/embeddings", g.inference)
	mux.HandleFunc("/v1/models", g.models)
	mux.HandleFunc("/health", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"status":"ok"}`)
	})
	mux.HandleFunc("/ready", g.ready)
	if opts.Gatherer != nil {
		mux.Handle("/metrics", promhttp.HandlerFor(opts.Gatherer, promhttp.HandlerOpts{}))
	}
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		openai.Errorf(w, http.StatusNotFound, "not_found", "unknown path "+r.URL.Path)
	})
	g.mux = mux
	return g, nil
}

// ServeHTTP implements http.Handler.
func (g *Gateway) ServeHTTP(w http.ResponseWriter, r *http.Request) { g.mux.ServeHTTP(w, r) }

func (g *Gateway) ready(w http.ResponseWriter, r *http.Request) {
	ok := false
	if g.opts.Ready != nil {
		ok = g.opts.Ready()
	} else {
		ok = len(g.opts.Router.Models()) > 0
	}
	if !ok {
		openai.Errorf(w, http.StatusServiceUnavailable, "not_ready", "no Tier 1 cluster known yet")
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = io.WriteString(w, `{"status":"ready"}`)
}

func (g *Gateway) authenticate(w http.ResponseWriter, r *http.Request) (*tenant.Tenant, bool) {
	t, err := g.opts.Auth.Authenticate(r.Context(), r)
	switch {
	case err == nil && t != nil:
		return t, true
	case errors.Is(err, tenant.ErrDisabled):
		openai.Errorf(w, http.StatusForbidden, "tenant_disabled", "this tenant is disabled")
	default:
		openai.Errorf(w, http.StatusUnauthorized, "invalid_api_key", "missing or invalid API key")
	}
	return nil, false
}

func (g *Gateway) models(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet {
		openai.Errorf(w, http.StatusMethodNotAllowed, "method_not_allowed", "use GET")
		return
	}
	if _, ok := g.authenticate(w, r); !ok {
		return
	}
	type model struct {
		ID      string `json:"id"`
		Object  string `json:"object"`
		Created int64  `json:"created"`
		OwnedBy string `json:"owned_by"`
	}
	list := struct {
		Object string  `json:"object"`
		Data   []model `json:"data"`
	}{Object: "list", Data: []model{}}
	for _, m := range g.opts.Router.Models() {
		list.Data = append(list.Data, model{ID: m, Object: "model", OwnedBy: "infergate"})
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(list)
}

type usage struct {
	PromptTokens     int `json:"prompt_tokens"`
	CompletionTokens int `json:"completion_tokens"`
	TotalTokens      int `json:"total_tokens"`
}

func (u *usage) total() int {
	if u.TotalTokens > 0 {
		return u.TotalTokens
	}
	return u.PromptTokens + u.CompletionTokens
}

// statusWriter remembers the status for metrics and whether anything was
// written (after which nothing may be retried).
type statusWriter struct {
	http.ResponseWriter
	code int
}

func (s *statusWriter) WriteHeader(code int) {
	if s.code == 0 {
		s.code = code
	}
	s.ResponseWriter.WriteHeader(code)
}

func (s *statusWriter) Write(b []byte) (int, error) {
	if s.code == 0 {
		s.code = http.StatusOK
	}
	return s.ResponseWriter.Write(b)
}

func (s *statusWriter) Flush() {
	if f, ok := s.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

func (g *Gateway) inference(rw http.ResponseWriter, r *http.Request) {
	start := time.Now()
	endpoint := strings.TrimPrefix(r.URL.Path, "/v1/")
	w := &statusWriter{ResponseWriter: rw}
	defer func() {
		code := w.code
		if code == 0 {
			code = 499 // client went away before any answer
		}
		g.mRequests.WithLabelValues(endpoint, strconv.Itoa(code)).Inc()
		g.mDuration.WithLabelValues(endpoint).Observe(time.Since(start).Seconds())
	}()
	if r.Method != http.MethodPost {
		openai.Errorf(w, http.StatusMethodNotAllowed, "method_not_allowed", "use POST")
		return
	}
	t, ok := g.authenticate(w, r)
	if !ok {
		return
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, g.opts.MaxBodyBytes+1))
	if err != nil {
		openai.Errorf(w, http.StatusBadRequest, "invalid_body", "could not read the request body")
		return
	}
	if int64(len(body)) > g.opts.MaxBodyBytes {
		openai.Errorf(w, http.StatusRequestEntityTooLarge, "body_too_large", fmt.Sprintf("request body exceeds %d bytes", g.opts.MaxBodyBytes))
		return
	}
	req, ok := decodeRequest(w, body, endpoint)
	if !ok {
		return
	}
	policy, err := route.ParsePolicy(string(t.Policy), "")
	if err != nil {
		policy = ""
	}
	plan, err := g.opts.Router.Plan(route.Request{Model: req.Model, Policy: policy, Region: t.Region})
	switch {
	case errors.Is(err, route.ErrUnknownModel):
		openai.Errorf(w, http.StatusNotFound, "model_not_found", fmt.Sprintf("the model %q does not exist or no cluster serves it", req.Model))
		return
	case err != nil:
		openai.Errorf(w, http.StatusServiceUnavailable, "no_capacity", fmt.Sprintf("no cluster can take %q requests right now", req.Model))
		return
	}

	// Admission after planning: a request we cannot route costs no quota.
	est := estimateTokens(body, req, g.opts.DefaultMaxTokens, endpoint)
	finish := func(int) {}
	if g.opts.Limiter != nil {
		adm, err := g.opts.Limiter.Admit(r.Context(), t, req.Model, est)
		if adm.SetHeaders != nil {
			adm.SetHeaders(w.Header())
		}
		if err != nil && !adm.Allowed {
			g.log.Error("rate limiter unavailable", "tenant", t.ID, "err", err)
			openai.Errorf(w, http.StatusServiceUnavailable, "rate_limiter_unavailable", "rate limiting is unavailable; try again shortly")
			return
		}
		if !adm.Allowed {
			if adm.RetryAfter > 0 && w.Header().Get("Retry-After") == "" {
				w.Header().Set("Retry-After", strconv.Itoa(int((adm.RetryAfter+time.Second-1)/time.Second)))
			}
			g.mLimited.WithLabelValues(t.ID, adm.Reason).Inc()
			msg := "rate limit exceeded"
			if adm.Reason != "" {
				msg += ": " + adm.Reason
			}
			openai.Errorf(w, http.StatusTooManyRequests, "rate_limit_exceeded", msg)
			return
		}
		if adm.Finish != nil {
			finish = func(actual int) {
				ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), 2*time.Second)
				defer cancel()
				adm.Finish(ctx, actual)
			}
		}
	}

	// For a stream, ask Tier 1 for usage even when the client did not, so
	// the limiter is reconciled with real counts; that usage chunk is then
	// kept from the client.
	injected := false
	if req.Stream && (req.StreamOptions == nil || !req.StreamOptions.IncludeUsage) {
		if nb, err := withIncludeUsage(body); err == nil {
			body, injected = nb, true
		}
	}

	x := &exchange{
		g: g, w: w, r: r, t: t, body: body, model: req.Model, stream: req.Stream, injected: injected,
		requestID: r.Header.Get("X-Request-Id"),
	}
	if x.requestID == "" {
		x.requestID = newID()
	}
	u := x.run(plan, start)
	actual := est
	if u != nil && u.total() > 0 {
		actual = u.total()
		if c := x.served; c != nil {
			g.mTokens.WithLabelValues(t.ID, c.Name, "prompt").Add(float64(u.PromptTokens))
			g.mTokens.WithLabelValues(t.ID, c.Name, "completion").Add(float64(u.CompletionTokens))
			if c.CostUnit == cluster.CostPerMTok && c.Cost > 0 {
				g.mCost.WithLabelValues(t.ID, c.Name).Add(float64(u.total()) / 1e6 * c.Cost)
			}
		}
	}
	finish(actual)
}

func newID() string {
	var b [12]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

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

	usage  *usage
	served *discovery.Cluster // the cluster whose answer reached the client
}

// attemptResult says whether the exchange is over or may move on to the
// next candidate (nothing reached the client).
type attemptResult int

const (
	resultDone  attemptResult = iota // answered (successfully or not); stop
	resultRetry                      // failed before any byte reached the client
)

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
		res, err := x.attempt(cand, a)
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
		g.log.Warn("tier1 attempt failed", "cluster", cand.Cluster.Name, "region", cand.Cluster.Region,
			"model", x.model, "attempt", attempts, "err", err, "request_id", x.requestID)
	}
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
	return nil
}

// attempt sends the request to one cluster. With resultRetry nothing was
// written to the client.
func (x *exchange) attempt(cand route.Candidate, a *route.Attempt) (attemptResult, error) {
	g := x.g
	ctx, cancel := context.WithCancel(x.r.Context())
	defer cancel()
	timeout := g.opts.ResponseTimeout
	if x.stream {
		timeout = g.opts.FirstByteTimeout
	}
	timer := time.AfterFunc(timeout, cancel)
	defer timer.Stop()
	clientGone := func(err error) error {
		if x.r.Context().Err() != nil {
			return route.ErrClientCanceled
		}
		if ctx.Err() != nil {
			return fmt.Errorf("no response within %v: %w", timeout, err)
		}
		return err
	}

	req, err := http.NewRequestWithContext(ctx, http.MethodPost, cand.Cluster.Address+x.r.URL.Path, bytes.NewReader(x.body))
	if err != nil {
		return resultRetry, err
	}
	// Only what Tier 1 needs goes through: client credentials and any
	// client-supplied internal (X-Infergate-*) headers never do.
	req.Header.Set("Content-Type", "application/json")
	if acc := x.r.Header.Get("Accept"); acc != "" {
		req.Header.Set("Accept", acc)
	}
	if g.opts.Tier1Token != "" {
		req.Header.Set("Authorization", "Bearer "+g.opts.Tier1Token)
	}
	req.Header.Set("X-Request-Id", x.requestID)
	req.Header.Set("X-Infergate-Tenant", x.t.ID)
	sent := time.Now()
	resp, err := g.opts.Transport.RoundTrip(req)
	if err != nil {
		err = clientGone(err)
		if errors.Is(err, route.ErrClientCanceled) {
			return resultDone, err
		}
		return resultRetry, err
	}
	defer resp.Body.Close()

	switch code := resp.StatusCode; {
	case code >= 500, code == http.StatusTooManyRequests,
		// Stale model list: another cluster may serve it (not a fault).
		code == http.StatusNotFound:
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
		return resultRetry, &route.StatusError{Code: code}
	case code == http.StatusUnauthorized, code == http.StatusForbidden:
		// Tier 1 refused Tier 2's own token: a misconfigured cluster, not
		// the client's fault; it counts against the cluster.
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
		return resultRetry, fmt.Errorf("tier1 rejected tier2's token (HTTP %d)", code)
	}
	h := x.w.Header()
	x.served = &cand.Cluster
	h.Set("X-Request-Id", x.requestID)
	h.Set("X-Infergate-Cluster", cand.Cluster.Name)
	h.Set("X-Infergate-Region", cand.Cluster.Region)
	if resp.StatusCode >= 400 {
		// The request's own fault: Tier 1's answer is the answer.
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		h.Set("Content-Type", resp.Header.Get("Content-Type"))
		x.w.WriteHeader(resp.StatusCode)
		_, _ = x.w.Write(b)
		return resultDone, &route.StatusError{Code: resp.StatusCode}
	}
	if x.stream && strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		return x.relayStream(ctx, resp, a, timer, sent)
	}

	// Non-streaming: buffer the answer so a failure while reading it can
	// still fail over.
	buf, err := io.ReadAll(io.LimitReader(resp.Body, g.opts.MaxBufferedResponse))
	if err != nil {
		err = clientGone(err)
		if errors.Is(err, route.ErrClientCanceled) {
			return resultDone, err
		}
		return resultRetry, fmt.Errorf("reading response: %w", err)
	}
	timer.Stop()
	var u struct {
		Usage *usage `json:"usage"`
	}
	if json.Unmarshal(buf, &u) == nil && u.Usage != nil {
		x.usage = u.Usage
	}
	h.Set("Content-Type", resp.Header.Get("Content-Type"))
	if int64(len(buf)) < g.opts.MaxBufferedResponse {
		h.Set("Content-Length", strconv.Itoa(len(buf)))
	}
	x.w.WriteHeader(resp.StatusCode)
	if _, err := x.w.Write(buf); err != nil {
		return resultDone, route.ErrClientCanceled
	}
	if int64(len(buf)) >= g.opts.MaxBufferedResponse {
		// Too big to buffer: the rest streams through, committed.
		if _, err := io.Copy(x.w, resp.Body); err != nil {
			return resultDone, clientGone(err)
		}
	}
	return resultDone, nil
}

// relayStream relays an SSE response event by event. Until the first event
// has been read nothing is written, so a cluster that dies before its first
// token still fails over.
func (x *exchange) relayStream(ctx context.Context, resp *http.Response, a *route.Attempt, timer *time.Timer, sent time.Time) (attemptResult, error) {
	br := bufio.NewReaderSize(resp.Body, 4<<10) // longer lines are handled by readEvent
	ev, err := readEvent(br)
	if err != nil {
		if x.r.Context().Err() != nil {
			return resultDone, route.ErrClientCanceled
		}
		if ctx.Err() != nil {
			return resultRetry, fmt.Errorf("no first event within %v", x.g.opts.FirstByteTimeout)
		}
		return resultRetry, fmt.Errorf("stream ended before its first event: %w", err)
	}
	timer.Stop()
	a.FirstToken(time.Since(sent))

	h := x.w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	h.Del("Content-Length")
	x.w.WriteHeader(http.StatusOK)
	for {
		if out := x.filterEvent(ev); len(out) > 0 {
			if _, err := x.w.Write(out); err != nil {
				return resultDone, route.ErrClientCanceled
			}
			x.w.Flush()
		}
		ev, err = readEvent(br)
		if err == io.EOF {
			return resultDone, nil
		}
		if err != nil {
			if x.r.Context().Err() != nil {
				return resultDone, route.ErrClientCanceled
			}
			// Bytes already reached the client: no retry, the stream just
			// ends; the cluster is charged with the failure.
			return resultDone, fmt.Errorf("stream broken: %w", err)
		}
	}
}

// readEvent reads one SSE event (lines up to a blank line), including its
// terminating blank line. io.EOF means a clean end between events.
func readEvent(br *bufio.Reader) ([]byte, error) {
	var ev []byte
	for {
		line, err := br.ReadSlice('\n')
		if err == bufio.ErrBufferFull {
			// A long line: keep reading it.
			ev = append(ev, line...)
			continue
		}
		if err != nil {
			if err == io.EOF && len(ev)+len(line) > 0 {
				ev = append(ev, line...)
				if len(bytes.TrimSpace(ev)) == 0 {
					return nil, io.EOF
				}
				return append(ev, '\n', '\n'), nil // unterminated last event
			}
			return nil, err
		}
		ev = append(ev, line...)
		if len(bytes.TrimRight(line, "\r\n")) == 0 {
			if len(bytes.TrimSpace(ev)) == 0 {
				ev = ev[:0] // stray blank line
				continue
			}
			return ev, nil
		}
	}
}

var (
	usageObj1 = []byte(`"usage":{`)
	usageObj2 = []byte(`"usage": {`)
)

// filterEvent records usage from a stream chunk and, when the gateway asked
// for usage on the client's behalf, keeps the usage chunk from the client.
func (x *exchange) filterEvent(ev []byte) []byte {
	if !bytes.Contains(ev, usageObj1) && !bytes.Contains(ev, usageObj2) {
		return ev
	}
	data := eventData(ev)
	if data == nil {
		return ev
	}
	var chunk struct {
		Choices []json.RawMessage `json:"choices"`
		Usage   *usage            `json:"usage"`
	}
	if json.Unmarshal(data, &chunk) != nil || chunk.Usage == nil {
		return ev
	}
	x.usage = chunk.Usage
	if !x.injected {
		return ev
	}
	if len(chunk.Choices) == 0 {
		return nil // the usage-only chunk the client did not ask for
	}
	// Usage riding on a content chunk: drop just the field.
	var m map[string]json.RawMessage
	if json.Unmarshal(data, &m) != nil {
		return ev
	}
	delete(m, "usage")
	nb, err := json.Marshal(m)
	if err != nil {
		return ev
	}
	return append(append([]byte("data: "), nb...), '\n', '\n')
}

// eventData joins an event's data lines (nil if it has none).
func eventData(ev []byte) []byte {
	var data []byte
	found := false
	for _, line := range bytes.Split(ev, []byte("\n")) {
		line = bytes.TrimRight(line, "\r")
		if v, ok := bytes.CutPrefix(line, []byte("data:")); ok {
			v = bytes.TrimPrefix(v, []byte(" "))
			if found {
				data = append(data, '\n')
			}
			data = append(data, v...)
			found = true
		}
	}
	if !found {
		return nil
	}
	return data
}
