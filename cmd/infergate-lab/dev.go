package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/infergate/infergate/cmd/internal/cli"
	"github.com/infergate/infergate/devstack"
	"github.com/infergate/infergate/shared/tracing"
)

// portBaseEnv sets --port-base's default, so that `INFERGATE_DEV_PORT_BASE=18000
// make run` works as `make run PORT_BASE=18000` does.
const portBaseEnv = "INFERGATE_DEV_PORT_BASE"

// devPorts lays the stack out from one base port (docs/local-stack.md):
// Tier 2's API on base, its admin API and status page on base+1, its
// /metrics on base+2, then cluster i's Tier 1 API on base+10+2i and its
// metrics listener (/metrics and the status page) on base+11+2i. Base 0
// puts everything on free ports.
type devPorts struct{ base int }

func (p devPorts) port(offset int) int {
	if p.base == 0 {
		return 0
	}
	return p.base + offset
}

func (p devPorts) addr(offset int) string {
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(p.port(offset)))
}

func (p devPorts) tier1(i int) (api, metrics string) { return p.addr(10 + 2*i), p.addr(11 + 2*i) }

func runDev(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("dev", flag.ContinueOnError)
	fs.SetOutput(stderr)
	defBase := 8080
	if v := os.Getenv(portBaseEnv); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 || n > 65535-20 {
			return fmt.Errorf("%s=%q: want a port from 0 to %d", portBaseEnv, v, 65535-20)
		}
		defBase = n
	}
	portBase := fs.Int("port-base", defBase, "first of the stack's ports on 127.0.0.1: Tier 2 API on it, admin +1, Tier 2 metrics +2, cluster i's Tier 1 API +10+2i and metrics +11+2i; 0 picks free ports (default from $"+portBaseEnv+")")
	port := fs.Int("port", -1, "Tier 2 (OpenAI API) port, overriding --port-base's; 0 picks a free one")
	adminPort := fs.Int("admin-port", -1, "admin API and Tier 2 status page port, overriding --port-base's; 0 picks a free one")
	timeScale := fs.Float64("time-scale", 1, "real seconds per simulated second (0.1 runs the simulated GPUs ten times faster)")
	apiKey := fs.String("api-key", "", "API key of the dev tenant (default: generated)")
	adminToken := fs.String("admin-token", "", "admin API token (default: generated)")
	logLevel := fs.String("log-level", "warn", "log level: debug, info, warn, error")
	traceConsole := fs.Bool("trace-console", false, "print every request's OpenTelemetry spans (both tiers) to stdout as JSON (docs/tracing.md)")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "Usage: infergate-lab dev [flags]")
		fmt.Fprintln(stderr)
		fmt.Fprintln(stderr, "Run the all-in-one local stack in one process: simulated GPU pods in two")
		fmt.Fprintln(stderr, "regions of two clusters each, a Tier 1 router per cluster, and a Tier 2")
		fmt.Fprintln(stderr, "front door with its admin API, all in memory. It prints every URL (APIs,")
		fmt.Fprintln(stderr, "status pages, metrics) with the credentials they need. Ctrl-C stops it.")
		fmt.Fprintln(stderr)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if *portBase < 0 || *portBase > 65535-20 {
		return fmt.Errorf("--port-base %d: want a port from 0 to %d", *portBase, 65535-20)
	}
	if *timeScale <= 0 {
		return fmt.Errorf("--time-scale must be positive, got %v", *timeScale)
	}
	ports := devPorts{base: *portBase}
	listen, adminListen := ports.addr(0), ports.addr(1)
	if *port >= 0 {
		listen = net.JoinHostPort("127.0.0.1", strconv.Itoa(*port))
	}
	if *adminPort >= 0 {
		adminListen = net.JoinHostPort("127.0.0.1", strconv.Itoa(*adminPort))
	}
	base, err := cli.NewLogger(stderr, *logLevel, false)
	if err != nil {
		return err
	}
	hold := newHoldHandler(base.Handler())
	log := slog.New(hold)

	tcfg := tracing.Config{}
	if *traceConsole {
		tcfg.Exporter = tracing.ExporterConsole
	}
	tp, err := tracing.New(ctx, tcfg, tracing.Options{ServiceName: "infergate-dev", Console: stdout})
	if err != nil {
		return err
	}
	// After the stack has stopped: its last spans are flushed.
	defer func() { _ = tp.Shutdown(context.WithoutCancel(ctx)) }()

	start := time.Now()
	st, err := devstack.Start(ctx, devstack.Options{
		Listen: listen, AdminListen: adminListen, MetricsListen: ports.addr(2), Tier1Listen: ports.tier1,
		TimeScale: *timeScale, APIKey: *apiKey, AdminToken: *adminToken, Logger: log,
		TracerProvider: tp,
	})
	if err != nil {
		hold.release(ctx, true) // what the components said may be why
		return err
	}
	held := hold.release(ctx, false)
	printDevBanner(stdout, st, time.Since(start), summary(held, slog.LevelWarn))
	err = st.Wait(ctx)
	fmt.Fprintln(stdout, "infergate-lab dev: stopping")
	if cerr := st.Close(); err == nil {
		err = cerr
	}
	return err
}

