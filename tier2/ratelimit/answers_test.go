package ratelimit

import (
	"context"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/infergate/infergate/internal/testservice"
	"github.com/infergate/infergate/tier2/tenant"
)

// resetOf parses an x-ratelimit-reset-* header ("59s", "1m0s", "20ms").
func resetOf(t *testing.T, h http.Header, name string) time.Duration {
	t.Helper()
	d, err := time.ParseDuration(h.Get(name))
	if err != nil {
		t.Fatalf("%s = %q: %v", name, h.Get(name), err)
	}
	return d
}

// TestPerMinuteAnswersWithinAMinute: with the production geometry (one
// minute, 2 s buckets), a per-minute limit's reset and a refused
// request's Retry-After are at most 60 s, on both backends.
func TestPerMinuteAnswersWithinAMinute(t *testing.T) {
	backends(t, func(t *testing.T, newLimiter func(Options) *Limiter) {
		l := newLimiter(Options{})
		tn := &tenant.Tenant{ID: "pm", Limits: tenant.Limits{RPM: 3, TPM: 1000}}
		for i := 0; i < 3; i++ {
			_, d := admit(t, l, tn, "m", 10)
			h := http.Header{}
			d.SetHeaders(h)
			if !d.Allowed {
				t.Fatalf("request %d refused: %+v", i, d)
			}
			for _, k := range []string{"x-ratelimit-reset-requests", "x-ratelimit-reset-tokens"} {
				if r := resetOf(t, h, k); r > time.Minute || r <= 0 {
					t.Errorf("request %d: %s = %v, want in (0, 60s]", i, k, r)
				}
			}
			if got := h.Get("x-ratelimit-remaining-requests"); got != strconv.Itoa(2-i) {
				t.Errorf("request %d: remaining-requests = %s, want %d", i, got, 2-i)
			}
		}
		_, d := admit(t, l, tn, "m", 10)
		h := http.Header{}
		d.SetHeaders(h)
		ra, err := strconv.Atoi(h.Get("Retry-After"))
		if d.Allowed || d.Code() != CodeRateLimited || err != nil || ra < 1 || ra > 60 {
			t.Fatalf("4th: allowed=%v code=%s Retry-After=%q, want refused with 1..60", d.Allowed, d.Code(), h.Get("Retry-After"))
		}
		if r := resetOf(t, h, "x-ratelimit-reset-requests"); r > time.Minute {
			t.Errorf("reset-requests = %v on the refusal", r)
		}
		if !strings.Contains(d.Message(), "3 requests per minute (tenant-wide); retry in ") {
			t.Errorf("message = %q", d.Message())
		}
	})
}

// TestRemainingAcrossReplicas: requests alternating between two replicas
// on one Redis see remaining-requests count down by one each time and the
// last unit admitted, not parked in the other replica's lease: the last
// units of a window are granted one admission at a time (op.Rsv).
func TestRemainingAcrossReplicas(t *testing.T) {
	rs := testservice.StartRedis(t)
	c := replicas(t, rs, 2, Options{Timeout: 2 * time.Second})
	tn := &tenant.Tenant{ID: "alt", Limits: tenant.Limits{RPM: 5}}
	var got []string
	for i := 0; i < 6; i++ {
		_, d := admit(t, c.limiters[i%2], tn, "m", 0)
		h := http.Header{}
		d.SetHeaders(h)
		got = append(got, strconv.FormatBool(d.Allowed)+":"+h.Get("x-ratelimit-remaining-requests"))
	}
	if want := "true:4 true:3 true:2 true:1 true:0 false:0"; strings.Join(got, " ") != want {
		t.Errorf("allowed:remaining = %s, want %s", strings.Join(got, " "), want)
	}
}

