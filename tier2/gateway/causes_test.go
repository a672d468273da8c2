package gateway_test

import (
	"context"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/infergate/infergate/shared/cluster"
	"github.com/infergate/infergate/tier2/gateway"
	"github.com/infergate/infergate/tier2/route"
	"github.com/infergate/infergate/tier2/tenant"
)

// TestServedByHeaders: the answer names the cluster, its region and the
// pod Tier 1 chose; an answer no cluster gave names none.
func TestServedByHeaders(t *testing.T) {
	a := newTier1(t, "a", "east", "m")
	s := newStack(t, stackOpts{src: static(t, a.cluster(1, 100))})
	r := s.chat(t, "key-cost")
	if r.code != 200 || r.header.Get(cluster.HeaderCluster) != "a" || r.header.Get(cluster.HeaderRegion) != "east" || r.header.Get(cluster.HeaderPod) != "a-pod-0" {
		t.Fatalf("served: %d %v", r.code, r.header)
	}
	stream := s.do(t, "key-cost", "/v1/chat/completions", `{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}`)
	if stream.header.Get(cluster.HeaderPod) != "a-pod-0" {
		t.Errorf("stream: pod header %q", stream.header.Get(cluster.HeaderPod))
	}
	a.mode.Store("500")
	r = s.chat(t, "key-cost")
	if r.code != 502 || r.header.Get(cluster.HeaderPod) != "" || r.header.Get(cluster.HeaderCluster) != "" {
		t.Errorf("failed: %d %v", r.code, r.header)
	}
}

// TestUnavailableCauses: every 503 names its cause in the OpenAI error's
// code and message — drained clusters, open breakers, a pinned region
// without the model, Tier 1's own refusals — and says when to retry
// where Tier 2 knows.
func TestUnavailableCauses(t *testing.T) {
	keys := keys{"key-cost": {ID: "acme"}, "key-eu": {ID: "euco", Policy: tenant.PolicyRegionPinned, Region: "eu"}}
	a := newTier1(t, "a", "east", "m")
	b := newTier1(t, "b", "west", "m")
	var overrides atomic.Pointer[map[string]route.Override]
	set := func(m map[string]route.Override) { overrides.Store(&m) }
	set(nil)
	s := newStack(t, stackOpts{src: static(t, a.cluster(1, 100), b.cluster(2, 100)),
		route: func(o *route.Options) {
			o.Breaker = route.BreakerOptions{ConsecutiveFailures: 1, OpenTimeout: 30 * time.Second}
			o.Overrides = func() map[string]route.Override { return *overrides.Load() }
		},
		gateway: func(o *gateway.Options) { o.Auth = keys }})
	drain := func(on bool) {
		set(map[string]route.Override{"a": {Drain: on}, "b": {Drain: on}})
	}
	expect := func(what, key string, code int, errCode string, msg ...string) reply {
		t.Helper()
		r := s.chat(t, key)
		_, c := errorBody(t, r.body)
		if r.code != code || c != errCode {
			t.Fatalf("%s: %d %s, want %d %s (%s)", what, r.code, c, code, errCode, r.body)
		}
		for _, m := range msg {
			if !strings.Contains(r.body, m) {
				t.Errorf("%s: message lacks %q: %s", what, m, r.body)
			}
		}
		return r
	}

	expect("pinned to a region without clusters", "key-eu", 503, route.CodeRegionPinned, `no cluster in region \"eu\" serves \"m\"`)

	drain(true)
	expect("all drained", "key-cost", 503, route.CodeClusterDrained, "2 drained by an operator")
	drain(false)

	// Tier 1 refuses, each with its cause: one 503 naming both.
	a.mode.Store("503:queue_full")
	b.mode.Store("503:no_ready_pod")
	expect("tier1 refusals", "key-cost", 503, route.CodeNoCapacity, "a: queue_full", "b: no_ready_pod")

	// Those refusals count against the breakers (5xx), which opened at
	// the first failure: the next request finds both open.
	r := expect("breakers open", "key-cost", 503, route.CodeBreakerOpen, "2 with its circuit breaker open")
	if ra, err := strconv.Atoi(r.header.Get("Retry-After")); err != nil || ra < 1 || ra > 30 {
		t.Errorf("Retry-After = %q, want the time to the next probe (≤ 30s)", r.header.Get("Retry-After"))
	}

	// Drained and broken at once: both named.
	set(map[string]route.Override{"a": {Drain: true}})
	expect("drained and broken", "key-cost", 503, route.CodeNoCapacity, "1 drained", "1 with its circuit breaker open")
}

// TestTier1OverloadNamed: when every cluster answers 429, the client's
// 429 says which Tier 1 cause each gave.
func TestTier1OverloadNamed(t *testing.T) {
	a := newTier1(t, "a", "east", "m")
	s := newStack(t, stackOpts{src: static(t, a.cluster(1, 100))})
	a.mode.Store("429")
	r := s.chat(t, "key-cost")
	if _, c := errorBody(t, r.body); r.code != 429 || c != "upstream_overloaded" || !strings.Contains(r.body, "a: 429") {
		t.Errorf("429: %d %s", r.code, r.body)
	}
}

// TestRefusalCodeAndMessage: the limiter's own code and message reach
// the client's 429 (a budget refusal is not a rate limit).
func TestRefusalCodeAndMessage(t *testing.T) {
	a := newTier1(t, "a", "east", "m")
	lim := gateway.LimiterFunc(func(_ context.Context, _ *tenant.Tenant, _ string, est int) (gateway.Admission, error) {
		return gateway.Admission{Reason: "budget", Code: "budget_exceeded", RetryAfter: time.Hour,
			Message: "token budget exceeded: this request may use up to " + strconv.Itoa(est) + " tokens"}, nil
	})
	s := newStack(t, stackOpts{src: static(t, a.cluster(1, 100)), gateway: func(o *gateway.Options) { o.Limiter = lim }})
	r := s.chat(t, "key-cost")
	if _, c := errorBody(t, r.body); r.code != 429 || c != "budget_exceeded" || !strings.Contains(r.body, "may use up to") || r.header.Get("Retry-After") != "3600" {
		t.Errorf("refusal: %d %v %s", r.code, r.header, r.body)
	}
}
