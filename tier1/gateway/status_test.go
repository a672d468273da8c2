package gateway

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/infergate/infergate/shared/config"
	"github.com/infergate/infergate/tier1/admission"
	"github.com/infergate/infergate/tier1/picker"
)

// serveMetrics starts the gateway's metrics listener (where the status
// page lives) and returns its base URL.
func serveMetrics(t testing.TB, gw *Gateway) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = gw.ServeMetrics(ctx, ln, time.Second) }()
	t.Cleanup(func() { cancel(); <-done })
	return "http://" + ln.Addr().String()
}

// getJSON GETs url with token ("" none) and decodes a 200 answer into v;
// it returns the status.
func getJSON(t testing.TB, url, token string, v any) int {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, url, nil)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode == http.StatusOK && v != nil {
		if err := json.Unmarshal(b, v); err != nil {
			t.Fatalf("GET %s: %v\n%s", url, err, b)
		}
	}
	return resp.StatusCode
}

type podsPage struct {
	Total, All, Offset, Limit int
	Pods                      []podStatus
}

type decisionsPage struct {
	Recorded  uint64
	Decisions []decisionJSON
}

func TestStatusAuth(t *testing.T) {
	e := newEnv(t, []*fakePod{newFakePod(t, "p0")}, "")
	base := serveMetrics(t, e.gw)
	for _, path := range []string{"summary", "pods", "decisions", "mesh", "queue"} {
		for _, tok := range []string{"", "wrong"} {
			if got := getJSON(t, base+"/status/api/"+path, tok, nil); got != http.StatusUnauthorized {
				t.Errorf("%s with token %q: %d, want 401", path, tok, got)
			}
		}
		if got := getJSON(t, base+"/status/api/"+path, testToken, nil); got != http.StatusOK {
			t.Errorf("%s with the token: %d", path, got)
		}
	}
	if got := getJSON(t, base+"/status/api/nope", testToken, nil); got != http.StatusNotFound {
		t.Errorf("unknown endpoint: %d, want 404", got)
	}
	// The page itself holds no data: no token needed, none in it.
	resp, err := http.Get(base + "/status")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(string(body), "tier1.js") || strings.Contains(string(body), "p0") {
		t.Errorf("/status: %d %s", resp.StatusCode, body)
	}
	if csp := resp.Header.Get("Content-Security-Policy"); !strings.Contains(csp, "script-src 'self'") {
		t.Errorf("/status CSP = %q", csp)
	}
	// /metrics stays open to Prometheus.
	if got := getJSON(t, base+"/metrics", "", nil); got != 200 {
		t.Errorf("/metrics: %d", got)
	}
}

