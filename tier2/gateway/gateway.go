// Package gateway is Tier 2's HTTP front door: the OpenAI API Tier 1
// speaks, in front of every Tier 1 cluster. A request is authenticated to a
// tenant, admitted by the rate limiter, planned by tier2/route, and sent to
// the planned clusters in order until one answers: a connect error, a
// timeout or an answer relay.Retryable names (5xx, 429, 404, 401/403)
// before the first response byte moves on to the next candidate within a
// bounded budget of attempts and time. Nothing is retried once a byte has
// reached the client.
//
// Answers are relayed by shared/relay, as Tier 1's are: streams event by
// event, each event bounded (MaxEventBytes), each write to the client too
// (StreamWriteTimeout, so a client that stops reading is dropped and its
// reservation released), and the whole stream (MaxStreamDuration). A
// stream that breaks after its first byte ends with one error event, never
// after its own end. Usage is read from the answer to settle the tenant's
// token limits with real counts; when the gateway asked for it on the
// client's behalf (the body edited at the bytes the parser found, never
// re-encoded) it is kept from the client.
//
// The code follows a request: gateway.go authenticates, decodes, plans and
// admits it; exchange.go tries the planned clusters; stream.go is what
// Tier 2 adds to the relay (headers, time to first token, usage).
package gateway

import (
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

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"

	"github.com/infergate/infergate/shared/config"
	"github.com/infergate/infergate/shared/openai"
	"github.com/infergate/infergate/shared/tracing"
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
	Reason     string        // the limit that refused it (metrics label)
	Code       string        // the 429's error code; default rate_limit_exceeded
	Message    string        // the 429's message; default names Reason
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

	MaxBodyBytes int64 // request body limit; default 8 MiB
	// BodyReadTimeout bounds reading a request's headers-to-end-of-body,
	// authenticated or not; a client that stalls its body gets 400 and
	// its connection closed. Default 30s.
	BodyReadTimeout     time.Duration
	MaxBufferedResponse int64 // non-streaming responses are buffered (so they can fail over) up to this; default 32 MiB
	DefaultMaxTokens    int   // completion tokens assumed for admission when the request names none; default 256

	// MaxEventBytes bounds one SSE event read from Tier 1; a longer one
	// ends the stream with an error event. Default 1 MiB.
	MaxEventBytes int
	// StreamWriteTimeout bounds each write of a stream to the client; a
	// client that stops reading is dropped and its reservation released.
	// Default 30s.
	StreamWriteTimeout time.Duration
	// MaxStreamDuration bounds a whole stream after its first event; a
	// stream still running then ends with an error event. Default 30m.
	MaxStreamDuration time.Duration

	// Registry receives the gateway's metrics; the gateway does not serve
	// them (they name tenants): tier2/server does, on its own listener.
	// Default: a private registry.
	Registry prometheus.Registerer
	// MaxTenantLabels and MaxModelLabels bound the tenant and model label
	// values of the metrics: the first ones seen keep their own, later
	// ones read "other" (docs/metrics.md). Default 100 each.
	MaxTenantLabels, MaxModelLabels int
	Logger                          *slog.Logger
	// TracerProvider records the request's spans (docs/tracing.md); nil
	// turns tracing off.
	TracerProvider trace.TracerProvider
}

func (o *Options) setDefaults() {
	if o.Transport == nil {
		o.Transport = NewTransport()
	}
	config.Default(&o.MaxAttempts, 3)
	config.Default(&o.FailoverBudget, 30*time.Second)
	config.Default(&o.FirstByteTimeout, 30*time.Second)
	config.Default(&o.ResponseTimeout, 5*time.Minute)
	config.Default(&o.MaxBodyBytes, 8<<20)
	config.Default(&o.MaxBufferedResponse, 32<<20)
	config.Default(&o.DefaultMaxTokens, 256)
	config.Default(&o.BodyReadTimeout, 30*time.Second)
	config.Default(&o.MaxEventBytes, 1<<20)
	config.Default(&o.StreamWriteTimeout, 30*time.Second)
	config.Default(&o.MaxStreamDuration, 30*time.Minute)
	if o.Registry == nil {
		reg := prometheus.NewRegistry()
		o.Registry = reg
	}
	config.Default(&o.MaxTenantLabels, 100)
	config.Default(&o.MaxModelLabels, 100)
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
}

