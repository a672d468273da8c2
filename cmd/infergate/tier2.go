package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/infergate/infergate/cmd/internal/cli"
	"github.com/infergate/infergate/tier2/server"
)

// runTier2 is `infergate tier2`: flags, logging and listeners around
// tier2/server, which does the wiring.
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
	if *listen != "" {
		cfg.Listen = *listen
	}

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	srv, err := server.New(ctx, cfg, server.Options{Logger: log, Registry: reg})
	if err != nil {
		return err
	}
	defer func() {
		if err := srv.Close(); err != nil {
			log.Warn("tier2 close", "err", err)
		}
	}()

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
	metricsLn, err := net.Listen("tcp", cfg.Metrics.Listen)
	if err != nil {
		ln.Close()
		if adminLn != nil {
			adminLn.Close()
		}
		return fmt.Errorf("metrics listen: %w", err)
	}
	fmt.Fprintf(stdout, "infergate tier2 listening on %s\n", ln.Addr())
	return srv.ServeListeners(ctx, server.Listeners{API: ln, Admin: adminLn, Metrics: metricsLn})
}
