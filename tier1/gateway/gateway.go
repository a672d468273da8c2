// Package gateway is the Tier 1 router's request path: an OpenAI-compatible
// reverse proxy that reads each request's model and prompt, asks the
// endpoint picker for the best pod of the model's pool and relays the
// response, streaming it event by event, retrying on the next-best pod
// when a pod fails before its first byte.
//
// Where to read: gateway.go builds a Gateway from Config and serves it.
// Every request is a call (call.go) with one lifecycle — enter, route,
// dispatch, observe, done — whichever front end it came in on: the HTTP
// listener (proxy.go, relaying with shared/relay) or an external data
// plane (pick.go, used by tier1/extproc). route.go is the routing step:
// parse and resolve (schedreq.go), build the scheduling input, then
// admission — schedule, wait in the pool's priority queue (queue.go) or
// shed — with the decisions of tier1/admission, which the routing
// benchmark runs too.
package gateway

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/otel/trace"

	"github.com/infergate/infergate/shared/clock"
	"github.com/infergate/infergate/shared/cluster"
	"github.com/infergate/infergate/shared/config"
	"github.com/infergate/infergate/shared/openai"
	"github.com/infergate/infergate/shared/tlsfiles"
	"github.com/infergate/infergate/shared/tracing"
	"github.com/infergate/infergate/tier1/picker"
	"github.com/infergate/infergate/tier1/scrape"
	"github.com/infergate/infergate/tier1/tokenize"
)

// Options are a Gateway's collaborators. Zero fields take defaults.
type Options struct {
	Logger *slog.Logger // default slog.Default()
	// Registry receives every infergate_ metric; default a new registry
	// (never the global one).
	Registry *prometheus.Registry
	// ConfigPath, when set, is polled for changes every
	// Config.ReloadInterval and applied without restart.
	ConfigPath string
	// Transport carries requests to pods; default one built from
	// Config.Timeouts.Connect (and upstream.tls with upstream.scheme
	// https).
	Transport http.RoundTripper
	// TLSReloadInterval is how often the upstream.tls files are re-read;
	// default tlsfiles' (10s). Tests shorten it.
	TLSReloadInterval time.Duration
	// Rand seeds the scheduler's tie-breaks; nil is random.
	Rand *rand.Rand
	// TracerProvider records the request path's spans
	// (docs/tracing.md); nil turns tracing off.
	TracerProvider trace.TracerProvider
}

// Gateway is the Tier 1 router. Create it with New; it is an http.Handler.
type Gateway struct {
	log       *slog.Logger
	reg       *prometheus.Registry
	m         *metrics
	scraper   *scrape.Scraper
	tracker   *picker.Tracker
	sched     *picker.Scheduler
	transport http.RoundTripper
	mux       *http.ServeMux
	opts      Options
	tracer    tracing.Tracer

	// upstreamScheme is upstream.scheme as read at start: the transport
	// and the scraper were built for it.
	upstreamScheme string
	tlsMetrics     *tlsfiles.Metrics

	state atomic.Pointer[state]

	queuesMu sync.Mutex
	queues   map[string]*waitQueue // by pool; outlive reloads

	adapters atomic.Pointer[adapterIndex]
	adaptMu  sync.Mutex

	applyMu sync.Mutex
	// discovered are the pods a discovery source (tier1/kube) last set,
	// merged into every applied configuration; guarded by applyMu.
	discovered []PodConfig
	// discoveryProblem is why discovery is not working, for /ready; nil
	// or "" when it is.
	discoveryProblem atomic.Pointer[string]

	kv *kvRouting // precise prefix routing (kvroute.go)

	// decisions are the last routing decisions, mesh the replica mesh's
	// view for the status page (status.go).
	decisions *decisionLog
	mesh      atomic.Pointer[func() any]
}

// state is one applied configuration; requests load it once and use it
// throughout, so a reload never changes a request midway.
type state struct {
	cfg           *Config // base plus the discovered pods
	base          *Config // the configuration as given to Apply
	tokens        tokenSet
	upstreamToken string
	pools         map[string]*poolState
	poolList      []*poolState
	routes        map[string]route // static model names -> pool
	policies      map[string]ModelConfig
	pods          map[string]*podRT
	tokenizers    map[string]*tokenize.Tokenizer // by pool, with kv_events on (kvroute.go)
}

