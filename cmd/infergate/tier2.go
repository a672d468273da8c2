package main

import (
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/consul/api"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/redis/go-redis/v9"

	"github.com/infergate/infergate/shared/config"
	"github.com/infergate/infergate/tier2/admin"
	"github.com/infergate/infergate/tier2/discovery"
	"github.com/infergate/infergate/tier2/gateway"
	"github.com/infergate/infergate/tier2/ratelimit"
	"github.com/infergate/infergate/tier2/route"
	"github.com/infergate/infergate/tier2/tenant"
)

// tier2Config is the file `infergate tier2 --config` reads (docs/tier2.md).
type tier2Config struct {
	Listen      string   `yaml:"listen"`       // default 127.0.0.1:8080
	Region      string   `yaml:"region"`       // this replica's region (required)
	RegionOrder []string `yaml:"region_order"` // failover preference after the own region

	Consul   *consulConfig       `yaml:"consul"`   // absent: the static clusters are the whole list
	Clusters []discovery.Cluster `yaml:"clusters"` // static list, or seeds until Consul first answers

	Tier1   tier1Access   `yaml:"tier1"`
	Routing routingConfig `yaml:"routing"`

	Redis   *redisConfig     `yaml:"redis"` // absent: in-memory tenants and limits (one replica only)
	Tenants []tenant.Tenant  `yaml:"tenants"`
	Keys    []tenant.SeedKey `yaml:"keys"`
	JWT     *jwtConfig       `yaml:"jwt"`
	Limits  limiterConfig    `yaml:"limits"`
	Admin   adminConfig      `yaml:"admin"`
}

type consulConfig struct {
	Address     string        `yaml:"address"` // host:port or http(s)://host:port; default 127.0.0.1:8500
	Token       string        `yaml:"token"`
	TokenEnv    string        `yaml:"token_env"` // read the ACL token from this variable
	Datacenter  string        `yaml:"datacenter"`
	Service     string        `yaml:"service"` // default infergate-tier1
	Tag         string        `yaml:"tag"`
	WaitTime    time.Duration `yaml:"wait_time"` // blocking query wait; default 30s
	Consistent  bool          `yaml:"consistent"`
	TLS         tlsFiles      `yaml:"tls"`
	MinInterval time.Duration `yaml:"min_interval"` // least time between queries; default 100ms
}

type tlsFiles struct {
	CAFile             string `yaml:"ca_file"`
	CertFile           string `yaml:"cert_file"`
	KeyFile            string `yaml:"key_file"`
	ServerName         string `yaml:"server_name"`
	InsecureSkipVerify bool   `yaml:"insecure_skip_verify"`
}

type tier1Access struct {
	Token        string        `yaml:"token"`
	TokenEnv     string        `yaml:"token_env"`
	PollInterval time.Duration `yaml:"poll_interval"` // load summaries; default 1s
	PollTimeout  time.Duration `yaml:"poll_timeout"`
}

type routingConfig struct {
	DefaultPolicy      string        `yaml:"default_policy"`        // cost-first (default), latency-first, region-pinned
	SpillThreshold     float64       `yaml:"spill_threshold"`       // default 0.8
	LatencyObjective   time.Duration `yaml:"latency_objective"`     // first-token objective; 0 = none
	ErrorRateThreshold float64       `yaml:"error_rate_threshold"`  // default 0.2
	TokensPerGPUSecond float64       `yaml:"tokens_per_gpu_second"` // converts gpu-hour costs to per-Mtok
	QueuePerPod        float64       `yaml:"queue_per_pod"`         // default 4
	MaxAttempts        int           `yaml:"max_attempts"`          // default 3
	FailoverBudget     time.Duration `yaml:"failover_budget"`       // default 30s
	FirstByteTimeout   time.Duration `yaml:"first_byte_timeout"`    // default 30s
	ResponseTimeout    time.Duration `yaml:"response_timeout"`      // default 5m
	MaxBodyBytes       int64         `yaml:"max_body_bytes"`        // default 8 MiB
	Breaker            breakerConfig `yaml:"breaker"`
}

