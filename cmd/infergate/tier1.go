package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/infergate/infergate/shared/config"
	"github.com/infergate/infergate/tier1/extproc"
	"github.com/infergate/infergate/tier1/gateway"
	"github.com/infergate/infergate/tier1/register"
	"github.com/infergate/infergate/tier1/tier1config"
)

func runTier1(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("tier1", flag.ContinueOnError)
	fs.SetOutput(stderr)
	cfgPath := fs.String("config", "", "Tier 1 configuration file (YAML; see docs/tier1.md); reloaded when it changes")
	listen := fs.String("listen", "", "listen address, overriding the config's listen (default "+tier1config.DefaultListen+")")
	logLevel := fs.String("log-level", "info", "log level: debug, info, warn, error")
	extProcListen := fs.String("ext-proc-listen", "", "also serve the endpoint picker to Envoy as a GIE-compatible ext_proc gRPC server on this address (see docs/tier1-extproc.md); empty = off")
	extProcAuthByEnvoy := fs.Bool("ext-proc-auth-by-envoy", false, "ext_proc: Envoy authenticates clients, skip the bearer-token check on requests arriving through ext_proc")
	extProcEndpointList := fs.Bool("ext-proc-endpoint-list", false, "ext_proc: put the fallback endpoints in x-gateway-destination-endpoint itself (ip:port,ip:port; GIE protocol v0.4+) instead of separate metadata")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "Usage: infergate tier1 --config FILE [--listen ADDR] [--ext-proc-listen ADDR]")
		fmt.Fprintln(stderr)
		fmt.Fprintln(stderr, "Run the per-cluster GPU-aware router: an OpenAI-compatible proxy that picks")
		fmt.Fprintln(stderr, "the best model-server pod for each request from scraped metrics.")
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
	log, err := newLogger(stderr, *logLevel, true)
	if err != nil {
		return err
	}

	var cfg tier1config.Config
	if err := config.Load(*cfgPath, &cfg); err != nil {
		return err
	}
	addr := cfg.Listen
	if *listen != "" {
		addr = *listen
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	gw, err := gateway.New(ctx, &cfg, gateway.Options{Logger: log, ConfigPath: *cfgPath})
	if err != nil {
		return err
	}
	defer gw.Close()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	log.Info("tier1 listening", "addr", ln.Addr().String(), "pools", len(cfg.Pools), "pods", len(cfg.Pods),
		"auth", !cfg.Auth.Disabled, "config", *cfgPath)
	fmt.Fprintf(stdout, "infergate tier1 listening on %s\n", ln.Addr())

	var registered sync.WaitGroup
	if cfg.Consul.Address != "" {
		reg, client, err := tier1Registration(&cfg, ln.Addr().(*net.TCPAddr))
		if err != nil {
			ln.Close()
			return err
		}
		registered.Add(1)
		go func() {
			defer registered.Done()
			// Keep deregisters when ctx ends, so Tier 2 stops sending
			// before the listener drains.
			_ = register.Keep(ctx, client, reg, 0, func(err error) {
				log.Warn("consul registration failed; retrying", "consul", cfg.Consul.Address, "err", err)
			})
		}()
		log.Info("registering in consul", "consul", cfg.Consul.Address, "service", register.ServiceName, "id", reg.ID)
	}
	extProcDone := make(chan error, 1)
	if *extProcListen != "" {
		epl, err := net.Listen("tcp", *extProcListen)
		if err != nil {
			ln.Close()
			cancel()
			registered.Wait()
			return fmt.Errorf("ext_proc listen: %w", err)
		}
		srv := extproc.New(gw, extproc.Options{Logger: log, AuthByEnvoy: *extProcAuthByEnvoy, EndpointList: *extProcEndpointList})
		log.Info("tier1 ext_proc listening", "addr", epl.Addr().String(), "auth_by_envoy", *extProcAuthByEnvoy)
		fmt.Fprintf(stdout, "infergate tier1 ext_proc listening on %s\n", epl.Addr())
		go func() {
			err := srv.Serve(ctx, epl, 30*time.Second)
			if err != nil {
				// One listener failing takes the process down, not half of it.
				log.Error("ext_proc server failed", "err", err)
				cancel()
			}
			extProcDone <- err
		}()
	} else {
		extProcDone <- nil
	}
	err = gw.Serve(ctx, ln, 30*time.Second)
	cancel() // the HTTP listener ended: stop the ext_proc server too
	if eerr := <-extProcDone; err == nil && eerr != nil {
		err = fmt.Errorf("ext_proc: %w", eerr)
	}
	registered.Wait()
	return err
}

// tier1Registration builds the Consul registration for this router from its
// configuration and the address it listens on.
func tier1Registration(cfg *tier1config.Config, addr *net.TCPAddr) (register.Registration, *api.Client, error) {
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
	scheme := c.Scheme
	if scheme == "" {
		scheme = "http"
	}
	seen := map[string]bool{}
	var models []string
	addModel := func(m string) {
		if m != "" && !seen[m] {
			seen[m] = true
			models = append(models, m)
		}
	}
	for _, p := range cfg.Pools {
		addModel(p.Model)
		for _, a := range p.Adapters {
			addModel(a)
		}
	}
	for _, m := range cfg.Models {
		addModel(m.Name)
	}
	// One instance per router replica: several replicas of one cluster's
	// Tier 1 must not overwrite each other's registration.
	id := "infergate-tier1-" + cfg.Cluster
	if hn, err := os.Hostname(); err == nil && hn != "" {
		id += "-" + hn
	}
	return register.Registration{
		ID:            id,
		Address:       host,
		Port:          port,
		Scheme:        scheme,
		Region:        cfg.Region,
		Cluster:       cfg.Cluster,
		Models:        models,
		Cost:          c.Cost,
		CostUnit:      c.CostUnit,
		Pricing:       c.Pricing,
		Capacity:      c.Capacity,
		Tags:          c.Tags,
		CheckHTTP:     fmt.Sprintf("%s://%s/ready", scheme, net.JoinHostPort(host, strconv.Itoa(port))),
		CheckInterval: c.CheckInterval,
		InitialStatus: "passing",
	}, client, nil
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
