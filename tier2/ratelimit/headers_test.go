package ratelimit

import (
	"net/http"
	"testing"
	"time"
)

func TestSetHeaders(t *testing.T) {
	tests := []struct {
		name string
		d    Decision
		want map[string]string // "" = absent
	}{
		{"allowed, both windows", Decision{Allowed: true,
			Requests: Window{Limit: 60, Remaining: 59, Reset: 1500 * time.Millisecond},
			Tokens:   Window{Limit: 1000, Remaining: 400, Reset: 6 * time.Minute}},
			map[string]string{
				"x-ratelimit-limit-requests": "60", "x-ratelimit-remaining-requests": "59", "x-ratelimit-reset-requests": "2s",
				"x-ratelimit-limit-tokens": "1000", "x-ratelimit-remaining-tokens": "400", "x-ratelimit-reset-tokens": "6m0s",
				"Retry-After": "",
			}},
		{"rejected", Decision{Reason: ReasonTPM, RetryAfter: 1200 * time.Millisecond, Tokens: Window{Limit: 10, Remaining: -3, Reset: 20 * time.Millisecond}},
			map[string]string{"Retry-After": "2", "retry-after-ms": "1200", "x-ratelimit-remaining-tokens": "0", "x-ratelimit-reset-tokens": "20ms", "x-ratelimit-limit-requests": ""}},
		{"no limits", Decision{Allowed: true}, map[string]string{"x-ratelimit-limit-requests": "", "x-ratelimit-limit-tokens": "", "Retry-After": ""}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := http.Header{}
			tt.d.SetHeaders(h)
			for k, v := range tt.want {
				if got := h.Get(k); got != v {
					t.Errorf("%s = %q, want %q", k, got, v)
				}
			}
		})
	}
}
