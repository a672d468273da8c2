package scrape

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/infergate/infergate/tier1/picker"
)

// Target is one pod to scrape.
type Target struct {
	Name    string
	Address string // host:port
	Engine  string // "" detects the engine from the metric names
	// Needs is the set of inputs the enabled scorers read for this pod; a
	// pod whose engine does not export one is reported.
	Needs Input
}

// Model is one entry of a pod's /v1/models.
type Model struct {
	ID     string `json:"id"`
	Root   string `json:"root,omitempty"`
	Parent string `json:"parent,omitempty"` // base model of a LoRA adapter
}

// PodState is the latest scraped state of one pod. Values are immutable once
// published; the scraper replaces them.
type PodState struct {
	Target
	Engine              string // effective engine (configured or detected)
	Metrics             picker.Metrics
	LastSuccess         time.Time // last successful /metrics scrape
	LastAttempt         time.Time
	LastError           string // error of the latest scrape, "" when it succeeded
	ConsecutiveFailures int
	Scrapes, Errors     uint64
	Models              []Model // from /v1/models; nil until first read
	ModelsAt            time.Time
}

// Age is the time since the last successful scrape, or -1 if there was none.
func (p *PodState) Age(now time.Time) time.Duration {
	if p.LastSuccess.IsZero() {
		return -1
	}
	return now.Sub(p.LastSuccess)
}

// Serves reports whether the pod's /v1/models lists model.
func (p *PodState) Serves(model string) bool {
	return slices.ContainsFunc(p.Models, func(m Model) bool { return m.ID == model })
}

// Options configures a Scraper. Zero fields take the defaults noted.
type Options struct {
	Interval       time.Duration // /metrics period; default 50ms
	Timeout        time.Duration // per-request timeout; default 1s
	ModelsInterval time.Duration // /v1/models period; default 5s
	// Client, when set, makes every request, /metrics included (a proxy,
	// TLS or custom dialer). By default /metrics goes through the
	// scraper's own lean HTTP/1.1 client (one persistent connection per
	// pod) and /v1/models through a dedicated keep-alive net/http client.
	Client *http.Client
	// Scheme is how pods are reached: "http" (default) or "https". The
	// lean client speaks plain HTTP only, so with https every request
	// goes through Client (give it the pods' TLS configuration).
	Scheme string
	Logger *slog.Logger // default: slog.Default()
	// Registerer receives the scrape metrics; nil registers nothing.
	Registerer prometheus.Registerer
	// ModelsToken, when set, is sent as a bearer token to /v1/models (model
	// servers started with --api-key protect it).
	ModelsToken string
	// OnUpdate, when set, is called after each scrape (from the scraping
	// goroutine; it must not block).
	OnUpdate func(pod string)
}

func (o *Options) setDefaults() (lean bool) {
	if o.Interval <= 0 {
		o.Interval = 50 * time.Millisecond
	}
	if o.Timeout <= 0 {
		o.Timeout = time.Second
	}
	if o.ModelsInterval <= 0 {
		o.ModelsInterval = 5 * time.Second
	}
	if o.Scheme == "" {
		o.Scheme = "http"
	}
	if o.Client == nil {
		o.Client = &http.Client{Transport: NewTransport()}
		lean = o.Scheme == "http"
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	return lean
}

// NewTransport is the transport of the scraper's net/http client; a caller
// scraping pods over https sets its TLS (DialTLSContext, TLSClientConfig).
func NewTransport() *http.Transport {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	// Keep one connection per pod for /metrics and one for
	// /v1/models alive: the default total of 100 idle connections
	// would make a 100-pod pool redial on most scrapes.
	tr.MaxIdleConns = 0 // no total limit
	tr.MaxIdleConnsPerHost = 4
	// Pods sit on the cluster network; inflating a gzipped page costs
	// the router more CPU than the bytes it saves (prometheus_client
	// compresses when asked).
	tr.DisableCompression = true
	// Read a whole page in a few syscalls rather than 4 KB ones.
	tr.ReadBufferSize = 64 << 10
	return tr
}

// Scraper polls a set of targets, one goroutine per target.
type Scraper struct {
	opts Options
	ctx  context.Context
	// lean: /metrics goes through pageClient rather than opts.Client.
	lean bool

	mu      sync.RWMutex
	targets map[string]*target

	errors   *prometheus.CounterVec
	duration prometheus.Histogram
	missing  *prometheus.GaugeVec
}

type target struct {
	t      Target
	state  atomic.Pointer[PodState]
	ctx    context.Context
	cancel context.CancelFunc
	done   chan struct{}
	// reported holds the metric names currently reported missing (touched
	// only by the target's goroutine).
	reported map[string]bool
	// metricsURL is built once, not on every scrape.
	metricsURL string
}

// New returns a Scraper that runs until ctx is done. Targets are added with
// SetTargets.
func New(ctx context.Context, opts Options) *Scraper {
	lean := opts.setDefaults()
	s := &Scraper{
		opts:    opts,
		lean:    lean,
		ctx:     ctx,
		targets: map[string]*target{},
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "infergate_scrape_errors_total",
			Help: "Failed scrapes of a pod's /metrics.",
		}, []string{"pod"}),
		duration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "infergate_scrape_duration_seconds",
			Help:    "Time to fetch and parse one pod's /metrics.",
			Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1},
		}),
		missing: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "infergate_scorer_input_missing",
			Help: "1 when a pod's engine does not export a metric an enabled scorer needs.",
		}, []string{"pod", "metric"}),
	}
	if opts.Registerer != nil {
		opts.Registerer.MustRegister(s.errors, s.duration, s.missing, ageCollector{s})
	}
	return s
}

