package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"

	"github.com/infergate/infergate/cmd/internal/cli"
	"github.com/infergate/infergate/sim/fleet"
	"github.com/infergate/infergate/sim/profile"
	"github.com/infergate/infergate/sim/server"
)

// stringList is a repeatable string flag.
type stringList []string

func (l *stringList) String() string { return strings.Join(*l, " ") }

func (l *stringList) Set(v string) error {
	// vLLM takes several modules after one flag; accept them
	// space-separated in one value too.
	*l = append(*l, strings.Fields(v)...)
	return nil
}

// podFlags are the flags that describe a single pod; with --fleet they come
// from the file instead.
var podFlags = []string{"port", "model", "served-model-name", "gpu", "engine", "tensor-parallel-size",
	"max-num-seqs", "lora-modules", "max-loras", "max-request-bytes",
	"kv-events-endpoint", "kv-events-replay", "kv-events-topic", "kv-events-legacy"}

func runSim(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("sim", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var (
		port      = fs.Int("port", 8000, "port to listen on (0 picks a free one)")
		host      = fs.String("host", "127.0.0.1", "address to listen on")
		model     = fs.String("model", server.DefaultModel, "model profile: "+strings.Join(profile.ModelNames(), ", "))
		served    = fs.String("served-model-name", "", "model name clients use (default: --model)")
		gpu       = fs.String("gpu", server.DefaultGPU, "GPU profile: "+strings.Join(profile.GPUNames(), ", "))
		engineF   = fs.String("engine", string(server.FlavorVLLM), "metric names to export: vllm, vllm-legacy, sglang, tgi")
		tp        = fs.Int("tensor-parallel-size", 1, "GPUs the model is sharded over")
		maxSeqs   = fs.Int("max-num-seqs", 0, "maximum running requests (0: vLLM's default, 256)")
		maxLoras  = fs.Int("max-loras", 0, "GPU LoRA slots (0: vLLM's default, 1)")
		maxBody   = fs.Int64("max-request-bytes", server.DefaultMaxBodyBytes, "largest request body accepted (larger: 413)")
		timeScale = fs.Float64("time-scale", 1, "real seconds per simulated second (0.1 runs ten times faster)")
		fleetFile = fs.String("fleet", "", "YAML file describing many pods to host in this process")
		logLevel  = fs.String("log-level", "info", "log level: debug, info, warn, error")
		kvEP      = fs.String("kv-events-endpoint", "", "publish KV-cache events over ZeroMQ as vLLM does: bound when the host is * (tcp://*:5557), else dialled (a router that binds); off when empty")
		kvReplay  = fs.String("kv-events-replay", "", "replay (ROUTER) socket for missed KV events, bound (tcp://*:5558); needs --kv-events-endpoint")
		kvTopic   = fs.String("kv-events-topic", "", "topic of every KV-event message ({addr}: the pod's host:port, {model}: its served name; llm-d's is kv@{addr}@{model})")
		kvLegacy  = fs.Bool("kv-events-legacy", false, "send KV events as positional arrays (vLLM before #42892, llm-d-inference-sim's default) instead of tagged maps")
		loras     stringList
	)
	fs.Var(&loras, "lora-modules", "LoRA adapter as name=path or name (repeatable)")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "Usage: infergate-lab sim [flags]\n\nRuns a simulated GPU model server (or, with --fleet, many) speaking the OpenAI API.\n\nFlags:")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q (repeat --lora-modules for each adapter)", fs.Args())
	}
	log, err := cli.NewLogger(stderr, *logLevel, false)
	if err != nil {
		return err
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })

	var cfg fleet.Config
	if *fleetFile != "" {
		for _, name := range podFlags {
			if set[name] {
				return fmt.Errorf("--%s describes a single pod; with --fleet, set it in %s", name, *fleetFile)
			}
		}
		var err error
		if cfg, err = fleet.Load(*fleetFile); err != nil {
			return err
		}
		if set["time-scale"] {
			cfg.TimeScale = *timeScale
		}
		if set["host"] {
			cfg.Host = *host
		}
	} else {
		if *maxBody <= 0 {
			return errors.New("--max-request-bytes must be positive")
		}
		kv := fleet.KVEventsSpec{Endpoint: *kvEP, ReplayEndpoint: *kvReplay, Topic: *kvTopic, Legacy: *kvLegacy}
		if errs := kv.Validate("kv_events"); len(errs) > 0 {
			return fmt.Errorf("--kv-events-endpoint: %w", errors.Join(errs...))
		}
		cfg = fleet.Config{TimeScale: *timeScale, Host: *host, Pods: []fleet.PodSpec{{
			Name:            "sim",
			Port:            *port,
			Model:           *model,
			ServedModelName: *served,
			GPU:             *gpu,
			Engine:          *engineF,
			TP:              *tp,
			MaxNumSeqs:      *maxSeqs,
			LoRAModules:     loras,
			MaxLoras:        *maxLoras,
			MaxRequestBytes: *maxBody,
			KVEvents:        kv,
		}}}
	}
	if cfg.TimeScale <= 0 {
		return fmt.Errorf("--time-scale must be positive, got %v", cfg.TimeScale)
	}
	cfg.Logger = log
	f, err := fleet.Start(ctx, cfg)
	if err != nil {
		return err
	}
	for _, p := range f.Pods {
		c := p.Config()
		fmt.Fprintf(stdout, "pod %s listening on %s (model %s, gpu %s x%d, engine %s)\n",
			p.Spec.Name, p.URL, c.ServedModelName, c.GPU, max(c.TensorParallel, 1), c.Flavor)
	}
	for _, p := range f.Pods {
		kv := p.Config().KVEvents
		if kv.Endpoint == "" {
			continue
		}
		form := "tagged maps"
		if kv.Legacy {
			form = "positional arrays"
		}
		if kv.Connect {
			fmt.Fprintf(stdout, "pod %s publishing KV events to %s (%s)\n", p.Spec.Name, kv.Endpoint, form)
			continue
		}
		replay := ""
		if a := p.KVEventsReplayAddr(); a != "" {
			replay = ", replay on " + a
		}
		fmt.Fprintf(stdout, "pod %s publishing KV events on %s (%s%s)\n", p.Spec.Name, p.KVEventsAddr(), form, replay)
	}
	<-ctx.Done()
	log.Info("shutting down", "pods", len(f.Pods))
	return f.Close()
}
