// Package server assembles Tier 2 — the regional front door — from its
// configuration: the Redis client, the tenant store and authenticator, the
// rate limiter, Consul (or static) discovery, the router, the OpenAI-facing
// gateway, the admin API and their metrics. `infergate tier2` and the local
// stack (devstack) both build Tier 2 through it, so there is one wiring.
//
// ServeListeners serves the OpenAI API, the admin API and /metrics on three
// listeners (metrics name tenants, so never on the API port), each with the
// timeouts of Config.Server: no client holds a connection by stalling its
// headers, its body or an idle keep-alive.
package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/consul/api"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/trace"

	"github.com/infergate/infergate/shared/config"
	"github.com/infergate/infergate/shared/statusui"
	"github.com/infergate/infergate/shared/tracing"
	"github.com/infergate/infergate/tier2/admin"
	"github.com/infergate/infergate/tier2/discovery"
	"github.com/infergate/infergate/tier2/gateway"
	"github.com/infergate/infergate/tier2/ratelimit"
	"github.com/infergate/infergate/tier2/route"
	"github.com/infergate/infergate/tier2/tenant"
)

// Options are the process-level dependencies of a Server.
type Options struct {
	Logger *slog.Logger // default: discard
	// Registry receives every Tier 2 metric and is what /metrics serves;
	// the caller adds process-wide collectors (Go, process) if it wants
	// them. Default: a new, private registry.
	Registry *prometheus.Registry
	// ShutdownTimeout is the grace period in-flight requests (long
	// streams, mostly) get after Serve's context ends; then connections
	// are cut. Default 30s.
	ShutdownTimeout time.Duration
	// TracerProvider, when set, records Tier 2's spans instead of one
	// built from Config.Tracing (the caller then owns its shutdown).
	TracerProvider trace.TracerProvider
	// TLSReloadInterval is how often the TLS files (tls, admin.tls,
	// metrics.tls, tier1.tls) are re-read; default 10s. Tests shorten it.
	TLSReloadInterval time.Duration
	// Version is reported by the admin API's /status; default the main
	// module's version from the build information.
	Version string
}

// Server is a configured Tier 2, ready to Serve. Close releases it.
type Server struct {
	cfg      Config
	log      *slog.Logger
	shutdown time.Duration

	rdb     redis.UniversalClient // nil: in memory
	store   *tenant.Store
	auth    *tenant.Authenticator // refreshes a remote JWKS until Close
	limiter *ratelimit.Limiter
	disc    *discovery.Discovery
	router  *route.Router
	gw      *gateway.Gateway
	admin   *admin.Server // nil without an admin token
	reg     *prometheus.Registry
	traces  *tracing.Provider // built from Config.Tracing; nil when given in Options
	tls     tlsState

	served    atomic.Bool
	closeOnce sync.Once
	closeErr  error

	started time.Time // for the admin API's /status
	version string
}

