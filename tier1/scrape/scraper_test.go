package scrape

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/iotest"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// fakePod is a real HTTP server on loopback serving /metrics and /v1/models.
type fakePod struct {
	srv     *httptest.Server
	mu      sync.Mutex
	text    string
	models  string
	status  int
	scrapes atomic.Int64
}

func newFakePod(t *testing.T, text string) *fakePod {
	p := &fakePod{text: text, status: 200,
		models: `{"object":"list","data":[{"id":"llama","object":"model","root":"llama","parent":null},{"id":"sql-lora","object":"model","root":"/adapters/sql","parent":"llama"}]}`}
	p.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p.mu.Lock()
		defer p.mu.Unlock()
		switch r.URL.Path {
		case "/metrics":
			p.scrapes.Add(1)
			w.WriteHeader(p.status)
			fmt.Fprint(w, p.text)
		case "/v1/models":
			fmt.Fprint(w, p.models)
		default:
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(p.srv.Close)
	return p
}

func (p *fakePod) set(text string, status int) {
	p.mu.Lock()
	p.text, p.status = text, status
	p.mu.Unlock()
}

func (p *fakePod) addr() string { return strings.TrimPrefix(p.srv.URL, "http://") }

// logBuf is a concurrency-safe log sink.
type logBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuf) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuf) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestScraper(t *testing.T) {
	pod := newFakePod(t, tgiText)
	logs := &logBuf{}
	reg := prometheus.NewRegistry()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// The scrapes the scraper starts, counted as it sends them (the pod
	// counts them when they arrive, which may be later).
	var sent atomic.Int64
	tr := NewTransport()
	counting := roundTripFunc(func(r *http.Request) (*http.Response, error) {
		if r.URL.Path == "/metrics" {
			sent.Add(1)
		}
		return tr.RoundTrip(r)
	})
	s := New(ctx, Options{
		Interval:     5 * time.Millisecond,
		IdleInterval: -1, // every scrape at Interval
		Timeout:      time.Second,
		Client:       &http.Client{Transport: counting},
		Logger:       slog.New(slog.NewTextHandler(logs, nil)),
		Registerer:   reg,
	})
	defer s.Close()
	s.SetTargets([]Target{{Name: "tgi-0", Address: pod.addr(), Needs: InputWaiting | InputKV | InputLoRA}})

	// Many scrapes of a TGI pod while a KV scorer is enabled.
	waitFor(t, "10 scrapes", func() bool { return pod.scrapes.Load() >= 10 })
	st, ok := s.Get("tgi-0")
	if !ok {
		t.Fatal("pod not found")
	}
	if st.Engine != EngineTGI || st.Metrics.Waiting != 7 || st.Metrics.Running != 4 {
		t.Errorf("state = engine %q %+v", st.Engine, st.Metrics)
	}
	if got := st.Metrics.Missing; len(got) != 2 || got[0] != "kv_cache_usage" || got[1] != "lora" {
		t.Errorf("Missing = %q, want [kv_cache_usage lora]", got)
	}
	if n := strings.Count(logs.String(), "does not export metrics"); n != 1 {
		t.Errorf("missing-metric log lines = %d, want exactly 1\n%s", n, logs.String())
	}
	if v := gaugeValue(t, reg, "infergate_tier1_scorer_input_missing", "metric", "kv_cache_usage"); v != 1 {
		t.Errorf("infergate_tier1_scorer_input_missing = %v, want 1", v)
	}
	// The scraped state is exported per pod; TGI has no KV usage to export.
	if v := gaugeValue(t, reg, "infergate_tier1_pod_queue_depth", "pod", "tgi-0"); v != 7 {
		t.Errorf("infergate_tier1_pod_queue_depth = %v, want 7", v)
	}
	if v := gaugeValue(t, reg, "infergate_tier1_pod_running", "pod", "tgi-0"); v != 4 {
		t.Errorf("infergate_tier1_pod_running = %v, want 4", v)
	}
	if n := len(series(t, reg, "infergate_tier1_pod_kv_cache_usage")); n != 0 {
		t.Errorf("kv usage series for a TGI pod = %d, want 0", n)
	}
	waitFor(t, "models", func() bool { st, _ := s.Get("tgi-0"); return st.Models != nil })
	st, _ = s.Get("tgi-0")
	if !st.Serves("sql-lora") || st.Models[1].Parent != "llama" {
		t.Errorf("models = %+v", st.Models)
	}

	// The pod starts exporting KV usage (engine changes): the gauge clears.
	pod.set(vllmText, 200)
	waitFor(t, "kv present", func() bool { st, _ := s.Get("tgi-0"); return st.Metrics.HasKV })
	if n := len(series(t, reg, "infergate_tier1_scorer_input_missing")); n != 0 {
		t.Errorf("missing gauge series = %d, want 0", n)
	}
	if n := len(series(t, reg, "infergate_tier1_pod_kv_cache_usage")); n != 1 {
		t.Errorf("kv usage series once exported = %d, want 1", n)
	}

	// Failing scrapes are counted, logged once and leave the last metrics.
	pod.set("oops", 500)
	waitFor(t, "3 failures", func() bool { st, _ := s.Get("tgi-0"); return st.ConsecutiveFailures >= 3 })
	st, _ = s.Get("tgi-0")
	if st.LastError == "" || !st.Metrics.HasKV || st.Age(time.Now()) <= 0 {
		t.Errorf("after failures: err %q hasKV %v", st.LastError, st.Metrics.HasKV)
	}
	if v := series(t, reg, "infergate_tier1_scrape_errors_total")[0].GetCounter().GetValue(); v < 3 {
		t.Errorf("errors counter = %v, want >= 3", v)
	}
	if n := strings.Count(logs.String(), "scrape failed"); n != 1 {
		t.Errorf("scrape-failed log lines = %d, want 1", n)
	}
	if n := len(series(t, reg, "infergate_tier1_scrape_age_seconds")); n != 1 {
		t.Errorf("age series = %d", n)
	}

	// Removing the target stops scraping and drops its series.
	s.SetTargets(nil)
	if _, ok := s.Get("tgi-0"); ok {
		t.Error("removed pod still present")
	}
	// None may start after: SetTargets returns once the pod's loop has
	// ended. Counted where they start, not at the pod, where one already
	// on the wire may still land, later than any fixed pause under load.
	before := sent.Load()
	time.Sleep(30 * time.Millisecond)
	if after := sent.Load(); after != before {
		t.Errorf("scrapes continued after removal: %d -> %d", before, after)
	}
	if n := len(series(t, reg, "infergate_tier1_scrape_age_seconds")); n != 0 {
		t.Errorf("age series after removal = %d", n)
	}
}