// SetTargets replaces the set of targets: new ones start scraping at once,
// removed ones stop, changed ones restart. It returns once stopped targets'
// goroutines have exited.
func (s *Scraper) SetTargets(ts []Target) {
	type restart struct{ old, new *target }
	var stopped []*target
	var restarted []restart
	s.mu.Lock()
	keep := make(map[string]bool, len(ts))
	for _, t := range ts {
		keep[t.Name] = true
		old, exists := s.targets[t.Name]
		if exists && old.t == t {
			continue
		}
		ctx, cancel := context.WithCancel(s.ctx)
		tg := &target{t: t, ctx: ctx, cancel: cancel, done: make(chan struct{}), reported: map[string]bool{},
			metricsURL: s.opts.Scheme + "://" + t.Address + "/metrics"}
		tg.state.Store(&PodState{Target: t, Engine: t.Engine})
		s.targets[t.Name] = tg
		if exists {
			old.cancel()
			restarted = append(restarted, restart{old, tg})
			continue
		}
		go s.loop(tg)
	}
	for name, tg := range s.targets {
		if !keep[name] {
			tg.cancel()
			delete(s.targets, name)
			stopped = append(stopped, tg)
		}
	}
	s.mu.Unlock()
	// Wait outside the lock: a loop's OnUpdate may read the scraper.
	for _, tg := range stopped {
		<-tg.done
		s.errors.DeleteLabelValues(tg.t.Name)
		for name := range tg.reported {
			s.missing.DeleteLabelValues(tg.t.Name, name)
		}
	}
	for _, r := range restarted {
		// The new loop inherits what the old one reported so gauges of
		// metrics that reappear are cleared, and nothing is logged twice.
		<-r.old.done
		r.new.reported = r.old.reported
		go s.loop(r.new)
	}
}

// Close stops every target and waits for the goroutines to exit.
func (s *Scraper) Close() {
	s.SetTargets(nil)
}

// Get returns the latest state of the named pod.
func (s *Scraper) Get(name string) (*PodState, bool) {
	s.mu.RLock()
	tg, ok := s.targets[name]
	s.mu.RUnlock()
	if !ok {
		return nil, false
	}
	return tg.state.Load(), true
}

// All returns the latest state of every pod, sorted by name.
func (s *Scraper) All() []*PodState {
	s.mu.RLock()
	out := make([]*PodState, 0, len(s.targets))
	for _, tg := range s.targets {
		out = append(out, tg.state.Load())
	}
	s.mu.RUnlock()
	slices.SortFunc(out, func(a, b *PodState) int {
		switch {
		case a.Name < b.Name:
			return -1
		case a.Name > b.Name:
			return 1
		}
		return 0
	})
	return out
}

