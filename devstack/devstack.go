// Package devstack runs the whole infergate topology in one process for
// local development: simulated GPU pods (sim/fleet) in two regions of two
// clusters each, a Tier 1 router per cluster and a Tier 2 front door with its
// admin API, all on loopback with in-memory state. `infergate-lab dev` prints how
// to reach it; tests start it directly.
package devstack

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/infergate/infergate/sim/fleet"
	"github.com/infergate/infergate/tier1/gateway"
	tier1server "github.com/infergate/infergate/tier1/server"
)

// Defaults for Options.
const (
	DefaultListen      = "127.0.0.1:8080"
	DefaultAdminListen = "127.0.0.1:8081"
	// TenantID is the tenant the generated API key belongs to.
	TenantID = "dev"
)

// Options configure Start. Zero fields take defaults.
type Options struct {
	// Listen is Tier 2's OpenAI API address; port 0 picks a free one.
	// Default DefaultListen.
	Listen string
	// AdminListen is the admin API's address (and Tier 2's status page);
	// port 0 picks a free one. Default DefaultAdminListen.
	AdminListen string
	// MetricsListen is Tier 2's /metrics address; empty: 127.0.0.1:0 (a
	// free port), so that a stack always has one to scrape.
	MetricsListen string
	// Tier1Listen gives cluster i (of Clusters) its Tier 1 API and
	// metrics addresses (the metrics listener also serves Tier 1's status
	// page); nil, or empty strings, take free loopback ports.
	Tier1Listen func(i int) (api, metrics string)
	// TimeScale is real seconds per simulated second; default 1.
	TimeScale float64
	// APIKey is the dev tenant's key; generated when empty.
	APIKey string
	// AdminToken guards the admin API; generated when empty.
	AdminToken string
	// Clusters is the topology; default Topology().
	Clusters []Cluster
	// ReadyTimeout bounds the wait for Tier 2 to route; default 15s.
	ReadyTimeout time.Duration
	Logger       *slog.Logger // default: discard
	// TracerProvider records both tiers' spans (docs/tracing.md); nil:
	// no tracing. The caller shuts it down after Close.
	TracerProvider trace.TracerProvider
}

// ClusterInfo is a running Tier 1 cluster.
type ClusterInfo struct {
	Cluster
	URL string // the Tier 1 router, http://host:port
	// MetricsURL is Tier 1's metrics listener, http://host:port: /metrics,
	// and the status page at /status (Tier1Token in its fragment).
	MetricsURL string
	Pods       []string // "name url" of each simulated pod
}

// Stack is a running local stack. Close stops it.
type Stack struct {
	// BaseURL is the OpenAI base URL of Tier 2, http://host:port/v1.
	BaseURL string
	// Addr is Tier 2's host:port.
	Addr string
	// APIKey authenticates as tenant TenantID.
	APIKey string
	// AdminURL is the admin API's base URL, http://host:port; it also
	// serves Tier 2's status page at /status.
	AdminURL   string
	AdminToken string
	// MetricsURL is Tier 2's /metrics, http://host:port/metrics.
	MetricsURL string
	// Tier1Token is what Tier 2 presents to every Tier 1.
	Tier1Token string
	Clusters   []ClusterInfo
	TimeScale  float64

	cancel    context.CancelFunc
	wg        sync.WaitGroup
	errc      chan error
	closeOnce sync.Once
	closeErr  error
	cleanups  []func() error // run in reverse by Close
}