type breakerConfig struct {
	ConsecutiveFailures uint32        `yaml:"consecutive_failures"` // default 5
	FailureRatio        float64       `yaml:"failure_ratio"`        // default 0.5
	MinRequests         uint32        `yaml:"min_requests"`         // default 20
	Interval            time.Duration `yaml:"interval"`             // default 30s
	OpenTimeout         time.Duration `yaml:"open_timeout"`         // default 10s
	HalfOpenRequests    uint32        `yaml:"half_open_requests"`   // default 1
}

type redisConfig struct {
	Addresses   []string `yaml:"addresses"` // one for a single node, several for a cluster
	Username    string   `yaml:"username"`
	Password    string   `yaml:"password"`
	PasswordEnv string   `yaml:"password_env"`
	DB          int      `yaml:"db"`
	TLS         bool     `yaml:"tls"`
	KeyPrefix   string   `yaml:"key_prefix"`
}

type jwtConfig struct {
	HMACSecretEnv string   `yaml:"hmac_secret_env"`
	PublicKeys    []string `yaml:"public_keys"` // PEM files
	JWKSFile      string   `yaml:"jwks_file"`
	Issuer        string   `yaml:"issuer"`
	Audience      string   `yaml:"audience"`
	TenantClaim   string   `yaml:"tenant_claim"`
	RequireExp    bool     `yaml:"require_exp"`
}

type limiterConfig struct {
	Replicas   int  `yaml:"replicas"`    // Tier 2 replicas sharing Redis; local share while Redis is down
	FailClosed bool `yaml:"fail_closed"` // reject while Redis is down (default: fail open to local shares)
}

type adminConfig struct {
	Listen   string `yaml:"listen"` // empty: no admin API
	Token    string `yaml:"token"`
	TokenEnv string `yaml:"token_env"`
}

func (c *tier2Config) SetDefaults() {
	if c.Listen == "" {
		c.Listen = "127.0.0.1:8080"
	}
	if c.Consul != nil && c.Consul.Address == "" {
		c.Consul.Address = "127.0.0.1:8500"
	}
}

