//go:build linux

package scrape

import (
	"context"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// threadCPU is the CPU time of the calling OS thread.
func threadCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_THREAD, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkFetch fetches and parses the fixture page from a loopback pod,
// once with net/http (the scraper's path when Options.Client is set) and
// once with pageClient, the default. The benchmark goroutine is locked to
// its thread so thread-cpu-ns/op is the fetching side's own CPU (system
// calls, parsing), without the in-process server's.
func BenchmarkFetch(b *testing.B) {
	page := loadFixture(b)
	for _, framing := range []string{"length", "chunked"} {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if framing == "length" {
				w.Header().Set("Content-Length", strconv.Itoa(len(page)))
			}
			_, _ = w.Write(page)
		}))
		addr := strings.TrimPrefix(srv.URL, "http://")
		s := New(context.Background(), Options{})
		tg := &target{t: Target{Name: "p", Address: addr, Engine: EngineVLLM}, metricsURL: srv.URL + "/metrics"}
		tg.state.Store(&PodState{Target: tg.t, Engine: EngineVLLM, Metrics: fixtureMetrics})
		for _, client := range []string{"nethttp", "page"} {
			b.Run(framing+"/"+client, func(b *testing.B) {
				runtime.LockOSThread()
				defer runtime.UnlockOSThread()
				pc := newPageClient(addr, time.Second)
				defer pc.close()
				fetch := func() (Sample, error) {
					if client == "page" {
						return s.fetchPage(context.Background(), tg, pc, time.Now())
					}
					return s.fetchMetrics(context.Background(), tg)
				}
				if _, err := fetch(); err != nil { // connect outside the timing
					b.Fatal(err)
				}
				b.SetBytes(int64(len(page)))
				b.ReportAllocs()
				cpu0 := threadCPU()
				for b.Loop() {
					if _, err := fetch(); err != nil {
						b.Fatal(err)
					}
				}
				b.ReportMetric(float64(threadCPU()-cpu0)/float64(b.N), "thread-cpu-ns/op")
			})
		}
		srv.Close()
	}
}