// Start starts the stack and returns once Tier 2 routes requests. The stack
// stops when ctx ends or Close is called.
func Start(ctx context.Context, opts Options) (st *Stack, err error) {
	if opts.Listen == "" {
		opts.Listen = DefaultListen
	}
	if opts.AdminListen == "" {
		opts.AdminListen = DefaultAdminListen
	}
	if opts.TimeScale == 0 {
		opts.TimeScale = 1
	}
	if opts.TimeScale < 0 {
		return nil, fmt.Errorf("devstack: time scale %v must be positive", opts.TimeScale)
	}
	if opts.Clusters == nil {
		opts.Clusters = Topology()
	}
	if opts.ReadyTimeout <= 0 {
		opts.ReadyTimeout = 15 * time.Second
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.APIKey == "" {
		opts.APIKey = "sk-dev-" + randomHex(16)
	}
	if opts.AdminToken == "" {
		opts.AdminToken = "adm-" + randomHex(16)
	}
	log := opts.Logger

	ctx, cancel := context.WithCancel(ctx)
	st = &Stack{
		APIKey: opts.APIKey, AdminToken: opts.AdminToken, Tier1Token: "t1-" + randomHex(16),
		TimeScale: opts.TimeScale, cancel: cancel, errc: make(chan error, 16),
	}
	defer func() {
		if err != nil {
			_ = st.Close()
			st = nil
		}
	}()

	// Listen first, so a busy port fails fast before anything starts.
	ln, err := net.Listen("tcp", opts.Listen)
	if err != nil {
		return st, fmt.Errorf("devstack: tier2 listen: %w", err)
	}
	st.cleanups = append(st.cleanups, ignoreClosed(ln.Close))
	adminLn, err := net.Listen("tcp", opts.AdminListen)
	if err != nil {
		return st, fmt.Errorf("devstack: admin listen: %w", err)
	}
	st.cleanups = append(st.cleanups, ignoreClosed(adminLn.Close))
	if opts.MetricsListen == "" {
		opts.MetricsListen = "127.0.0.1:0"
	}
	metricsLn, err := net.Listen("tcp", opts.MetricsListen)
	if err != nil {
		return st, fmt.Errorf("devstack: tier2 metrics listen: %w", err)
	}
	st.cleanups = append(st.cleanups, ignoreClosed(metricsLn.Close))
	st.Addr = ln.Addr().String()
	st.BaseURL = "http://" + st.Addr + "/v1"
	st.AdminURL = "http://" + adminLn.Addr().String()
	st.MetricsURL = "http://" + metricsLn.Addr().String() + "/metrics"

	for i, c := range opts.Clusters {
		apiAddr, metricsAddr := "", ""
		if opts.Tier1Listen != nil {
			apiAddr, metricsAddr = opts.Tier1Listen(i)
		}
		info, err := st.startCluster(ctx, c, listens{api: apiAddr, metrics: metricsAddr}, opts, log.With("cluster", c.Name))
		if err != nil {
			return st, fmt.Errorf("devstack: cluster %s: %w", c.Name, err)
		}
		st.Clusters = append(st.Clusters, info)
	}
	if err := st.startTier2(ctx, server2Listeners(ln, adminLn, metricsLn), opts, log.With("component", "tier2")); err != nil {
		return st, fmt.Errorf("devstack: tier2: %w", err)
	}
	if err := waitReady(ctx, "http://"+st.Addr+"/ready", opts.ReadyTimeout); err != nil {
		return st, fmt.Errorf("devstack: tier2 not ready: %w", err)
	}
	log.Info("local stack ready", "tier2", st.Addr, "admin", st.AdminURL, "clusters", len(st.Clusters))
	return st, nil
}

// listens are a Tier 1's addresses; empty takes a free loopback port.
type listens struct{ api, metrics string }

// startCluster starts a cluster's simulated pods and its Tier 1 router.
func (st *Stack) startCluster(ctx context.Context, c Cluster, addrs listens, opts Options, log *slog.Logger) (ClusterInfo, error) {
	if addrs.api == "" {
		addrs.api = "127.0.0.1:0"
	}
	if addrs.metrics == "" {
		addrs.metrics = "127.0.0.1:0"
	}
	info := ClusterInfo{Cluster: c}
	f, err := fleet.Start(ctx, fleet.Config{TimeScale: opts.TimeScale, Host: "127.0.0.1", Pods: c.Pods, Logger: log.With("component", "sim")})
	if err != nil {
		return info, err
	}
	st.cleanups = append(st.cleanups, f.Close)

	cfg := gateway.Config{
		Listen: addrs.api, MetricsListen: addrs.metrics, Cluster: c.Name, Region: c.Region,
		Auth: gateway.AuthConfig{Tokens: []string{st.Tier1Token}},
		// A local stack needs no 50ms scrapes; this keeps a dozen pods
		// cheap on a laptop.
		Scrape: gateway.ScrapeConfig{Interval: 100 * time.Millisecond},
		Pools:  c.Pools,
	}
	for _, p := range f.Pods {
		pc := p.Config()
		pool := c.Pool(pc.ServedModelName)
		if pool == "" {
			return info, fmt.Errorf("pod %s serves %q, which no pool of the cluster declares", p.Spec.Name, pc.ServedModelName)
		}
		cfg.Pods = append(cfg.Pods, gateway.PodConfig{Name: p.Spec.Name, Address: p.Addr, Pool: pool,
			Engine: p.Spec.Engine, GPU: p.Spec.GPU, GPUs: max(p.Spec.TP, 1)})
		info.Pods = append(info.Pods, p.Spec.Name+" "+p.URL)
	}
	cfg.SetDefaults()
	if err := cfg.Validate(); err != nil {
		return info, fmt.Errorf("tier1 config: %w", err)
	}
	// Both listeners are opened here rather than by the server, which
	// falls back (with a warning) when the default metrics address is
	// taken: every Tier 1 of the stack has its own, and a busy port fails
	// the start.
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return info, fmt.Errorf("tier1 listen: %w", err)
	}
	st.cleanups = append(st.cleanups, ignoreClosed(ln.Close))
	mln, err := net.Listen("tcp", cfg.MetricsListen)
	if err != nil {
		return info, fmt.Errorf("tier1 metrics listen: %w", err)
	}
	st.cleanups = append(st.cleanups, ignoreClosed(mln.Close))
	srv, err := tier1server.New(ctx, &cfg, tier1server.Options{Logger: log.With("component", "tier1"), ShutdownTimeout: 5 * time.Second,
		TracerProvider: opts.TracerProvider, MetricsListener: mln})
	if err != nil {
		return info, err
	}
	st.cleanups = append(st.cleanups, func() error { srv.Close(); return nil })
	info.URL = "http://" + ln.Addr().String()
	info.MetricsURL = "http://" + mln.Addr().String()
	st.run(c.Name+" tier1", func() error { return srv.Serve(ctx, ln, nil) })
	// Tier 2 is ready once it sees a cluster, which can be before that
	// cluster's Tier 1 has scraped a pod; a first request in that gap would
	// get a 502. Wait for Tier 1 to route too.
	if err := waitReady(ctx, info.URL+"/ready", opts.ReadyTimeout); err != nil {
		return info, fmt.Errorf("tier1 not ready: %w", err)
	}
	return info, nil
}