func TestScraperUnreachable(t *testing.T) {
	pod := newFakePod(t, vllmText)
	addr := pod.addr()
	pod.srv.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	s := New(ctx, Options{Interval: 5 * time.Millisecond, IdleInterval: -1, Timeout: 200 * time.Millisecond, Logger: slog.New(slog.DiscardHandler)})
	defer s.Close()
	s.SetTargets([]Target{{Name: "dead", Address: addr, Engine: EngineVLLM}})
	waitFor(t, "failure", func() bool { st, _ := s.Get("dead"); return st.ConsecutiveFailures > 0 })
	st, _ := s.Get("dead")
	if !st.LastSuccess.IsZero() || st.Age(time.Now()) != -1 {
		t.Errorf("dead pod has a success: %+v", st)
	}
}

// series returns the gathered series of one metric family.
func series(t *testing.T, reg *prometheus.Registry, name string) []*dto.Metric {
	t.Helper()
	fams, err := reg.Gather()
	if err != nil {
		t.Fatalf("gather: %v", err)
	}
	for _, f := range fams {
		if f.GetName() == name {
			return f.GetMetric()
		}
	}
	return nil
}

// gaugeValue returns the value of the series of name whose label has value,
// or -1.
func gaugeValue(t *testing.T, reg *prometheus.Registry, name, label, value string) float64 {
	t.Helper()
	for _, m := range series(t, reg, name) {
		for _, lp := range m.GetLabel() {
			if lp.GetName() == label && lp.GetValue() == value {
				return m.GetGauge().GetValue()
			}
		}
	}
	return -1
}

