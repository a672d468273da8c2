package gateway

// Tracing of a Tier 1 request (docs/tracing.md): a server span per
// request, admission (with the queue wait) and each scheduling cycle
// under it, then one span per upstream attempt, whose context goes to the
// pod as W3C traceparent; the first token is an event on the attempt.
// Every helper is a no-op when tracing is off, so the hot path pays a nil
// check; call sites stay a line or two.

import (
	"context"
	"fmt"
	"net/http"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/infergate/infergate/shared/tracing"
	"github.com/infergate/infergate/tier1/admission"
	"github.com/infergate/infergate/tier1/picker"
)

// tracerName is the instrumentation scope of Tier 1's spans.
const tracerName = "github.com/infergate/infergate/tier1/gateway"

// traceRequest starts the request's span and returns r carrying it. The
// caller's traceparent is its parent only when the caller authenticated
// with a configured token (Tier 2, or a client holding a token); otherwise
// the span starts a new trace linked to the caller's, as Tier 2 does for
// clients, so an anonymous caller cannot choose trace IDs or sampling.
func (g *Gateway) traceRequest(r *http.Request, trusted bool) *http.Request {
	if !g.tracer.Enabled() {
		return r
	}
	ctx, _ := g.tracer.StartServer(r.Context(), "tier1.request", r.Header, r.Method, r.URL.Path, trusted)
	return r.WithContext(ctx)
}

// tracePick starts the span of one ext_proc pick (Envoy sends the
// request, Tier 1 only schedules it), with the same trust rule as
// traceRequest and the tenant as traceTenant names it; admission and
// scheduling spans nest under it. Envoy's upstream attempt is Envoy's to
// trace.
func (g *Gateway) tracePick(ctx context.Context, h http.Header, path string, trusted bool, tenant string) (context.Context, trace.Span) {
	if !g.tracer.Enabled() {
		return ctx, noSpan
	}
	ctx, sp := g.tracer.StartServer(ctx, "tier1.pick", h, http.MethodPost, path, trusted)
	traceTenant(ctx, tenant)
	return ctx, sp
}

// traceTenant names Tier 2's tenant (cluster.HeaderTenant, from an
// authenticated caller) on the request's span.
func traceTenant(ctx context.Context, tenant string) {
	if sp := trace.SpanFromContext(ctx); tenant != "" && sp.IsRecording() {
		sp.SetAttributes(attribute.String(tracing.Tenant, tenant))
	}
}

// endRequest ends the request's span.
func endRequest(r *http.Request) {
	if sp := trace.SpanFromContext(r.Context()); sp.IsRecording() {
		sp.End()
	}
}

// startAdmission starts the admission span (queue wait included) and
// names the model and pool on the request's span.
func (g *Gateway) startAdmission(ctx context.Context, req *picker.Request, pool *poolState) (context.Context, trace.Span) {
	if !g.tracer.Enabled() {
		return ctx, noSpan
	}
	attrs := []attribute.KeyValue{attribute.String(tracing.GenAIModel, req.Model), attribute.String(tracing.Pool, pool.cfg.Name)}
	trace.SpanFromContext(ctx).SetAttributes(attrs...)
	return g.tracer.Start(ctx, "tier1.admission", trace.WithAttributes(append(attrs,
		attribute.Int("infergate.priority", int(req.Priority)))...))
}

// endAdmission ends the admission span with its decision.
func endAdmission(sp trace.Span, d admission.Decision) {
	if !sp.IsRecording() {
		return
	}
	sp.SetAttributes(attribute.String("infergate.admission", d.Action.String()))
	if d.Action != admission.Dispatch {
		sp.SetAttributes(attribute.Int(tracing.HTTPStatus, d.Status), attribute.String(tracing.ErrorType, d.Code))
		sp.SetStatus(codes.Error, d.Message)
	}
	sp.End()
}

// traceQueued notes on the admission span that the request waited in the
// pool's queue, and how long.
func traceQueued(ctx context.Context, since time.Time) {
	if sp := trace.SpanFromContext(ctx); sp.IsRecording() {
		sp.SetAttributes(attribute.Bool("infergate.queued", true),
			attribute.Float64(tracing.QueuedMs, float64(time.Since(since).Microseconds())/1000))
	}
}

