// Package server assembles Tier 1 — the per-cluster router — from its
// configuration: the OpenAI-compatible proxy (tier1/gateway), the optional
// Envoy ext_proc endpoint picker (tier1/extproc), the optional Kubernetes
// pod discovery (tier1/kube), the optional Consul registration that lets
// Tier 2 find this cluster (tier1/register) and the /metrics listener
// (metrics_listen, loopback by default).
// `infergate tier1` and the local stack (devstack) both build Tier 1
// through it, so there is one wiring; it mirrors tier2/server.
package server

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/hashicorp/consul/api"
	"go.opentelemetry.io/otel/trace"

	"github.com/infergate/infergate/shared/cluster"
	loader "github.com/infergate/infergate/shared/config"
	"github.com/infergate/infergate/shared/tlsfiles"
	"github.com/infergate/infergate/shared/tracing"
	"github.com/infergate/infergate/tier1/config"
	"github.com/infergate/infergate/tier1/extproc"
	"github.com/infergate/infergate/tier1/gateway"
	"github.com/infergate/infergate/tier1/kube"
	"github.com/infergate/infergate/tier1/peers"
	"github.com/infergate/infergate/tier1/prefix"
	"github.com/infergate/infergate/tier1/register"
)

// Config is Tier 1's configuration file (docs/tier1.md); its schema is
// tier1/config's.
type Config = config.Config

// Options are the process-level dependencies of a Server.
type Options struct {
	Logger *slog.Logger // default: discard
	// ConfigPath, when set, is watched and hot-reloaded (see docs/tier1.md).
	ConfigPath string
	// ExtProc configures the ext_proc listener passed to Serve.
	ExtProc extproc.Options
	// ShutdownTimeout is the grace period in-flight requests get after
	// Serve's context ends. Default 30s.
	ShutdownTimeout time.Duration
	// MetricsListener, when set, serves /metrics instead of a listener
	// opened on the config's metrics_listen.
	MetricsListener net.Listener
	// PeersListener, when set, receives peer replicas' state instead of a
	// listener opened on the config's peers.listen.
	PeersListener net.Listener
	// TracerProvider, when set, records Tier 1's spans instead of one
	// built from the config's tracing block (the caller then owns its
	// shutdown).
	TracerProvider trace.TracerProvider
	// TLSReloadInterval is how often the TLS files (tls, metrics_tls,
	// ext_proc_tls, upstream.tls) are re-read; default 10s. Tests
	// shorten it.
	TLSReloadInterval time.Duration
}

// Server is a configured Tier 1, ready to Serve. Close releases it.
type Server struct {
	cfg  *Config
	log  *slog.Logger
	opts Options
	gw   *gateway.Gateway
	node *peers.Node // nil unless peers.listen is set
	// traces is the provider built from cfg.Tracing; nil when given.
	traces *tracing.Provider
	tls    listenerTLS
}

// New builds Tier 1 from cfg (defaults applied, validated). Scraping starts
// at once; nothing listens until Serve.
func New(ctx context.Context, cfg *Config, opts Options) (*Server, error) {
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	loader.Default(&opts.ShutdownTimeout, 30*time.Second)
	if opts.ExtProc.Logger == nil {
		opts.ExtProc.Logger = opts.Logger
	}
	tp := opts.TracerProvider
	var traces *tracing.Provider
	if tp == nil {
		var err error
		if traces, err = tracing.New(ctx, cfg.Tracing, tracing.Options{ServiceName: "infergate-tier1"}); err != nil {
			return nil, err
		}
		tp = traces
		if cfg.Tracing.Enabled() {
			opts.Logger.Info("tracing on", "exporter", cfg.Tracing.Exporter)
		}
	}
	gw, err := gateway.New(ctx, cfg, gateway.Options{Logger: opts.Logger, ConfigPath: opts.ConfigPath, TracerProvider: tp,
		TLSReloadInterval: opts.TLSReloadInterval})
	if err != nil {
		_ = traces.Shutdown(ctx)
		return nil, err
	}
	lt, err := loadListenerTLS(ctx, cfg, gw.Registry(), opts.Logger, opts.TLSReloadInterval)
	if err != nil {
		gw.Close()
		_ = traces.Shutdown(ctx)
		return nil, err
	}
	s := &Server{cfg: cfg, log: opts.Logger, opts: opts, gw: gw, traces: traces, tls: lt}
	if cfg.Peers.Enabled() {
		if s.node, err = newPeers(ctx, cfg, gw, opts.Logger); err != nil {
			gw.Close()
			return nil, err
		}
		if err := gw.Registry().Register(s.node.Collector()); err != nil {
			gw.Close()
			return nil, fmt.Errorf("peers metrics: %w", err)
		}
		node := s.node
		gw.SetMeshStatus(func() any { return node.Members() }) // the status page's mesh panel
	}
	if len(cfg.Kubernetes.Sources) > 0 {
		pools := make([]string, 0, len(cfg.Pools))
		for _, p := range cfg.Pools {
			pools = append(pools, p.Name)
		}
		d, err := kube.New(cfg.Kubernetes, pools, gw, kube.Options{Logger: opts.Logger})
		if err != nil {
			gw.Close()
			return nil, err
		}
		opts.Logger.Info("kubernetes discovery", "namespace", d.Namespace(), "sources", len(cfg.Kubernetes.Sources))
		go func() {
			if err := d.Run(ctx); err != nil {
				opts.Logger.Error("kubernetes discovery stopped", "err", err)
			}
		}()
	}
	return s, nil
}