// With Options.Client set, /metrics goes through it (net/http) instead of
// the built-in client, with the same results.
func TestScraperCustomClient(t *testing.T) {
	pod := newFakePod(t, vllmText)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var used atomic.Int64
	client := &http.Client{Transport: roundTripFunc(func(r *http.Request) (*http.Response, error) {
		used.Add(1)
		return http.DefaultTransport.RoundTrip(r)
	})}
	s := New(ctx, Options{Interval: 5 * time.Millisecond, IdleInterval: -1, Client: client, Logger: slog.New(slog.DiscardHandler)})
	defer s.Close()
	s.SetTargets([]Target{{Name: "v", Address: pod.addr()}})
	waitFor(t, "a scrape", func() bool { st, _ := s.Get("v"); return !st.LastSuccess.IsZero() })
	st, _ := s.Get("v")
	want, err := Parse("", strings.NewReader(vllmText))
	if err != nil {
		t.Fatal(err)
	}
	if st.Engine != want.Engine || st.Metrics.Waiting != want.Metrics.Waiting || st.Metrics.KVUsage != want.Metrics.KVUsage {
		t.Errorf("state = %q %+v, want %+v", st.Engine, st.Metrics, want)
	}
	if used.Load() == 0 {
		t.Error("the configured client was not used")
	}
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// A pod that answers in a form the scraper cannot read (compressed though
// identity was asked for) fails its scrapes, so it is not ready.
func TestScraperCompressedPage(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Encoding", "gzip")
		_, _ = w.Write([]byte("abc"))
	}))
	t.Cleanup(srv.Close)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	s := New(ctx, Options{Interval: 5 * time.Millisecond, IdleInterval: -1, Logger: slog.New(slog.DiscardHandler)})
	defer s.Close()
	s.SetTargets([]Target{{Name: "z", Address: strings.TrimPrefix(srv.URL, "http://"), Engine: EngineVLLM}})
	waitFor(t, "failures", func() bool { st, _ := s.Get("z"); return st.ConsecutiveFailures >= 2 })
	st, _ := s.Get("z")
	if !st.LastSuccess.IsZero() || !strings.Contains(st.LastError, "Content-Encoding") {
		t.Errorf("state = %+v", st)
	}
}

// Removing a pod whose scrape hangs does not wait for the scrape timeout.
func TestScraperRemovesHungPod(t *testing.T) {
	var requests atomic.Int64
	stop := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		requests.Add(1)
		select {
		case <-stop:
		case <-r.Context().Done():
		}
	}))
	t.Cleanup(srv.Close)
	t.Cleanup(func() { close(stop) }) // runs before srv.Close
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	s := New(ctx, Options{Interval: 5 * time.Millisecond, Timeout: time.Minute, Logger: slog.New(slog.DiscardHandler)})
	defer s.Close()
	s.SetTargets([]Target{{Name: "h", Address: strings.TrimPrefix(srv.URL, "http://"), Engine: EngineVLLM}})
	waitFor(t, "the request", func() bool { return requests.Load() > 0 })
	done := make(chan struct{})
	go func() { s.SetTargets(nil); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("SetTargets waited for the hung scrape")
	}
}

// withRequests returns a vLLM page with its running and waiting gauges set.
func withRequests(page string, running, waiting int) string {
	page = regexp.MustCompile(`(?m)^(vllm:num_requests_running\{[^}]*\}) .*$`).ReplaceAllString(page, fmt.Sprintf("${1} %d", running))
	return regexp.MustCompile(`(?m)^(vllm:num_requests_waiting\{[^}]*\}) .*$`).ReplaceAllString(page, fmt.Sprintf("${1} %d", waiting))
}

// scrapes returns the pod's count of /metrics scrapes so far.
func scrapes(s *Scraper, pod string) uint64 {
	st, _ := s.Get(pod)
	return st.Scrapes
}

