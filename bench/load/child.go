package load

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"runtime"
	"runtime/pprof"
	"strconv"
	"strings"

	"github.com/infergate/infergate/shared/config"
	"github.com/infergate/infergate/tier1/server"
	tier2server "github.com/infergate/infergate/tier2/server"
)

// The benchmark runs three processes so that Tier 1's CPU time and memory
// can be read apart from the rest: this one (the load generator), a child
// holding the fake pods and a child running Tier 1. Both children are
// re-executions of the benchmark's own binary with ChildEnv set; the
// binary must call RunChild early when it is (see IsChild).
//
// Protocol: the child prints one line when it is ready ("pods ADDR,ADDR,…"
// or "tier1 ADDR") and then reads commands from stdin, one per line
// ("profile-start FILE", "profile-stop": a CPU profile in FILE, lock
// contention in FILE.mutex, allocations since start in FILE.allocs;
// answered "ok" or "err …";
// "records-dropped", answered "ok N": Tier 1's prefix-index records
// dropped so far, 0 from the pods child).
// It exits when stdin closes, so it never outlives the benchmark.

// The CPU comparison (RunCompare) adds two roles: "bare" (BareProxy in
// front of the pods, answering "bare ADDR") and "tier2" (Tier 2 built
// through tier2/server as `infergate tier2` builds it, "tier2 ADDR"), the
// latter for profiling only: measured runs start the real binary.

// ChildEnv selects the child role ("pods", "tier1", "bare" or "tier2") of
// a re-executed benchmark binary.
const ChildEnv = "INFERGATE_LOADBENCH_CHILD"

const (
	childPodsEnv   = "INFERGATE_LOADBENCH_PODS"   // pods: how many
	childConfigEnv = "INFERGATE_LOADBENCH_CONFIG" // tier1, tier2: config file
	childAddrsEnv  = "INFERGATE_LOADBENCH_ADDRS"  // bare: the pods, comma-separated
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
		if _, err := fmt.Fprintf(stdout, "pods %s\n", strings.Join(pods.Addrs, ",")); err != nil {
			return fmt.Errorf("tell the parent its address: %w", err)
		}
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
		if _, err := fmt.Fprintf(stdout, "tier1 %s\n", ln.Addr()); err != nil {
			return fmt.Errorf("tell the parent its address: %w", err)
		}
		cerr := serveCommands(ctx, stdin, stdout, srv.Gateway().Tracker().RecordsDropped)
		cancel()
		if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
			return err
		}
		return cerr
	case "bare":
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return fmt.Errorf("bare child: listen: %w", err)
		}
		srv := benchServer(BareProxy(strings.Split(os.Getenv(childAddrsEnv), ",")))
		done := make(chan error, 1)
		go func() { done <- srv.Serve(ln) }()
		if _, err := fmt.Fprintf(stdout, "bare %s\n", ln.Addr()); err != nil {
			return fmt.Errorf("tell the parent its address: %w", err)
		}
		cerr := serveCommands(ctx, stdin, stdout, func() uint64 { return 0 })
		if err := srv.Close(); err != nil {
			return err
		}
		if err := <-done; err != nil && !errors.Is(err, http.ErrServerClosed) {
			return err
		}
		return cerr
	case "tier2":
		var cfg tier2server.Config
		if err := config.Load(os.Getenv(childConfigEnv), &cfg); err != nil {
			return fmt.Errorf("tier2 child: %w", err)
		}
		log := slog.New(slog.NewJSONHandler(stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
		srv, err := tier2server.New(ctx, cfg, tier2server.Options{Logger: log})
		if err != nil {
			return fmt.Errorf("tier2 child: %w", err)
		}
		defer func() { _ = srv.Close() }() // the child is exiting; its answers are already measured
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return fmt.Errorf("tier2 child: listen: %w", err)
		}
		done := make(chan error, 1)
		go func() { done <- srv.Serve(ctx, ln, nil) }()
		if _, err := fmt.Fprintf(stdout, "tier2 %s\n", ln.Addr()); err != nil {
			return fmt.Errorf("tell the parent its address: %w", err)
		}
		cerr := serveCommands(ctx, stdin, stdout, func() uint64 { return 0 })
		cancel()
		if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
			return err
		}
		return cerr
	default:
		return fmt.Errorf("%s=%q: want pods, tier1, bare or tier2", ChildEnv, role)
	}
}

// serveCommands answers the parent's commands until stdin closes.
func serveCommands(ctx context.Context, stdin io.Reader, stdout io.Writer, dropped func() uint64) error {
	var prof *os.File
	var mutexPath string
	defer func() {
		if prof != nil {
			pprof.StopCPUProfile()
			_ = prof.Close() // stdin closed mid-profile: nobody is left to read the profile or the error
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
			if _, err := fmt.Fprintf(stdout, "ok %d\n", dropped()); err != nil {
				return fmt.Errorf("answer the parent: %w", err)
			}
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
				_ = prof.Close() // the profile never started; err says why
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
			if herr := writeProfile("allocs", strings.TrimSuffix(mutexPath, ".mutex")+".allocs"); err == nil {
				err = herr
			}
		default:
			err = fmt.Errorf("unknown command %q", cmd)
		}
		answer := "ok"
		if err != nil {
			answer = "err " + err.Error()
		}
		if _, err := fmt.Fprintln(stdout, answer); err != nil {
			return fmt.Errorf("answer the parent: %w", err)
		}
	}
}

// writeProfile writes the named runtime/pprof profile to path (allocs:
// every allocation sampled since the process started).
func writeProfile(name, path string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := pprof.Lookup(name).WriteTo(f, 0); err != nil {
		_ = f.Close() // the write failed; its error is the one to report
		return err
	}
	return f.Close()
}

// writeMutexProfile writes the contention sampled since profiling started
// and stops sampling.
func writeMutexProfile(path string) error {
	defer runtime.SetMutexProfileFraction(0)
	return writeProfile("mutex", path)
}