// printDevBanner tells the developer what runs and how to reach it: every
// URL opens as printed (the status pages take their token from the URL
// fragment, which the browser keeps to itself), and the export lines can
// be pasted into a shell as they are. warnings are the start's held
// warning lines.
func printDevBanner(w io.Writer, st *devstack.Stack, took time.Duration, warnings []string) {
	var b strings.Builder
	fmt.Fprintf(&b, "infergate-lab dev: local stack up in %s (simulated GPUs, time scale %g)\n\n", took.Round(time.Millisecond), st.TimeScale)
	fmt.Fprintf(&b, "Tier 2 (region %s; API key %s, admin token %s)\n", devstack.HomeRegion, st.APIKey, st.AdminToken)
	fmt.Fprintf(&b, "  OpenAI API    %s\n", st.BaseURL)
	fmt.Fprintf(&b, "  admin API     %s/admin/v1/  (described at %s/openapi.json)\n", st.AdminURL, st.AdminURL)
	fmt.Fprintf(&b, "  status page   %s/status#token=%s\n", st.AdminURL, st.AdminToken)
	fmt.Fprintf(&b, "  metrics       %s\n", st.MetricsURL)
	fmt.Fprintf(&b, "\nTier 1 routers (token %s)\n", st.Tier1Token)
	for _, c := range st.Clusters {
		fmt.Fprintf(&b, "  %s/%s  cost %.2f/gpu-hour (%s)  models: %s\n",
			c.Region, c.Name, c.Cost, c.Pricing, strings.Join(c.Models(), ", "))
		fmt.Fprintf(&b, "    API         %s/v1\n", c.URL)
		fmt.Fprintf(&b, "    status page %s/status#token=%s\n", c.MetricsURL, st.Tier1Token)
		fmt.Fprintf(&b, "    metrics     %s/metrics\n", c.MetricsURL)
		for _, p := range c.Pods {
			fmt.Fprintf(&b, "    pod         %s\n", p)
		}
	}
	if len(warnings) > 0 {
		fmt.Fprintf(&b, "\nWarnings at start (%d; each is in docs/troubleshooting.md):\n", len(warnings))
		for _, l := range warnings {
			fmt.Fprintf(&b, "  %s\n", l)
		}
	}
	fmt.Fprintln(&b)
	fmt.Fprintln(&b, "Paste into a shell:")
	fmt.Fprintln(&b)
	fmt.Fprintf(&b, "export OPENAI_BASE_URL=%s\n", st.BaseURL)
	fmt.Fprintf(&b, "export OPENAI_API_KEY=%s\n", st.APIKey)
	fmt.Fprintf(&b, "export INFERGATE_ADMIN_URL=%s\n", st.AdminURL)
	fmt.Fprintf(&b, "export INFERGATE_ADMIN_TOKEN=%s\n", st.AdminToken)
	fmt.Fprintf(&b, "export INFERGATE_TIER1_TOKEN=%s\n", st.Tier1Token)
	fmt.Fprintln(&b)
	fmt.Fprintln(&b, "Try:")
	fmt.Fprintln(&b)
	fmt.Fprintln(&b, `curl -sS "$OPENAI_BASE_URL/chat/completions" -H "Authorization: Bearer $OPENAI_API_KEY" \`)
	fmt.Fprintf(&b, "  -H 'Content-Type: application/json' -d '{\"model\":%q,\"messages\":[{\"role\":\"user\",\"content\":\"Hello!\"}],\"max_tokens\":32}' -i\n", devstack.LlamaModel)
	fmt.Fprintln(&b, `curl -sS "$INFERGATE_ADMIN_URL/admin/v1/clusters" -H "Authorization: Bearer $INFERGATE_ADMIN_TOKEN"`)
	fmt.Fprintln(&b)
	fmt.Fprintln(&b, "Ctrl-C stops everything.")
	_, _ = io.WriteString(w, b.String())
}