type poolState struct {
	cfg   PoolConfig
	pods  []*podRT
	queue *waitQueue
}

// podRT is a configured pod plus the router's runtime notes on it.
type podRT struct {
	cfg  PodConfig
	pool *poolState
	// downUntil (unix nanos) marks the pod unready after a failed
	// connection, until the scraper has had time to notice.
	downUntil atomic.Int64

	mu     sync.Mutex
	scores lastScores
}

// lastScores is the most recent scheduling cycle that rated a pod.
type lastScores struct {
	At      time.Time
	Picked  bool
	Total   float64
	Scorers []string
	Scores  []float64
}

// route is where a model name leads.
type route struct {
	pool    *poolState
	adapter string // "" for the base model
}

// New builds a Gateway for cfg (defaults are filled in place) and starts
// scraping its pods. It runs until ctx is done.
func New(ctx context.Context, cfg *Config, opts Options) (*Gateway, error) {
	cfg.SetDefaults()
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.Registry == nil {
		opts.Registry = prometheus.NewRegistry()
		opts.Registry.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	}
	g := &Gateway{
		log:    opts.Logger,
		reg:    opts.Registry,
		opts:   opts,
		queues: map[string]*waitQueue{},
		tracer: tracing.NewTracer(opts.TracerProvider, tracerName),

		decisions: newDecisionLog(cfg.Status.Decisions),
	}
	g.m = newMetrics(g.reg)
	kv, err := newKVRouting(cfg, g.reg, g.log)
	if err != nil {
		return nil, err
	}
	g.kv = kv
	// Prefix-index writes run off the request path (see RecordAsync).
	g.tracker = picker.NewTracker(picker.TrackerOptions{RecordAsync: true, Exact: kv.exact()})
	g.reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{
		Name: "infergate_tier1_prefix_records_dropped_total",
		Help: "Dispatches not recorded in the prefix index because its write queue was full.",
	}, func() float64 { return float64(g.tracker.RecordsDropped()) }))
	sched, err := picker.NewScheduler(cfg.Scheduler, picker.Options{Tracker: g.tracker, Rand: opts.Rand})
	if err != nil {
		return nil, fmt.Errorf("scheduler: %w", err)
	}
	g.sched = sched
	if g.tlsMetrics, err = tlsfiles.NewMetrics(g.reg); err != nil {
		return nil, fmt.Errorf("tls metrics: %w", err)
	}
	// Pods over https: the proxy and the scraper share the TLS
	// configuration (one reload) but not connections. Both dial through
	// it, so each new connection takes the files current then (a rotated
	// CA bundle included).
	var upstreamTLS *tlsfiles.ClientConfig
	var scrapeClient *http.Client
	g.upstreamScheme = cfg.Upstream.Scheme
	if g.upstreamScheme == "https" {
		if upstreamTLS, err = tlsfiles.NewClient(ctx, cfg.Upstream.TLS, tlsfiles.Options{Name: "tier1-upstream", Logger: g.log,
			Metrics: g.tlsMetrics, Interval: opts.TLSReloadInterval}); err != nil {
			return nil, fmt.Errorf("upstream.tls: %w", err)
		}
		tr := scrape.NewTransport()
		// The scrape's own timeout bounds the connection and handshake.
		tr.DialTLSContext = upstreamTLS.DialTLSContext(tr.DialContext)
		scrapeClient = &http.Client{Transport: tr}
	}
	g.transport = opts.Transport
	if g.transport == nil {
		g.transport = newTransport(cfg.Timeouts.Connect, upstreamTLS)
	}
	// The upstream token also guards pods' /v1/models (vLLM --api-key).
	modelsToken, err := cfg.Upstream.ResolveToken()
	if err != nil {
		return nil, err
	}
	g.scraper = scrape.New(ctx, scrape.Options{
		Scheme:         g.upstreamScheme,
		Client:         scrapeClient, // nil: plain HTTP, the scraper's default client
		ModelsToken:    modelsToken,
		Interval:       cfg.Scrape.Interval,
		IdleInterval:   cfg.Scrape.IdleInterval,
		InFlight:       g.tracker.InFlight, // a pod with requests in flight is scraped at Interval
		Timeout:        cfg.Scrape.Timeout,
		ModelsInterval: cfg.Scrape.ModelsInterval,
		Logger:         g.log,
		Registerer:     g.reg,
		OnUpdate:       g.podUpdated,
	})
	g.reg.MustRegister(podCollector{g})
	if err := g.Apply(cfg); err != nil {
		g.scraper.Close()
		return nil, err
	}
	g.routes()
	if err := g.kv.start(ctx, g.reg, g.tracker); err != nil {
		g.scraper.Close()
		return nil, err
	}
	if opts.ConfigPath != "" && cfg.ReloadInterval > 0 {
		go g.watchConfig(ctx, opts.ConfigPath, cfg.ReloadInterval)
	}
	return g, nil
}

