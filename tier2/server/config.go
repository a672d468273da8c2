package server

import (
	"errors"
	"maps"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/infergate/infergate/shared/config"
	"github.com/infergate/infergate/shared/tlsfiles"
	"github.com/infergate/infergate/shared/tracing"
	"github.com/infergate/infergate/tier2/discovery"
	"github.com/infergate/infergate/tier2/route"
	"github.com/infergate/infergate/tier2/tenant"
)

// Config is the file `infergate tier2 --config` reads (docs/tier2.md). Load
// it with shared/config (strict: an unknown key is an error), which calls
// SetDefaults and Validate; New calls both again, so a Config literal works
// as well.
type Config struct {
	Listen      string   `yaml:"listen"`       // the OpenAI API's address (--listen overrides); default 127.0.0.1:8080
	Region      string   `yaml:"region"`       // this replica's region (required)
	RegionOrder []string `yaml:"region_order"` // failover preference after the own region; unlisted regions follow by name

	// TLS serves the API (listen) over TLS; off while cert_file and
	// key_file are empty (docs/security.md).
	TLS tlsfiles.Server `yaml:"tls"`

	Consul   *ConsulConfig       `yaml:"consul"`   // discovers Tier 1 clusters from Consul; absent, the static clusters are the whole list
	Clusters []discovery.Cluster `yaml:"clusters"` // the Tier 1 clusters: the whole list without Consul, seeds until Consul first answers

	Tier1   Tier1Config   `yaml:"tier1"`
	Routing RoutingConfig `yaml:"routing"`

	Redis   *RedisConfig     `yaml:"redis"` // the Redis every replica shares (tenants and limits); absent, they are in memory (one replica only)
	Tenants []tenant.Tenant  `yaml:"tenants"`
	Keys    []tenant.SeedKey `yaml:"keys"`
	JWT     *JWTConfig       `yaml:"jwt"`
	Limits  LimitsConfig     `yaml:"limits"`
	Admin   AdminConfig      `yaml:"admin"`

	Server  ServerConfig  `yaml:"server"`  // what a client may hold of the API and admin listeners
	Metrics MetricsConfig `yaml:"metrics"` // the /metrics listener
	// Tracing exports OpenTelemetry spans (docs/tracing.md); off by default.
	Tracing tracing.Config `yaml:"tracing"`
}

// ServerConfig bounds what one client may hold of Tier 2: every listener
// has timeouts, and streams are bounded too. Zero takes the default noted.
type ServerConfig struct {
	ReadHeaderTimeout time.Duration `yaml:"read_header_timeout"` // request headers; default 10s
	// BodyReadTimeout bounds the headers-to-end-of-body of a request on
	// the API (authenticated or not) and the whole request on the admin
	// API. Default 30s.
	BodyReadTimeout    time.Duration `yaml:"body_read_timeout"`
	IdleTimeout        time.Duration `yaml:"idle_timeout"`         // how long a keep-alive connection waits between requests; default 2m
	StreamWriteTimeout time.Duration `yaml:"stream_write_timeout"` // each write of a stream to the client; default 30s
	MaxStreamDuration  time.Duration `yaml:"max_stream_duration"`  // a whole stream after its first event; default 30m
	MaxEventBytes      int           `yaml:"max_event_bytes"`      // one SSE event from Tier 1; default 1 MiB
}

// MetricsConfig is the Prometheus listener. /metrics names tenants,
// clusters and token counts, so it is not on the API port; it defaults to
// loopback, and a deployment exposes it only to its scraper.
type MetricsConfig struct {
	Listen string          `yaml:"listen"` // the /metrics listener's address; default 127.0.0.1:9464
	TLS    tlsfiles.Server `yaml:"tls"`    // serves /metrics over TLS
}

// ConsulConfig says where to discover Tier 1 clusters.
type ConsulConfig struct {
	Address     string        `yaml:"address"`    // host:port or http(s)://host:port; default 127.0.0.1:8500
	Token       string        `yaml:"token"`      // ACL token (service:read on the service, node:read); prefer token_env
	TokenEnv    string        `yaml:"token_env"`  // read the ACL token from this variable (wins over token)
	Datacenter  string        `yaml:"datacenter"` // the Consul datacenter to watch; default the agent's
	Service     string        `yaml:"service"`    // the Consul service Tier 1 registers as; default infergate-tier1
	Tag         string        `yaml:"tag"`        // only instances carrying this tag
	WaitTime    time.Duration `yaml:"wait_time"`  // how long a blocking query waits for a change; default 30s
	Consistent  bool          `yaml:"consistent"` // disable stale reads (which spread load over every server)
	TLS         TLSFiles      `yaml:"tls"`
	MinInterval time.Duration `yaml:"min_interval"` // least time between queries; default 100ms
}

