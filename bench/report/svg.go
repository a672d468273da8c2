package report

import (
	"bufio"
	"fmt"
	"html"
	"io"
	"math"
	"slices"
	"strconv"
	"time"
)

// palette is colour-blind-safe (Okabe–Ito).
var palette = []string{"#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#F0E442", "#000000"}

const (
	plotW, plotH             = 720, 420
	marginL, marginR         = 70, 170
	marginT, marginB         = 40, 50
	innerW, innerH           = plotW - marginL - marginR, plotH - marginT - marginB
	maxCDFPoints             = 400
	svgHeader                = `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">` + "\n"
	svgFooter                = "</svg>\n"
	axisStyle                = `stroke="#333" stroke-width="1"`
	gridStyle                = `stroke="#ddd" stroke-width="1"`
	heatRowsMax, heatColsMax = 64, 200
	heatLevels               = 10
)

func f1(v float64) string { return strconv.FormatFloat(v, 'f', 1, 64) }

// WriteTTFTCDF writes an SVG of each policy's TTFT distribution (pooled over
// seeds) as a CDF on a log time axis, so both the median and the tail are
// visible.
func (r Report) WriteTTFTCDF(w io.Writer) error {
	bw := bufio.NewWriter(w)
	fmt.Fprintf(bw, svgHeader, plotW, plotH, plotW, plotH)
	fmt.Fprintf(bw, `<rect width="%d" height="%d" fill="white"/>`+"\n", plotW, plotH)
	fmt.Fprintf(bw, `<text x="%d" y="22" font-size="15">%s: TTFT CDF (%d seed(s) pooled)</text>`+"\n", marginL, html.EscapeString(r.Scenario), r.Seeds)

	series := make([][]float64, len(r.Policies))
	lo, hi := math.Inf(1), math.Inf(-1)
	for i, p := range r.Policies {
		for _, run := range p.runs {
			series[i] = append(series[i], run.TTFT...)
		}
		slices.Sort(series[i])
		if n := len(series[i]); n > 0 {
			lo = math.Min(lo, math.Max(series[i][0], 0.1))
			hi = math.Max(hi, series[i][n-1])
		}
	}
	if math.IsInf(lo, 1) {
		lo, hi = 1, 10
	}
	// Whole decades keep the axis readable.
	dlo, dhi := math.Floor(math.Log10(lo)), math.Ceil(math.Log10(hi))
	if dhi <= dlo {
		dhi = dlo + 1
	}
	x := func(ms float64) float64 {
		v := (math.Log10(math.Max(ms, math.Pow(10, dlo))) - dlo) / (dhi - dlo)
		return marginL + v*innerW
	}
	y := func(q float64) float64 { return marginT + (1-q)*innerH }

	for d := dlo; d <= dhi; d++ {
		xv := x(math.Pow(10, d))
		fmt.Fprintf(bw, `<line x1="%s" y1="%d" x2="%s" y2="%d" %s/>`+"\n", f1(xv), marginT, f1(xv), marginT+innerH, gridStyle)
		fmt.Fprintf(bw, `<text x="%s" y="%d" text-anchor="middle">%s</text>`+"\n", f1(xv), marginT+innerH+16, msLabel(math.Pow(10, d)))
	}
	for _, q := range []float64{0, 0.25, 0.5, 0.75, 0.9, 0.99, 1} {
		fmt.Fprintf(bw, `<line x1="%d" y1="%s" x2="%d" y2="%s" %s/>`+"\n", marginL, f1(y(q)), marginL+innerW, f1(y(q)), gridStyle)
		fmt.Fprintf(bw, `<text x="%d" y="%s" text-anchor="end">%g</text>`+"\n", marginL-6, f1(y(q)+4), q)
	}
	fmt.Fprintf(bw, `<rect x="%d" y="%d" width="%d" height="%d" fill="none" %s/>`+"\n", marginL, marginT, innerW, innerH, axisStyle)
	fmt.Fprintf(bw, `<text x="%d" y="%d" text-anchor="middle">time to first token (log scale)</text>`+"\n", marginL+innerW/2, plotH-12)
	fmt.Fprintf(bw, `<text transform="translate(16 %d) rotate(-90)" text-anchor="middle">fraction of requests</text>`+"\n", marginT+innerH/2)

	for i, s := range series {
		col := palette[i%len(palette)]
		if n := len(s); n > 0 {
			fmt.Fprintf(bw, `<polyline fill="none" stroke="%s" stroke-width="2" points="`, col)
			// maxCDFPoints/4 points up to the 90th percentile and as many
			// again above it: half the points of an even spread (keeps
			// docs/bench small) and finer in the tail, which is what the
			// tables report.
			body := n * 9 / 10
			step := max(1, body/(maxCDFPoints/4))
			tail := max(1, (n-body)/(maxCDFPoints/4))
			for k := 0; k < n; {
				fmt.Fprintf(bw, "%s,%s ", f1(x(s[k])), f1(y(float64(k+1)/float64(n))))
				if k < body {
					k += step
				} else {
					k += tail
				}
			}
			fmt.Fprintf(bw, "%s,%s", f1(x(s[n-1])), f1(y(1)))
			fmt.Fprintln(bw, `"/>`)
		}
		ly := marginT + 10 + i*20
		fmt.Fprintf(bw, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="%s" stroke-width="3"/>`+"\n", marginL+innerW+12, ly, marginL+innerW+32, ly, col)
		fmt.Fprintf(bw, `<text x="%d" y="%d">%s</text>`+"\n", marginL+innerW+38, ly+4, html.EscapeString(r.Policies[i].Name))
	}
	bw.WriteString(svgFooter)
	return bw.Flush()
}

func msLabel(ms float64) string {
	if ms >= 1000 {
		return strconv.FormatFloat(ms/1000, 'g', 3, 64) + " s"
	}
	return strconv.FormatFloat(ms, 'g', 3, 64) + " ms"
}

// WriteLoad writes an SVG heatmap of per-pod load (server waiting + running
// requests) over time for one run: a row per pod (pods binned, taking the
// max, beyond 64 rows), darker is busier. A heatmap rather than lines keeps
// 1,000-pod fleets legible.
func WriteLoad(w io.Writer, title string, l *Load) error {
	bw := bufio.NewWriter(w)
	fmt.Fprintf(bw, svgHeader, plotW, plotH, plotW, plotH)
	fmt.Fprintf(bw, `<rect width="%d" height="%d" fill="white"/>`+"\n", plotW, plotH)
	fmt.Fprintf(bw, `<text x="%d" y="22" font-size="15">%s</text>`+"\n", marginL, html.EscapeString(title))
	if l == nil || len(l.Times) == 0 || len(l.Pods) == 0 {
		fmt.Fprintf(bw, `<text x="%d" y="%d">no load samples</text>`+"\n", marginL, marginT+20)
		bw.WriteString(svgFooter)
		return bw.Flush()
	}
	nPods, nT := len(l.Pods), len(l.Times)
	rows := min(nPods, heatRowsMax)
	cols := min(nT, heatColsMax)
	grid := make([][]int, rows)
	peak := 1
	for r := range grid {
		grid[r] = make([]int, cols)
	}
	for ti := range nT {
		c := ti * cols / nT
		for p := range nPods {
			r := p * rows / nPods
			if v := l.Values[ti][p]; v > grid[r][c] {
				grid[r][c] = v
			}
		}
	}
	for r := range grid {
		for _, v := range grid[r] {
			peak = max(peak, v)
		}
	}
	cw, rh := float64(innerW)/float64(cols), float64(innerH)/float64(rows)
	// Opacity is quantised to heatLevels steps and equal neighbours in a
	// row are merged into one rect, which keeps 1,000-pod plots small.
	level := func(v int) int {
		if v == 0 {
			return 0
		}
		// sqrt keeps moderate loads visible next to a hot spot.
		return max(1, int(math.Round(math.Sqrt(float64(v)/float64(peak))*heatLevels)))
	}
	for r := range grid {
		for c := 0; c < cols; {
			lv := level(grid[r][c])
			end := c + 1
			for end < cols && level(grid[r][end]) == lv {
				end++
			}
			if lv > 0 {
				fmt.Fprintf(bw, `<rect x="%s" y="%s" width="%s" height="%s" fill="#B2182B" fill-opacity="%.2f"/>`+"\n",
					f1(marginL+float64(c)*cw), f1(marginT+float64(r)*rh), f1(float64(end-c)*cw+0.5), f1(rh+0.5), float64(lv)/heatLevels)
			}
			c = end
		}
	}
	fmt.Fprintf(bw, `<rect x="%d" y="%d" width="%d" height="%d" fill="none" %s/>`+"\n", marginL, marginT, innerW, innerH, axisStyle)
	// Row labels: pod name and GPU when they fit.
	if rows == nPods && rows <= 32 {
		for p := range nPods {
			fmt.Fprintf(bw, `<text x="%d" y="%s" text-anchor="end" font-size="10">%s</text>`+"\n", marginL-4, f1(marginT+(float64(p)+0.5)*rh+3), html.EscapeString(l.GPUs[p]+" "+l.Pods[p]))
		}
	} else {
		fmt.Fprintf(bw, `<text transform="translate(16 %d) rotate(-90)" text-anchor="middle">%d pods (%d per row, max)</text>`+"\n", marginT+innerH/2, nPods, (nPods+rows-1)/rows)
	}
	end := l.Times[nT-1]
	for k := 0; k <= 4; k++ {
		t := end * time.Duration(k) / 4
		xv := marginL + float64(innerW)*float64(k)/4
		fmt.Fprintf(bw, `<text x="%s" y="%d" text-anchor="middle">%s</text>`+"\n", f1(xv), marginT+innerH+16, t.Round(time.Second))
	}
	fmt.Fprintf(bw, `<text x="%d" y="%d" text-anchor="middle">virtual time</text>`+"\n", marginL+innerW/2, plotH-12)
	lx := marginL + innerW + 12
	fmt.Fprintf(bw, `<text x="%d" y="%d">load = waiting + running</text>`+"\n", lx, marginT+10)
	for k, v := range []int{peak, peak / 4, 1} {
		ly := marginT + 24 + k*20
		a := math.Sqrt(float64(max(v, 1)) / float64(peak))
		fmt.Fprintf(bw, `<rect x="%d" y="%d" width="14" height="14" fill="#B2182B" fill-opacity="%.2f"/>`+"\n", lx, ly, a)
		fmt.Fprintf(bw, `<text x="%d" y="%d">%d</text>`+"\n", lx+20, ly+11, max(v, 1))
	}
	bw.WriteString(svgFooter)
	return bw.Flush()
}
