package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"time"

	"github.com/infergate/infergate/shared/config"
	"github.com/infergate/infergate/tier1/gateway"
	"github.com/infergate/infergate/tier1/tier1config"
)

func runTier1(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("tier1", flag.ContinueOnError)
	fs.SetOutput(stderr)
	cfgPath := fs.String("config", "", "Tier 1 configuration file (YAML; see docs/tier1.md); reloaded when it changes")
	listen := fs.String("listen", "", "listen address, overriding the config's listen (default "+tier1config.DefaultListen+")")
	logLevel := fs.String("log-level", "info", "log level: debug, info, warn, error")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "Usage: infergate tier1 --config FILE [--listen ADDR]")
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
	var level slog.Level
	if err := level.UnmarshalText([]byte(*logLevel)); err != nil {
		return fmt.Errorf("--log-level: %w", err)
	}
	log := slog.New(slog.NewJSONHandler(stderr, &slog.HandlerOptions{Level: level}))

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
	return gw.Serve(ctx, ln, 30*time.Second)
}