// New builds Tier 2 from cfg: it connects to Redis (if configured), loads
// and seeds the tenant store, and wires the limiter, discovery, router,
// gateway and admin API. Nothing listens and nothing runs in the
// background until Serve, except the store's and the limiter's own sync
// loops. Secrets named by *_env fields are read from the environment here.
func New(ctx context.Context, cfg Config, opts Options) (_ *Server, err error) {
	cfg.SetDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("tier2 config: %w", err)
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.Registry == nil {
		opts.Registry = prometheus.NewRegistry()
	}
	config.Default(&opts.ShutdownTimeout, 30*time.Second)
	log, reg := opts.Logger, opts.Registry
	s := &Server{cfg: cfg, log: log, shutdown: opts.ShutdownTimeout, reg: reg, started: time.Now(), version: buildVersion(opts.Version)}
	defer func() {
		if err != nil {
			_ = s.Close()
		}
	}()
	// TLS first: a bad certificate file is the cheapest mistake to report.
	if s.tls, err = loadTLS(ctx, cfg, reg, log, opts.TLSReloadInterval); err != nil {
		return nil, err
	}

	// Shared state: Redis, or in memory for a single replica.
	if r := cfg.Redis; r != nil {
		pw, err := secret(r.Password, r.PasswordEnv, "redis.password_env")
		if err != nil {
			return nil, err
		}
		rc := ratelimit.RedisConfig{Addrs: r.Addresses, Username: r.Username, Password: pw, DB: r.DB,
			TLS: ratelimit.RedisTLSConfig{Enabled: r.TLS}}
		if s.rdb, err = rc.Client(); err != nil {
			return nil, err
		}
	} else {
		log.Warn("no redis configured: tenants, API keys and limits are kept in memory; run ONE replica only, or limits multiply by the replica count")
	}
	tenantPrefix, limiterPrefix := "", ""
	if cfg.Redis != nil && cfg.Redis.KeyPrefix != "" {
		tenantPrefix, limiterPrefix = cfg.Redis.KeyPrefix, cfg.Redis.KeyPrefix+"rl:"
	}
	s.store, err = tenant.New(ctx, tenant.Options{Redis: s.rdb, KeyPrefix: tenantPrefix, Seed: cfg.Tenants, SeedKeys: cfg.Keys,
		Logger: log.With("component", "tenant")})
	if err != nil {
		return nil, fmt.Errorf("tenant store: %w", err)
	}
	jwtOpts, err := jwtOptions(cfg.JWT)
	if err != nil {
		return nil, err
	}
	if jwtOpts != nil {
		jwtOpts.Logger = log.With("component", "jwt")
	}
	auth, err := tenant.NewAuthenticator(ctx, s.store, jwtOpts)
	if err != nil {
		return nil, fmt.Errorf("authenticator: %w", err)
	}
	s.auth = auth
	s.limiter = ratelimit.New(ratelimit.Options{Redis: s.rdb, KeyPrefix: limiterPrefix, Replicas: cfg.Limits.Replicas,
		FailClosed: cfg.Limits.FailClosed, Timeout: cfg.Limits.RedisTimeout, Logger: log.With("component", "ratelimit"), ReplicaID: replicaID(),
		// The router, built below, knows adapters from load summaries.
		BaseModel: func(model string) string { return s.router.BaseModel(model) }})
	if err := reg.Register(s.limiter.Collector()); err != nil {
		return nil, fmt.Errorf("ratelimit metrics: %w", err)
	}

	// Discovery: Consul, or the static list.
	dopts := discovery.Options{Static: cfg.Clusters, Registry: reg, Logger: log}
	if c := cfg.Consul; c != nil {
		tok, err := secret(c.Token, c.TokenEnv, "consul.token_env")
		if err != nil {
			return nil, err
		}
		dopts.Consul = &discovery.ConsulOptions{
			Address: c.Address, Token: tok, Datacenter: c.Datacenter, Service: c.Service, Tag: c.Tag,
			WaitTime: c.WaitTime, MinInterval: c.MinInterval, Consistent: c.Consistent,
			TLS: api.TLSConfig{CAFile: c.TLS.CAFile, CertFile: c.TLS.CertFile, KeyFile: c.TLS.KeyFile,
				Address: c.TLS.ServerName, InsecureSkipVerify: c.TLS.InsecureSkipVerify},
		}
	}
	if s.disc, err = discovery.New(dopts); err != nil {
		return nil, err
	}

	tier1Token, err := secret(cfg.Tier1.Token, cfg.Tier1.TokenEnv, "tier1.token_env")
	if err != nil {
		return nil, err
	}
	policy, _ := route.ParsePolicy(cfg.Routing.DefaultPolicy, route.CostFirst) // checked by Validate
	rc := cfg.Routing
	s.router, err = route.New(s.disc, route.Options{
		Region: cfg.Region, RegionOrder: cfg.RegionOrder, Token: tier1Token,
		PollInterval: cfg.Tier1.PollInterval, PollTimeout: cfg.Tier1.PollTimeout,
		DefaultPolicy: policy, SpillThreshold: rc.SpillThreshold, QueuePerPod: rc.QueuePerPod,
		LatencyObjective: rc.LatencyObjective, ErrorRateThreshold: rc.ErrorRateThreshold, TokensPerGPUSecond: rc.TokensPerGPUSecond,
		Breaker: route.BreakerOptions{
			ConsecutiveFailures: rc.Breaker.ConsecutiveFailures, FailureRatio: rc.Breaker.FailureRatio, MinRequests: rc.Breaker.MinRequests,
			Interval: rc.Breaker.Interval, OpenTimeout: rc.Breaker.OpenTimeout, HalfOpenRequests: rc.Breaker.HalfOpenRequests,
		},
		Overrides: overridesFrom(s.store), Adapters: rc.Adapters,
		Registry: reg, Logger: log, DialTLSContext: s.tls.tier1Dialer((&net.Dialer{}).DialContext, tier1HandshakeTimeout),
	})
	if err != nil {
		return nil, err
	}
	tp := opts.TracerProvider
	if tp == nil {
		if s.traces, err = tracing.New(ctx, cfg.Tracing, tracing.Options{ServiceName: "infergate-tier2"}); err != nil {
			return nil, err
		}
		tp = s.traces
		if cfg.Tracing.Enabled() {
			log.Info("tracing on", "exporter", cfg.Tracing.Exporter)
		}
	}
	tier1Transport := gateway.NewTransport()
	// nil without tier1.tls: the transport's own TLS, system roots.
	tier1Transport.DialTLSContext = s.tls.tier1Dialer(tier1Transport.DialContext, tier1HandshakeTimeout)
	s.gw, err = gateway.New(gateway.Options{
		Router: s.router, Auth: auth, Limiter: gateway.RateLimiter(s.limiter), Tier1Token: tier1Token, Transport: tier1Transport,
		MaxAttempts: rc.MaxAttempts, FailoverBudget: rc.FailoverBudget, FirstByteTimeout: rc.FirstByteTimeout,
		ResponseTimeout: rc.ResponseTimeout, MaxBodyBytes: rc.MaxBodyBytes,
		BodyReadTimeout: cfg.Server.BodyReadTimeout, StreamWriteTimeout: cfg.Server.StreamWriteTimeout,
		MaxStreamDuration: cfg.Server.MaxStreamDuration, MaxEventBytes: cfg.Server.MaxEventBytes,
		Registry: reg, Logger: log, TracerProvider: tp,
	})
	if err != nil {
		return nil, err
	}

	adminToken, err := secret(cfg.Admin.Token, cfg.Admin.TokenEnv, "admin.token_env")
	if err != nil {
		return nil, err
	}
	if adminToken != "" {
		s.admin = admin.New(admin.Options{Store: s.store, Limiter: s.limiter, Token: adminToken,
			Breakers: breakerReporter{s.router}, Clusters: admin.DiscoveryClusters(s.disc), Router: s.router, Status: s,
			Logger: log.With("component", "admin")})
	}
	return s, nil
}