// TLSFiles configures TLS to the Consul agent.
type TLSFiles struct {
	CAFile             string `yaml:"ca_file"`              // PEM bundle the agent's certificate is verified against
	CertFile           string `yaml:"cert_file"`            // client certificate, with key_file
	KeyFile            string `yaml:"key_file"`             // PEM private key of cert_file
	ServerName         string `yaml:"server_name"`          // name verified in the agent's certificate
	InsecureSkipVerify bool   `yaml:"insecure_skip_verify"` // do not verify the agent (testing only)
}

// Tier1Config is how Tier 2 talks to the Tier 1 routers.
type Tier1Config struct {
	Token        string        `yaml:"token"`         // bearer token sent to every Tier 1; prefer token_env
	TokenEnv     string        `yaml:"token_env"`     // read the token from this variable (wins over token)
	PollInterval time.Duration `yaml:"poll_interval"` // how often each cluster's load summary is polled; default 1s
	PollTimeout  time.Duration `yaml:"poll_timeout"`  // one load poll; default poll_interval, at most 2s
	// TLS is how https clusters are dialled, for requests and load polls:
	// the CA bundle their certificates are verified against (default the
	// system roots) and the client certificate Tier 1 may require.
	TLS tlsfiles.Client `yaml:"tls"`
}

// RoutingConfig tunes cluster choice, failover and timeouts.
type RoutingConfig struct {
	DefaultPolicy      string        `yaml:"default_policy"`              // the policy of tenants without one: cost-first (default), latency-first or region-pinned
	SpillThreshold     float64       `yaml:"spill_threshold"`             // utilisation where a cluster stops counting as having headroom; default 0.8
	LatencyObjective   time.Duration `yaml:"latency_objective"`           // the first-token objective latency-first routing aims at; 0 = none
	ErrorRateThreshold float64       `yaml:"error_rate_threshold"`        // recent error rate (EWMA, 30 s half-life) that demotes a cluster; default 0.2
	TokensPerGPUSecond float64       `yaml:"tokens_per_gpu_second"`       // converts gpu-hour costs to per-million-token ones; 0 = not converted
	QueuePerPod        float64       `yaml:"queue_per_pod"`               // queued requests per ready pod that count as full (no capacity); default 4
	MaxAttempts        int           `yaml:"max_attempts" config:"min=1"` // clusters tried per request; default 3
	FailoverBudget     time.Duration `yaml:"failover_budget"`             // no new attempt after this since the first; default 30s
	FirstByteTimeout   time.Duration `yaml:"first_byte_timeout"`          // how long a stream waits for headers and its first event; default 30s
	ResponseTimeout    time.Duration `yaml:"response_timeout"`            // how long a non-streaming request waits for the whole answer; default 5m
	MaxBodyBytes       int64         `yaml:"max_body_bytes"`              // request body limit (413 above); default 8 MiB
	Breaker            BreakerConfig `yaml:"breaker"`
	// Adapters maps LoRA adapter names to their base model, for Tier 1
	// clusters whose load summaries do not name it; a base model's
	// per-model limits cover its adapters (docs/tier2-limits.md).
	Adapters map[string]string `yaml:"adapters"`
}

// BreakerConfig tunes the per-(cluster, model) circuit breakers.
type BreakerConfig struct {
	ConsecutiveFailures uint32        `yaml:"consecutive_failures"` // failures in a row that open the breaker; default 5
	FailureRatio        float64       `yaml:"failure_ratio"`        // share of failed requests in an interval that opens it; default 0.5
	MinRequests         uint32        `yaml:"min_requests"`         // requests an interval needs before failure_ratio counts; default 20
	Interval            time.Duration `yaml:"interval"`             // the window failure_ratio is measured over; default 30s
	OpenTimeout         time.Duration `yaml:"open_timeout"`         // how long it stays open before probing (half-open); default 10s
	HalfOpenRequests    uint32        `yaml:"half_open_requests"`   // probes let through at a time while half-open; default 1
}