// An idle pod is scraped on the idle schedule; Active wakes it at once, and
// it returns to idle when its hold runs out. With an idle interval of an
// hour every count here is exact: no scrape can come from the timer.
func TestScraperIdlePodWakesOnActive(t *testing.T) {
	pod := newFakePod(t, withRequests(vllmText, 0, 0))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var published atomic.Int64
	s := New(ctx, Options{Interval: 5 * time.Millisecond, IdleInterval: time.Hour, ActiveHold: 50 * time.Millisecond,
		ModelsInterval: time.Hour, Logger: slog.New(slog.DiscardHandler), OnUpdate: func(string) { published.Add(1) }})
	defer s.Close()
	s.SetTargets([]Target{{Name: "p", Address: pod.addr(), Engine: EngineVLLM}})

	// A new pod is scraped once at once, then sleeps on the idle schedule.
	waitFor(t, "the first scrape", func() bool { return published.Load() == 1 })
	st, _ := s.Get("p")
	if !st.Idle || st.Scrapes != 1 || st.LastSuccess.IsZero() {
		t.Fatalf("after the first scrape: idle %v, scrapes %d, err %q", st.Idle, st.Scrapes, st.LastError)
	}
	// Idle and scraped on time, its metrics are as fresh as an active
	// pod's for routing, though their real age keeps growing.
	later := st.LastSuccess.Add(30 * time.Minute)
	if got := st.MetricsAge(later); got != 0 {
		t.Errorf("MetricsAge half an idle interval after the scrape = %v, want 0", got)
	}
	if got := st.MetricsAge(st.LastSuccess.Add(time.Hour + time.Second)); got != 5*time.Millisecond+time.Second {
		t.Errorf("MetricsAge an idle interval + 1s after the scrape = %v, want 1.005s (late by 1s)", got)
	}
	if got := st.Age(later); got != 30*time.Minute {
		t.Errorf("Age = %v, want 30m", got)
	}
	time.Sleep(30 * time.Millisecond)
	if n := scrapes(s, "p"); n != 1 {
		t.Fatalf("idle pod scraped %d times, want 1", n)
	}

	// Its first request wakes it; it stays on the fast schedule until the
	// hold runs out, then sleeps again.
	s.Active("p")
	waitFor(t, "an active scrape", func() bool { st, _ := s.Get("p"); return st.Scrapes >= 3 && !st.Idle })
	waitFor(t, "idle again", func() bool { st, _ := s.Get("p"); return st.Idle })
	n := scrapes(s, "p")
	time.Sleep(30 * time.Millisecond)
	if m := scrapes(s, "p"); m != n {
		t.Fatalf("pod idle again was scraped %d more times", m-n)
	}
	s.Active("nope") // unknown pods are ignored
}

// A pod with requests in flight stays on the fast schedule past its hold,
// and goes back to idle once they are done.
func TestScraperInFlightKeepsPodActive(t *testing.T) {
	pod := newFakePod(t, withRequests(vllmText, 0, 0))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var inFlight atomic.Int64
	s := New(ctx, Options{Interval: 5 * time.Millisecond, IdleInterval: time.Hour, ActiveHold: 20 * time.Millisecond,
		ModelsInterval: time.Hour, Logger: slog.New(slog.DiscardHandler),
		InFlight: func(p string) int {
			if p != "p" {
				t.Errorf("InFlight(%q)", p)
			}
			return int(inFlight.Load())
		}})
	defer s.Close()
	inFlight.Store(1)
	s.SetTargets([]Target{{Name: "p", Address: pod.addr(), Engine: EngineVLLM}})
	// Far more scrapes than the hold alone would allow: 40 at 5ms are at
	// least 200ms, ten holds.
	waitFor(t, "40 scrapes", func() bool { return scrapes(s, "p") >= 40 })
	if st, _ := s.Get("p"); st.Idle || st.MetricsAge(st.LastSuccess.Add(time.Second)) != time.Second {
		t.Errorf("pod with a request in flight: idle %v, or its metrics age discounted", st.Idle)
	}
	inFlight.Store(0)
	waitFor(t, "idle", func() bool { st, _ := s.Get("p"); return st.Idle })
	n := scrapes(s, "p")
	time.Sleep(30 * time.Millisecond)
	if m := scrapes(s, "p"); m != n {
		t.Fatalf("idle pod scraped %d more times", m-n)
	}
}

