package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/infergate/infergate/cmd/internal/cli"
	"github.com/infergate/infergate/devstack"
	"github.com/infergate/infergate/shared/tracing"
)

func runDev(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("dev", flag.ContinueOnError)
	fs.SetOutput(stderr)
	port := fs.Int("port", 8080, "Tier 2 (OpenAI API) port on 127.0.0.1; 0 picks a free one")
	adminPort := fs.Int("admin-port", 8081, "admin API port on 127.0.0.1; 0 picks a free one")
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
		fmt.Fprintln(stderr, "front door with its admin API, all in memory. Ctrl-C stops it.")
		fmt.Fprintln(stderr)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if *timeScale <= 0 {
		return fmt.Errorf("--time-scale must be positive, got %v", *timeScale)
	}
	log, err := cli.NewLogger(stderr, *logLevel, false)
	if err != nil {
		return err
	}

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
		Listen:      net.JoinHostPort("127.0.0.1", strconv.Itoa(*port)),
		AdminListen: net.JoinHostPort("127.0.0.1", strconv.Itoa(*adminPort)),
		TimeScale:   *timeScale, APIKey: *apiKey, AdminToken: *adminToken, Logger: log,
		TracerProvider: tp,
	})
	if err != nil {
		return err
	}
	printDevBanner(stdout, st, time.Since(start))
	err = st.Wait(ctx)
	fmt.Fprintln(stdout, "infergate-lab dev: stopping")
	if cerr := st.Close(); err == nil {
		err = cerr
	}
	return err
}

// printDevBanner tells the developer what runs and how to reach it; the
// export lines can be pasted into a shell as they are.
func printDevBanner(w io.Writer, st *devstack.Stack, took time.Duration) {
	var b strings.Builder
	fmt.Fprintf(&b, "infergate-lab dev: local stack up in %s (simulated GPUs, time scale %g)\n\n", took.Round(time.Millisecond), st.TimeScale)
	for _, c := range st.Clusters {
		fmt.Fprintf(&b, "  %s/%s  tier1 %s  cost %.2f/gpu-hour (%s)  models: %s\n",
			c.Region, c.Name, c.URL, c.Cost, c.Pricing, strings.Join(c.Models(), ", "))
		for _, p := range c.Pods {
			fmt.Fprintf(&b, "      pod %s\n", p)
		}
	}
	fmt.Fprintf(&b, "\n  tier2 (OpenAI API)  http://%s   admin API  %s\n\n", st.Addr, st.AdminURL)
	fmt.Fprintln(&b, "Paste into a shell:")
	fmt.Fprintln(&b)
	fmt.Fprintf(&b, "export OPENAI_BASE_URL=%s\n", st.BaseURL)
	fmt.Fprintf(&b, "export OPENAI_API_KEY=%s\n", st.APIKey)
	fmt.Fprintf(&b, "export INFERGATE_ADMIN_URL=%s\n", st.AdminURL)
	fmt.Fprintf(&b, "export INFERGATE_ADMIN_TOKEN=%s\n", st.AdminToken)
	fmt.Fprintln(&b)
	fmt.Fprintln(&b, "Try:")
	fmt.Fprintln(&b)
	fmt.Fprintln(&b, `curl -sS "$OPENAI_BASE_URL/chat/completions" -H "Authorization: Bearer $OPENAI_API_KEY" \`)
	fmt.Fprintf(&b, "  -H 'Content-Type: application/json' -d '{\"model\":%q,\"messages\":[{\"role\":\"user\",\"content\":\"Hello!\"}],\"max_tokens\":32}' -i\n", devstack.LlamaModel)
	fmt.Fprintln(&b, `curl -sS "$INFERGATE_ADMIN_URL/admin/v1/tenants/`+devstack.TenantID+`/usage" -H "Authorization: Bearer $INFERGATE_ADMIN_TOKEN"`)
	fmt.Fprintln(&b)
	fmt.Fprintln(&b, "Ctrl-C stops everything.")
	_, _ = io.WriteString(w, b.String())
}
