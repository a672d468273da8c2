package load

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"runtime"
	"runtime/pprof"
	"strconv"
	"strings"

	"github.com/infergate/infergate/shared/config"
	"github.com/infergate/infergate/tier1/server"
)

// The benchmark runs three processes so that Tier 1's CPU time and memory
// can be read apart from the rest: this one (the load generator), a child
// holding the fake pods and a child running Tier 1. Both children are
// re-executions of the benchmark's own binary with ChildEnv set; the
// binary must call RunChild early when it is (see IsChild).
//
// Protocol: the child prints one line when it is ready ("pods ADDR,ADDR,…"
// or "tier1 ADDR") and then reads commands from stdin, one per line
// ("profile-start FILE", "profile-stop", answered "ok" or "err …";
// "records-dropped", answered "ok N": Tier 1's prefix-index records
// dropped so far, 0 from the pods child).
// It exits when stdin closes, so it never outlives the benchmark.

// ChildEnv selects the child role ("pods" or "tier1") of a re-executed
// benchmark binary.
const ChildEnv = "INFERGATE_LOADBENCH_CHILD"

const (
	childPodsEnv   = "INFERGATE_LOADBENCH_PODS"   // pods: how many
	childConfigEnv = "INFERGATE_LOADBENCH_CONFIG" // tier1: config file
)

// IsChild reports whether this process is a benchmark child.
func IsChild() bool { return os.Getenv(ChildEnv) != "" }

// RunChild runs this process's child role until stdin closes or ctx ends.
func RunChild(ctx context.Context, stdin io.Reader, stdout, stderr io.Writer) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	switch role := os.Getenv(ChildEnv); role {
	case "pods":
		n, err := strconv.Atoi(os.Getenv(childPodsEnv))
		if err != nil {
			return fmt.Errorf("pods child: %s: %w", childPodsEnv, err)
		}
		pods, err := StartPods(n)
		if err != nil {
			return err
		}
		defer pods.Close()
		fmt.Fprintf(stdout, "pods %s\n", strings.Join(pods.Addrs, ","))
		return serveCommands(ctx, stdin, stdout, func() uint64 { return 0 })
	case "tier1":
		var cfg server.Config
		if err := config.Load(os.Getenv(childConfigEnv), &cfg); err != nil {
			return fmt.Errorf("tier1 child: %w", err)
		}
		log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
		srv, err := server.New(ctx, &cfg, server.Options{Logger: log})
		if err != nil {
			return fmt.Errorf("tier1 child: %w", err)
		}
		defer srv.Close()
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return fmt.Errorf("tier1 child: listen: %w", err)
		}
		done := make(chan error, 1)
		go func() { done <- srv.Serve(ctx, ln, nil) }()
		fmt.Fprintf(stdout, "tier1 %s\n", ln.Addr())
		cerr := serveCommands(ctx, stdin, stdout, srv.Gateway().Tracker().RecordsDropped)
		cancel()
		if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
			return err
		}
		return cerr
	default:
		return fmt.Errorf("%s=%q: want pods or tier1", ChildEnv, role)
	}
}

// serveCommands answers the parent's commands until stdin closes.
func serveCommands(ctx context.Context, stdin io.Reader, stdout io.Writer, dropped func() uint64) error {
	var prof *os.File
	var mutexPath string
	defer func() {
		if prof != nil {
			pprof.StopCPUProfile()
			prof.Close()
		}
	}()
	lines := make(chan string)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(stdin)
		for sc.Scan() {
			lines <- sc.Text()
		}
	}()
	for {
		var line string
		var ok bool
		select {
		case <-ctx.Done():
			return nil
		case line, ok = <-lines:
			if !ok {
				return nil
			}
		}
		cmd, arg, _ := strings.Cut(line, " ")
		var err error
		switch cmd {
		case "records-dropped":
			fmt.Fprintf(stdout, "ok %d\n", dropped())
			continue
		case "profile-start":
			if prof != nil {
				err = errors.New("profile already running")
				break
			}
			if prof, err = os.Create(arg); err != nil {
				break
			}
			if err = pprof.StartCPUProfile(prof); err != nil {
				prof.Close()
				prof = nil
				break
			}
			// Lock contention does not show in a CPU profile: sample
			// it alongside (one event in 10), written at stop.
			mutexPath = arg + ".mutex"
			runtime.SetMutexProfileFraction(10)
		case "profile-stop":
			if prof == nil {
				err = errors.New("no profile running")
				break
			}
			pprof.StopCPUProfile()
			err = prof.Close()
			prof = nil
			if merr := writeMutexProfile(mutexPath); err == nil {
				err = merr
			}
		default:
			err = fmt.Errorf("unknown command %q", cmd)
		}
		if err != nil {
			fmt.Fprintf(stdout, "err %v\n", err)
		} else {
			fmt.Fprintln(stdout, "ok")
		}
	}
}

// writeMutexProfile writes the contention sampled since profiling started
// and stops sampling.
func writeMutexProfile(path string) error {
	defer runtime.SetMutexProfileFraction(0)
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := pprof.Lookup("mutex").WriteTo(f, 0); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