// newTransport is the proxy's transport to pods; upstreamTLS is nil for
// plain HTTP.
func newTransport(connect time.Duration, upstreamTLS *tlsfiles.ClientConfig) *http.Transport {
	dial := (&net.Dialer{Timeout: connect, KeepAlive: 30 * time.Second}).DialContext
	tr := &http.Transport{
		Proxy:                 nil, // pods are cluster-local; never via HTTP_PROXY
		DialContext:           dial,
		MaxIdleConns:          1024,
		MaxIdleConnsPerHost:   256,
		IdleConnTimeout:       90 * time.Second,
		DisableCompression:    true, // relay bytes as the pod sent them
		ExpectContinueTimeout: 0,
		// A request body of up to 64 KB (most chat requests) is copied
		// into the write buffer and sent with its headers; with the 4 KB
		// default the rest went through net.TCPConn.ReadFrom's io.Copy,
		// which allocated a 32 KB buffer per request (37 % of Tier 1's
		// allocated bytes in infergate-lab loadbench cpu at 600 req/s).
		// Tier 2's transport does the same (tier2/gateway). Costs 64 KB
		// per open connection to a pod.
		WriteBufferSize: 64 << 10,
	}
	if upstreamTLS != nil {
		dialTLS := upstreamTLS.DialTLSContext(dial)
		// The handshake is part of reaching the pod: a pod that does not
		// finish it within the connect timeout is passed over like one
		// that does not accept the connection. HTTP/1.1 as in plain HTTP
		// (the connection offers no ALPN): model servers speak it.
		tr.DialTLSContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
			ctx, cancel := context.WithTimeout(ctx, connect)
			defer cancel()
			return dialTLS(ctx, network, addr)
		}
	}
	return tr
}

// Registry returns the registry holding the gateway's metrics.
func (g *Gateway) Registry() *prometheus.Registry { return g.reg }

// Close stops scraping. In-flight requests are not interrupted.
func (g *Gateway) Close() {
	g.scraper.Close()
	g.kv.close()
}

// Apply switches to cfg (defaulted and validated): pods, pools, models,
// tokens and the scheduling profile change at once for new requests.
// Listen address, scrape intervals, the connect timeout, the TLS blocks
// and upstream.scheme need a restart (the TLS files' content reloads by
// itself).
// On error the previous configuration stays in force.
func (g *Gateway) Apply(cfg *Config) error {
	g.applyMu.Lock()
	defer g.applyMu.Unlock()
	return g.applyLocked(cfg)
}