func (s *Scraper) loop(tg *target) {
	defer close(tg.done)
	ctx := tg.ctx
	var pc *pageClient
	if s.lean {
		pc = newPageClient(tg.t.Address, s.opts.Timeout)
		defer pc.close()
		// Stopping the target interrupts a scrape on the wire.
		defer context.AfterFunc(ctx, pc.abort)()
	}
	var nextModels time.Time
	timer := time.NewTimer(0)
	defer timer.Stop()
	// Stopping the target fires the timer, so the wait is one channel
	// receive, not a select on ctx.Done as well (measurably cheaper at
	// thousands of scrapes a second).
	defer context.AfterFunc(ctx, func() { timer.Reset(0) })()
	for {
		<-timer.C
		if ctx.Err() != nil {
			return
		}
		start := time.Now()
		s.scrapeMetrics(ctx, tg, pc, start)
		if !start.Before(nextModels) {
			s.scrapeModels(ctx, tg)
			nextModels = start.Add(s.opts.ModelsInterval)
		}
		if s.opts.OnUpdate != nil {
			s.opts.OnUpdate(tg.t.Name)
		}
		// The period runs from the start of a scrape so a slow pod is not
		// polled less often than the interval, but scrapes never overlap.
		timer.Reset(max(0, s.opts.Interval-time.Since(start)))
		// A stop that came before this Reset had its wake-up overwritten.
		if ctx.Err() != nil {
			return
		}
	}
}

func (s *Scraper) scrapeMetrics(ctx context.Context, tg *target, pc *pageClient, start time.Time) {
	var sample Sample
	var err error
	if pc != nil {
		sample, err = s.fetchPage(ctx, tg, pc, start)
	} else {
		sample, err = s.fetchMetrics(ctx, tg)
	}
	if ctx.Err() != nil {
		return // stopping; not the pod's fault
	}
	s.duration.Observe(time.Since(start).Seconds())
	prev := tg.state.Load()
	next := *prev
	next.LastAttempt = start
	next.Scrapes++
	if err != nil {
		s.errors.WithLabelValues(tg.t.Name).Inc()
		next.Errors++
		next.ConsecutiveFailures++
		next.LastError = err.Error()
		if prev.ConsecutiveFailures == 0 {
			s.opts.Logger.Warn("scrape failed", "pod", tg.t.Name, "address", tg.t.Address, "err", err)
		}
		tg.state.Store(&next)
		return
	}
	if prev.ConsecutiveFailures > 0 {
		s.opts.Logger.Info("scrape recovered", "pod", tg.t.Name, "failures", prev.ConsecutiveFailures)
	}
	next.ConsecutiveFailures = 0
	next.LastError = ""
	next.LastSuccess = time.Now()
	next.Engine = sample.Engine
	sample.Metrics.Missing = sample.Missing(tg.t.Needs)
	next.Metrics = sample.Metrics
	s.reportMissing(tg, sample.Engine, sample.Metrics.Missing)
	tg.state.Store(&next)
}

// reportMissing logs missing scorer inputs once, in one line per pod, when
// they go missing (not on every scrape), and keeps the gauge in step.
func (s *Scraper) reportMissing(tg *target, engine string, missing []string) {
	var added, gone []string
	for _, name := range missing {
		if !tg.reported[name] {
			tg.reported[name] = true
			s.missing.WithLabelValues(tg.t.Name, name).Set(1)
			added = append(added, name)
		}
	}
	for name := range tg.reported {
		if !slices.Contains(missing, name) {
			delete(tg.reported, name)
			s.missing.DeleteLabelValues(tg.t.Name, name)
			gone = append(gone, name)
		}
	}
	if len(added) > 0 {
		s.opts.Logger.Warn("pod does not export metrics that enabled scorers need; those scorers treat the pod as unknown",
			"pod", tg.t.Name, "engine", engine, "metrics", added)
	}
	if len(gone) > 0 {
		slices.Sort(gone)
		s.opts.Logger.Info("pod now exports previously missing metrics", "pod", tg.t.Name, "metrics", gone)
	}
}

// fetchPage reads /metrics with the pod's own client and parses the page
// where it landed.
func (s *Scraper) fetchPage(ctx context.Context, tg *target, pc *pageClient, start time.Time) (Sample, error) {
	resp, err := pc.get(ctx, start.Add(s.opts.Timeout))
	if err != nil {
		return Sample{}, err
	}
	defer resp.release()
	if resp.status != http.StatusOK {
		return Sample{}, fmt.Errorf("GET /metrics: status %d", resp.status)
	}
	return parsePage(tg.t.Engine, resp.body, &tg.state.Load().Metrics)
}