// A thousand pods: the pod list pages and filters on the server, the
// summary aggregates by pool and GPU, and one page stays small.
func TestStatusThousandPods(t *testing.T) {
	live := newFakePod(t, "live-0")
	var b strings.Builder
	// Slow scrapes and a long stale_after: the scraper works through 999
	// refused connections, under -race on a loaded machine, and the live
	// pod must stay ready between its scrapes for the assertions below.
	fmt.Fprintf(&b, "auth: {tokens: [%s]}\nscrape: {interval: 5s, idle_interval: 10s, timeout: 4s}\nscheduler: {stale_after: 10m}\n", testToken)
	b.WriteString("pools:\n  - {name: big, model: llama}\n  - {name: small, model: qwen}\npods:\n")
	fmt.Fprintf(&b, "  - {name: live-0, address: %q, pool: big, engine: vllm, gpu: h100}\n", live.addr())
	// The others point at a closed port, each on its own loopback address
	// (the config refuses two pods on one server): they stay unscraped, as
	// pods that are not up yet.
	for i := 1; i < 1000; i++ {
		pool, gpu := "big", "h100"
		if i%4 == 0 {
			pool, gpu = "small", "a10g"
		}
		fmt.Fprintf(&b, "  - {name: pod-%04d, address: \"127.1.%d.%d:1\", pool: %s, engine: vllm, gpu: %s}\n", i, i/250, i%250+1, pool, gpu)
	}
	var cfg Config
	if err := config.Decode("test.yaml", []byte(b.String()), &cfg); err != nil {
		t.Fatal(err)
	}
	// startEnv's own wait (10 s) is short for a first scrape among 999
	// refused connections under -race on a loaded machine: wait longer
	// here, for the one pod that answers.
	e := startEnv(t, &cfg, nil, "")
	e.pods[live.name] = live
	deadline := time.Now().Add(60 * time.Second)
	for s, ok := e.gw.scraper.Get(live.name); !ok || s.LastSuccess.IsZero() || s.Models == nil; s, ok = e.gw.scraper.Get(live.name) {
		if time.Now().After(deadline) {
			t.Fatalf("pod %s never scraped", live.name)
		}
		time.Sleep(20 * time.Millisecond)
	}
	base := serveMetrics(t, e.gw) + "/status/api/"

	tests := []struct {
		query              string
		wantTotal, wantLen int
		wantFirst          string
	}{
		{"", 1000, 50, "live-0"},
		{"offset=950", 1000, 50, ""},
		{"offset=990&limit=50", 1000, 10, ""},
		{"limit=5000", 1000, maxPageSize, "live-0"},
		{"q=POD-0999", 1, 1, "pod-0999"},
		{"pool=small", 249, 50, "pod-0004"},
		{"gpu=a10g&limit=10", 249, 10, "pod-0004"},
		{"state=ready", 1, 1, "live-0"},
		{"state=problem", 999, 50, "pod-0001"},
		{"state=not_scraped&pool=small&offset=240", 249, 9, ""},
		{"q=nothing-matches", 0, 0, ""},
	}
	for _, tt := range tests {
		var p podsPage
		if got := getJSON(t, base+"pods?"+tt.query, testToken, &p); got != 200 {
			t.Fatalf("%s: status %d", tt.query, got)
		}
		if p.Total != tt.wantTotal || len(p.Pods) != tt.wantLen || p.All != 1000 {
			t.Errorf("%s: total %d, %d pods, all %d; want %d, %d, 1000", tt.query, p.Total, len(p.Pods), p.All, tt.wantTotal, tt.wantLen)
		}
		if tt.wantFirst != "" && (len(p.Pods) == 0 || p.Pods[0].Name != tt.wantFirst) {
			t.Errorf("%s: first pod %+v, want %s", tt.query, p.Pods[:min(1, len(p.Pods))], tt.wantFirst)
		}
	}

	var live0 podsPage
	getJSON(t, base+"pods?q=live-0", testToken, &live0)
	if p := live0.Pods[0]; p.State != stateReady || !p.Ready || p.KVUsage == nil || p.MetricsAgeMS < 0 || len(p.Models) == 0 || p.GPU != "h100" {
		t.Errorf("live pod: %+v", p)
	}
	var dead podsPage
	getJSON(t, base+"pods?q=pod-0001", testToken, &dead)
	if p := dead.Pods[0]; p.State != stateNotScraped || p.Ready || p.MetricsAgeMS != -1 {
		t.Errorf("unreachable pod: %+v", p)
	}

	var sum struct {
		Total groupStatus
		Pools []groupStatus
		GPUs  []groupStatus `json:"gpus"`
	}
	if got := getJSON(t, base+"summary", testToken, &sum); got != 200 {
		t.Fatalf("summary: %d", got)
	}
	if sum.Total.Pods != 1000 || sum.Total.States[stateReady] != 1 || sum.Total.States[stateNotScraped] != 999 {
		t.Errorf("summary total %+v", sum.Total)
	}
	if len(sum.Pools) != 2 || sum.Pools[0].Name != "big" || sum.Pools[0].Pods != 751 || sum.Pools[1].Pods != 249 || sum.Pools[0].Queue == nil {
		t.Errorf("summary pools %+v", sum.Pools)
	}
	if len(sum.GPUs) != 2 || sum.GPUs[0].Name != "a10g" || sum.GPUs[0].Pods != 249 || sum.GPUs[1].Pods != 751 {
		t.Errorf("summary gpus %+v", sum.GPUs)
	}

	// One page of 50 is a few tens of KB, whatever the fleet's size.
	resp, err := http.NewRequest(http.MethodGet, base+"pods", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Header.Set("Authorization", "Bearer "+testToken)
	r, err := http.DefaultClient.Do(resp)
	if err != nil {
		t.Fatal(err)
	}
	n, _ := io.Copy(io.Discard, r.Body)
	r.Body.Close()
	if n > 64<<10 {
		t.Errorf("one page of pods is %d bytes", n)
	}
}

// Each routed request leaves a decision: the pick with its runners-up'
// score breakdown, the pods filtered out and why, and how it ended.
func TestStatusDecisions(t *testing.T) {
	a, b, c := newFakePod(t, "a"), newFakePod(t, "b"), newFakePod(t, "c")
	// b looks busier, so a is the first choice; c will be down.
	b.set(func(p *fakePod) { p.waiting = 3; p.kv = 0.5 })
	e := newEnv(t, []*fakePod{a, b, c}, "")
	base := serveMetrics(t, e.gw) + "/status/api/"

	c.srv.Close()
	waitFor(t, "c unready", func() bool {
		s, _ := e.gw.scraper.Get("c")
		return s.ConsecutiveFailures >= 2
	})
	res := e.do(t, "POST", "/v1/chat/completions", chatBody("llama", "hello"), map[string]string{"X-Request-Id": "req-one"})
	if res.status != 200 || res.header.Get("X-Infergate-Pod") != "a" {
		t.Fatalf("first request: %d %q", res.status, res.header.Get("X-Infergate-Pod"))
	}
	var page decisionsPage
	getJSON(t, base+"decisions", testToken, &page)
	if page.Recorded != 1 || len(page.Decisions) != 1 {
		t.Fatalf("decisions: %+v", page)
	}
	d := page.Decisions[0]
	if d.RequestID != "req-one" || d.Outcome != "dispatched" || d.Pod != "a" || d.Pool != "llama-pool" || d.Cands != 2 || d.Pods != 3 {
		t.Errorf("decision %+v", d)
	}
	if !strings.Contains(d.Reason, "a: highest total") {
		t.Errorf("reason %q", d.Reason)
	}
	if len(d.Top) != 2 || d.Top[0].Pod != "a" || d.Top[0].Rank != 1 || d.Top[1].Pod != "b" || d.Top[0].Total <= d.Top[1].Total {
		t.Errorf("candidates %+v", d.Top)
	}
	if len(d.Scorers) == 0 || len(d.Top[0].Scores) != len(d.Scorers) {
		t.Errorf("scorers %+v, scores %+v", d.Scorers, d.Top[0].Scores)
	}
	// The weighted scores add up to the total.
	var sum float64
	for _, s := range d.Scorers {
		sum += s.Weight * d.Top[0].Scores[s.Name]
	}
	if sum < d.Top[0].Total-0.01 || sum > d.Top[0].Total+0.01 {
		t.Errorf("Σ weight×score = %v, total %v", sum, d.Top[0].Total)
	}
	if d.Excluded["unready"] != 1 || len(d.ExPods) != 1 || d.ExPods[0].Pod != "c" || d.ExPods[0].Reason != "unready" {
		t.Errorf("excluded %v %+v", d.Excluded, d.ExPods)
	}

	// a fails with a 5xx: the decision shows the retry on b.
	a.set(func(p *fakePod) {
		p.handler = func(w http.ResponseWriter, r *http.Request) { http.Error(w, "boom", 500) }
	})
	res = e.do(t, "POST", "/v1/chat/completions", chatBody("llama", "again"), nil)
	if res.status != 200 || res.header.Get("X-Infergate-Pod") != "b" {
		t.Fatalf("retried request: %d %q", res.status, res.header.Get("X-Infergate-Pod"))
	}
	// The call ends (and completes its decision) just after the client
	// has the response: wait for it rather than read too early.
	deadline := time.Now().Add(30 * time.Second)
	for {
		getJSON(t, base+"decisions?limit=1", testToken, &page)
		d = page.Decisions[0]
		if d.Attempts > 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if d.Served == nil || *d.Served != "b" || d.Attempts != 2 || !strings.Contains(d.Reason, "retried: served by b") {
		t.Errorf("retried decision: served %v attempts %d reason %q", d.Served, d.Attempts, d.Reason)
	}
	// Filters, and the same log on the API listener for tooling.
	getJSON(t, base+"decisions?pod=c", testToken, &page)
	if len(page.Decisions) != 2 {
		t.Errorf("decisions naming c: %d, want 2", len(page.Decisions))
	}
	getJSON(t, base+"decisions?outcome=failed", testToken, &page)
	if len(page.Decisions) != 0 {
		t.Errorf("failed decisions: %+v", page.Decisions)
	}
	res = e.do(t, "GET", "/debug/decisions?limit=5", "", nil)
	if res.status != 200 || !strings.Contains(res.body, `"request_id": "req-one"`) {
		t.Errorf("/debug/decisions: %d %s", res.status, res.body)
	}
}

// Every 503 says why: no ready pod names what the pods are doing; no pod
// answering names the attempts.
func TestStatus503Causes(t *testing.T) {
	a, b := newFakePod(t, "a"), newFakePod(t, "b")
	e := newEnv(t, []*fakePod{a, b}, "scrape: {interval: 1h}\n")

	// Scrapes are hourly: the router still thinks both are fine, tries
	// both and neither answers.
	a.srv.Close()
	b.srv.Close()
	res := e.do(t, "POST", "/v1/chat/completions", chatBody("llama", "hello"), nil)
	if res.status != 503 || errorCode(t, res.body) != "upstream_unavailable" || !strings.Contains(res.body, "tried 2 of 2 ranked pods") ||
		!strings.Contains(res.body, "failed: connect") {
		t.Errorf("nobody answering: %d %s", res.status, res.body)
	}
	// Both are now held out after the refused connections: no ready pod,
	// and the message says which way.
	res = e.do(t, "POST", "/v1/chat/completions", chatBody("llama", "hello"), nil)
	if res.status != 503 || errorCode(t, res.body) != "no_ready_pod" || !strings.Contains(res.body, `pool \"llama-pool\" has 2 pods: 2 refusing connections`) {
		t.Errorf("all refused: %d %s", res.status, res.body)
	}
	var page decisionsPage
	getJSON(t, serveMetrics(t, e.gw)+"/status/api/decisions?outcome=failed", testToken, &page)
	if len(page.Decisions) != 1 || page.Decisions[0].Code != "no_ready_pod" || page.Decisions[0].Excluded["connect_failed"] != 2 {
		t.Errorf("failed decision: %+v", page.Decisions)
	}
	getJSON(t, serveMetrics(t, e.gw)+"/status/api/decisions?outcome=dispatched", testToken, &page)
	if len(page.Decisions) != 1 || page.Decisions[0].Attempts != 2 || page.Decisions[0].Served == nil || *page.Decisions[0].Served != "" {
		t.Errorf("unanswered decision: %+v", page.Decisions)
	}
}

func TestWhyNoPod(t *testing.T) {
	a, b := newFakePod(t, "a"), newFakePod(t, "b")
	e := newEnv(t, []*fakePod{a, b}, "scrape: {interval: 20ms, unready_after: 1}\n")
	b.srv.Close()
	waitFor(t, "b unready", func() bool {
		s, _ := e.gw.scraper.Get("b")
		return s.ConsecutiveFailures >= 1
	})
	st := e.gw.state.Load()
	got := e.gw.whyNoPod(st, st.pools["llama-pool"], &picker.Request{Model: "llama"})
	if !strings.Contains(got, "1 unready (scrapes failing), 1 ready") || !strings.Contains(got, "last scrape error (b)") {
		t.Errorf("whyNoPod = %q", got)
	}
	st.pools["llama-pool"].pods = nil
	if got := e.gw.whyNoPod(st, st.pools["llama-pool"], &picker.Request{Model: "llama"}); !strings.Contains(got, "has no pods") {
		t.Errorf("empty pool: %q", got)
	}
}

// A request waiting for capacity shows in the queue, then in its
// decision.
func TestStatusQueue(t *testing.T) {
	pod := newFakePod(t, "p0")
	e := newEnv(t, []*fakePod{pod}, "queue: {max_wait: 1m}\n")
	base := serveMetrics(t, e.gw) + "/status/api/"
	pod.set(func(p *fakePod) { p.waiting = 50 })
	e.waitScraped(t)
	done := make(chan result, 1)
	go func() { done <- e.do(t, "POST", "/v1/chat/completions", chatBody("llama", "wait"), nil) }()
	var q queuesStatus
	waitFor(t, "request queued", func() bool {
		getJSON(t, base+"queue", testToken, &q)
		return len(q.Pools) == 1 && q.Pools[0].Waiting == 1
	})
	time.Sleep(20 * time.Millisecond)
	getJSON(t, base+"queue", testToken, &q)
	if p := q.Pools[0]; p.Pool != "llama-pool" || p.OldestWaitMS <= 0 || p.ByPriority["0"] != 1 || p.MaxLen != 1024 {
		t.Errorf("queue %+v", p)
	}
	pod.set(func(p *fakePod) { p.waiting = 0 })
	if r := <-done; r.status != 200 {
		t.Fatalf("queued request: %d %s", r.status, r.body)
	}
	var page decisionsPage
	getJSON(t, base+"decisions", testToken, &page)
	if d := page.Decisions[0]; !d.Queued || d.WaitedMS <= 0 || d.Cycles < 2 || !strings.Contains(d.Reason, "queued") {
		t.Errorf("queued decision %+v", d)
	}
}

func TestDecisionLogRing(t *testing.T) {
	add := func(l *decisionLog, ids ...string) []uint64 {
		var seqs []uint64
		for _, id := range ids {
			seqs = append(seqs, l.add(&decision{id: id, action: admission.Dispatch}))
		}
		return seqs
	}
	ids := func(ds []decision) string {
		var s []string
		for _, d := range ds {
			s = append(s, d.id)
		}
		return strings.Join(s, ",")
	}
	tests := []struct {
		name   string
		size   int
		add    []string
		limit  int
		resize int // 0: none
		want   string
	}{
		{"empty", 3, nil, 10, 0, ""},
		{"fewer than size", 3, []string{"a", "b"}, 10, 0, "b,a"},
		{"wraps", 3, []string{"a", "b", "c", "d", "e"}, 10, 0, "e,d,c"},
		{"limit", 3, []string{"a", "b", "c", "d"}, 2, 0, "d,c"},
		{"shrink keeps the newest", 4, []string{"a", "b", "c", "d"}, 10, 2, "d,c"},
		{"grow keeps all", 2, []string{"a", "b", "c"}, 10, 5, "c,b"},
		{"size zero is one", 0, []string{"a", "b"}, 10, 0, "b"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l := newDecisionLog(tt.size)
			add(l, tt.add...)
			if tt.resize > 0 {
				l.resize(tt.resize)
			}
			got, n := l.latest(tt.limit, nil)
			if ids(got) != tt.want || n != uint64(len(tt.add)) {
				t.Errorf("latest = %q (recorded %d), want %q (%d)", ids(got), n, tt.want, len(tt.add))
			}
		})
	}
	// An amendment reaches its own decision, never one that replaced it.
	l := newDecisionLog(2)
	seqs := add(l, "a", "b")
	l.amend(seqs[1], "pod-x", 2, "200")
	add(l, "c", "d") // a and b overwritten
	l.amend(seqs[0], "pod-y", 3, "503")
	got, _ := l.latest(10, nil)
	for _, d := range got {
		if d.amended {
			t.Errorf("decision %s amended by an overwritten one's amendment", d.id)
		}
	}
	seqs = add(l, "e")
	l.amend(seqs[0], "pod-z", 2, "200")
	if got, _ := l.latest(1, nil); !got[0].amended || got[0].served != "pod-z" {
		t.Errorf("amended decision %+v", got[0])
	}
}