// RedisConfig is the Redis shared by every replica (tenants and limits).
type RedisConfig struct {
	Addresses   []string `yaml:"addresses"`    // one for a single node, several for a cluster; required
	Username    string   `yaml:"username"`     // ACL user; empty: the default user
	Password    string   `yaml:"password"`     // the password written inline; prefer password_env
	PasswordEnv string   `yaml:"password_env"` // read the password from this variable
	DB          int      `yaml:"db"`           // database number (single node only)
	TLS         bool     `yaml:"tls"`          // connect over TLS (ElastiCache in-transit encryption)
	KeyPrefix   string   `yaml:"key_prefix"`   // prefix of every key; default infergate:
}

// JWTConfig is in jwt.go.

// LimitsConfig says how the limiter behaves while Redis is unreachable.
type LimitsConfig struct {
	Replicas   int  `yaml:"replicas"`    // Tier 2 replicas sharing Redis, for each one's local share while Redis is down; default 1
	FailClosed bool `yaml:"fail_closed"` // reject while Redis is down (default: fail open to local shares)
	// RedisTimeout bounds each limiter call to Redis on the request path;
	// a call that takes longer is decided by this replica's local share
	// (default 50ms). Raise it where Redis is far or busy.
	RedisTimeout time.Duration `yaml:"redis_timeout"`
}

// AdminConfig is the admin API's listener and credential.
type AdminConfig struct {
	Listen   string `yaml:"listen"`    // the admin API's address; empty: no admin API
	Token    string `yaml:"token"`     // the admin API's bearer token; prefer token_env
	TokenEnv string `yaml:"token_env"` // read the token from this variable (wins over token)
	// TLS serves the admin API over TLS.
	TLS tlsfiles.Server `yaml:"tls"`
}

// DefaultMetricsListen is where /metrics is served unless configured.
const DefaultMetricsListen = "127.0.0.1:9464"

// SetDefaults fills the defaults that belong to the file rather than to
// the packages it configures (those apply their own).
func (c *Config) SetDefaults() {
	if c.Listen == "" {
		c.Listen = "127.0.0.1:8080"
	}
	if c.Metrics.Listen == "" {
		c.Metrics.Listen = DefaultMetricsListen
	}
	sc := &c.Server
	for _, d := range []struct {
		p   *time.Duration
		def time.Duration
	}{
		{&sc.ReadHeaderTimeout, 10 * time.Second},
		{&sc.BodyReadTimeout, 30 * time.Second},
		{&sc.IdleTimeout, 2 * time.Minute},
		{&sc.StreamWriteTimeout, 30 * time.Second},
		{&sc.MaxStreamDuration, 30 * time.Minute},
	} {
		if *d.p == 0 { // negative is refused by Validate
			*d.p = d.def
		}
	}
	if sc.MaxEventBytes == 0 {
		sc.MaxEventBytes = 1 << 20
	}
	if c.Consul != nil && c.Consul.Address == "" {
		c.Consul.Address = "127.0.0.1:8500"
	}
}

// Validate reports every problem at once, each at its key (FieldErrors
// of shared/config).
func (c *Config) Validate() error {
	var errs []error
	at := func(path, format string, args ...any) { errs = append(errs, config.Errorf(path, format, args...)) }
	if c.Region == "" {
		at("region", "region is required: this replica's region, the first in its failover order")
	}
	if c.Consul == nil && len(c.Clusters) == 0 {
		at("clusters", "either consul or clusters is required: Tier 2 has no Tier 1 cluster to send to")
	}
	names := map[string]int{}
	for i, cl := range c.Clusters {
		path := config.Index("clusters", i)
		errs = append(errs, config.At(path, cl.Validate()))
		if j, ok := names[cl.Name]; ok && cl.Name != "" {
			at(path+".name", "duplicate name %q (also clusters[%d])", cl.Name, j)
		}
		names[cl.Name] = i
	}
	if _, err := route.ParsePolicy(c.Routing.DefaultPolicy, route.CostFirst); err != nil {
		at("routing.default_policy", "%v", err)
	}
	errs = append(errs, c.validateNumbers()...)
	if c.Redis != nil && len(c.Redis.Addresses) == 0 {
		at("redis.addresses", "required when redis is set (host:port, several for a cluster)")
	}
	if c.Admin.Listen != "" && c.Admin.Token == "" && c.Admin.TokenEnv == "" {
		at("admin.token", "admin.token or admin.token_env is required when admin.listen is set")
	}
	if err := c.Tracing.Validate(); err != nil {
		errs = append(errs, err)
	}
	if c.JWT != nil {
		if err := c.JWT.Validate(); err != nil {
			errs = append(errs, config.At("", err))
		}
	}
	errs = append(errs, c.validateTLS()...)
	errs = append(errs, c.validateTenants()...)
	errs = append(errs, config.ListenClashes([]config.Listener{
		{Path: "listen", Addr: c.Listen}, {Path: "admin.listen", Addr: c.Admin.Listen}, {Path: "metrics.listen", Addr: c.Metrics.Listen},
	}))
	return errors.Join(errs...)
}