// fetchMetrics reads /metrics with opts.Client when one was given.
func (s *Scraper) fetchMetrics(ctx context.Context, tg *target) (Sample, error) {
	ctx, cancel := context.WithTimeout(ctx, s.opts.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, tg.metricsURL, nil)
	if err != nil {
		return Sample{}, err
	}
	req.Header.Set("Accept", "text/plain;version=0.0.4")
	resp, err := s.opts.Client.Do(req)
	if err != nil {
		return Sample{}, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
		return Sample{}, fmt.Errorf("GET /metrics: status %d", resp.StatusCode)
	}
	sample, err := Parse(tg.t.Engine, io.LimitReader(resp.Body, maxPage))
	// Read to EOF (a page over the limit, or a parse error, leaves some) so
	// the connection goes back to the pool instead of being closed.
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 256<<10))
	return sample, err
}

// maxPage bounds the /metrics page read from a pod.
const maxPage = 16 << 20

func (s *Scraper) scrapeModels(ctx context.Context, tg *target) {
	models, err := s.fetchModels(ctx, tg.t)
	if ctx.Err() != nil {
		return
	}
	if err != nil {
		// Keep the last good list: adapters rarely change and /metrics
		// already tracks liveness.
		s.opts.Logger.Debug("read /v1/models failed", "pod", tg.t.Name, "err", err)
		return
	}
	next := *tg.state.Load()
	next.Models = models
	next.ModelsAt = time.Now()
	tg.state.Store(&next)
}

func (s *Scraper) fetchModels(ctx context.Context, t Target) ([]Model, error) {
	ctx, cancel := context.WithTimeout(ctx, s.opts.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, s.opts.Scheme+"://"+t.Address+"/v1/models", nil)
	if err != nil {
		return nil, err
	}
	if s.opts.ModelsToken != "" {
		req.Header.Set("Authorization", "Bearer "+s.opts.ModelsToken)
	}
	resp, err := s.opts.Client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
		return nil, fmt.Errorf("GET /v1/models: status %d", resp.StatusCode)
	}
	var list struct {
		Data []Model `json:"data"`
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 4<<20)).Decode(&list); err != nil {
		return nil, fmt.Errorf("decode /v1/models: %w", err)
	}
	if list.Data == nil {
		list.Data = []Model{}
	}
	return list.Data, nil
}

// ageCollector exports the age of each pod's last successful scrape,
// computed at collection time so it keeps growing while a pod is down, and
// the scraped state the scorers read, so dashboards show what the router saw.
type ageCollector struct{ s *Scraper }

var (
	ageDesc = prometheus.NewDesc("infergate_scrape_age_seconds",
		"Seconds since the pod's /metrics was last scraped successfully (-1: never).", []string{"pod"}, nil)
	queueDesc = prometheus.NewDesc("infergate_pod_queue_depth",
		"Requests waiting on the pod's server, as last scraped.", []string{"pod"}, nil)
	runningDesc = prometheus.NewDesc("infergate_pod_running",
		"Requests running on the pod's server, as last scraped.", []string{"pod"}, nil)
	kvDesc = prometheus.NewDesc("infergate_pod_kv_cache_usage",
		"KV-cache utilization in [0,1] as last scraped; absent when the engine does not export it.", []string{"pod"}, nil)
)

func (c ageCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- ageDesc
	ch <- queueDesc
	ch <- runningDesc
	ch <- kvDesc
}

func (c ageCollector) Collect(ch chan<- prometheus.Metric) {
	now := time.Now()
	for _, p := range c.s.All() {
		age := p.Age(now).Seconds()
		if p.LastSuccess.IsZero() {
			age = -1
		}
		ch <- prometheus.MustNewConstMetric(ageDesc, prometheus.GaugeValue, age, p.Name)
		if p.LastSuccess.IsZero() {
			continue
		}
		ch <- prometheus.MustNewConstMetric(queueDesc, prometheus.GaugeValue, float64(p.Metrics.Waiting), p.Name)
		ch <- prometheus.MustNewConstMetric(runningDesc, prometheus.GaugeValue, float64(p.Metrics.Running), p.Name)
		if p.Metrics.HasKV {
			ch <- prometheus.MustNewConstMetric(kvDesc, prometheus.GaugeValue, p.Metrics.KVUsage, p.Name)
		}
	}
}
