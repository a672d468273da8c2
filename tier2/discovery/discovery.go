// Package discovery keeps Tier 2's list of Tier 1 clusters: the healthy
// instances of the Consul service infergate-tier1, watched with blocking
// queries, or a static list when Consul is not configured.
//
// Consul trouble never empties the list: on errors the last good answer is
// kept (its age is exported as a gauge), and before the first good answer
// the static seeds are used.
package discovery

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"net/url"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/consul/api"
	"github.com/infergate/infergate/shared/cluster"
	"github.com/infergate/infergate/shared/config"
	"github.com/infergate/infergate/shared/metric"
	"github.com/prometheus/client_golang/prometheus"
)

// Cluster is one Tier 1 router as Tier 2 sees it.
type Cluster struct {
	ID       string   `yaml:"id" json:"id"`               // unique key: the Consul service ID, or Name for static clusters
	Name     string   `yaml:"name" json:"name"`           // cluster name (metrics, logs, overrides)
	Region   string   `yaml:"region" json:"region"`       // region name
	Address  string   `yaml:"address" json:"address"`     // base URL, e.g. http://10.0.0.5:8080
	Models   []string `yaml:"models" json:"models"`       // served models; empty means unknown
	Cost     float64  `yaml:"cost" json:"cost"`           // in CostUnit
	CostUnit string   `yaml:"cost_unit" json:"cost_unit"` // what cost is per: gpu-hour (the default) or mtok (per million tokens)
	Pricing  string   `yaml:"pricing" json:"pricing"`     // spot / on-demand, informational
	Capacity int      `yaml:"capacity" json:"capacity"`   // concurrent requests the cluster is sized for; 0 = unknown
}

// Serves reports whether c lists model; unknown (empty) lists serve nothing
// as far as Serves is concerned.
func (c Cluster) Serves(model string) bool { return slices.Contains(c.Models, model) }

// Validate checks a statically configured cluster. Errors are
// config.FieldErrors at the cluster's keys (name, address, ...).
func (c Cluster) Validate() error {
	var errs []error
	if c.Name == "" {
		errs = append(errs, config.Errorf("name", "required"))
	}
	if c.Region == "" {
		errs = append(errs, config.Errorf("region", "required (cluster %q)", c.Name))
	}
	u, err := url.Parse(c.Address)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		errs = append(errs, config.Errorf("address", "%q: want an http(s) base URL such as http://10.0.0.5:8080 (cluster %q)", c.Address, c.Name))
	}
	if c.Cost < 0 {
		errs = append(errs, config.Errorf("cost", "%v is negative (cluster %q)", c.Cost, c.Name))
	}
	if c.CostUnit != "" && c.CostUnit != cluster.CostPerGPUHour && c.CostUnit != cluster.CostPerMTok {
		errs = append(errs, config.Errorf("cost_unit", "%q: want %q or %q (cluster %q)", c.CostUnit, cluster.CostPerGPUHour, cluster.CostPerMTok, c.Name))
	}
	if c.Capacity < 0 {
		errs = append(errs, config.Errorf("capacity", "%d is negative (0: unknown)", c.Capacity))
	}
	return errors.Join(errs...)
}

// ConsulOptions says how to reach Consul.
type ConsulOptions struct {
	Address    string // host:port or URL of the agent's HTTP API
	Scheme     string // http or https; inferred from Address when it is a URL
	Token      string // ACL token (needs service:read on infergate-tier1 and node:read)
	Datacenter string
	TLS        api.TLSConfig // CA / client certificate files, server name, skip-verify
	Service    string        // default cluster.ServiceName
	Tag        string        // optional tag filter
	// WaitTime bounds one blocking query (Consul caps it at 10m). Default 30s.
	WaitTime time.Duration
	// MinInterval is the least time between two queries, so a flapping
	// index cannot turn the watch into a busy loop. Default 100ms.
	MinInterval time.Duration
	// MaxBackoff caps the wait after consecutive errors. Default 10s.
	MaxBackoff time.Duration
	// Consistent turns off AllowStale (stale reads spread load over all
	// servers and keep working without a leader, so they are the default).
	Consistent bool
}