// Store is the tenant store (tenants, API keys, cluster overrides).
func (s *Server) Store() *tenant.Store { return s.store }

// Limiter is the rate limiter.
func (s *Server) Limiter() *ratelimit.Limiter { return s.limiter }

// Handler is the OpenAI-facing gateway, for callers that serve it
// themselves; it routes only while Serve runs discovery and load polling.
func (s *Server) Handler() http.Handler { return s.gw }

// Listeners are what Tier 2 serves on. API is required; Admin needs an
// admin token; Metrics serves /metrics alone (nil: not served).
type Listeners struct {
	API, Admin, Metrics net.Listener
}

func (ls Listeners) close() {
	for _, l := range []net.Listener{ls.API, ls.Admin, ls.Metrics} {
		if l != nil {
			_ = l.Close()
		}
	}
}

// Serve is ServeListeners without a metrics listener.
func (s *Server) Serve(ctx context.Context, ln, adminLn net.Listener) error {
	return s.ServeListeners(ctx, Listeners{API: ln, Admin: adminLn})
}

// ServeListeners runs Tier 2 until ctx ends or a part of it fails:
// discovery, load polling, the OpenAI API, the admin API and /metrics on
// their listeners. Every listener has the timeouts of Config.Server. When
// ctx ends, in-flight requests get Options.ShutdownTimeout to finish; then
// it returns nil. It closes the listeners, and may be called once.
func (s *Server) ServeListeners(ctx context.Context, ls Listeners) error {
	if !s.served.CompareAndSwap(false, true) {
		ls.close()
		return errors.New("tier2: Serve called twice")
	}
	if ls.Admin != nil && s.admin == nil {
		ls.close()
		return errors.New("tier2: admin listener given but no admin token configured")
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()

	var wg sync.WaitGroup
	errc := make(chan error, 5)
	goRun := func(name string, f func() error) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := f(); err != nil && ctx.Err() == nil {
				errc <- fmt.Errorf("%s: %w", name, err)
			}
		}()
	}
	goRun("discovery", func() error { return s.disc.Run(ctx) })
	goRun("route", func() error { return s.router.Run(ctx) })
	var servers []*http.Server
	serveHTTP := func(name string, srv *http.Server, ln net.Listener) {
		// Refused TLS handshakes and the like, in the process's log
		// rather than on bare stderr.
		srv.ErrorLog = slog.NewLogLogger(s.log.With("listener", name).Handler(), slog.LevelWarn)
		servers = append(servers, srv)
		goRun(name, func() error {
			if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
				return err
			}
			return nil
		})
		s.log.Info("tier2 "+name+" listening", "addr", ln.Addr().String())
	}
	sc := s.cfg.Server
	// No write timeout on the API: streams last as long as generation
	// does; the gateway bounds each write and each stream instead, and
	// each request body (BodyReadTimeout).
	// Listeners are plain TCP; TLS is added where the config turns it on.
	serveHTTP("api", &http.Server{Handler: s.gw, ReadHeaderTimeout: sc.ReadHeaderTimeout, IdleTimeout: sc.IdleTimeout,
		MaxHeaderBytes: 64 << 10}, s.tls.api.Wrap(ls.API))
	if ls.Admin != nil {
		// The status page (docs/operations.md) beside the admin API it reads.
		serveHTTP("admin", s.plainServer(statusui.Mount(s.admin.Handler(), statusui.Tier2)), s.tls.admin.Wrap(ls.Admin))
	}
	if ls.Metrics != nil {
		mux := http.NewServeMux()
		mux.Handle("/metrics", promhttp.HandlerFor(s.reg, promhttp.HandlerOpts{}))
		serveHTTP("metrics", s.plainServer(mux), s.tls.metrics.Wrap(ls.Metrics))
	}
	if s.cfg.Consul != nil {
		s.log.Info("discovering tier1 clusters through consul", "address", s.cfg.Consul.Address, "service", s.cfg.Consul.Service, "seeds", len(s.cfg.Clusters))
	} else {
		s.log.Info("no consul configured: using the static cluster list", "clusters", len(s.cfg.Clusters))
	}
	s.log.Info("tier2 serving", "region", s.cfg.Region, "consul", s.cfg.Consul != nil,
		"redis", s.cfg.Redis != nil, "static_clusters", len(s.cfg.Clusters), "tenants", len(s.cfg.Tenants))

	var runErr error
	select {
	case <-ctx.Done():
	case runErr = <-errc:
	}
	cancel()
	sctx, scancel := context.WithTimeout(context.Background(), s.shutdown)
	defer scancel()
	for _, srv := range servers {
		if err := srv.Shutdown(sctx); err != nil {
			_ = srv.Close()
		}
	}
	wg.Wait()
	ls.close() // a part that failed early may have left one open
	return runErr
}

