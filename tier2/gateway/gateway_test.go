package gateway_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/infergate/infergate/tier2/discovery"
	"github.com/infergate/infergate/tier2/gateway"
	"github.com/infergate/infergate/tier2/route"
	"github.com/infergate/infergate/tier2/tenant"
)

func static(t testing.TB, cs ...discovery.Cluster) *discovery.Discovery {
	t.Helper()
	d, err := discovery.New(discovery.Options{Static: cs})
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// fakeLimiter records admissions and reconciliations.
type fakeLimiter struct {
	mu       sync.Mutex
	deny     bool
	est      []int
	finished []int
}

func (l *fakeLimiter) Admit(_ context.Context, t *tenant.Tenant, model string, est int) (gateway.Admission, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.est = append(l.est, est)
	if l.deny {
		return gateway.Admission{Allowed: false, Reason: "tpm", RetryAfter: 1500 * time.Millisecond,
			SetHeaders: func(h http.Header) { h.Set("X-Ratelimit-Remaining-Tokens", "0") }}, nil
	}
	return gateway.Admission{Allowed: true,
		SetHeaders: func(h http.Header) { h.Set("X-Ratelimit-Remaining-Tokens", "99") },
		Finish: func(_ context.Context, actual int) {
			l.mu.Lock()
			defer l.mu.Unlock()
			l.finished = append(l.finished, actual)
		}}, nil
}

func (l *fakeLimiter) lastFinished() []int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]int(nil), l.finished...)
}

// finished waits until n admissions were settled and returns them all:
// Tier 2 settles after the answer is written, so a client may read the
// whole answer a moment before its settlement.
func (l *fakeLimiter) settled(t *testing.T, n int) []int {
	t.Helper()
	waitFor(t, 10*time.Second, fmt.Sprintf("%d settlements", n), func() bool { return len(l.lastFinished()) >= n })
	return l.lastFinished()
}