func (c *tier2Config) Validate() error {
	var errs []error
	if c.Region == "" {
		errs = append(errs, errors.New("region is required"))
	}
	if c.Consul == nil && len(c.Clusters) == 0 {
		errs = append(errs, errors.New("either consul or clusters is required"))
	}
	names := map[string]bool{}
	for i, cl := range c.Clusters {
		if err := cl.Validate(); err != nil {
			errs = append(errs, fmt.Errorf("clusters[%d]: %w", i, err))
		}
		if names[cl.Name] {
			errs = append(errs, fmt.Errorf("clusters[%d]: duplicate name %q", i, cl.Name))
		}
		names[cl.Name] = true
	}
	if _, err := route.ParsePolicy(c.Routing.DefaultPolicy, route.CostFirst); err != nil {
		errs = append(errs, fmt.Errorf("routing.default_policy: %w", err))
	}
	if t := c.Routing.SpillThreshold; t < 0 || t > 1 {
		errs = append(errs, fmt.Errorf("routing.spill_threshold %v: want (0,1]", t))
	}
	if c.Redis != nil && len(c.Redis.Addresses) == 0 {
		errs = append(errs, errors.New("redis.addresses is required when redis is set"))
	}
	if c.Admin.Listen != "" && c.Admin.Token == "" && c.Admin.TokenEnv == "" {
		errs = append(errs, errors.New("admin.token or admin.token_env is required when admin.listen is set"))
	}
	return errors.Join(errs...)
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

func runTier2(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("tier2", flag.ContinueOnError)
	fs.SetOutput(stderr)
	cfgPath := fs.String("config", "", "Tier 2 configuration file (YAML; see docs/tier2.md)")
	listen := fs.String("listen", "", "listen address, overriding the config's listen")
	logLevel := fs.String("log-level", "info", "log level: debug, info, warn, error")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "Usage: infergate tier2 --config FILE [--listen ADDR]")
		fmt.Fprintln(stderr)
		fmt.Fprintln(stderr, "Run the regional front door: an OpenAI-compatible gateway that finds Tier 1")
		fmt.Fprintln(stderr, "clusters through Consul, enforces tenant limits, shapes traffic by cost and")
		fmt.Fprintln(stderr, "fails over across clusters and regions.")
		fmt.Fprintln(stderr)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *cfgPath == "" {
		fs.Usage()
		return errors.New("--config is required")
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(*logLevel)); err != nil {
		return fmt.Errorf("--log-level: %w", err)
	}
	log := slog.New(slog.NewJSONHandler(stderr, &slog.HandlerOptions{Level: level}))

	var cfg tier2Config
	if err := config.Load(*cfgPath, &cfg); err != nil {
		return err
	}
	if *listen != "" {
		cfg.Listen = *listen
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))

	// Shared state: Redis, or in memory for a single replica.
	var rdb redis.UniversalClient
	if cfg.Redis != nil {
		pw, err := secret(cfg.Redis.Password, cfg.Redis.PasswordEnv, "redis.password_env")
		if err != nil {
			return err
		}
		o := &redis.UniversalOptions{Addrs: cfg.Redis.Addresses, Username: cfg.Redis.Username, Password: pw, DB: cfg.Redis.DB}
		if cfg.Redis.TLS {
			o.TLSConfig = &tls.Config{MinVersion: tls.VersionTLS12}
		}
		rdb = redis.NewUniversalClient(o)
		defer rdb.Close()
	} else {
		log.Warn("no redis configured: tenants, API keys and limits are kept in memory; run ONE replica only, or limits multiply by the replica count")
	}
	store, err := tenant.New(ctx, tenant.Options{Redis: rdb, KeyPrefix: redisPrefix(cfg.Redis), Seed: cfg.Tenants, SeedKeys: cfg.Keys, Logger: log.With("component", "tenant")})
	if err != nil {
		return fmt.Errorf("tenant store: %w", err)
	}
	defer store.Close()
	var jwtOpts *tenant.JWTOptions
	if j := cfg.JWT; j != nil {
		jwtOpts = &tenant.JWTOptions{JWKSFile: j.JWKSFile, Issuer: j.Issuer, Audience: j.Audience, TenantClaim: j.TenantClaim, RequireExp: j.RequireExp}
		if j.HMACSecretEnv != "" {
			s, err := secret("", j.HMACSecretEnv, "jwt.hmac_secret_env")
			if err != nil {
				return err
			}
			jwtOpts.HMACSecret = []byte(s)
		}
		for _, f := range j.PublicKeys {
			b, err := os.ReadFile(f)
			if err != nil {
				return fmt.Errorf("jwt.public_keys: %w", err)
			}
			jwtOpts.PublicKeysPEM = append(jwtOpts.PublicKeysPEM, string(b))
		}
	}
	auth, err := tenant.NewAuthenticator(store, jwtOpts)
	if err != nil {
		return fmt.Errorf("authenticator: %w", err)
	}
	limiter := ratelimit.New(ratelimit.Options{Redis: rdb, KeyPrefix: limiterPrefix(cfg.Redis), Replicas: cfg.Limits.Replicas,
		FailClosed: cfg.Limits.FailClosed, Logger: log.With("component", "ratelimit")})
	defer limiter.Close()

	// Discovery: Consul, or the static list.
	dopts := discovery.Options{Static: cfg.Clusters, Registry: reg, Logger: log}
	if c := cfg.Consul; c != nil {
		tok, err := secret(c.Token, c.TokenEnv, "consul.token_env")
		if err != nil {
			return err
		}
		dopts.Consul = &discovery.ConsulOptions{
			Address: c.Address, Token: tok, Datacenter: c.Datacenter, Service: c.Service, Tag: c.Tag,
			WaitTime: c.WaitTime, MinInterval: c.MinInterval, Consistent: c.Consistent,
			TLS: api.TLSConfig{CAFile: c.TLS.CAFile, CertFile: c.TLS.CertFile, KeyFile: c.TLS.KeyFile,
				Address: c.TLS.ServerName, InsecureSkipVerify: c.TLS.InsecureSkipVerify},
		}
		log.Info("discovering tier1 clusters through consul", "address", c.Address, "service", c.Service, "seeds", len(cfg.Clusters))
	} else {
		log.Info("no consul configured: using the static cluster list", "clusters", len(cfg.Clusters))
	}
	disc, err := discovery.New(dopts)
	if err != nil {
		return err
	}

	tier1Token, err := secret(cfg.Tier1.Token, cfg.Tier1.TokenEnv, "tier1.token_env")
	if err != nil {
		return err
	}
	policy, _ := route.ParsePolicy(cfg.Routing.DefaultPolicy, route.CostFirst)
	rc := cfg.Routing
	router, err := route.New(disc, route.Options{
		Region: cfg.Region, RegionOrder: cfg.RegionOrder, Token: tier1Token,
		PollInterval: cfg.Tier1.PollInterval, PollTimeout: cfg.Tier1.PollTimeout,
		DefaultPolicy: policy, SpillThreshold: rc.SpillThreshold, QueuePerPod: rc.QueuePerPod,
		LatencyObjective: rc.LatencyObjective, ErrorRateThreshold: rc.ErrorRateThreshold, TokensPerGPUSecond: rc.TokensPerGPUSecond,
		Breaker: route.BreakerOptions{
			ConsecutiveFailures: rc.Breaker.ConsecutiveFailures, FailureRatio: rc.Breaker.FailureRatio, MinRequests: rc.Breaker.MinRequests,
			Interval: rc.Breaker.Interval, OpenTimeout: rc.Breaker.OpenTimeout, HalfOpenRequests: rc.Breaker.HalfOpenRequests,
		},
		Overrides: overridesFrom(store),
		Registry:  reg, Logger: log,
	})
	if err != nil {
		return err
	}
	gw, err := gateway.New(gateway.Options{
		Router: router, Auth: auth, Limiter: gateway.RateLimiter(limiter), Tier1Token: tier1Token,
		MaxAttempts: rc.MaxAttempts, FailoverBudget: rc.FailoverBudget, FirstByteTimeout: rc.FirstByteTimeout,
		ResponseTimeout: rc.ResponseTimeout, MaxBodyBytes: rc.MaxBodyBytes,
		Registry: reg, Gatherer: reg, Logger: log,
	})
	if err != nil {
		return err
	}

	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	var adminLn net.Listener
	if cfg.Admin.Listen != "" {
		if adminLn, err = net.Listen("tcp", cfg.Admin.Listen); err != nil {
			ln.Close()
			return fmt.Errorf("admin listen: %w", err)
		}
	}

	var wg sync.WaitGroup
	errc := make(chan error, 4)
	goRun := func(name string, f func() error) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := f(); err != nil && ctx.Err() == nil {
				errc <- fmt.Errorf("%s: %w", name, err)
			}
		}()
	}
	goRun("discovery", func() error { return disc.Run(ctx) })
	goRun("route", func() error { return router.Run(ctx) })
	if adminLn != nil {
		tok, err := secret(cfg.Admin.Token, cfg.Admin.TokenEnv, "admin.token_env")
		if err != nil {
			ln.Close()
			adminLn.Close()
			return err
		}
		srv := admin.New(admin.Options{Store: store, Limiter: limiter, Token: tok, Breakers: breakerReporter{router}, Logger: log.With("component", "admin")})
		goRun("admin", func() error { return srv.Serve(ctx, adminLn) })
		log.Info("tier2 admin API listening", "addr", adminLn.Addr().String())
	}
	// No write timeout: streams last as long as generation does.
	srv := &http.Server{Handler: gw, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 2 * time.Minute}
	goRun("http", func() error {
		if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
			return err
		}
		return nil
	})
	log.Info("tier2 listening", "addr", ln.Addr().String(), "region", cfg.Region, "consul", cfg.Consul != nil,
		"redis", cfg.Redis != nil, "static_clusters", len(cfg.Clusters), "tenants", len(cfg.Tenants))
	fmt.Fprintf(stdout, "infergate tier2 listening on %s\n", ln.Addr())

	var runErr error
	select {
	case <-ctx.Done():
	case runErr = <-errc:
	}
	cancel()
	// In-flight streams get a grace period; then connections are cut.
	sctx, scancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer scancel()
	if err := srv.Shutdown(sctx); err != nil {
		_ = srv.Close()
	}
	wg.Wait()
	return runErr
}

func redisPrefix(c *redisConfig) string {
	if c == nil || c.KeyPrefix == "" {
		return ""
	}
	return c.KeyPrefix
}

func limiterPrefix(c *redisConfig) string {
	if c == nil || c.KeyPrefix == "" {
		return ""
	}
	return c.KeyPrefix + "rl:"
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