// Options configures a Discovery.
type Options struct {
	// Consul, when nil, makes Static the whole, fixed cluster list.
	Consul *ConsulOptions
	// Static is the cluster list without Consul, and the seeds with Consul
	// until its first good answer.
	Static   []Cluster
	Registry prometheus.Registerer // default: a private registry
	Logger   *slog.Logger          // default: slog.Default()
}

// Discovery watches the Tier 1 clusters. Its methods are safe for
// concurrent use.
type Discovery struct {
	opts   Options
	client *api.Client
	log    *slog.Logger

	mu       sync.Mutex
	clusters []Cluster
	lastGood time.Time // zero until Consul answered once
	lastErr  error     // the last query's error; nil after a good answer
	errAt    time.Time
	changed  chan struct{}

	mQueries *prometheus.CounterVec
	mCount   prometheus.Gauge
}

// New builds a Discovery. Call Run to start watching Consul.
func New(opts Options) (*Discovery, error) {
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.Registry == nil {
		opts.Registry = prometheus.NewRegistry()
	}
	for _, c := range opts.Static {
		if err := c.Validate(); err != nil {
			return nil, fmt.Errorf("discovery: static cluster: %w", err)
		}
	}
	d := &Discovery{
		opts:     opts,
		log:      opts.Logger.With("component", "discovery"),
		clusters: normalise(opts.Static),
		changed:  make(chan struct{}),
		mQueries: metric.Counter("infergate_tier2_discovery_queries_total", "Consul health queries by result (ok, error).", "result"),
		mCount:   prometheus.NewGauge(prometheus.GaugeOpts{Name: "infergate_tier2_discovery_clusters", Help: "Tier 1 clusters currently known."}),
	}
	d.mCount.Set(float64(len(d.clusters)))
	age := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "infergate_tier2_discovery_snapshot_age_seconds",
		Help: "Seconds since Consul last answered; the cluster list in use is that old (-1 before the first answer or without Consul).",
	}, func() float64 {
		d.mu.Lock()
		defer d.mu.Unlock()
		if d.lastGood.IsZero() {
			return -1
		}
		return time.Since(d.lastGood).Seconds()
	})
	if err := metric.Register(opts.Registry, d.mQueries, d.mCount, age); err != nil {
		return nil, fmt.Errorf("discovery: %w", err)
	}
	if opts.Consul != nil {
		c := *opts.Consul
		config.Default(&c.Service, cluster.ServiceName)
		config.Default(&c.WaitTime, 30*time.Second)
		config.Default(&c.MinInterval, 100*time.Millisecond)
		config.Default(&c.MaxBackoff, 10*time.Second)
		d.opts.Consul = &c
		client, err := NewConsulClient(c)
		if err != nil {
			return nil, err
		}
		d.client = client
	}
	return d, nil
}

// NewConsulClient builds a Consul API client from o (also used by Tier 1's
// registration wiring).
func NewConsulClient(o ConsulOptions) (*api.Client, error) {
	cfg := api.DefaultNonPooledConfig()
	addr, scheme := o.Address, o.Scheme
	if u, err := url.Parse(addr); err == nil && (u.Scheme == "http" || u.Scheme == "https") {
		addr, scheme = u.Host, u.Scheme
	}
	if addr != "" {
		cfg.Address = addr
	}
	if scheme != "" {
		cfg.Scheme = scheme
	}
	cfg.Token = o.Token
	cfg.Datacenter = o.Datacenter
	cfg.TLSConfig = o.TLS
	if o.TLS.CAFile != "" || o.TLS.CertFile != "" || o.TLS.InsecureSkipVerify {
		if scheme == "" {
			cfg.Scheme = "https"
		}
		// api.NewClient builds the same config; this surfaces bad files early.
		if _, err := api.SetupTLSConfig(&o.TLS); err != nil {
			return nil, fmt.Errorf("discovery: consul TLS: %w", err)
		}
	}
	client, err := api.NewClient(cfg)
	if err != nil {
		return nil, fmt.Errorf("discovery: consul client: %w", err)
	}
	return client, nil
}