// Gateway is the Tier 2 HTTP handler.
type Gateway struct {
	opts Options
	log  *slog.Logger
	mux  *http.ServeMux

	metrics

	tracer tracing.Tracer
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
		opts:   opts,
		log:    opts.Logger.With("component", "gateway"),
		tracer: tracing.NewTracer(opts.TracerProvider, tracerName),
	}
	var err error
	if g.metrics, err = newMetrics(opts.Registry, opts.MaxTenantLabels, opts.MaxModelLabels); err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/v1/chat/completions", g.inference)
	mux.HandleFunc("/v1/completions", g.inference)
	mux.HandleFunc("/v1/embeddings", g.inference)
	mux.HandleFunc("/v1/responses", g.inference)
	mux.HandleFunc("/v1/messages", g.inference)
	mux.HandleFunc("/v1/messages/count_tokens", g.inference)
	mux.HandleFunc("/v1/models", g.models)
	mux.HandleFunc("/health", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"status":"ok"}`)
	})
	mux.HandleFunc("/ready", g.ready)
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

// closeAfter marks an answer given before the request body was read: the
// connection closes after it, and reading ends now, so the server does not
// wait to drain a body of up to 256 KiB that nobody will read (net/http
// drains an unread body after the handler, Connection: close or not).
func closeAfter(w http.ResponseWriter) {
	w.Header().Set("Connection", "close")
	_ = http.NewResponseController(w).SetReadDeadline(time.Now())
}

func (g *Gateway) authenticate(w http.ResponseWriter, r *http.Request) (*tenant.Tenant, bool) {
	t, err := g.opts.Auth.Authenticate(r.Context(), r)
	if err == nil && t != nil {
		return t, true
	}
	closeAfter(w)
	switch {
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

// statusWriter remembers the status for metrics and whether anything was
// written (after which nothing may be retried).
type statusWriter struct {
	http.ResponseWriter
	code      int
	anthropic bool   // an Anthropic Messages path: errors in that shape
	lab       labels // the request's metric labels, filled as it goes
}

// AnthropicErrors implements openai.AnthropicShaper.
func (s *statusWriter) AnthropicErrors() bool { return s.anthropic }

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

// Unwrap lets http.ResponseController reach the connection.
func (s *statusWriter) Unwrap() http.ResponseWriter { return s.ResponseWriter }

func (s *statusWriter) Flush() {
	if f, ok := s.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// inference serves the three inference endpoints: authenticate, decode,
// plan, admit, then the exchange with Tier 1, and settle the tokens used.
func (g *Gateway) inference(rw http.ResponseWriter, r *http.Request) {
	start := time.Now()
	endpoint := strings.TrimPrefix(r.URL.Path, "/v1/")
	w := &statusWriter{ResponseWriter: rw, anthropic: openai.IsAnthropicPath(r.URL.Path)}
	// One ID for the request in every hop, log line and answer, errors
	// included: the client's when well-formed, else a fresh one.
	id := openai.RequestID(r.Header.Get(openai.HeaderRequestID))
	w.Header().Set(openai.HeaderRequestID, id)
	log := g.log.With("request_id", id)
	defer g.observe(w, endpoint, start)
	r = g.traceRequest(r)
	defer endRequest(r, w)
	// The body must arrive in BodyReadTimeout, whoever sends it.
	rc := http.NewResponseController(rw)
	_ = rc.SetReadDeadline(start.Add(g.opts.BodyReadTimeout))
	if r.Method != http.MethodPost {
		closeAfter(w)
		openai.Errorf(w, http.StatusMethodNotAllowed, "method_not_allowed", "use POST")
		return
	}
	sp := g.step(r, "tier2.auth")
	t, ok := g.authenticate(w, r)
	endAuth(sp, r, w, t, ok)
	if !ok {
		return
	}
	w.lab.tenant = g.tenantLabels.value(t.ID)
	body, ok := g.readBody(w, r)
	if !ok {
		return
	}
	// Read in full: lift the deadline, which would otherwise end a long
	// stream (the server's background read of the connection would fail).
	_ = rc.SetReadDeadline(time.Time{})
	req, ok := decodeRequest(w, body, endpoint)
	if !ok {
		return
	}
	traceModel(r, req.Model, req.Stream)
	sp = g.step(r, "tier2.route")
	plan, ok := g.plan(w, t, req.Model)
	endRoute(sp, w, plan, ok)
	if !ok {
		return
	}

	// Admission after planning: a request we cannot route costs no quota.
	est := estimateTokens(body, req, g.opts.DefaultMaxTokens, endpoint)
	sp = g.step(r, "tier2.limits")
	finish, ok := g.admit(w, r, log, t, req.Model, est)
	endStep(sp, w, ok)
	if !ok {
		return
	}

	// For a stream, ask Tier 1 for usage even when the client did not (or
	// said false), so the limiter is reconciled with real counts; that
	// usage is then kept from the client. The body is edited at the bytes
	// the parser found, never re-encoded. (Only the chat and completions
	// APIs have stream_options; the Responses and Anthropic streams always
	// carry usage.)
	x := &exchange{
		g: g, w: w, r: r, t: t, body: body, model: req.Model, stream: req.Stream, api: openai.APIForPath(r.URL.Path),
		requestID: id, log: log, start: start,
	}
	if endpoint == "chat/completions" || endpoint == "completions" {
		sp, changed, err := req.IncludeUsage(body)
		if err != nil {
			log.Error("include_usage not set", "err", err)
		}
		if changed {
			// In place (readBody left room): req's raw fields no longer
			// point at their values, and nothing below reads them.
			x.body, x.injected = sp.Edit(body), true
		}
	}
	u := x.run(plan, start)
	traceUsage(r, u)
	if u == nil && r.Context().Err() != nil {
		log.Info("client cancelled the request", "tenant", t.ID, "model", req.Model, "relayed_events", x.relayed)
		// The client left before any usage arrived: charge what was
		// plausibly consumed, not the whole completion bound (see
		// docs/tier2-limits.md, "Cancelled requests").
		est = cancelledTokens(x.sentLen(), x.relayed)
	}
	if x.broken {
		u = brokenUsage(u, x.sentLen(), x.relayed)
	}
	finish(g.account(w.lab, x.served, u, est))
	if x.abort {
		// A broken answer that is not a stream: its limits are settled;
		// now cut the connection so the client cannot take it for whole.
		panic(http.ErrAbortHandler)
	}
}

// observe counts an answered request; 499 when nothing was answered
// because the client went away.
func (g *Gateway) observe(w *statusWriter, endpoint string, start time.Time) {
	code := w.code
	if code == 0 {
		code = 499
	}
	l := &w.lab
	g.mRequests.WithLabelValues(endpoint, strconv.Itoa(code), l.tenant, l.model, l.cluster, l.region).Inc()
	g.mDuration.WithLabelValues(endpoint, l.model, l.cluster).Observe(time.Since(start).Seconds())
}

// plan asks the router for the clusters to try, answering 404 or 503
// itself when there are none. It sets the request's model label: the
// model, or "other" for one no cluster serves.
func (g *Gateway) plan(w *statusWriter, t *tenant.Tenant, model string) ([]route.Candidate, bool) {
	policy, err := route.ParsePolicy(string(t.Policy), "")
	if err != nil {
		policy = ""
	}
	plan, err := g.opts.Router.Plan(route.Request{Model: model, Policy: policy, Region: t.Region})
	w.lab.model = g.modelLabels.value(model)
	var nc *route.NoCandidatesError
	switch {
	case errors.Is(err, route.ErrUnknownModel):
		w.lab.model = OtherLabel
		openai.Errorf(w, http.StatusNotFound, "model_not_found", fmt.Sprintf("the model %q does not exist or no cluster serves it", model))
		return nil, false
	case errors.As(err, &nc):
		// Drained, breakers open, or a pinned region: the code and the
		// message say which (docs/tier2.md, "Errors").
		if nc.RetryAfter > 0 {
			w.Header().Set("Retry-After", strconv.Itoa(int((nc.RetryAfter+time.Second-1)/time.Second)))
		}
		openai.Errorf(w, http.StatusServiceUnavailable, nc.Code(), nc.Error())
		return nil, false
	case err != nil:
		openai.Errorf(w, http.StatusServiceUnavailable, route.CodeNoCapacity, fmt.Sprintf("no cluster can take %q requests right now", model))
		return nil, false
	}
	return plan, true
}

// admit asks the limiter for est tokens of model, answering 429 or 503
// itself when refused. finish settles the admission with the tokens used.
func (g *Gateway) admit(w http.ResponseWriter, r *http.Request, log *slog.Logger, t *tenant.Tenant, model string, est int) (finish func(actual int), ok bool) {
	finish = func(int) {}
	if g.opts.Limiter == nil {
		return finish, true
	}
	adm, err := g.opts.Limiter.Admit(r.Context(), t, model, est)
	if adm.SetHeaders != nil {
		adm.SetHeaders(w.Header())
	}
	if err != nil && !adm.Allowed {
		log.Error("rate limiter unavailable", "tenant", t.ID, "err", err)
		openai.Errorf(w, http.StatusServiceUnavailable, "rate_limiter_unavailable", "rate limiting is unavailable; try again shortly")
		return nil, false
	}
	if !adm.Allowed {
		if adm.RetryAfter > 0 && w.Header().Get("Retry-After") == "" {
			w.Header().Set("Retry-After", strconv.Itoa(int((adm.RetryAfter+time.Second-1)/time.Second)))
		}
		g.mLimited.WithLabelValues(g.tenantLabels.value(t.ID), adm.Reason).Inc()
		code, msg := adm.Code, adm.Message
		if code == "" {
			code = "rate_limit_exceeded"
		}
		if msg == "" {
			msg = "rate limit exceeded"
			if adm.Reason != "" {
				msg += ": " + adm.Reason
			}
		}
		openai.Errorf(w, http.StatusTooManyRequests, code, msg)
		return nil, false
	}
	if adm.Finish != nil {
		finish = func(actual int) {
			ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), 2*time.Second)
			defer cancel()
			adm.Finish(ctx, actual)
		}
	}
	return finish, true
}

// account records the tokens and cost of a served request and returns the
// tokens to settle the admission with: the response's usage, else est.
// The cost is counted in every pricing mode the router can convert to a
// price per million tokens (per-GPU-hour needs routing.tokens_per_gpu_second).
func (g *Gateway) account(l labels, served *discovery.Cluster, u *openai.Usage, est int) int {
	if u == nil || u.Total() <= 0 {
		return est
	}
	if c := served; c != nil {
		g.mTokens.WithLabelValues(l.tenant, l.model, c.Name, "prompt").Add(float64(u.PromptTokens))
		g.mTokens.WithLabelValues(l.tenant, l.model, c.Name, "completion").Add(float64(u.CompletionTokens))
		if perMTok, ok := g.opts.Router.SpendPerMTok(*c); ok {
			g.mCost.WithLabelValues(l.tenant, l.model, c.Name).Add(float64(u.Total()) / 1e6 * perMTok)
		}
	}
	return u.Total()
}