func (g *Gateway) applyLocked(cfg *Config) error {
	// Callers building a Config in code may skip the loader: default and
	// validate here too (both are idempotent).
	cfg.SetDefaults()
	if err := cfg.Validate(); err != nil {
		return fmt.Errorf("invalid configuration: %w", err)
	}
	base := cfg
	cfg = g.withDiscovered(cfg)
	tokens, err := cfg.Auth.ResolveTokens()
	if err != nil {
		return err
	}
	upTok, err := cfg.Upstream.ResolveToken()
	if err != nil {
		return err
	}
	tokenizers, err := g.kv.tokenizers(cfg)
	if err != nil {
		return err
	}
	if err := g.sched.Update(cfg.Scheduler); err != nil {
		return fmt.Errorf("scheduler: %w", err)
	}
	st := &state{
		cfg:           cfg,
		base:          base,
		tokens:        newTokenSet(tokens),
		upstreamToken: upTok,
		pools:         map[string]*poolState{},
		routes:        map[string]route{},
		policies:      map[string]ModelConfig{},
		pods:          map[string]*podRT{},
		tokenizers:    tokenizers,
	}
	g.queuesMu.Lock()
	for _, pc := range cfg.Pools {
		q := g.queues[pc.Name]
		if q == nil {
			q = newWaitQueue()
			g.queues[pc.Name] = q
		}
		ps := &poolState{cfg: pc, queue: q}
		st.pools[pc.Name] = ps
		g.m.initPool(pc.Name, pc.Model, pc.Adapters)
		st.poolList = append(st.poolList, ps)
		st.routes[pc.Model] = route{pool: ps}
		for _, a := range pc.Adapters {
			st.routes[a] = route{pool: ps, adapter: a}
		}
	}
	g.queuesMu.Unlock()
	for _, mc := range cfg.Models {
		st.policies[mc.Name] = mc
		if mc.Base != "" {
			for _, ps := range st.poolList {
				if ps.cfg.Model == mc.Base {
					st.routes[mc.Name] = route{pool: ps, adapter: mc.Name}
				}
			}
		}
	}
	needs := g.sched.Consumes() // what the profile just applied reads
	var targets []scrape.Target
	old := g.state.Load()
	for _, pc := range cfg.Pods {
		ps := st.pools[pc.Pool]
		rt := &podRT{cfg: pc, pool: ps}
		if old != nil {
			if prev := old.pods[pc.Name]; prev != nil {
				prev.mu.Lock()
				rt.scores = prev.scores
				// Its own backing array: requests still on the old state
				// write prev's scores under prev's lock only.
				rt.scores.Scores = slices.Clone(prev.scores.Scores)
				prev.mu.Unlock()
				// Discovery applies often: keep a recent connect failure
				// of the same address.
				if prev.cfg.Address == pc.Address {
					rt.downUntil.Store(prev.downUntil.Load())
				}
			}
		}
		st.pods[pc.Name] = rt
		ps.pods = append(ps.pods, rt)
		need := needs
		if !poolHasAdapters(cfg, ps.cfg) {
			need &^= scrape.InputLoRA // LoRA state is irrelevant without adapters
		}
		targets = append(targets, scrape.Target{Name: pc.Name, Address: pc.Address, Engine: pc.Engine, Needs: need})
	}
	g.state.Store(st)
	g.decisions.resize(cfg.Status.Decisions)
	g.scraper.SetTargets(targets)
	g.kv.follow(st)
	if old != nil {
		for name := range old.pods {
			if st.pods[name] == nil {
				g.tracker.RemovePod(name)
			}
		}
	}
	g.adapters.Store(nil)
	return nil
}

func poolHasAdapters(cfg *Config, pc PoolConfig) bool {
	if len(pc.Adapters) > 0 {
		return true
	}
	return slices.ContainsFunc(cfg.Models, func(m ModelConfig) bool { return m.Base == pc.Model })
}

// watchConfig polls the config file's modification time and size and
// applies a changed file. A file that fails to load is logged and ignored.
func (g *Gateway) watchConfig(ctx context.Context, path string, every time.Duration) {
	stamp := func() (time.Time, int64) {
		fi, err := os.Stat(path)
		if err != nil {
			return time.Time{}, -1
		}
		return fi.ModTime(), fi.Size()
	}
	lastMod, lastSize := stamp()
	for range clock.Ticks(ctx, every) {
		mod, size := stamp()
		if size < 0 || (mod.Equal(lastMod) && size == lastSize) {
			continue
		}
		lastMod, lastSize = mod, size
		if err := g.Reload(path); err != nil {
			g.log.Error("config reload failed; keeping the previous configuration", "path", path, "err", err)
			continue
		}
		g.log.Info("config reloaded", "path", path)
	}
}