// startSchedule starts the span of one scheduling cycle.
func (g *Gateway) startSchedule(ctx context.Context) trace.Span {
	if !g.tracer.Enabled() {
		return noSpan
	}
	_, sp := g.tracer.Start(ctx, "tier1.schedule")
	return sp
}

// traceTopPods is how many ranked pods a scheduling span lists.
const traceTopPods = 3

// endSchedule ends a scheduling span with its outcome: the chosen pod,
// its total and per-scorer scores, and the best-ranked pods' totals.
func endSchedule(sp trace.Span, res *picker.Result, err error) {
	if !sp.IsRecording() {
		return
	}
	sp.SetAttributes(attribute.Int("infergate.candidates", len(res.Candidates)))
	if err != nil {
		sp.SetAttributes(attribute.String(tracing.ErrorType, err.Error()))
	}
	if len(res.Ranked) > 0 && (err == nil || res.Saturated) {
		chosen := res.Ranked[0]
		sp.SetAttributes(attribute.String(tracing.Pod, chosen.Name))
		if i := res.Index(chosen); i >= 0 {
			sp.SetAttributes(attribute.Float64("infergate.score.total", res.Total[i]))
			for s, name := range res.Scorers {
				sp.SetAttributes(attribute.Float64("infergate.score."+name, res.Scores[s][i]))
			}
		}
		top := make([]string, 0, traceTopPods)
		for _, p := range res.Ranked[:min(traceTopPods, len(res.Ranked))] {
			if i := res.Index(p); i >= 0 {
				top = append(top, fmt.Sprintf("%s=%.3f", p.Name, res.Total[i]))
			}
		}
		sp.SetAttributes(attribute.StringSlice("infergate.ranked", top))
	}
	sp.End()
}

// tracedAttempt is c.attempt (the n-th of the request) inside its span,
// on which the first token is marked. The span ends even when the relay
// aborts the response by panicking (http.ErrAbortHandler).
func (g *Gateway) tracedAttempt(ctx context.Context, c *call, u *upstreamCall, pod *picker.Pod, n int, canRetry func() bool) (last *attemptError) {
	if !g.tracer.Enabled() {
		return c.attempt(ctx, u, pod, canRetry)
	}
	ctx, sp := g.tracer.Start(ctx, "tier1.upstream", trace.WithSpanKind(trace.SpanKindClient),
		trace.WithAttributes(attribute.String(tracing.Pod, pod.Name), attribute.String(tracing.GenAISystem, pod.Engine),
			attribute.Int(tracing.Attempt, n)))
	c.span = sp
	returned := false
	defer func() {
		c.span = nil
		if !returned {
			sp.SetStatus(codes.Error, "response aborted")
		}
		endUpstream(sp, last)
	}()
	last = c.attempt(ctx, u, pod, canRetry)
	returned = true
	return last
}

// upstreamHeader returns the headers for a pod request: h itself when not
// tracing, else a copy carrying the attempt's traceparent (h is shared by
// every attempt of the request).
func (g *Gateway) upstreamHeader(ctx context.Context, h http.Header) http.Header {
	if !g.tracer.Enabled() {
		return h
	}
	h = h.Clone()
	tracing.Inject(ctx, h)
	return h
}

// traceStatus notes the pod's response status on the attempt's span.
func traceStatus(ctx context.Context, code int) {
	if sp := trace.SpanFromContext(ctx); sp.IsRecording() {
		sp.SetAttributes(attribute.Int(tracing.HTTPStatus, code))
	}
}

// endUpstream ends an attempt's span; err is why it failed before its
// first byte (nil once a response was relayed).
func endUpstream(sp trace.Span, err *attemptError) {
	if !sp.IsRecording() {
		return
	}
	if err != nil {
		sp.SetAttributes(attribute.String(tracing.ErrorType, err.reason))
		sp.SetStatus(codes.Error, err.err.Error())
	}
	sp.End()
}

// traceFirstToken marks the first token on the attempt's span: an event,
// and the time to it from the request's arrival as an attribute.
func traceFirstToken(sp trace.Span, start time.Time) {
	if sp == nil || !sp.IsRecording() {
		return
	}
	ttft := float64(time.Since(start).Microseconds()) / 1000
	sp.AddEvent("first_token", trace.WithAttributes(attribute.Float64(tracing.TTFTMs, ttft)))
	sp.SetAttributes(attribute.Float64(tracing.TTFTMs, ttft))
}

var noSpan = trace.SpanFromContext(context.Background())