// validateNumbers refuses negative durations, counts and shares, which
// would otherwise be taken silently as "use the default".
func (c *Config) validateNumbers() []error {
	var errs []error
	durations := []struct {
		path string
		d    time.Duration
	}{
		{"routing.latency_objective", c.Routing.LatencyObjective}, {"routing.failover_budget", c.Routing.FailoverBudget},
		{"routing.first_byte_timeout", c.Routing.FirstByteTimeout}, {"routing.response_timeout", c.Routing.ResponseTimeout},
		{"routing.breaker.interval", c.Routing.Breaker.Interval}, {"routing.breaker.open_timeout", c.Routing.Breaker.OpenTimeout},
		{"tier1.poll_interval", c.Tier1.PollInterval}, {"tier1.poll_timeout", c.Tier1.PollTimeout},
		{"server.read_header_timeout", c.Server.ReadHeaderTimeout}, {"server.body_read_timeout", c.Server.BodyReadTimeout},
		{"server.idle_timeout", c.Server.IdleTimeout}, {"server.stream_write_timeout", c.Server.StreamWriteTimeout},
		{"server.max_stream_duration", c.Server.MaxStreamDuration}, {"limits.redis_timeout", c.Limits.RedisTimeout},
	}
	if c.Consul != nil {
		durations = append(durations, struct {
			path string
			d    time.Duration
		}{"consul.wait_time", c.Consul.WaitTime}, struct {
			path string
			d    time.Duration
		}{"consul.min_interval", c.Consul.MinInterval})
	}
	for _, d := range durations {
		if d.d < 0 {
			errs = append(errs, config.Errorf(d.path, "%v is negative (leave it out for the default)", d.d))
		}
	}
	for _, n := range []struct {
		path string
		v    float64
	}{
		{"routing.max_attempts", float64(c.Routing.MaxAttempts)}, {"routing.max_body_bytes", float64(c.Routing.MaxBodyBytes)},
		{"routing.queue_per_pod", c.Routing.QueuePerPod}, {"routing.tokens_per_gpu_second", c.Routing.TokensPerGPUSecond},
		{"server.max_event_bytes", float64(c.Server.MaxEventBytes)}, {"limits.replicas", float64(c.Limits.Replicas)},
	} {
		if n.v < 0 {
			errs = append(errs, config.Errorf(n.path, "%v is negative (leave it out for the default)", n.v))
		}
	}
	for _, r := range []struct {
		path string
		v    float64
	}{{"routing.error_rate_threshold", c.Routing.ErrorRateThreshold}, {"routing.breaker.failure_ratio", c.Routing.Breaker.FailureRatio}} {
		if !(r.v >= 0 && r.v <= 1) {
			errs = append(errs, config.Errorf(r.path, "want a share in [0, 1], got %v", r.v))
		}
	}
	if t := c.Routing.SpillThreshold; !(t >= 0 && t <= 1) {
		errs = append(errs, config.Errorf("routing.spill_threshold", "want a share in (0, 1], got %v", t))
	}
	if c.Redis != nil && c.Redis.DB < 0 {
		errs = append(errs, config.Errorf("redis.db", "%d is negative", c.Redis.DB))
	}
	return errs
}