func TestProxyBasics(t *testing.T) {
	a := newTier1(t, "a", "east", "m")
	lim := &fakeLimiter{}
	s := newStack(t, stackOpts{src: static(t, a.cluster(1, 10)), gateway: func(o *gateway.Options) { o.Limiter = lim }})

	// Non-streaming: forwarded with Tier 1's token, internal headers and
	// client credentials stripped, usage reconciled.
	r := s.do(t, "key-cost", "/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":50}`,
		"X-Infergate-Tenant", "someone-else", "X-Infergate-Cluster", "b", "X-Api-Key", "key-cost", "X-Request-Id", "rid-1")
	if r.code != 200 || !strings.Contains(r.body, "hello from a") {
		t.Fatalf("got %d %s", r.code, r.body)
	}
	if r.header.Get("X-Ratelimit-Remaining-Tokens") != "99" || r.header.Get("X-Request-Id") != "rid-1" || r.cluster != "a" {
		t.Errorf("response headers = %v", r.header)
	}
	up, _ := a.lastRequest()
	if got := up.Header.Get("X-Infergate-Tenant"); got != "acme" {
		t.Errorf("tier1 saw X-Infergate-Tenant %q, want acme", got)
	}
	if up.Header.Get("X-Infergate-Cluster") != "" || up.Header.Get("X-Api-Key") != "" {
		t.Errorf("client headers leaked to tier1: %v", up.Header)
	}
	if got := up.Header.Get("Authorization"); got != "Bearer "+tier1Token {
		t.Errorf("tier1 saw Authorization %q", got)
	}
	if got := lim.settled(t, 1); len(got) != 1 || got[0] != 12 {
		t.Errorf("reconciled tokens = %v, want [12]", got)
	}
	if lim.est[0] < 50 {
		t.Errorf("estimate %d ignores max_tokens", lim.est[0])
	}

	// Other endpoints go to the same path on Tier 1.
	for _, p := range []string{"/v1/completions", "/v1/embeddings"} {
		if r := s.do(t, "key-cost", p, `{"model":"m","prompt":"x","input":"x"}`); r.code != 200 {
			t.Errorf("%s: %d %s", p, r.code, r.body)
		}
		if up, _ := a.lastRequest(); up.URL.Path != p {
			t.Errorf("tier1 path = %s, want %s", up.URL.Path, p)
		}
	}

	// /v1/models is the union of what clusters serve.
	req, _ := http.NewRequest(http.MethodGet, s.url+"/v1/models", nil)
	req.Header.Set("Authorization", "Bearer key-cost")
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var list struct {
		Data []struct{ ID string } `json:"data"`
	}
	_ = json.NewDecoder(resp.Body).Decode(&list)
	resp.Body.Close()
	if len(list.Data) != 1 || list.Data[0].ID != "m" {
		t.Errorf("models = %+v", list)
	}
	for p, want := range map[string]int{"/health": 200, "/ready": 200,
		"/metrics": 404} { // tenants' figures: served by tier2/server on its own listener
		resp, err := client.Get(s.url + p)
		if err != nil || resp.StatusCode != want {
			t.Errorf("GET %s: %v %v, want %d", p, err, resp, want)
		}
		resp.Body.Close()
	}
}

func TestBadInput(t *testing.T) {
	a := newTier1(t, "a", "east", "m", "bad-request")
	lim := &fakeLimiter{}
	s := newStack(t, stackOpts{src: static(t, a.cluster(1, 10)), gateway: func(o *gateway.Options) {
		o.Limiter = lim
		o.MaxBodyBytes = 1024
	}})
	for _, tc := range []struct {
		name, key, path, body string
		code                  int
		errCode               string
	}{
		{"no key", "", "/v1/chat/completions", `{"model":"m"}`, 401, "invalid_api_key"},
		{"bad key", "nope", "/v1/chat/completions", `{"model":"m"}`, 401, "invalid_api_key"},
		{"disabled tenant", "key-closed", "/v1/chat/completions", `{"model":"m"}`, 403, "tenant_disabled"},
		{"bad json", "key-cost", "/v1/chat/completions", `{"model":`, 400, "invalid_json"},
		{"no model", "key-cost", "/v1/chat/completions", `{"messages":[]}`, 400, "missing_model"},
		{"unknown model", "key-cost", "/v1/chat/completions", `{"model":"gpt-9"}`, 404, "model_not_found"},
		{"too large", "key-cost", "/v1/chat/completions", `{"model":"m","x":"` + strings.Repeat("a", 2000) + `"}`, 413, "body_too_large"},
		{"streamed embeddings", "key-cost", "/v1/embeddings", `{"model":"m","stream":true}`, 400, "invalid_stream"},
		{"unknown path", "key-cost", "/v1/images", `{}`, 404, "not_found"},
		{"tier1 4xx passes through", "key-cost", "/v1/chat/completions", `{"model":"bad-request"}`, 400, "bad"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := s.do(t, tc.key, tc.path, tc.body)
			if r.code != tc.code {
				t.Fatalf("status = %d, want %d (%s)", r.code, tc.code, r.body)
			}
			if _, code := errorBody(t, r.body); code != tc.errCode {
				t.Errorf("error code = %q, want %q", code, tc.errCode)
			}
		})
	}
	if hits := a.hits.Load(); hits != 1 {
		t.Errorf("tier1 got %d requests, want only the bad-request one", hits)
	}
	req, _ := http.NewRequest(http.MethodGet, s.url+"/v1/chat/completions", nil)
	req.Header.Set("Authorization", "Bearer key-cost")
	resp, _ := client.Do(req)
	resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("GET chat: %d", resp.StatusCode)
	}
	// A 4xx from Tier 1 does not count against its breaker.
	if st := s.router.BreakerState("a", "bad-request"); st != "" && st != "closed" {
		t.Errorf("breaker after a 4xx = %s", st)
	}
}

func TestRateLimited(t *testing.T) {
	a := newTier1(t, "a", "east", "m")
	lim := &fakeLimiter{deny: true}
	s := newStack(t, stackOpts{src: static(t, a.cluster(1, 10)), gateway: func(o *gateway.Options) { o.Limiter = lim }})
	r := s.chat(t, "key-cost")
	if r.code != 429 {
		t.Fatalf("status %d", r.code)
	}
	if typ, code := errorBody(t, r.body); typ != "rate_limit_error" || code != "rate_limit_exceeded" {
		t.Errorf("error = %s/%s", typ, code)
	}
	if r.header.Get("Retry-After") != "2" || r.header.Get("X-Ratelimit-Remaining-Tokens") != "0" {
		t.Errorf("headers = %v", r.header)
	}
	if a.hits.Load() != 0 {
		t.Error("a rejected request reached tier1")
	}
	if n := s.metric(t, "infergate_tier2_ratelimited_total", nil); n != 1 {
		t.Errorf("infergate_tier2_ratelimited_total = %v, want 1", n)
	}
}

// sseData returns the data payloads of an SSE body.
func sseData(body string) []string {
	var out []string
	for _, ev := range strings.Split(body, "\n\n") {
		if d, ok := strings.CutPrefix(strings.TrimSpace(ev), "data: "); ok {
			out = append(out, d)
		}
	}
	return out
}

func TestStreamingUsage(t *testing.T) {
	a := newTier1(t, "a", "east", "m")
	lim := &fakeLimiter{}
	s := newStack(t, stackOpts{src: static(t, a.cluster(1, 10)), gateway: func(o *gateway.Options) { o.Limiter = lim }})

	// The client did not ask for usage: Tier 2 asks Tier 1 for it, uses it,
	// and the client never sees the usage chunk.
	r := s.do(t, "key-cost", "/v1/chat/completions", `{"model":"m","stream":true,"stream_options":{"foo":1},"messages":[]}`)
	if r.code != 200 || r.header.Get("Content-Type") != "text/event-stream" {
		t.Fatalf("got %d %v", r.code, r.header)
	}
	data := sseData(r.body)
	if len(data) != 4 || data[3] != "[DONE]" || strings.Contains(r.body, "usage") {
		t.Fatalf("client stream = %q", r.body)
	}
	_, raw := a.lastRequest()
	var sent struct {
		StreamOptions map[string]any `json:"stream_options"`
	}
	_ = json.Unmarshal(raw, &sent)
	if sent.StreamOptions["include_usage"] != true || sent.StreamOptions["foo"] != float64(1) {
		t.Errorf("tier1 got stream_options %v", sent.StreamOptions)
	}
	if got := lim.settled(t, 1); len(got) != 1 || got[0] != 8 {
		t.Errorf("reconciled = %v, want [8]", got)
	}

	// The client asked: it gets the usage chunk.
	r = s.do(t, "key-cost", "/v1/chat/completions", `{"model":"m","stream":true,"stream_options":{"include_usage":true}}`)
	data = sseData(r.body)
	if len(data) != 5 || !strings.Contains(data[3], `"total_tokens":8`) {
		t.Fatalf("client stream with usage = %q", r.body)
	}
	if got := lim.settled(t, 2); len(got) != 2 || got[1] != 8 {
		t.Errorf("reconciled = %v", got)
	}
	// Both streams' usage is counted against the cluster that served them.
	if n := s.metric(t, "infergate_tier2_tokens_total", map[string]string{"cluster": "a"}); n != 16 {
		t.Errorf("infergate_tier2_tokens_total{cluster=a} = %v, want 16", n)
	}
}

func TestFailover(t *testing.T) {
	for _, mode := range []string{"500", "429", "hang", "stall", "dead"} {
		t.Run(mode, func(t *testing.T) {
			a := newTier1(t, "a", "east", "m")
			b := newTier1(t, "b", "east", "m")
			s := newStack(t, stackOpts{src: static(t, a.cluster(1, 100), b.cluster(2, 100)),
				// No load polls: a failed poll would demote a dead cluster
				// before the second request and make the count timing-bound.
				route: func(o *route.Options) { o.PollInterval = time.Hour },
				gateway: func(o *gateway.Options) {
					o.FirstByteTimeout = 300 * time.Millisecond
					o.ResponseTimeout = 300 * time.Millisecond
				}})
			if mode == "dead" {
				a.kill()
			} else {
				a.mode.Store(mode)
			}
			for _, body := range []string{`{"model":"m"}`, `{"model":"m","stream":true}`} {
				r := s.do(t, "key-cost", "/v1/chat/completions", body)
				if r.code != 200 || r.cluster != "b" {
					t.Fatalf("%s: got %d from %q: %s", body, r.code, r.cluster, r.body)
				}
			}
			if n := s.metric(t, "infergate_tier2_failovers_total", nil); n != 2 {
				t.Errorf("failovers = %v, want 2", n)
			}
		})
	}
}

// A cluster that refuses Tier 2's token or does not know the model is
// skipped, not blamed on the client.
func TestTier1RejectsFailOver(t *testing.T) {
	a := newTier1(t, "a", "east", "m")
	b := newTier1(t, "b", "east", "m")
	s := newStack(t, stackOpts{src: static(t, a.cluster(1, 100), b.cluster(2, 100))})
	for _, mode := range []string{"401", "404"} {
		a.mode.Store(mode)
		if r := s.chat(t, "key-cost"); r.code != 200 || r.cluster != "b" {
			t.Fatalf("a answers %s: got %d from %q", mode, r.code, r.cluster)
		}
	}
	if n := s.metric(t, "infergate_tier2_attempts_total", map[string]string{"cluster": "a", "outcome": "failure"}); n != 1 {
		t.Errorf("a's failures = %v, want 1 (the 401; a 404 is not its fault)", n)
	}
}

func TestAllClustersFailing(t *testing.T) {
	a := newTier1(t, "a", "east", "m")
	b := newTier1(t, "b", "east", "m")
	s := newStack(t, stackOpts{src: static(t, a.cluster(1, 100), b.cluster(2, 100))})
	a.mode.Store("429")
	b.mode.Store("429")
	if r := s.chat(t, "key-cost"); r.code != 429 || r.header.Get("Retry-After") == "" {
		t.Fatalf("all 429: got %d %v", r.code, r.header)
	}
	b.mode.Store("500")
	if r := s.chat(t, "key-cost"); r.code != 502 {
		t.Fatalf("429 + 500: got %d", r.code)
	}
	// 429s do not trip breakers; 500s count.
	if st := s.router.BreakerState("a", "m"); st != "closed" {
		t.Errorf("breaker a = %s", st)
	}
}

// Once bytes reached the client nothing is retried: a cluster that dies
// mid-stream ends the client's stream.
func TestNoRetryAfterBytes(t *testing.T) {
	a := newTier1(t, "a", "east", "m")
	b := newTier1(t, "b", "east", "m")
	lim := &fakeLimiter{}
	s := newStack(t, stackOpts{src: static(t, a.cluster(1, 100), b.cluster(2, 100)), gateway: func(o *gateway.Options) { o.Limiter = lim }})
	a.mode.Store("die-after-first")
	r := s.do(t, "key-cost", "/v1/chat/completions", `{"model":"m","stream":true}`)
	if r.code != 200 || !strings.Contains(r.body, "a-0") || strings.Contains(r.body, "[DONE]") {
		t.Fatalf("got %d %q", r.code, r.body)
	}
	// The client learns the stream broke: it ends with Tier 1's error event.
	if d := sseData(r.body); len(d) == 0 || !strings.Contains(d[len(d)-1], `"code":"upstream_interrupted"`) {
		t.Fatalf("stream does not end with an error event: %q", r.body)
	}
	if b.hits.Load() != 0 {
		t.Fatal("a stream that had started was retried on b")
	}
	if n := s.metric(t, "infergate_tier2_attempts_total", map[string]string{"cluster": "a", "outcome": "failure"}); n != 1 {
		t.Errorf("a's broken stream counted %v failures, want 1", n)
	}
	// Charged like a cancelled request: the prompt estimate of the body
	// Tier 1 got plus the one event relayed, not the max_tokens bound.
	_, sent := a.lastRequest()
	if got, want := lim.settled(t, 1), len(sent)/4+1+1; len(got) != 1 || got[0] != want {
		t.Errorf("broken stream charged %v, want [%d]", got, want)
	}
}

// Killing the cheap cluster under load (half JSON, half streaming
// requests): zero client errors for every request that had not started
// streaming — they fail over; a stream already flowing from the dead cluster
// may only be cut short (counted, not an error). Its breaker opens, and once
// it is back a half-open probe closes it and it takes traffic again.
func TestKillUnderLoad(t *testing.T) {
	a := newTier1(t, "a", "east", "m")
	b := newTier1(t, "b", "east", "m")
	a.chunkDelay.Store(int64(2 * time.Millisecond))
	s := newStack(t, stackOpts{src: static(t, a.cluster(1, 1000), b.cluster(2, 1000))})

	var ok, failed, cut, onA, onB atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	defer func() { close(stop); wg.Wait() }()
	for i := range 8 {
		body := `{"model":"m","messages":[{"role":"user","content":"hi"}]}`
		stream := i%2 == 1
		if stream {
			body = `{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}`
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				r, err := s.try("key-cost", "/v1/chat/completions", body)
				switch {
				case err != nil || r.code != 200:
					failed.Add(1)
					t.Logf("client error %v %d: %s", err, r.code, r.body)
				case stream && !strings.Contains(r.body, "[DONE]"):
					cut.Add(1) // was streaming from a when it died
				case r.cluster == "a":
					ok.Add(1)
					onA.Add(1)
				default:
					ok.Add(1)
					onB.Add(1)
				}
			}
		}()
	}
	waitFor(t, 5*time.Second, "traffic on a", func() bool { return onA.Load() > 50 })
	a.kill()
	waitFor(t, 5*time.Second, "a's breaker open", func() bool { return s.router.BreakerState("a", "m") == "open" })
	before := onB.Load()
	waitFor(t, 5*time.Second, "traffic on b", func() bool { return onB.Load() > before+50 })
	a.revive()
	waitFor(t, 10*time.Second, "a's breaker closed again", func() bool { return s.router.BreakerState("a", "m") == "closed" })
	back := onA.Load()
	waitFor(t, 5*time.Second, "traffic back on a", func() bool { return onA.Load() > back+20 })
	if failed.Load() != 0 {
		t.Fatalf("%d client errors out of %d", failed.Load(), ok.Load()+failed.Load())
	}
	t.Logf("requests ok=%d (on a=%d, on b=%d), streams cut mid-way=%d; breaker transitions to open=%v",
		ok.Load(), onA.Load(), onB.Load(), cut.Load(),
		s.metric(t, "infergate_tier2_breaker_transitions_total", map[string]string{"cluster": "a", "to": "open"}))
}

// Losing every cluster of the own region moves traffic to the next region.
func TestRegionFailover(t *testing.T) {
	e1 := newTier1(t, "e1", "east", "m")
	e2 := newTier1(t, "e2", "east", "m")
	w1 := newTier1(t, "w1", "west", "m")
	s := newStack(t, stackOpts{src: static(t, e1.cluster(1, 100), e2.cluster(1, 100), w1.cluster(1, 100))})
	for range 5 {
		if r := s.do(t, "key-lat", "/v1/chat/completions", `{"model":"m"}`); r.code != 200 || r.header.Get("X-Infergate-Region") != "east" {
			t.Fatalf("latency-first with east up: %d from %s", r.code, r.header.Get("X-Infergate-Region"))
		}
	}
	e1.kill()
	e2.kill()
	for range 20 {
		r := s.do(t, "key-lat", "/v1/chat/completions", `{"model":"m"}`)
		if r.code != 200 || r.cluster != "w1" {
			t.Fatalf("east down: %d from %q: %s", r.code, r.cluster, r.body)
		}
	}
	waitFor(t, 2*time.Second, "remote decisions", func() bool {
		s.do(t, "key-lat", "/v1/chat/completions", `{"model":"m"}`)
		return s.metric(t, "infergate_tier2_route_decisions_total", map[string]string{"cluster": "w1", "reason": "remote"}) > 0
	})
}

// Two clusters at different costs: light load goes to the cheaper one,
// heavy load spills to the dearer one.
func TestCostShaping(t *testing.T) {
	cheap := newTier1(t, "cheap", "east", "m")
	dear := newTier1(t, "dear", "west", "m")
	s := newStack(t, stackOpts{src: static(t, cheap.cluster(1, 10), dear.cluster(3, 100))})
	for range 20 {
		if r := s.chat(t, "key-cost"); r.cluster != "cheap" {
			t.Fatalf("light load went to %q", r.cluster)
		}
	}
	// Heavy load reported by the cheap cluster: over the spill threshold.
	cheap.setLoad(9, 3)
	waitFor(t, 2*time.Second, "spill to the dearer cluster", func() bool { return s.chat(t, "key-cost").cluster == "dear" })
	if n := s.metric(t, "infergate_tier2_route_decisions_total", map[string]string{"cluster": "dear", "reason": "spill"}); n == 0 {
		t.Error("no spill decisions recorded")
	}
	cheap.setLoad(1, 0)
	waitFor(t, 2*time.Second, "back to the cheaper cluster", func() bool { return s.chat(t, "key-cost").cluster == "cheap" })

	// Concurrency alone spills too: slow streams hold capacity.
	cheap.chunkDelay.Store(int64(100 * time.Millisecond))
	var wg sync.WaitGroup
	var mu sync.Mutex
	got := map[string]int{}
	for range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := s.do(t, "key-cost", "/v1/chat/completions", `{"model":"m","stream":true}`)
			mu.Lock()
			got[r.cluster]++
			mu.Unlock()
		}()
	}
	wg.Wait()
	if got["cheap"] == 0 || got["dear"] == 0 {
		t.Fatalf("20 concurrent streams split %v, want both clusters used", got)
	}
	t.Logf("20 concurrent slow streams: %v", got)
}

// A region-pinned tenant never leaves its region, even when it is down.
func TestRegionPinned(t *testing.T) {
	e := newTier1(t, "e", "east", "m")
	w := newTier1(t, "w", "west", "m")
	s := newStack(t, stackOpts{src: static(t, e.cluster(1, 100), w.cluster(5, 100))})
	for range 10 {
		if r := s.chat(t, "key-west"); r.code != 200 || r.cluster != "w" {
			t.Fatalf("pinned to west: %d from %q", r.code, r.cluster)
		}
	}
	w.kill()
	before := e.hits.Load()
	for range 10 {
		r := s.chat(t, "key-west")
		if r.code == 200 {
			t.Fatalf("pinned tenant served from %q with its region down", r.cluster)
		}
		if _, code := errorBody(t, r.body); code == "" {
			t.Fatalf("no OpenAI error: %s", r.body)
		}
	}
	if e.hits.Load() != before {
		t.Fatal("a region-pinned request reached another region")
	}
	// Other tenants still get east.
	if r := s.chat(t, "key-cost"); r.cluster != "e" {
		t.Fatalf("cost-first tenant: %q", r.cluster)
	}
}