// Reload loads the file at path and applies it.
func (g *Gateway) Reload(path string) error {
	var cfg Config
	err := config.Load(path, &cfg)
	if err == nil {
		err = g.Apply(&cfg)
	}
	if err != nil {
		g.m.reloads.WithLabelValues("error").Inc()
		return err
	}
	g.m.reloads.WithLabelValues("ok").Inc()
	return nil
}

// podUpdated runs after every scrape of pod: waiting requests of its pool
// re-check for capacity.
func (g *Gateway) podUpdated(pod string) {
	if st := g.state.Load(); st != nil {
		if rt := st.pods[pod]; rt != nil {
			rt.pool.queue.signal()
		}
	}
}

func (g *Gateway) routes() {
	mux := http.NewServeMux()
	for _, ep := range inferenceEndpoints {
		mux.Handle(ep.path, g.authed(func(w http.ResponseWriter, r *http.Request, st *state, trusted bool) {
			g.handleInference(w, r, st, ep, trusted)
		}))
	}
	mux.Handle("/v1/models", g.authed(g.handleModels))
	mux.Handle("/debug/pods", g.authed(g.handleDebugPods))
	mux.Handle("/debug/decisions", g.authed(g.handleDecisions))
	mux.Handle(cluster.LoadPath, g.authed(g.handleLoad))
	mux.HandleFunc("/health", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"status":"ok"}`))
	})
	mux.HandleFunc("/ready", g.handleReady)
	// /metrics is served on its own listener (ServeMetrics), not here.
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		closeAfter(w)
		openai.Errorf(w, http.StatusNotFound, "not_found", "no such endpoint: "+r.URL.Path)
	})
	g.mux = mux
}

// ServeHTTP implements http.Handler.
func (g *Gateway) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	g.mux.ServeHTTP(w, r)
}

// authed wraps a handler with bearer-token authentication. trusted tells
// the handler the client was authenticated (so may set trusted headers).
func (g *Gateway) authed(h func(w http.ResponseWriter, r *http.Request, st *state, trusted bool)) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		st := g.state.Load()
		if openai.IsAnthropicPath(r.URL.Path) {
			w = openai.AnthropicWriter{ResponseWriter: w} // errors in that API's shape
		}
		if st.cfg.Auth.Disabled {
			h(w, r, st, false)
			return
		}
		if !st.tokens.check(r) {
			g.m.requests.WithLabelValues("", "", "", "401").Inc()
			closeAfter(w)
			w.Header().Set("WWW-Authenticate", `Bearer realm="infergate"`)
			openai.Errorf(w, http.StatusUnauthorized, "invalid_api_key", "missing or invalid bearer token")
			return
		}
		h(w, r, st, true)
	})
}

// Serve serves the API on ln until ctx is done, then shuts down
// gracefully, giving in-flight requests up to grace to finish.
func (g *Gateway) Serve(ctx context.Context, ln net.Listener, grace time.Duration) error {
	return g.serve(ctx, ln, g, grace)
}

// ServeMetrics serves /metrics (the gateway's registry) and the status
// page (/status, status.go) on ln, apart from the API, until ctx is done.
// Config.MetricsListen names its address.
func (g *Gateway) ServeMetrics(ctx context.Context, ln net.Listener, grace time.Duration) error {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(g.reg, promhttp.HandlerOpts{}))
	g.statusRoutes(mux)
	return g.serve(ctx, ln, mux, grace)
}

// serve runs an http.Server with the configured client-side timeouts.
func (g *Gateway) serve(ctx context.Context, ln net.Listener, h http.Handler, grace time.Duration) error {
	t := g.state.Load().cfg.Timeouts
	srv := &http.Server{
		Handler:           h,
		ReadHeaderTimeout: t.ReadHeader,
		IdleTimeout:       t.ClientIdle,
		ErrorLog:          slog.NewLogLogger(g.log.Handler(), slog.LevelWarn),
		// No ReadTimeout or WriteTimeout: bodies get timeouts.read_body and
		// streamed responses a deadline per write (timeouts.write) plus
		// timeouts.max_stream, set by the handler.
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), grace)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	err := srv.Serve(ln)
	if errors.Is(err, http.ErrServerClosed) {
		<-done
		return nil
	}
	return err
}