// newPeers builds the node that shares the gateway's routing state with
// the cluster's other replicas (docs/tier1-replicas.md): mutual TLS from
// peers.tls (checked now, so a replica the mesh would refuse fails at
// start), the prefix hash key, discovery.
func newPeers(ctx context.Context, cfg *Config, gw *gateway.Gateway, log *slog.Logger) (*peers.Node, error) {
	pc := cfg.Peers
	log = log.With("component", "peers")
	secret, err := pc.ResolveHashKey()
	if err != nil {
		return nil, err
	}
	if secret != nil {
		key, err := prefix.NewKey(secret)
		if err != nil {
			return nil, fmt.Errorf("peers: hash key: %w", err)
		}
		// Before the first request: the index keys what it records and
		// looks up, the node what it streams.
		gw.Tracker().Index().SetKey(key)
	}
	var meshTLS *peers.TLS
	if pc.InsecurePlaintext {
		log.Warn("peers.insecure_plaintext: the replica mesh runs WITHOUT TLS or any authentication; loopback only, never across hosts")
	} else {
		m, err := tlsfiles.NewMetrics(gw.Registry())
		if err != nil {
			return nil, fmt.Errorf("peers: tls metrics: %w", err)
		}
		t := pc.TLS
		meshTLS, err = peers.LoadTLS(ctx, peers.TLSFiles{CertFile: t.CertFile, KeyFile: t.KeyFile, CAFile: t.CAFile,
			ServerName: t.ServerName, MinVersion: t.MinVersion}, tlsfiles.Options{Name: "tier1-peers", Logger: log, Metrics: m})
		if err != nil {
			return nil, fmt.Errorf("peers.tls: %w", err)
		}
	}
	var disc peers.Multi
	if len(pc.Static) > 0 {
		disc = append(disc, peers.Static(pc.Static))
	}
	if pc.DNS != "" {
		disc = append(disc, peers.DNS{Name: pc.DNS, Port: pc.PeerPort()})
	}
	if pc.Consul {
		ctoken, err := cfg.Consul.ResolveToken()
		if err != nil {
			return nil, err
		}
		client, err := api.NewClient(&api.Config{Address: cfg.Consul.Address, Token: ctoken})
		if err != nil {
			return nil, fmt.Errorf("peers: consul client: %w", err)
		}
		disc = append(disc, peers.Consul{Client: client, Cluster: cfg.Cluster, Port: pc.PeerPort()})
	}
	n, err := peers.New(gw.Tracker(), peers.Options{
		TLS: meshTLS, InsecurePlaintext: pc.InsecurePlaintext, Known: gw.HasPod, Discover: disc,
		TTL: pc.TTL, Flush: pc.Flush, Heartbeat: pc.Heartbeat, Refresh: pc.Refresh,
		QueueLen: pc.QueueLen, Logger: log,
	})
	if err != nil {
		return nil, err
	}
	return n, nil
}

// Peers is the state-sharing node, nil when peers are not configured.
func (s *Server) Peers() *peers.Node { return s.node }

// Gateway is the proxy, for callers that need its handler or its picks.
func (s *Server) Gateway() *gateway.Gateway { return s.gw }

