package gateway

// Tracing of a Tier 2 request (docs/tracing.md): a server span per
// request with children for auth, cluster choice (route), the limits check
// and each attempt at a cluster, whose context goes to Tier 1 as W3C
// traceparent. Every helper is a no-op when tracing is off; call sites
// stay a line or two so the request path reads as before.

import (
	"context"
	"errors"
	"net/http"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/infergate/infergate/shared/openai"
	"github.com/infergate/infergate/shared/tracing"
	"github.com/infergate/infergate/tier2/route"
	"github.com/infergate/infergate/tier2/tenant"
)

// tracerName is the instrumentation scope of Tier 2's spans.
const tracerName = "github.com/infergate/infergate/tier2/gateway"

// traceRequest starts the request's span and returns r carrying it. A
// client's traceparent is not trusted as the parent (it would let any
// client choose trace IDs and force sampling): the span starts a new
// trace and links to the client's span instead.
func (g *Gateway) traceRequest(r *http.Request) *http.Request {
	if !g.tracer.Enabled() {
		return r
	}
	ctx, _ := g.tracer.StartServer(r.Context(), "tier2.request", r.Header, r.Method, r.URL.Path, false)
	return r.WithContext(ctx)
}

// endRequest ends the request's span with the status answered.
func endRequest(r *http.Request, w *statusWriter) {
	sp := trace.SpanFromContext(r.Context())
	if !sp.IsRecording() {
		return
	}
	code := w.code
	if code == 0 {
		code = 499
	}
	sp.SetAttributes(attribute.Int(tracing.HTTPStatus, code))
	if code >= 500 {
		sp.SetStatus(codes.Error, http.StatusText(code))
	}
	sp.End()
}

// traceModel notes the decoded request on its span.
func traceModel(r *http.Request, model string, stream bool) {
	if sp := trace.SpanFromContext(r.Context()); sp.IsRecording() {
		sp.SetAttributes(attribute.String(tracing.GenAIModel, model), attribute.Bool(tracing.Stream, stream))
	}
}

// step starts a child span of the request's for one step of it.
func (g *Gateway) step(r *http.Request, name string) trace.Span {
	if !g.tracer.Enabled() {
		return noSpan
	}
	_, sp := g.tracer.Start(r.Context(), name)
	return sp
}

// endStep ends a step's span; a refused step (ok false) records the
// status answered.
func endStep(sp trace.Span, w *statusWriter, ok bool) {
	if !sp.IsRecording() {
		return
	}
	if ok {
		sp.SetAttributes(attribute.String(tracing.Outcome, "ok"))
	} else {
		sp.SetAttributes(attribute.String(tracing.Outcome, "refused"), attribute.Int(tracing.HTTPStatus, w.code))
		sp.SetStatus(codes.Error, http.StatusText(w.code))
	}
	sp.End()
}

// endAuth ends the auth span, naming the tenant on the request's span.
func endAuth(sp trace.Span, r *http.Request, w *statusWriter, t *tenant.Tenant, ok bool) {
	if !sp.IsRecording() {
		return
	}
	if ok {
		trace.SpanFromContext(r.Context()).SetAttributes(attribute.String(tracing.Tenant, t.ID))
	}
	endStep(sp, w, ok)
}

// endRoute ends the cluster-choice span with the clusters planned, in the
// order they will be tried.
func endRoute(sp trace.Span, w *statusWriter, plan []route.Candidate, ok bool) {
	if !sp.IsRecording() {
		return
	}
	names := make([]string, len(plan))
	for i, c := range plan {
		names[i] = c.Cluster.Name
	}
	sp.SetAttributes(attribute.StringSlice("infergate.plan", names))
	if len(plan) > 0 {
		sp.SetAttributes(attribute.String(tracing.Cluster, plan[0].Cluster.Name),
			attribute.String(tracing.Region, plan[0].Cluster.Region), attribute.String("infergate.reason", plan[0].Reason))
	}
	endStep(sp, w, ok)
}

// startAttempt starts the span of one attempt at a cluster; send injects
// its context into the request to Tier 1.
func (x *exchange) startAttempt(cand route.Candidate, n int) trace.Span {
	if !x.g.tracer.Enabled() {
		x.span = nil
		return noSpan
	}
	_, sp := x.g.tracer.Start(x.r.Context(), "tier2.attempt", trace.WithSpanKind(trace.SpanKindClient),
		trace.WithAttributes(attribute.String(tracing.Cluster, cand.Cluster.Name), attribute.String(tracing.Region, cand.Cluster.Region),
			attribute.Int(tracing.Attempt, n), attribute.String("infergate.reason", cand.Reason)))
	x.span = sp
	return sp
}

// injectTrace puts the current attempt's context on the request to Tier 1.
func (x *exchange) injectTrace(h http.Header) {
	if x.span != nil {
		tracing.Inject(trace.ContextWithSpan(context.Background(), x.span), h)
	}
}

// endAttempt ends an attempt's span with the status Tier 1 answered (or
// the error that stopped it) and, when served, the tokens used.
func (x *exchange) endAttempt(sp trace.Span, res attemptResult, err error) {
	x.span = nil
	if !sp.IsRecording() {
		return
	}
	var se *route.StatusError
	switch {
	case errors.As(err, &se):
		sp.SetAttributes(attribute.Int(tracing.HTTPStatus, se.Code))
	case err == nil && x.w.code != 0:
		sp.SetAttributes(attribute.Int(tracing.HTTPStatus, x.w.code))
	}
	if res == resultRetry {
		sp.SetAttributes(attribute.String(tracing.Outcome, "failover"))
	} else {
		sp.SetAttributes(attribute.String(tracing.Outcome, "done"))
	}
	if err != nil {
		sp.SetStatus(codes.Error, err.Error())
	}
	if x.usage != nil && res == resultDone {
		setUsage(sp, x.usage)
	}
	sp.End()
}

// traceUsage notes the served answer's token counts on the request's span.
func traceUsage(r *http.Request, u *openai.Usage) {
	if sp := trace.SpanFromContext(r.Context()); u != nil && sp.IsRecording() {
		setUsage(sp, u)
	}
}

func setUsage(sp trace.Span, u *openai.Usage) {
	sp.SetAttributes(attribute.Int(tracing.GenAIInputTokens, u.PromptTokens), attribute.Int(tracing.GenAIOutputTokens, u.CompletionTokens))
}

var noSpan = trace.SpanFromContext(context.Background())
