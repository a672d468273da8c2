package gateway_test

import (
	"context"
	"strings"
	"testing"

	"github.com/infergate/infergate/tier2/gateway"
	"github.com/infergate/infergate/tier2/ratelimit"
	"github.com/infergate/infergate/tier2/tenant"
)

// TestParsingAttacks replays issue 10's attacks against a real in-memory
// rate limiter: tenants with 2,000 tokens per minute whose streams are all
// still running (nothing is refunded). Bodies that the gateway and the
// engine would read differently, or whose counts would wrap the token
// estimate, must be refused with 400 and never reach Tier 1.
func TestParsingAttacks(t *testing.T) {
	a := newTier1(t, "a", "east", "m")
	rl := ratelimit.New(ratelimit.Options{})
	t.Cleanup(func() { _ = rl.Close() })
	inner := gateway.RateLimiter(rl)
	limiter := gateway.LimiterFunc(func(ctx context.Context, tn *tenant.Tenant, model string, est int) (gateway.Admission, error) {
		adm, err := inner.Admit(ctx, tn, model, est)
		adm.Finish = nil // the streams are still running: nothing comes back
		return adm, err
	})
	lim := tenant.Limits{TPM: 2000}
	auth := keys{
		"key-honest": {ID: "honest", Limits: lim},
		"key-attack": {ID: "attack", Limits: lim},
		"key-full":   {ID: "full", Limits: lim},
		"key-model":  {ID: "model"},
	}
	s := newStack(t, stackOpts{src: static(t, a.cluster(1, 10)), gateway: func(o *gateway.Options) {
		o.Limiter, o.Auth = limiter, auth
	}})
	const msgs = `"messages":[{"role":"user","content":"hi"}]`
	count := func(key, body string) map[int]int {
		codes := map[int]int{}
		for range 10 {
			codes[s.do(t, key, "/v1/chat/completions", body).code]++
		}
		return codes
	}

	// Baseline: the limit bites for honest 500-token streams.
	honest := count("key-honest", `{"model":"m",`+msgs+`,"max_tokens":500,"stream":true}`)
	if honest[200] == 0 || honest[200] > 4 || honest[429] == 0 {
		t.Fatalf("honest streams: %v, want at most 4 of 10 admitted", honest)
	}

	// encoding/json reads Max_tokens (1) over max_tokens (500); the engine
	// reads max_tokens. Old behaviour: 10 of 10 admitted.
	hits := a.hits.Load()
	attack := count("key-attack", `{"model":"m",`+msgs+`,"max_tokens":500,"Max_tokens":1,"stream":true,"Stream_options":{"include_usage":true}}`)
	if attack[400] != 10 {
		t.Fatalf("case-variant max_tokens: %v, want 10 × 400", attack)
	}
	r := s.do(t, "key-attack", "/v1/chat/completions", `{"model":"m",`+msgs+`,"max_tokens":500,"Max_tokens":1}`)
	if _, code := errorBody(t, r.body); code != "duplicate_key" || !strings.Contains(r.body, "max_tokens") {
		t.Errorf("error %s, want duplicate_key naming max_tokens", r.body)
	}

	// Limited and routed as "m" while the engine serves the other model.
	r = s.do(t, "key-model", "/v1/chat/completions", `{"model":"unlisted-expensive-model","Model":"m",`+msgs+`}`)
	if _, code := errorBody(t, r.body); r.code != 400 || code != "duplicate_key" {
		t.Errorf("case-variant model: %d %s", r.code, r.body)
	}
	r = s.do(t, "key-model", "/v1/chat/completions", `{"model":"unlisted-expensive-model",`+msgs+`,"model":"m"}`)
	if r.code != 400 {
		t.Errorf("duplicate model: %d %s", r.code, r.body)
	}

	if n := a.hits.Load() - hits; n != 0 {
		t.Errorf("%d refused requests reached tier1", n)
	}

	// Overflow: at its limit the tenant gets 429 for 1000 tokens; 2^62 × 2
	// used to wrap negative and count as nothing.
	for range 3 {
		s.do(t, "key-full", "/v1/chat/completions", `{"model":"m",`+msgs+`,"max_tokens":1000,"stream":true}`)
	}
	if r := s.do(t, "key-full", "/v1/chat/completions", `{"model":"m",`+msgs+`,"max_tokens":1000}`); r.code != 429 {
		t.Fatalf("tenant not at its limit: %d %s", r.code, r.body)
	}
	hits = a.hits.Load()
	r = s.do(t, "key-full", "/v1/chat/completions", `{"model":"m",`+msgs+`,"max_tokens":4611686018427387904,"n":2}`)
	if _, code := errorBody(t, r.body); r.code != 400 || code != "invalid_value" {
		t.Errorf("max_tokens 2^62, n 2: %d %s, want 400 invalid_value", r.code, r.body)
	}
	if n := a.hits.Load() - hits; n != 0 {
		t.Error("the 2^62 request reached tier1")
	}
}
