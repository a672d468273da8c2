// Command scrapecpu measures the CPU the Tier 1 scraper burns while idle:
// one process serves a metrics page as N fake pods, another scrapes them
// with scrape.Scraper and reports its own CPU time (user+system, from
// getrusage) over a window, so only the scraper's cost is counted.
//
//	scrapecpu serve -pods 100 -page tier1/scrape/testdata/vllm_metrics.txt > addrs.txt
//	scrapecpu scrape -addrs addrs.txt -interval 50ms -warmup 2s -for 10s
//	scrapecpu floor -addrs addrs.txt -batch 10 -for 10s   # Linux: the transfer alone
//
// It uses only the package's exported API, so the same file builds against
// an older scrape package for before/after figures.
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"net"
	"net/http"
	"os"
	"os/signal"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/infergate/infergate/tier1/scrape"
)

func main() {
	if len(os.Args) < 2 {
		log.Fatal("usage: scrapecpu serve|scrape [flags]")
	}
	switch os.Args[1] {
	case "serve":
		serve(os.Args[2:])
	case "scrape":
		scrapeCmd(os.Args[2:])
	case "floor":
		floorCmd(os.Args[2:])
	default:
		log.Fatalf("unknown mode %q", os.Args[1])
	}
}

func serve(args []string) {
	fs := flag.NewFlagSet("serve", flag.ExitOnError)
	pods := fs.Int("pods", 100, "fake pods to serve")
	pagePath := fs.String("page", "tier1/scrape/testdata/vllm_metrics.txt", "metrics page to serve")
	length := fs.Bool("content-length", false, "send a Content-Length (as vLLM's server does) rather than a chunked body")
	_ = fs.Parse(args)
	page, err := os.ReadFile(*pagePath)
	if err != nil {
		log.Fatal(err)
	}
	var hits atomic.Int64
	mux := http.NewServeMux()
	mux.HandleFunc("/metrics", func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
		if *length {
			w.Header().Set("Content-Length", strconv.Itoa(len(page)))
		}
		_, _ = w.Write(page)
	})
	mux.HandleFunc("/v1/models", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"object":"list","data":[{"id":"meta-llama/Llama-3.1-8B-Instruct","root":"meta-llama/Llama-3.1-8B-Instruct"}]}`))
	})
	for range *pods {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			log.Fatal(err)
		}
		srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second, IdleTimeout: 2 * time.Minute}
		go func() { _ = srv.Serve(ln) }()
		fmt.Println(ln.Addr().String())
	}
	_ = os.Stdout.Sync()
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, os.Interrupt, syscall.SIGTERM)
	<-ch
	fmt.Fprintf(os.Stderr, "served %d /metrics requests\n", hits.Load())
}

func cpuSeconds() float64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		log.Fatal(err)
	}
	tv := func(t syscall.Timeval) float64 { return float64(t.Sec) + float64(t.Usec)/1e6 }
	return tv(ru.Utime) + tv(ru.Stime)
}

func scrapeCmd(args []string) {
	fs := flag.NewFlagSet("scrape", flag.ExitOnError)
	addrsPath := fs.String("addrs", "addrs.txt", "file with one pod host:port per line")
	interval := fs.Duration("interval", 50*time.Millisecond, "scrape interval")
	warmup := fs.Duration("warmup", 2*time.Second, "time before the measured window")
	window := fs.Duration("for", 10*time.Second, "measured window")
	engine := fs.String("engine", "vllm", "engine of every pod")
	profile := fs.String("cpuprofile", "", "write a CPU profile of the measured window here")
	netHTTP := fs.Bool("nethttp", false, "fetch /metrics with a net/http client (Options.Client) instead of the scraper's own")
	_ = fs.Parse(args)
	var targets []scrape.Target
	for _, a := range readAddrs(*addrsPath) {
		targets = append(targets, scrape.Target{Name: fmt.Sprintf("pod-%03d", len(targets)), Address: a, Engine: *engine, Needs: scrape.AllInputs})
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	opts := scrape.Options{Interval: *interval}
	if *netHTTP {
		// The transport the scraper used before it had its own client.
		tr := http.DefaultTransport.(*http.Transport).Clone()
		tr.MaxIdleConns, tr.MaxIdleConnsPerHost = 0, 4
		tr.DisableCompression = true
		tr.ReadBufferSize = 64 << 10
		opts.Client = &http.Client{Transport: tr}
	}
	s := scrape.New(ctx, opts)
	s.SetTargets(targets)
	time.Sleep(*warmup)
	count := func() (n, errs uint64) {
		for _, p := range s.All() {
			n += p.Scrapes
			errs += p.Errors
		}
		return n, errs
	}
	n0, e0 := count()
	if *profile != "" {
		pf, err := os.Create(*profile)
		if err != nil {
			log.Fatal(err)
		}
		if err := pprof.StartCPUProfile(pf); err != nil {
			log.Fatal(err)
		}
		defer pf.Close()
	}
	c0, t0 := cpuSeconds(), time.Now()
	time.Sleep(*window)
	c1, t1 := cpuSeconds(), time.Now()
	if *profile != "" {
		pprof.StopCPUProfile()
	}
	n1, e1 := count()
	s.Close()
	wall := t1.Sub(t0).Seconds()
	scrapes := n1 - n0
	fmt.Printf("pods=%d interval=%s window=%.1fs cpu=%.2fs cores=%.3f scrapes=%d (%.0f/s, want %.0f/s) errors=%d cpu/scrape=%.0fµs\n",
		len(targets), *interval, wall, c1-c0, (c1-c0)/wall, scrapes, float64(scrapes)/wall,
		float64(len(targets))/interval.Seconds(), e1-e0, (c1-c0)/float64(max(scrapes, 1))*1e6)
}

// readAddrs reads the pods' host:port list that serve printed.
func readAddrs(path string) []string {
	raw, err := os.ReadFile(path)
	if err != nil {
		log.Fatal(err)
	}
	return strings.Fields(string(raw))
}