// Clusters returns the current cluster list, sorted by ID. The list is
// shared and replaced, never changed, on updates (it is read on every
// request): callers must not modify it.
func (d *Discovery) Clusters() []Cluster {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.clusters
}

// Changed returns a channel that is closed at the next change of the
// cluster list. Call it again after it fires for the one after.
func (d *Discovery) Changed() <-chan struct{} {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.changed
}

// LastGood is when Consul last answered (zero if never, or without Consul).
func (d *Discovery) LastGood() time.Time {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.lastGood
}

// Status is discovery's state for the admin API.
type Status struct {
	Consul      bool   // watching Consul; false: the static list
	Address     string // Consul's address as configured
	Reachable   bool   // Consul's last answer was good (the last query did not fail)
	LastSuccess time.Time
	LastError   error // the last query's error, nil once a query succeeds again
	LastErrorAt time.Time
	Clusters    int // in the list in use
}

// Status reports where discovery stands.
func (d *Discovery) Status() Status {
	d.mu.Lock()
	defer d.mu.Unlock()
	st := Status{Consul: d.client != nil, LastSuccess: d.lastGood, LastError: d.lastErr, LastErrorAt: d.errAt, Clusters: len(d.clusters)}
	if d.opts.Consul != nil {
		st.Address = d.opts.Consul.Address
	}
	st.Reachable = st.Consul && d.lastErr == nil && !d.lastGood.IsZero()
	return st
}

// Run watches Consul until ctx ends. Without Consul it just waits.
func (d *Discovery) Run(ctx context.Context) error {
	if d.client == nil {
		<-ctx.Done()
		return nil
	}
	co := d.opts.Consul
	var index uint64
	backoff := time.Duration(0)
	for {
		start := time.Now()
		q := &api.QueryOptions{
			AllowStale: !co.Consistent,
			WaitIndex:  index,
			WaitTime:   co.WaitTime,
		}
		entries, meta, err := d.client.Health().Service(co.Service, co.Tag, true, q.WithContext(ctx))
		if ctx.Err() != nil {
			return nil
		}
		if err != nil {
			d.mQueries.WithLabelValues("error").Inc()
			d.mu.Lock()
			d.lastErr, d.errAt = err, time.Now()
			d.mu.Unlock()
			// The agent may come back as a different (restarted, restored)
			// one whose index is behind ours: ask without blocking first.
			index = 0
			// Keep the last good list; never replace it with an error.
			backoff = min(max(2*backoff, 250*time.Millisecond), co.MaxBackoff)
			d.log.Warn("consul query failed; keeping the last known clusters", "err", err, "retry_in", backoff)
			if !sleep(ctx, backoff) {
				return nil
			}
			continue
		}
		backoff = 0
		d.mQueries.WithLabelValues("ok").Inc()
		switch {
		case meta.LastIndex < index:
			// The index went backwards (a restored or restarted server):
			// start over, or we would block on a future that never comes.
			index = 0
		case meta.LastIndex == 0:
			index = 0
		default:
			index = meta.LastIndex
		}
		d.update(fromConsul(entries, d.log))
		if wait := co.MinInterval - time.Since(start); wait > 0 && !sleep(ctx, wait) {
			return nil
		}
	}
}

func (d *Discovery) update(cs []Cluster) {
	cs = normalise(cs)
	d.mu.Lock()
	defer d.mu.Unlock()
	d.lastGood = time.Now()
	d.lastErr = nil
	if equal(d.clusters, cs) {
		return
	}
	d.clusters = cs
	d.mCount.Set(float64(len(cs)))
	close(d.changed)
	d.changed = make(chan struct{})
	names := make([]string, len(cs))
	for i, c := range cs {
		names[i] = c.Name + "@" + c.Region
	}
	d.log.Info("tier1 clusters changed", "clusters", names)
}

