package load

import (
	"bufio"
	"fmt"
	"io"
	"time"
)

// WriteMarkdown writes the report as Markdown tables (as in
// docs/performance.md).
func (r *Report) WriteMarkdown(w io.Writer) error {
	bw := bufio.NewWriter(w) // its error is sticky: Flush returns the first failed write
	fmt.Fprintf(bw, "Load benchmark of one Tier 1 process, %s: %d fake pods, %d-byte chat bodies, %d%% streaming, %v per path per rate in %d alternating rounds.\n\n",
		r.Start.Format(time.RFC3339), r.Pods, r.BodyBytes, r.StreamPct, r.Duration, r.Rounds)
	ms := func(d time.Duration) string { return fmt.Sprintf("%.2f", float64(d)/float64(time.Millisecond)) }
	fmt.Fprintln(bw, "| rate (req/s) | load avg | direct p50 / p99 (ms) | Tier 1 p50 / p99 (ms) | added p50 / p99 (ms) | delivered direct / Tier 1 (req/s) | errors+dropped direct / Tier 1 | Tier 1 CPU-s per 1k req (net / gross) | Tier 1 cores | Tier 1 RSS (MiB) | generator max lag direct / Tier 1 (ms) |")
	fmt.Fprintln(bw, "|---|---|---|---|---|---|---|---|---|---|---|")
	for _, x := range r.Rates {
		fmt.Fprintf(bw, "| %g | %.1f→%.1f | %s / %s | %s / %s | %s / %s | %.0f / %.0f | %d / %d | %.3f / %.3f | %.2f | %.1f | %.0f / %.0f |\n",
			x.Rate, x.LoadAvg[0], x.LoadAvg[1],
			ms(x.Direct.Latency.P50), ms(x.Direct.Latency.P99),
			ms(x.Tier1.Latency.P50), ms(x.Tier1.Latency.P99),
			ms(x.AddedP50), ms(x.AddedP99),
			x.Direct.Delivered, x.Tier1.Delivered,
			x.Direct.Errors+x.Direct.Dropped, x.Tier1.Errors+x.Tier1.Dropped,
			x.CPUPer1k.Seconds(), x.GrossCPUPer1k.Seconds(), x.Cores, float64(x.RSS)/(1<<20),
			float64(x.Direct.MaxLag)/float64(time.Millisecond), float64(x.Tier1.MaxLag)/float64(time.Millisecond))
	}
	fmt.Fprintln(bw)
	if r.Crossing > 0 {
		fmt.Fprintf(bw, "p99 added latency passes 5 ms at %g req/s.\n", r.Crossing)
	} else {
		fmt.Fprintln(bw, "p99 added latency stayed at or below 5 ms at every rate.")
	}
	fmt.Fprintf(bw, "Tier 1 with no load (scraping %d pods): %.2f cores, RSS %.1f MiB. Peak RSS: %.1f MiB.\n",
		r.Pods, r.IdleCores, float64(r.IdleRSS)/(1<<20), float64(r.PeakRSS)/(1<<20))
	for _, x := range r.Rates {
		for _, p := range []struct {
			name string
			r    PathResult
		}{{"direct", x.Direct}, {"tier1", x.Tier1}} {
			if p.r.FirstErr != "" {
				fmt.Fprintf(bw, "First error at %g req/s (%s): %s\n", x.Rate, p.name, p.r.FirstErr)
			}
		}
	}
	for _, x := range r.Rates {
		if x.RecordsDropped > 0 {
			fmt.Fprintf(bw, "At %g req/s Tier 1 dropped %d prefix-index records (record queue full): their CPU is not in the figures.\n", x.Rate, x.RecordsDropped)
		}
	}
	if r.ProfileFile != "" {
		fmt.Fprintf(bw, "Tier 1 CPU profile at %g req/s: %s (go tool pprof -top %s), lock contention in %s.mutex\n", r.ProfileRate, r.ProfileFile, r.ProfileFile, r.ProfileFile)
	}
	return bw.Flush()
}