// plainServer serves a handler that neither streams nor takes large
// bodies (admin API, metrics): whole requests and answers are bounded.
func (s *Server) plainServer(h http.Handler) *http.Server {
	sc := s.cfg.Server
	return &http.Server{Handler: h, ReadHeaderTimeout: sc.ReadHeaderTimeout, ReadTimeout: sc.BodyReadTimeout,
		WriteTimeout: sc.BodyReadTimeout + time.Minute, IdleTimeout: sc.IdleTimeout, MaxHeaderBytes: 64 << 10}
}

// Close releases what New opened: the limiter (returning its leases and
// concurrency holdings to Redis, best effort), the tenant store and the
// Redis client. Call it after Serve returns. It is safe to call more than
// once.
func (s *Server) Close() error {
	s.closeOnce.Do(func() {
		var errs []error
		if s.limiter != nil {
			errs = append(errs, s.limiter.Close())
		}
		if s.auth != nil {
			errs = append(errs, s.auth.Close())
		}
		if s.store != nil {
			errs = append(errs, s.store.Close())
		}
		if s.rdb != nil {
			errs = append(errs, s.rdb.Close())
		}
		if s.traces != nil {
			// Flush the spans still buffered, briefly: a collector that is
			// down must not hold up the exit.
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			errs = append(errs, s.traces.Shutdown(ctx))
			cancel()
		}
		s.closeErr = errors.Join(errs...)
	})
	return s.closeErr
}

// secret returns value, or the environment variable env when set.
func secret(value, env, what string) (string, error) {
	if env == "" {
		return value, nil
	}
	v, ok := os.LookupEnv(env)
	if !ok || v == "" {
		return "", fmt.Errorf("%s: environment variable %s is not set", what, env)
	}
	return v, nil
}

// overridesFrom converts the store's cluster overrides for the router,
// once per store version rather than per request.
func overridesFrom(s *tenant.Store) func() map[string]route.Override {
	type cached struct {
		version int64
		m       map[string]route.Override
	}
	var cache atomic.Pointer[cached]
	return func() map[string]route.Override {
		v := s.Version()
		if c := cache.Load(); c != nil && c.version == v {
			return c.m
		}
		src := s.Overrides()
		m := make(map[string]route.Override, len(src))
		for name, o := range src {
			m[name] = route.Override{Drain: o.Drain, Weight: o.Weight, Cost: o.Cost}
		}
		cache.Store(&cached{version: v, m: m})
		return m
	}
}

// breakerReporter exposes the router's breakers to the admin API.
type breakerReporter struct{ r *route.Router }

func (b breakerReporter) Breakers() []admin.BreakerState {
	var out []admin.BreakerState
	for _, br := range b.r.Breakers() {
		out = append(out, admin.BreakerState{Cluster: br.Cluster, Model: br.Model, State: br.State,
			ConsecutiveFailures: br.ConsecutiveFailures, Since: br.Since})
	}
	return out
}