// Close stops scraping, releases the gateway and flushes the spans still
// buffered (briefly: a collector that is down must not hold up the exit).
func (s *Server) Close() {
	s.gw.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := s.traces.Shutdown(ctx); err != nil {
		s.log.Warn("tracing: flushing spans failed", "err", err)
	}
}

// Serve serves the OpenAI-compatible proxy on ln and, when extProcLn is not
// nil, the ext_proc endpoint picker on it, until ctx ends; then both drain
// for the shutdown timeout. Listeners are plain TCP: Serve adds TLS where
// the config turns it on (tls, metrics_tls, ext_proc_tls). When the config
// names a Consul agent, the router registers itself for as long as it
// serves and deregisters before draining, so Tier 2 stops sending first.
// One listener failing stops the other: the process goes down whole, not
// half of it.
func (s *Server) Serve(ctx context.Context, ln, extProcLn net.Listener) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()

	var registered sync.WaitGroup
	defer registered.Wait()
	if s.cfg.Consul.Address != "" {
		tcp, _ := ln.Addr().(*net.TCPAddr)
		if tcp == nil {
			return fmt.Errorf("consul registration needs a TCP listener, got %s", ln.Addr())
		}
		reg, client, err := Registration(s.cfg, tcp)
		if err != nil {
			return err
		}
		registered.Add(1)
		go func() {
			defer registered.Done()
			_ = register.Keep(ctx, client, reg, 0, func(err error) {
				s.log.Warn("consul registration failed; retrying", "consul", s.cfg.Consul.Address, "err", err)
			})
		}()
		s.log.Info("registering in consul", "consul", s.cfg.Consul.Address, "service", cluster.ServiceName, "id", reg.ID)
	}

	if s.node != nil {
		pln := s.opts.PeersListener
		if pln == nil {
			var err error
			if pln, err = net.Listen("tcp", s.cfg.Peers.Listen); err != nil {
				return fmt.Errorf("peers listen: %w", err)
			}
		}
		s.log.Info("sharing routing state with peer replicas", "listen", pln.Addr().String(), "id", s.node.ID())
		var shared sync.WaitGroup
		defer func() { cancel(); shared.Wait() }()
		shared.Add(1)
		go func() {
			defer shared.Done()
			_ = s.node.Run(ctx, pln)
		}()
	}

	mln, err := s.metricsListener()
	if err != nil {
		return err
	}
	mln = s.tls.metrics.Wrap(mln)
	metricsDone := make(chan error, 1)
	if mln != nil {
		go func() {
			err := s.gw.ServeMetrics(ctx, mln, s.opts.ShutdownTimeout)
			if err != nil {
				s.log.Error("metrics listener failed", "err", err)
				cancel()
			}
			metricsDone <- err
		}()
	} else {
		metricsDone <- nil
	}

	extProcDone := make(chan error, 1)
	if extProcLn != nil {
		eopts := s.opts.ExtProc
		eopts.TLS = s.tls.extProc.ConfigOrNil()
		srv := extproc.New(s.gw, eopts)
		go func() {
			err := srv.Serve(ctx, extProcLn, s.opts.ShutdownTimeout)
			if err != nil {
				s.log.Error("ext_proc server failed", "err", err)
				cancel()
			}
			extProcDone <- err
		}()
	} else {
		extProcDone <- nil
	}
	err = s.gw.Serve(ctx, s.tls.api.Wrap(ln), s.opts.ShutdownTimeout)
	cancel() // the HTTP listener ended: stop the other listeners too
	if eerr := <-extProcDone; err == nil && eerr != nil {
		err = fmt.Errorf("ext_proc: %w", eerr)
	}
	if merr := <-metricsDone; err == nil && merr != nil {
		err = fmt.Errorf("metrics: %w", merr)
	}
	return err
}

// metricsListener opens the /metrics listener: Options.MetricsListener,
// else the config's metrics_listen ("-": none). The default address is
// best effort, so that several routers on one host (tests, a laptop) all
// start; an address set in the config must be free.
func (s *Server) metricsListener() (net.Listener, error) {
	if s.opts.MetricsListener != nil {
		return s.opts.MetricsListener, nil
	}
	addr := s.cfg.MetricsListen
	if addr == "-" || addr == "" {
		return nil, nil
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		if addr == config.DefaultMetricsListen {
			s.log.Warn("metrics listener not started: default address in use; set metrics_listen", "addr", addr, "err", err)
			return nil, nil
		}
		return nil, fmt.Errorf("metrics listen: %w", err)
	}
	s.log.Info("tier1 metrics listening", "addr", ln.Addr().String())
	return ln, nil
}

