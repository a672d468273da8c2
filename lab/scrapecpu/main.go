// Command scrapecpu measures what Tier 1's scraping costs in CPU: one
// process serves a real-sized metrics page as N fake pods on real sockets,
// and either an in-process scrape.Scraper or a whole `infergate tier1`
// process scrapes them while its own CPU time is read over a window.
//
//	scrapecpu serve -pods 100 > /tmp/addrs.txt &             # pods with no requests
//	scrapecpu serve -pods 100 -busy > /tmp/busy.txt &        # pods running requests
//	scrapecpu scrape -addrs /tmp/addrs.txt                   # no traffic: the idle schedule
//	scrapecpu scrape -addrs /tmp/addrs.txt -active           # requests in flight everywhere
//	scrapecpu tier1 -bin /tmp/infergate -addrs /tmp/addrs.txt   # the whole router, no traffic
//	scrapecpu tier1 -bin /tmp/infergate -addrs /tmp/busy.txt    # the whole router, busy pods
//
// It is a lab tool (docs/performance.md, "Scraping"): it reports figures
// and asserts nothing.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"maps"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"regexp"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/infergate/infergate/shared/clock"
	"github.com/infergate/infergate/tier1/scrape"
)

func main() {
	if len(os.Args) < 2 {
		log.Fatal("usage: scrapecpu serve|scrape|tier1 [flags]")
	}
	var err error
	switch os.Args[1] {
	case "serve":
		err = serve(os.Args[2:])
	case "scrape":
		err = scrapeCmd(os.Args[2:])
	case "tier1":
		err = tier1Cmd(os.Args[2:])
	default:
		err = fmt.Errorf("unknown mode %q", os.Args[1])
	}
	if err != nil {
		log.Fatal(err)
	}
}

