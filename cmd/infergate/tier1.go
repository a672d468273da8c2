package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"

	"github.com/infergate/infergate/cmd/internal/cli"
	"github.com/infergate/infergate/tier1/extproc"
	"github.com/infergate/infergate/tier1/server"
)

func runTier1(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("tier1", flag.ContinueOnError)
	fs.SetOutput(stderr)
	cfgPath := fs.String("config", "", "Tier 1 configuration file (YAML; see docs/tier1.md); reloaded when it changes")
	listen := fs.String("listen", "", "listen address, overriding the config's listen (default "+server.DefaultListen+")")
	metricsListen := fs.String("metrics-listen", "", "/metrics listen address, overriding the config's metrics_listen (default "+server.DefaultMetricsListen+"; - = off)")
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
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if *cfgPath == "" {
		fs.Usage()
		return errors.New("--config is required")
	}
	log, err := cli.NewLogger(stderr, *logLevel, true)
	if err != nil {
		return err
	}

	var cfg server.Config
	if err := loadConfig(*cfgPath, &cfg); err != nil {
		return err
	}
	addr := cfg.Listen
	if *listen != "" {
		addr = *listen
	}
	if *metricsListen != "" {
		cfg.MetricsListen = *metricsListen
	}
	srv, err := server.New(ctx, &cfg, server.Options{
		Logger:     log,
		ConfigPath: *cfgPath,
		ExtProc:    extproc.Options{Logger: log, AuthByEnvoy: *extProcAuthByEnvoy, EndpointList: *extProcEndpointList},
	})
	if err != nil {
		return err
	}
	defer srv.Close()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	log.Info("tier1 listening", "addr", ln.Addr().String(), "pools", len(cfg.Pools), "pods", len(cfg.Pods),
		"auth", !cfg.Auth.Disabled, "config", *cfgPath)
	fmt.Fprintf(stdout, "infergate tier1 listening on %s\n", ln.Addr())
	var epl net.Listener
	if *extProcListen != "" {
		if epl, err = net.Listen("tcp", *extProcListen); err != nil {
			ln.Close()
			return fmt.Errorf("ext_proc listen: %w", err)
		}
		log.Info("tier1 ext_proc listening", "addr", epl.Addr().String(), "auth_by_envoy", *extProcAuthByEnvoy)
		fmt.Fprintf(stdout, "infergate tier1 ext_proc listening on %s\n", epl.Addr())
	}
	return srv.Serve(ctx, ln, epl)
}
