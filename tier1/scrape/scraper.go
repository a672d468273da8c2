package scrape

import (
	"context"
	"log/slog"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/infergate/infergate/shared/config"
	"github.com/infergate/infergate/shared/metric"
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
	// Idle is true while the pod has no traffic (none through this router,
	// none running or waiting on it) and is scraped every
	// Options.IdleInterval instead of every Interval.
	Idle bool
	// slack is how much longer than Interval the schedule in force waits
	// between scrapes (IdleInterval-Interval while Idle, else 0).
	slack time.Duration
}

// Age is the time since the last successful scrape, or -1 if there was none.
func (p *PodState) Age(now time.Time) time.Duration {
	if p.LastSuccess.IsZero() {
		return -1
	}
	return now.Sub(p.LastSuccess)
}

// MetricsAge is the age of the metrics as routing should weigh it: Age,
// less the extra wait of the idle schedule while the pod is Idle, so an idle
// pod scraped on time looks as fresh as an active one and staleness still
// measures missed scrapes. Nothing this router sends can change an idle
// pod's state unseen: its first request makes it active (Scraper.Active),
// and the router's own in-flight count covers it until the next scrape;
// other clients' requests show on the next idle scrape and make it active.
// -1 if there was no successful scrape.
func (p *PodState) MetricsAge(now time.Time) time.Duration {
	if p.LastSuccess.IsZero() {
		return -1
	}
	return max(0, now.Sub(p.LastSuccess)-p.slack)
}

// Serves reports whether the pod's /v1/models lists model.
func (p *PodState) Serves(model string) bool {
	return slices.ContainsFunc(p.Models, func(m Model) bool { return m.ID == model })
}