// serve runs the fake pods: /metrics answers with the page (chunked, as
// net/http writes it, or with a Content-Length, as vLLM's server does) and
// /v1/models with one model. It prints one host:port per line.
func serve(args []string) error {
	fs := flag.NewFlagSet("serve", flag.ExitOnError)
	pods := fs.Int("pods", 100, "fake pods to serve")
	pagePath := fs.String("page", "tier1/scrape/testdata/vllm_metrics.txt", "metrics page to serve")
	length := fs.Bool("content-length", false, "send a Content-Length rather than a chunked body")
	busy := fs.Bool("busy", false, "keep the page's running and waiting requests (the fixture's 7 and 3); "+
		"without it they are 0, a pod with no traffic")
	_ = fs.Parse(args)
	page, err := os.ReadFile(*pagePath)
	if err != nil {
		return err
	}
	if !*busy {
		page = regexp.MustCompile(`(?m)^(vllm:num_requests_(running|waiting)\{[^}]*\}) .*$`).ReplaceAll(page, []byte("${1} 0.0"))
	}
	var hits atomic.Int64
	mux := http.NewServeMux()
	mux.HandleFunc("/metrics", func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
		if *length {
			w.Header().Set("Content-Length", strconv.Itoa(len(page)))
		}
		_, _ = w.Write(page) // a failed write is the scraper's error to see
	})
	mux.HandleFunc("/v1/models", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"object":"list","data":[{"id":"meta-llama/Llama-3.1-8B-Instruct","root":"meta-llama/Llama-3.1-8B-Instruct"}]}`))
	})
	for range *pods {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return err
		}
		srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second, IdleTimeout: 2 * time.Minute}
		go func() { _ = srv.Serve(ln) }() // runs until the process ends
		fmt.Println(ln.Addr().String())
	}
	if err := os.Stdout.Sync(); err != nil && !errors.Is(err, syscall.EINVAL) {
		return err
	}
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, os.Interrupt, syscall.SIGTERM)
	<-ch
	fmt.Fprintf(os.Stderr, "served %d /metrics requests\n", hits.Load())
	return nil
}

// cpuSeconds is the process's user+system CPU time.
func cpuSeconds() float64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		log.Fatal(err)
	}
	tv := func(t syscall.Timeval) float64 { return float64(t.Sec) + float64(t.Usec)/1e6 }
	return tv(ru.Utime) + tv(ru.Stime)
}

// scrapeCmd scrapes the pods with an in-process scrape.Scraper; -active
// gives every pod a request in flight, as under load.
func scrapeCmd(args []string) error {
	fs := flag.NewFlagSet("scrape", flag.ExitOnError)
	addrsPath := fs.String("addrs", "/tmp/addrs.txt", "file with one pod host:port per line")
	interval := fs.Duration("interval", scrape.DefaultInterval, "scrape.interval")
	idle := fs.Duration("idle-interval", scrape.DefaultIdleInterval, "scrape.idle_interval")
	active := fs.Bool("active", false, "every pod has a request in flight (scraped every -interval)")
	warmup := fs.Duration("warmup", 3*time.Second, "time before the measured window")
	window := fs.Duration("for", 10*time.Second, "measured window")
	profile := fs.String("cpuprofile", "", "write a CPU profile of the measured window here")
	plain := fs.Bool("plain", false, "the floor: a plain net/http GET of /metrics every -interval per pod on the scraper's transport, "+
		"the body read and discarded (no parsing, no state), instead of the scraper")
	_ = fs.Parse(args)
	addrs, err := readAddrs(*addrsPath)
	if err != nil {
		return err
	}
	if *plain {
		return plainGets(addrs, *interval, *warmup, *window)
	}
	var targets []scrape.Target
	for i, a := range addrs {
		targets = append(targets, scrape.Target{Name: fmt.Sprintf("pod-%03d", i), Address: a, Engine: scrape.EngineVLLM, Needs: scrape.AllInputs})
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	opts := scrape.Options{Interval: *interval, IdleInterval: *idle}
	if *active {
		opts.InFlight = func(string) int { return 1 }
	}
	s := scrape.New(ctx, opts)
	defer s.Close()
	s.SetTargets(targets)
	time.Sleep(*warmup)
	before := counts(s)
	var prof *os.File
	if *profile != "" {
		if prof, err = os.Create(*profile); err != nil {
			return err
		}
		if err := pprof.StartCPUProfile(prof); err != nil {
			_ = prof.Close() // nothing written; the start error is the one to return
			return err
		}
	}
	c0, t0 := cpuSeconds(), time.Now()
	time.Sleep(*window)
	c1, t1 := cpuSeconds(), time.Now()
	if *profile != "" {
		pprof.StopCPUProfile()
		// The profile is written: a failed close may have lost its tail.
		if err := prof.Close(); err != nil {
			return fmt.Errorf("cpu profile: %w", err)
		}
	}
	after := counts(s)
	report("scraper", len(targets), t1.Sub(t0), c1-c0, before, after)
	return nil
}

// plainGets is the floor under the scraper: one goroutine per pod GETs its
// /metrics every interval through net/http on scrape.NewTransport and
// discards the body. What the scraper costs above this is its own.
func plainGets(addrs []string, interval, warmup, window time.Duration) error {
	client := &http.Client{Transport: scrape.NewTransport()}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var mu sync.Mutex
	n := map[string]podCount{}
	for _, a := range addrs {
		go func() {
			for range clock.Ticks(ctx, interval) {
				resp, err := client.Get("http://" + a + "/metrics")
				if err == nil {
					_, err = io.Copy(io.Discard, resp.Body)
					_ = resp.Body.Close() // read to its end: the connection is kept
				}
				mu.Lock()
				c := n[a]
				c.scrapes++
				if err != nil {
					c.errors++
				}
				n[a] = c
				mu.Unlock()
			}
		}()
	}
	snapshot := func() map[string]podCount {
		mu.Lock()
		defer mu.Unlock()
		return maps.Clone(n)
	}
	time.Sleep(warmup)
	before := snapshot()
	c0, t0 := cpuSeconds(), time.Now()
	time.Sleep(window)
	c1, t1 := cpuSeconds(), time.Now()
	report("plain net/http GET", len(addrs), t1.Sub(t0), c1-c0, before, snapshot())
	return nil
}

// podCount is one pod's scrape and error counts.
type podCount struct{ scrapes, errors uint64 }

func counts(s *scrape.Scraper) map[string]podCount {
	out := map[string]podCount{}
	for _, p := range s.All() {
		out[p.Name] = podCount{p.Scrapes, p.Errors}
	}
	return out
}

func report(what string, pods int, window time.Duration, cpu float64, before, after map[string]podCount) {
	wall := window.Seconds()
	var total, errs uint64
	var perPod []float64
	for name, a := range after {
		n := a.scrapes - before[name].scrapes
		total += n
		errs += a.errors - before[name].errors
		perPod = append(perPod, float64(n)/wall)
	}
	slices.Sort(perPod)
	pct := func(q float64) float64 {
		if len(perPod) == 0 {
			return 0
		}
		return perPod[int(q*float64(len(perPod)-1))]
	}
	fmt.Printf("%s: pods=%d window=%.1fs cpu=%.3fs cores=%.4f scrapes=%d (%.0f/s) per-pod scrapes/s min=%.1f median=%.1f max=%.1f errors=%d cpu/scrape=%.0fµs\n",
		what, pods, wall, cpu, cpu/wall, total, float64(total)/wall, pct(0), pct(0.5), pct(1), errs, cpu/float64(max(total, 1))*1e6)
}

// tier1Cmd runs `infergate tier1` with every fake pod in one pool and no
// traffic, and reads the process's CPU time from /proc over the window;
// the pods' scrape counts come from /debug/pods before and after it.
func tier1Cmd(args []string) error {
	fs := flag.NewFlagSet("tier1", flag.ExitOnError)
	bin := fs.String("bin", "infergate", "the infergate binary")
	addrsPath := fs.String("addrs", "/tmp/addrs.txt", "file with one pod host:port per line")
	scrapeYAML := fs.String("scrape", "{}", "the config's scrape block, e.g. '{idle_interval: 50ms}'")
	warmup := fs.Duration("warmup", 3*time.Second, "time before the measured window")
	window := fs.Duration("for", 10*time.Second, "measured window")
	_ = fs.Parse(args)
	addrs, err := readAddrs(*addrsPath)
	if err != nil {
		return err
	}
	const token = "scrapecpu-token"
	var cfg strings.Builder
	fmt.Fprintf(&cfg, "metrics_listen: \"-\"\nauth: {tokens: [%s]}\nscrape: %s\npools: [{name: p, model: m}]\npods:\n", token, *scrapeYAML)
	for i, a := range addrs {
		fmt.Fprintf(&cfg, "  - {name: pod-%03d, address: %q, pool: p, engine: vllm}\n", i, a)
	}
	dir, err := os.MkdirTemp("", "scrapecpu")
	if err != nil {
		return err
	}
	defer func() { _ = os.RemoveAll(dir) }() // a leftover temporary directory costs disk, not the measurement
	cfgPath := filepath.Join(dir, "tier1.yaml")
	if err := os.WriteFile(cfgPath, []byte(cfg.String()), 0o600); err != nil {
		return err
	}
	listen, err := freeAddr()
	if err != nil {
		return err
	}
	cmd := exec.Command(*bin, "tier1", "--config", cfgPath, "--listen", listen, "--log-level", "warn")
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Start(); err != nil {
		return err
	}
	defer func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		_ = cmd.Wait() // its exit status after SIGTERM is not the measurement
	}()
	time.Sleep(*warmup)
	before, err := debugPods(listen, token)
	if err != nil {
		return err
	}
	c0, t0 := procCPU(cmd.Process.Pid), time.Now()
	time.Sleep(*window)
	c1, t1 := procCPU(cmd.Process.Pid), time.Now()
	after, err := debugPods(listen, token)
	if err != nil {
		return err
	}
	report("tier1 "+*bin, len(addrs), t1.Sub(t0), c1-c0, before, after)
	return nil
}

// procCPU is a process's user+system CPU time from /proc/PID/stat.
func procCPU(pid int) float64 {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		log.Fatal(err)
	}
	// Fields after the command name (which may hold spaces) in
	// parentheses; utime and stime are the 14th and 15th fields.
	f := strings.Fields(string(raw[strings.LastIndexByte(string(raw), ')')+2:]))
	utime, err1 := strconv.ParseFloat(f[11], 64)
	stime, err2 := strconv.ParseFloat(f[12], 64)
	if err := errors.Join(err1, err2); err != nil {
		log.Fatal(err)
	}
	const ticks = 100 // USER_HZ on Linux
	return (utime + stime) / ticks
}

func debugPods(listen, token string) (map[string]podCount, error) {
	req, err := http.NewRequest(http.MethodGet, "http://"+listen+"/debug/pods", nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var body struct {
		Pods []struct {
			Name         string `json:"name"`
			Scrapes      uint64 `json:"scrapes"`
			ScrapeErrors uint64 `json:"scrape_errors"`
		} `json:"pods"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		return nil, fmt.Errorf("/debug/pods: %s: %w", resp.Status, err)
	}
	out := map[string]podCount{}
	for _, p := range body.Pods {
		out[p.Name] = podCount{p.Scrapes, p.ScrapeErrors}
	}
	return out, nil
}

func freeAddr() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}

// readAddrs reads the pods' host:port list that serve printed.
func readAddrs(path string) ([]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer func() { _ = f.Close() }() // read only: closing loses nothing
	var out []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if a := strings.TrimSpace(sc.Text()); a != "" {
			out = append(out, a)
		}
	}
	return out, sc.Err()
}