// validateTenants checks the seed tenants and keys, and what they name
// against the static clusters: a region no cluster is in, a model no
// cluster serves. Those are checked only without Consul, when the static
// list is every cluster there is.
func (c *Config) validateTenants() []error {
	var errs []error
	at := func(path, format string, args ...any) { errs = append(errs, config.Errorf(path, format, args...)) }
	regions, served := c.staticRegions(), c.staticModels()
	ids := map[string]int{}
	for i, t := range c.Tenants {
		path := config.Index("tenants", i)
		if j, ok := ids[t.ID]; ok {
			at(path+".id", "duplicate tenant %q (also tenants[%d])", t.ID, j)
		}
		ids[t.ID] = i
		n := t.Clone()
		n.Normalize()
		if err := n.Validate(); err != nil {
			errs = append(errs, tenantError(path, n, err))
		}
		if regions != nil && t.Region != "" && !slices.Contains(regions, t.Region) {
			at(path+".region", "%q is not the region of any cluster (regions: %s); its requests would find no cluster",
				t.Region, strings.Join(regions, ", "))
		}
		if served != nil {
			for _, m := range slices.Sorted(maps.Keys(t.ModelLimits)) {
				if !served[m] {
					at(config.Key(path+".model_limits", m), "no cluster serves model %q (served: %s)", m, strings.Join(slices.Sorted(maps.Keys(served)), ", "))
				}
			}
		}
	}
	if served != nil {
		for _, a := range slices.Sorted(maps.Keys(c.Routing.Adapters)) {
			if b := c.Routing.Adapters[a]; !served[b] {
				at(config.Key("routing.adapters", a), "base model %q is served by no cluster (served: %s)", b, strings.Join(slices.Sorted(maps.Keys(served)), ", "))
			}
		}
	}
	keys := map[string]int{}
	for i, k := range c.Keys {
		path := config.Index("keys", i)
		switch _, ok := ids[k.TenantID]; {
		case k.TenantID == "":
			at(path+".tenant", "required: the id of the tenant the key authenticates")
		case !ok && c.Redis == nil:
			// With Redis the tenant may have been created through the
			// admin API.
			at(path+".tenant", "unknown tenant %q (tenants: %s)", k.TenantID, c.tenantIDs())
		}
		switch {
		case (k.Key == "") == (k.SHA256 == ""):
			at(path, "set exactly one of key and sha256")
		case k.SHA256 != "" && !sha256Hex.MatchString(k.SHA256):
			at(path+".sha256", "want 64 hexadecimal digits (the key's SHA-256), got %d characters", len(k.SHA256))
		}
		secret := k.Key + "/" + strings.ToLower(k.SHA256)
		if j, ok := keys[secret]; ok {
			at(path, "the same key as keys[%d]", j)
		}
		keys[secret] = i
	}
	return errs
}

var sha256Hex = regexp.MustCompile(`^[0-9a-fA-F]{64}$`)

// tenantError puts a tenant's FieldError at its key; model_limits fields
// name a model, which may hold dots.
func tenantError(path string, t *tenant.Tenant, err error) error {
	var fe *tenant.FieldError
	if !errors.As(err, &fe) {
		return config.At(path, err)
	}
	field := fe.Field
	if rest, ok := strings.CutPrefix(field, "model_limits."); ok {
		for m := range t.ModelLimits {
			if sub, ok := strings.CutPrefix(rest, m+"."); ok {
				return config.Errorf(config.Key(path+".model_limits", m)+"."+sub, "%s", fe.Msg)
			}
		}
	}
	return config.Errorf(path+"."+field, "%s", fe.Msg)
}

func (c *Config) tenantIDs() string {
	return config.List(c.Tenants, func(t tenant.Tenant) string { return t.ID }, "none configured")
}

// staticRegions returns the static clusters' regions when they are the
// whole list (no Consul); nil when regions cannot be known here.
func (c *Config) staticRegions() []string {
	if c.Consul != nil || len(c.Clusters) == 0 {
		return nil
	}
	var out []string
	for _, cl := range c.Clusters {
		if cl.Region != "" && !slices.Contains(out, cl.Region) {
			out = append(out, cl.Region)
		}
	}
	slices.Sort(out)
	return out
}

// staticModels returns the models the static clusters serve (and the
// adapters routing.adapters maps onto them) when that is knowable: no
// Consul, and every cluster lists its models.
func (c *Config) staticModels() map[string]bool {
	if c.Consul != nil || len(c.Clusters) == 0 {
		return nil
	}
	out := map[string]bool{}
	for _, cl := range c.Clusters {
		if len(cl.Models) == 0 {
			return nil // a cluster whose models are unknown may serve anything
		}
		for _, m := range cl.Models {
			out[m] = true
		}
	}
	for a, b := range c.Routing.Adapters {
		if out[b] {
			out[a] = true
		}
	}
	return out
}

// validateTLS checks the TLS blocks; errors name their keys.
func (c *Config) validateTLS() []error {
	errs := tlsfiles.ValidateListeners([]tlsfiles.Listener{
		{Key: "tls", Block: c.TLS}, {Key: "admin.tls", Block: c.Admin.TLS}, {Key: "metrics.tls", Block: c.Metrics.TLS},
	})
	if c.Admin.TLS.Enabled() && c.Admin.Listen == "" {
		errs = append(errs, errors.New("admin.tls is set but admin.listen is empty"))
	}
	if err := c.Tier1.TLS.Validate("tier1.tls"); err != nil {
		errs = append(errs, err)
	}
	return errs
}