// Options configures a Scraper. Zero fields take the defaults noted.
type Options struct {
	Interval time.Duration // /metrics period of an active pod; default 50ms
	// IdleInterval is the /metrics period of an idle pod: one with no
	// request through this router in flight (InFlight) or dispatched
	// (Active), and none running or waiting on its last scrape, within
	// ActiveHold. Default 1s; a value not above Interval (e.g. -1) scrapes
	// every pod every Interval.
	IdleInterval time.Duration
	// ActiveHold is how long a pod stays active after its last dispatch or
	// the last scrape that found requests on it; default 2s.
	ActiveHold time.Duration
	// InFlight, when set, reports the requests in flight on a pod (by
	// target name); a pod with any stays active. Without it only Active
	// calls and ActiveHold make a pod active.
	InFlight       func(pod string) int
	Timeout        time.Duration // per-request timeout; default 1s
	ModelsInterval time.Duration // /v1/models period; default 5s
	// Client makes every request; default a client on NewTransport().
	// Set it for a proxy, TLS or a custom dialer (keep the transport's
	// one-connection-per-pod tuning: start from NewTransport).
	Client *http.Client
	// Scheme is how pods are reached: "http" (default) or "https" (give
	// Client the pods' TLS configuration).
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

// Defaults of Options.
const (
	DefaultInterval     = 50 * time.Millisecond
	DefaultIdleInterval = time.Second
	DefaultActiveHold   = 2 * time.Second
)

func (o *Options) setDefaults() {
	config.Default(&o.Interval, DefaultInterval)
	if o.IdleInterval == 0 {
		o.IdleInterval = DefaultIdleInterval
	}
	// Never scrape an idle pod more often than an active one.
	o.IdleInterval = max(o.IdleInterval, o.Interval)
	config.Default(&o.ActiveHold, DefaultActiveHold)
	config.Default(&o.Timeout, time.Second)
	config.Default(&o.ModelsInterval, 5*time.Second)
	config.Default(&o.Scheme, "http")
	if o.Client == nil {
		o.Client = &http.Client{Transport: NewTransport()}
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
}

// Scraper polls a set of targets, one goroutine per target.
type Scraper struct {
	opts  Options
	ctx   context.Context
	epoch time.Time // origin of target.active (monotonic)

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
	// active is the time of the last Active call, as time since the
	// scraper's epoch (0: never).
	active atomic.Int64
	// idle is set while the loop sleeps on the idle interval; the Active
	// call that clears it sends on wake.
	idle atomic.Bool
	wake chan struct{}
}

// New returns a Scraper that runs until ctx is done. Targets are added with
// SetTargets.
func New(ctx context.Context, opts Options) *Scraper {
	opts.setDefaults()
	s := &Scraper{
		opts:    opts,
		ctx:     ctx,
		epoch:   time.Now(),
		targets: map[string]*target{},
		errors:  metric.Counter("infergate_tier1_scrape_errors_total", "Failed scrapes of a pod's /metrics.", "pod"),
		duration: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "infergate_tier1_scrape_duration_seconds",
			Help: "Time to fetch and parse one pod's /metrics.", Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1}}),
		missing: metric.Gauge("infergate_tier1_scorer_input_missing",
			"1 when a pod's engine does not export a metric an enabled scorer needs.", "pod", "metric"),
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
			wake: make(chan struct{}, 1)}
		tg.state.Store(&PodState{Target: t, Engine: t.Engine})
		s.targets[t.Name] = tg
		if exists {
			old.cancel()
			tg.active.Store(old.active.Load())
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

// Active tells the scraper that a request was dispatched to pod: the pod is
// scraped every Interval from now until ActiveHold after its traffic stops,
// and one asleep on the idle interval is scraped at once (no sooner than
// Interval after its last scrape). The router calls it on every dispatch:
// it is a map read, a clock read and an atomic store, plus a channel send
// when the pod was idle. Unknown pods are ignored.
func (s *Scraper) Active(pod string) {
	s.mu.RLock()
	tg := s.targets[pod]
	s.mu.RUnlock()
	if tg == nil {
		return
	}
	tg.active.Store(int64(time.Since(s.epoch)))
	if tg.idle.Load() && tg.idle.CompareAndSwap(true, false) {
		select {
		case tg.wake <- struct{}{}:
		default:
		}
	}
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

// busy reports whether tg is active at now: dispatched to (Active) within
// ActiveHold, with requests in flight (InFlight), or seen busy (lastBusy:
// in flight, or running or waiting requests on its last scrape) within
// ActiveHold.
func (s *Scraper) busy(tg *target, now time.Time, lastBusy *time.Time) bool {
	if s.opts.IdleInterval <= s.opts.Interval {
		return true
	}
	if s.opts.InFlight != nil && s.opts.InFlight(tg.t.Name) > 0 {
		*lastBusy = now
		return true
	}
	since := now.Sub(s.epoch)
	if a := tg.active.Load(); a > 0 && since-time.Duration(a) < s.opts.ActiveHold {
		return true
	}
	return !lastBusy.IsZero() && now.Sub(*lastBusy) < s.opts.ActiveHold
}

func (s *Scraper) loop(tg *target) {
	defer close(tg.done)
	ctx := tg.ctx
	req, reqErr := http.NewRequest(http.MethodGet, s.opts.Scheme+"://"+tg.t.Address+MetricsPath(tg.t.Engine), nil)
	if reqErr == nil {
		req.Header.Set("Accept", "text/plain;version=0.0.4")
		req.Header.Set("Accept-Encoding", "identity")
	}
	var nextModels, start, lastBusy time.Time
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		select {
		case <-timer.C:
		case <-tg.wake:
			// A dispatch to the pod while it slept on the idle
			// interval: scrape now, or once Interval has passed since
			// the last scrape.
			if d := s.opts.Interval - time.Since(start); d > 0 {
				timer.Reset(d)
				continue
			}
			timer.Stop()
		case <-ctx.Done():
			return
		}
		start = time.Now()
		var sample Sample
		err := reqErr
		if err == nil {
			sample, err = s.fetchMetrics(ctx, tg, req)
		}
		if ctx.Err() != nil {
			return // stopping; not the pod's fault
		}
		s.duration.Observe(time.Since(start).Seconds())
		// Which schedule follows is decided before the state is
		// published, so the state says how fresh it will stay. Requests
		// on the pod from other clients (other routers, direct traffic)
		// keep it active as this router's own do.
		now := time.Now()
		if err == nil && sample.Metrics.Running+sample.Metrics.Waiting > 0 {
			lastBusy = now
		}
		active := s.busy(tg, now, &lastBusy)
		s.publish(tg, start, sample, err, active)
		if !start.Before(nextModels) {
			s.scrapeModels(ctx, tg)
			nextModels = start.Add(s.opts.ModelsInterval)
		}
		if s.opts.OnUpdate != nil {
			s.opts.OnUpdate(tg.t.Name)
		}
		// The period runs from the start of a scrape so a slow pod is not
		// polled less often than the interval, but scrapes never overlap.
		if active {
			timer.Reset(max(0, s.opts.Interval-time.Since(start)))
			continue
		}
		timer.Reset(max(0, s.opts.IdleInterval-time.Since(start)))
		tg.idle.Store(true)
		// An Active call between busy and the store above found idle
		// unset and sent nothing: look again now that it is set.
		if s.busy(tg, time.Now(), &lastBusy) && tg.idle.CompareAndSwap(true, false) {
			timer.Reset(max(0, s.opts.Interval-time.Since(start)))
		}
	}
}

// publish records the outcome of one /metrics scrape.
func (s *Scraper) publish(tg *target, start time.Time, sample Sample, err error, active bool) {
	prev := tg.state.Load()
	next := *prev
	next.LastAttempt = start
	next.Scrapes++
	next.Idle = !active
	next.slack = 0
	if !active {
		next.slack = s.opts.IdleInterval - s.opts.Interval
	}
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

// ageCollector exports the age of each pod's last successful scrape,
// computed at collection time so it keeps growing while a pod is down, and
// the scraped state the scorers read, so dashboards show what the router saw.
type ageCollector struct{ s *Scraper }

var (
	ageDesc = prometheus.NewDesc("infergate_tier1_scrape_age_seconds",
		"Seconds since the pod's /metrics was last scraped successfully (-1: never).", []string{"pod"}, nil)
	queueDesc = prometheus.NewDesc("infergate_tier1_pod_queue_depth",
		"Requests waiting on the pod's server, as last scraped.", []string{"pod"}, nil)
	runningDesc = prometheus.NewDesc("infergate_tier1_pod_running",
		"Requests running on the pod's server, as last scraped.", []string{"pod"}, nil)
	kvDesc = prometheus.NewDesc("infergate_tier1_pod_kv_cache_usage",
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