// Requests on a pod that did not come through this router (running or
// waiting on its scrape) make it active too, until they are done.
func TestScraperOtherClientsTrafficKeepsPodActive(t *testing.T) {
	pod := newFakePod(t, withRequests(vllmText, 0, 0))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	s := New(ctx, Options{Interval: 5 * time.Millisecond, IdleInterval: 50 * time.Millisecond, ActiveHold: 20 * time.Millisecond,
		ModelsInterval: time.Hour, Logger: slog.New(slog.DiscardHandler)})
	defer s.Close()
	s.SetTargets([]Target{{Name: "p", Address: pod.addr(), Engine: EngineVLLM}})
	waitFor(t, "idle", func() bool { st, _ := s.Get("p"); return st.Idle && st.Scrapes > 0 })
	for _, tc := range []struct {
		running, waiting int
		idle             bool
	}{{1, 0, false}, {0, 0, true}, {0, 2, false}, {0, 0, true}} {
		pod.set(withRequests(vllmText, tc.running, tc.waiting), 200)
		waitFor(t, fmt.Sprintf("idle=%v with %d running, %d waiting", tc.idle, tc.running, tc.waiting), func() bool {
			st, _ := s.Get("p")
			return st.Idle == tc.idle && st.Metrics.Running == tc.running && st.Metrics.Waiting == tc.waiting
		})
	}
}

// Counted over the same window, an idle pod is scraped about window /
// IdleInterval times and an active one about window / Interval times. The
// bounds are wide (a quarter of the expected active count, four times the
// expected idle one) so a loaded machine does not fail the test; the two
// schedules differ twentyfold.
func TestScraperIntervalsUnderLoad(t *testing.T) {
	const (
		pods     = 8
		interval = 20 * time.Millisecond
		idle     = 400 * time.Millisecond
		window   = 1200 * time.Millisecond
	)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var busy sync.Map // pod name -> true while it has traffic
	s := New(ctx, Options{Interval: interval, IdleInterval: idle, ActiveHold: interval, ModelsInterval: time.Hour,
		Logger: slog.New(slog.DiscardHandler),
		InFlight: func(p string) int {
			if _, ok := busy.Load(p); ok {
				return 1
			}
			return 0
		}})
	defer s.Close()
	page := withRequests(string(loadFixture(t)), 0, 0) // no other client's requests
	var targets []Target
	for i := range pods + 1 {
		name := fmt.Sprintf("active-%d", i)
		if i == pods {
			name = "idle"
		} else {
			busy.Store(name, true)
		}
		targets = append(targets, Target{Name: name, Address: newFakePod(t, page).addr(), Engine: EngineVLLM})
	}
	s.SetTargets(targets)
	waitFor(t, "every pod scraped", func() bool {
		for _, p := range s.All() {
			if p.LastSuccess.IsZero() {
				return false
			}
		}
		return true
	})
	before := map[string]uint64{}
	for _, p := range s.All() {
		before[p.Name] = p.Scrapes
	}
	time.Sleep(window)
	for _, p := range s.All() {
		n := p.Scrapes - before[p.Name]
		if p.Errors > 0 {
			t.Errorf("%s: %d failed scrapes (%s)", p.Name, p.Errors, p.LastError)
		}
		if p.Name == "idle" {
			if want := uint64(window / idle); n > 4*want || !p.Idle {
				t.Errorf("idle pod: %d scrapes in %v (idle %v), want about %d", n, window, p.Idle, want)
			}
			continue
		}
		if want := uint64(window / interval); n < want/4 || p.Idle {
			t.Errorf("%s: %d scrapes in %v (idle %v), want about %d", p.Name, n, window, p.Idle, want)
		}
	}
}