// run runs f in the background; an error while the stack is up ends Wait.
func (st *Stack) run(name string, f func() error) {
	st.wg.Add(1)
	go func() {
		defer st.wg.Done()
		if err := f(); err != nil {
			select {
			case st.errc <- fmt.Errorf("%s: %w", name, err):
			default:
			}
		}
	}()
}

// Wait blocks until ctx ends (nil) or a component of the stack fails (its
// error). Call Close afterwards.
func (st *Stack) Wait(ctx context.Context) error {
	select {
	case <-ctx.Done():
		return nil
	case err := <-st.errc:
		return err
	}
}

// Close stops everything and waits for it. It is safe to call more than once.
func (st *Stack) Close() error {
	st.closeOnce.Do(func() {
		st.cancel()
		st.wg.Wait()
		var errs []error
		for i := len(st.cleanups) - 1; i >= 0; i-- {
			if err := st.cleanups[i](); err != nil {
				errs = append(errs, err)
			}
		}
		st.closeErr = errors.Join(errs...)
	})
	return st.closeErr
}

// waitReady polls url until it answers 200.
func waitReady(ctx context.Context, url string, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	client := &http.Client{Timeout: time.Second}
	var last error
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return err
		}
		resp, err := client.Do(req)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			err = fmt.Errorf("%s: %s", url, resp.Status)
		}
		last = err
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (last: %v)", ctx.Err(), last)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b) // never fails (crypto/rand)
	return hex.EncodeToString(b)
}

// ignoreClosed drops the error of closing an already closed listener (the
// servers close theirs on shutdown).
func ignoreClosed(f func() error) func() error {
	return func() error {
		if err := f(); err != nil && !errors.Is(err, net.ErrClosed) {
			return err
		}
		return nil
	}
}