// TestBudgetRefusal: a token budget reserves each request's estimate and
// gives back what it did not use; a refusal has its own code, says the
// request's estimate and what is left, and the budget headers show it.
func TestBudgetRefusal(t *testing.T) {
	backends(t, func(t *testing.T, newLimiter func(Options) *Limiter) {
		l := newLimiter(Options{})
		tn := &tenant.Tenant{ID: "bud40", Limits: tenant.Limits{TokenBudget: 40, BudgetPeriod: tenant.PeriodDay}}
		ctx := context.Background()
		// Three requests estimated at 15 tokens that use 5 each: 15 used,
		// 25 left once they are settled.
		for i := 0; i < 3; i++ {
			res, d := admit(t, l, tn, "m", 15)
			if !d.Allowed {
				t.Fatalf("request %d refused: %+v (%s)", i, d, d.Message())
			}
			res.Finish(ctx, 5)
		}
		time.Sleep(3 * l.opts.FlushInterval) // refunds reach Redis
		_, d := admit(t, l, tn, "m", 30)
		if d.Allowed || d.Reason != ReasonBudget || d.Code() != CodeBudgetExceeded || d.Need != 30 {
			t.Fatalf("30 of 25 left: %+v", d)
		}
		if d.Remaining != 25 {
			t.Errorf("remaining = %d, want 25", d.Remaining)
		}
		for _, want := range []string{"up to 30 tokens", "25 of the daily budget of 40 tokens", "resets in", "midnight UTC", "lower max_tokens"} {
			if !strings.Contains(strings.ToLower(d.Message()), strings.ToLower(want)) {
				t.Errorf("message %q lacks %q", d.Message(), want)
			}
		}
		h := http.Header{}
		d.SetHeaders(h)
		if h.Get("x-ratelimit-limit-budget-tokens") != "40" || h.Get("x-ratelimit-remaining-budget-tokens") != "25" {
			t.Errorf("budget headers = %v", h)
		}
		if r := resetOf(t, h, "x-ratelimit-reset-budget-tokens"); r <= 0 || r > 24*time.Hour {
			t.Errorf("reset-budget-tokens = %v", r)
		}
		if ra, _ := strconv.Atoi(h.Get("Retry-After")); ra < 1 || ra > 24*3600 {
			t.Errorf("Retry-After = %q: the budget's period end", h.Get("Retry-After"))
		}
		// What is left is still usable.
		if _, d := admit(t, l, tn, "m", 25); !d.Allowed {
			t.Errorf("25 of 25 left refused: %s", d.Message())
		}
		// A request bigger than the whole budget says so.
		if _, d := admit(t, l, tn, "m", 41); d.Allowed || !strings.Contains(d.Message(), "more than the whole daily budget") {
			t.Errorf("41 > 40: %+v %q", d, d.Message())
		}
	})
}

// TestMessages covers the words of each refusal.
func TestMessages(t *testing.T) {
	for _, tc := range []struct {
		d    Decision
		code string
		want []string
	}{
		{Decision{Reason: ReasonRPM, Limit: 5, RetryAfter: 42 * time.Second}, CodeRateLimited, []string{"5 requests per minute (tenant-wide); retry in 42s"}},
		{Decision{Reason: ReasonConcurrency, Limit: 4, Model: "m"}, CodeRateLimited, []string{`4 concurrent requests (for model "m")`, "when one finishes"}},
		{Decision{Reason: ReasonTPM, Limit: 1000, Remaining: 120, Need: 300, RetryAfter: 1500 * time.Millisecond}, CodeRateLimited,
			[]string{"up to 300 tokens (prompt estimate + max_tokens", "120 of 1000 tokens per minute", "retry in 2s"}},
		{Decision{Reason: ReasonTPM, Limit: 1000, Need: 5000}, CodeRateLimited, []string{"more than the limit of 1000 tokens per minute", "lower max_tokens"}},
		{Decision{Reason: ReasonBudget, Period: tenant.PeriodMonth, Limit: 10, Remaining: 2, Need: 4, RetryAfter: 3 * time.Hour, Degraded: true}, CodeBudgetExceeded,
			[]string{"2 of the monthly budget of 10 tokens", "resets in 3h0m0s", "of the 1st", "unreachable"}},
	} {
		if tc.d.Code() != tc.code {
			t.Errorf("%s: code %s, want %s", tc.d.Reason, tc.d.Code(), tc.code)
		}
		for _, w := range tc.want {
			if !strings.Contains(tc.d.Message(), w) {
				t.Errorf("%s: message %q lacks %q", tc.d.Reason, tc.d.Message(), w)
			}
		}
	}
}