// Each pod's /metrics and /v1/models share one kept-alive connection, also
// when the pod closes idle connections (the next scrape redials without
// failing) .
func TestScraperOneConnectionPerPod(t *testing.T) {
	for _, keepAlive := range []bool{true, false} {
		t.Run(fmt.Sprintf("keep-alive=%v", keepAlive), func(t *testing.T) {
			var conns, models atomic.Int64
			srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.URL.Path == "/v1/models" {
					models.Add(1)
					fmt.Fprint(w, `{"data":[{"id":"m"}]}`)
					return
				}
				fmt.Fprint(w, vllmText)
			}))
			srv.Config.ConnState = func(_ net.Conn, st http.ConnState) {
				if st == http.StateNew {
					conns.Add(1)
				}
			}
			srv.Config.SetKeepAlivesEnabled(keepAlive)
			srv.Start()
			t.Cleanup(srv.Close)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			s := New(ctx, Options{Interval: 2 * time.Millisecond, IdleInterval: -1, ModelsInterval: 10 * time.Millisecond,
				Logger: slog.New(slog.DiscardHandler)})
			defer s.Close()
			s.SetTargets([]Target{{Name: "p", Address: strings.TrimPrefix(srv.URL, "http://"), Engine: EngineVLLM}})
			waitFor(t, "scrapes and model reads", func() bool { return scrapes(s, "p") >= 30 && models.Load() >= 3 })
			st, _ := s.Get("p")
			if st.Errors > 0 {
				t.Errorf("%d failed scrapes: %s", st.Errors, st.LastError)
			}
			n := conns.Load()
			switch {
			case keepAlive && n != 1:
				t.Errorf("connections = %d for %d scrapes and %d model reads, want 1", n, st.Scrapes, models.Load())
			case !keepAlive && n < int64(st.Scrapes):
				t.Errorf("connections = %d for %d scrapes with keep-alive off: not redialled", n, st.Scrapes)
			}
		})
	}
}

func TestReadPage(t *testing.T) {
	for _, tc := range []struct {
		name   string
		body   string
		length int64
		limit  int
		err    bool
	}{
		{name: "length", body: "abc", length: 3, limit: 10},
		{name: "unknown length", body: "abc", length: -1, limit: 10},
		{name: "exactly the limit", body: "0123456789", length: -1, limit: 10},
		{name: "over the limit", body: "0123456789x", length: -1, limit: 10, err: true},
		{name: "announced over the limit", body: "", length: 11, limit: 10, err: true},
		{name: "more than announced", body: "0123456789x", length: 3, limit: 10, err: true},
		{name: "large", body: strings.Repeat("x", 3*initialPageBuf+5), length: -1, limit: maxPage},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := readPage(iotest.OneByteReader(strings.NewReader(tc.body)), make([]byte, 0, 4), tc.length, tc.limit)
			if tc.err {
				if !errors.Is(err, errPageTooLarge) {
					t.Fatalf("err = %v, want errPageTooLarge", err)
				}
				return
			}
			if err != nil || string(got) != tc.body {
				t.Fatalf("got %d bytes, %v; want %d", len(got), err, len(tc.body))
			}
		})
	}
}

// BenchmarkFetch fetches and parses the fixture page from a loopback pod
// through the scraper's client (net/http on NewTransport). ns/op includes
// the in-process server; lab/scrapecpu measures the scraper's CPU alone.
func BenchmarkFetch(b *testing.B) {
	page := loadFixture(b)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = w.Write(page) }))
	defer srv.Close()
	s := New(context.Background(), Options{})
	tg := &target{t: Target{Name: "p", Address: strings.TrimPrefix(srv.URL, "http://"), Engine: EngineVLLM}}
	tg.state.Store(&PodState{Target: tg.t, Engine: EngineVLLM})
	req, err := http.NewRequest(http.MethodGet, srv.URL+"/metrics", nil)
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(page)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := s.fetchMetrics(context.Background(), tg, req); err != nil {
			b.Fatal(err)
		}
	}
}
