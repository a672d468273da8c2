package scrape

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
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
	s := New(ctx, Options{
		Interval:     5 * time.Millisecond,
		IdleInterval: -1, // every scrape at Interval
		Timeout:      time.Second,
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
	if v := gaugeValue(t, reg, "infergate_scorer_input_missing", "metric", "kv_cache_usage"); v != 1 {
		t.Errorf("infergate_scorer_input_missing = %v, want 1", v)
	}
	// The scraped state is exported per pod; TGI has no KV usage to export.
	if v := gaugeValue(t, reg, "infergate_pod_queue_depth", "pod", "tgi-0"); v != 7 {
		t.Errorf("infergate_pod_queue_depth = %v, want 7", v)
	}
	if v := gaugeValue(t, reg, "infergate_pod_running", "pod", "tgi-0"); v != 4 {
		t.Errorf("infergate_pod_running = %v, want 4", v)
	}
	if n := len(series(t, reg, "infergate_pod_kv_cache_usage")); n != 0 {
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
	if n := len(series(t, reg, "infergate_scorer_input_missing")); n != 0 {
		t.Errorf("missing gauge series = %d, want 0", n)
	}
	if n := len(series(t, reg, "infergate_pod_kv_cache_usage")); n != 1 {
		t.Errorf("kv usage series once exported = %d, want 1", n)
	}

	// Failing scrapes are counted, logged once and leave the last metrics.
	pod.set("oops", 500)
	waitFor(t, "3 failures", func() bool { st, _ := s.Get("tgi-0"); return st.ConsecutiveFailures >= 3 })
	st, _ = s.Get("tgi-0")
	if st.LastError == "" || !st.Metrics.HasKV || st.Age(time.Now()) <= 0 {
		t.Errorf("after failures: err %q hasKV %v", st.LastError, st.Metrics.HasKV)
	}
	if v := series(t, reg, "infergate_scrape_errors_total")[0].GetCounter().GetValue(); v < 3 {
		t.Errorf("errors counter = %v, want >= 3", v)
	}
	if n := strings.Count(logs.String(), "scrape failed"); n != 1 {
		t.Errorf("scrape-failed log lines = %d, want 1", n)
	}
	if n := len(series(t, reg, "infergate_scrape_age_seconds")); n != 1 {
		t.Errorf("age series = %d", n)
	}

	// Removing the target stops scraping and drops its series.
	s.SetTargets(nil)
	if _, ok := s.Get("tgi-0"); ok {
		t.Error("removed pod still present")
	}
	// A request already on the wire may still land; none may start after.
	time.Sleep(20 * time.Millisecond)
	before := pod.scrapes.Load()
	time.Sleep(30 * time.Millisecond)
	if after := pod.scrapes.Load(); after != before {
		t.Errorf("scrapes continued after removal: %d -> %d", before, after)
	}
	if n := len(series(t, reg, "infergate_scrape_age_seconds")); n != 0 {
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