func fromConsul(entries []*api.ServiceEntry, log *slog.Logger) []Cluster {
	out := make([]Cluster, 0, len(entries))
	for _, e := range entries {
		s := e.Service
		if s == nil {
			continue
		}
		addr := s.Address
		if addr == "" && e.Node != nil {
			addr = e.Node.Address
		}
		meta := s.Meta
		address, ok := consulAddress(meta[cluster.MetaScheme], addr, s.Port)
		if !ok {
			log.Warn("skipping tier1 instance with an unusable address", "service", s.ID,
				"scheme", meta[cluster.MetaScheme], "address", addr, "port", s.Port)
			continue
		}
		c := Cluster{
			ID:       s.ID,
			Name:     meta[cluster.MetaCluster],
			Region:   meta[cluster.MetaRegion],
			Address:  address,
			CostUnit: meta[cluster.MetaCostUnit],
			Pricing:  meta[cluster.MetaPricing],
		}
		if c.CostUnit != "" && c.CostUnit != cluster.CostPerGPUHour && c.CostUnit != cluster.CostPerMTok {
			log.Warn("ignoring unknown cost_unit in consul metadata", "service", s.ID, "cost_unit", c.CostUnit)
			c.CostUnit = ""
		}
		if c.Name == "" {
			c.Name = s.ID
		}
		if m := meta[cluster.MetaModels]; m != "" {
			for _, name := range strings.Split(m, ",") {
				if name = strings.TrimSpace(name); name != "" {
					c.Models = append(c.Models, name)
				}
			}
		}
		if v := meta[cluster.MetaCost]; v != "" {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil || !(f >= 0) || math.IsInf(f, 1) { // NaN fails f >= 0
				log.Warn("ignoring bad cost in consul metadata", "service", s.ID, "cost", v)
			} else {
				c.Cost = f
			}
		}
		if v := meta[cluster.MetaCapacity]; v != "" {
			n, err := strconv.Atoi(v)
			if err != nil || n < 0 {
				log.Warn("ignoring bad capacity in consul metadata", "service", s.ID, "capacity", v)
			} else {
				c.Capacity = n
			}
		}
		if c.Region == "" || addr == "" {
			log.Warn("skipping tier1 instance without region or address", "service", s.ID)
			continue
		}
		if c.ID == "" {
			// Consul names every instance; an empty ID (a hand-made answer)
			// leaves the cluster nothing to be told apart by.
			log.Warn("skipping tier1 instance without a service ID", "cluster", c.Name, "address", c.Address)
			continue
		}
		out = append(out, c)
	}
	return out
}

// consulAddress builds a registration's base URL, or reports false when
// the scheme is not http(s), the port is out of range or the result does not
// parse back to just a host (an IPv6 zone is escaped, not dropped).
func consulAddress(scheme, host string, port int) (string, bool) {
	scheme = strings.ToLower(scheme)
	if scheme == "" {
		scheme = "http"
	}
	if (scheme != "http" && scheme != "https") || port <= 0 || port > 65535 || host == "" {
		return "", false
	}
	u := url.URL{Scheme: scheme, Host: net.JoinHostPort(host, strconv.Itoa(port))}
	s := u.String()
	back, err := url.Parse(s)
	if err != nil || back.Host != u.Host || back.Path != "" || back.RawQuery != "" || back.Fragment != "" || back.User != nil {
		return "", false
	}
	return s, true
}

func normalise(cs []Cluster) []Cluster {
	out := make([]Cluster, len(cs))
	for i, c := range cs {
		if c.ID == "" {
			c.ID = c.Name
		}
		if c.CostUnit == "" {
			c.CostUnit = cluster.CostPerGPUHour
		}
		c.Address = strings.TrimRight(c.Address, "/")
		c.Models = slices.Clone(c.Models)
		sort.Strings(c.Models)
		out[i] = c
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

func equal(a, b []Cluster) bool {
	return slices.EqualFunc(a, b, func(x, y Cluster) bool {
		return x.ID == y.ID && x.Name == y.Name && x.Region == y.Region && x.Address == y.Address &&
			x.Cost == y.Cost && x.CostUnit == y.CostUnit && x.Pricing == y.Pricing &&
			x.Capacity == y.Capacity && slices.Equal(x.Models, y.Models)
	})
}

func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