// Registration builds the Consul registration for a router configured by
// cfg and listening on addr.
func Registration(cfg *Config, addr *net.TCPAddr) (register.Registration, *api.Client, error) {
	c := cfg.Consul
	token, err := c.ResolveToken()
	if err != nil {
		return register.Registration{}, nil, err
	}
	client, err := api.NewClient(&api.Config{Address: c.Address, Token: token})
	if err != nil {
		return register.Registration{}, nil, fmt.Errorf("consul client: %w", err)
	}
	host := c.ServiceAddress
	if host == "" {
		host = addr.IP.String()
		if addr.IP.IsUnspecified() {
			// Listening on every interface (as in a pod): announce the
			// first non-loopback address, which is what peers can dial.
			host = outboundIP()
		}
	}
	port := c.ServicePort
	if port == 0 {
		port = addr.Port
	}
	scheme := c.Scheme // Validate refused http with tls on
	if scheme == "" {
		scheme = "http"
		if cfg.TLS.Enabled() {
			scheme = "https"
		}
	}
	// One instance per router replica: several replicas of one cluster's
	// Tier 1 must not overwrite each other's registration, also when they
	// share a host (distinct ports).
	id := cluster.ServiceName + "-" + cfg.Cluster
	if hn, err := os.Hostname(); err == nil && hn != "" {
		id += "-" + hn
	}
	id += "-" + strconv.Itoa(port)
	hostPort := net.JoinHostPort(host, strconv.Itoa(port))
	check := fmt.Sprintf("%s://%s/ready", scheme, hostPort)
	var checkTCP string
	if cfg.TLS.RequiresClientCert() {
		// Consul's HTTP check cannot present a client certificate, so
		// against this listener it would always fail. A TCP check still
		// takes a dead process out of Tier 2's list; readiness (ready
		// pods) reaches Tier 2 through the load summaries it polls with
		// its client certificate. Preferred over checking another
		// listener: metrics_listen is loopback by default and would not
		// prove the API port is up.
		check, checkTCP = "", hostPort
	}
	return register.Registration{
		ID:            id,
		Address:       host,
		Port:          port,
		Scheme:        scheme,
		Region:        cfg.Region,
		Cluster:       cfg.Cluster,
		Models:        servedModels(cfg),
		Cost:          c.Cost,
		CostUnit:      c.CostUnit,
		Pricing:       c.Pricing,
		Capacity:      c.Capacity,
		Tags:          c.Tags,
		CheckHTTP:     check,
		CheckTCP:      checkTCP,
		CheckInterval: c.CheckInterval,
		InitialStatus: "passing",

		// Our own certificate is often from a private CA the agent does
		// not trust; the check sends no secret (as a Kubernetes HTTPS
		// probe, it does not verify).
		CheckTLSSkipVerify: check != "" && scheme == "https" && cfg.TLS.Enabled(),
	}, client, nil
}

// servedModels lists every model name the cluster answers for, once.
func servedModels(cfg *Config) []string {
	seen := map[string]bool{}
	var models []string
	add := func(m string) {
		if m != "" && !seen[m] {
			seen[m] = true
			models = append(models, m)
		}
	}
	for _, p := range cfg.Pools {
		add(p.Model)
		for _, a := range p.Adapters {
			add(a)
		}
	}
	for _, m := range cfg.Models {
		add(m.Name)
	}
	return models
}

// outboundIP returns the first non-loopback IPv4 address of this host, or
// 127.0.0.1 when there is none.
func outboundIP() string {
	addrs, err := net.InterfaceAddrs()
	if err == nil {
		for _, a := range addrs {
			if ipn, ok := a.(*net.IPNet); ok && !ipn.IP.IsLoopback() && ipn.IP.To4() != nil {
				return ipn.IP.String()
			}
		}
	}
	return "127.0.0.1"
}

// DefaultListen is the proxy's listen address when the config names none.
const DefaultListen = config.DefaultListen

// DefaultMetricsListen is where /metrics is served when the config names
// no metrics_listen: loopback only.
const DefaultMetricsListen = config.DefaultMetricsListen
