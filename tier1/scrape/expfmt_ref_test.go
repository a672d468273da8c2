package scrape

// The reference parser: Parse's answers, computed with expfmt's text parser
// over the wanted families. Only the differential tests and
// FuzzParseMatchesExpfmt use it, so it lives in a test file and stays out
// of the binary.

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"sort"
	"strconv"
	"strings"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/infergate/infergate/tier1/picker"
)

// parseExpfmt is the reference implementation of Parse on top of expfmt's
// text parser: it copies the wanted families' lines out, builds their
// dto.MetricFamily values and reads them. Parse (fastparse.go) does the same
// in one streaming pass without building the exposition; the differential
// tests and FuzzParseMatchesExpfmt hold the two to the same answers.
func parseExpfmt(engine string, r io.Reader) (Sample, error) {
	filtered, err := filterWanted(r)
	if err != nil {
		return Sample{}, fmt.Errorf("read metrics: %w", err)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(bytes.NewReader(filtered))
	if err != nil {
		return Sample{}, fmt.Errorf("parse metrics: %w", err)
	}
	if engine == "" {
		engine = detect(fams)
		if engine == "" {
			return Sample{}, ErrUnknownEngine
		}
	}
	m := dialectOf(engine)
	if m == nil {
		return Sample{}, fmt.Errorf("unknown engine %q", engine)
	}
	for name, l := range breakdownOf {
		fams[name] = withoutBreakdown(fams[name], l)
	}
	s := Sample{Engine: engine}
	for _, name := range m.families[picker.MetricWaiting] {
		if v, ok := sum(fams[name]); ok {
			s.Metrics.Waiting = count(v)
			s.Have |= InputWaiting
			break
		}
	}
	for _, name := range m.families[picker.MetricRunning] {
		if v, ok := sum(fams[name]); ok {
			if m.runningIncludesWaiting {
				v -= float64(s.Metrics.Waiting)
			}
			s.Metrics.Running = count(v)
			s.Have |= InputRunning
			break
		}
	}
	for _, name := range m.families[picker.MetricKVUsage] {
		if v, ok := mean(fams[name]); ok {
			s.Metrics.KVUsage = clamp01(v)
			s.Metrics.HasKV = true
			s.Have |= InputKV
			break
		}
	}
	for _, name := range m.families[picker.MetricLoRA] {
		if parseLoRA(fams[name], &s.Metrics) {
			s.Have |= InputLoRA
			break
		}
	}
	if m.loraLoaded != "" && parseLoRALoaded(fams[m.loraLoaded], &s.Metrics) {
		s.Have |= InputLoRA
	}
	if m.cacheConfig != "" {
		parseCacheConfig(fams[m.cacheConfig], m, &s.Metrics)
	}
	if v, ok := mean(fams[m.blockSizeFamily]); ok && s.Metrics.BlockSize == 0 {
		s.Metrics.BlockSize = count(math.Round(v))
	}
	if v, ok := mean(fams[m.numBlocksFamily]); ok && s.Metrics.NumBlocks == 0 {
		s.Metrics.NumBlocks = count(math.Round(v))
	}
	return s, nil
}

// withoutBreakdown drops the series of f whose label l is not empty: they
// break down another series of f (SGLang's per-priority counts).
func withoutBreakdown(f *dto.MetricFamily, l string) *dto.MetricFamily {
	if f == nil {
		return nil
	}
	out := &dto.MetricFamily{Name: f.Name, Type: f.Type}
	for _, m := range f.GetMetric() {
		if v, _ := label(m, l); v == "" {
			out.Metric = append(out.Metric, m)
		}
	}
	return out
}

// parseLoRALoaded reads vllm:lora_adapter_loaded{adapter_name,level,pinned}
// (vllm-project/vllm#54830): one series per loaded adapter, present while
// it is loaded. The GPU-resident ones join ActiveAdapters, sorted, after
// those lora_requests_info named.
func parseLoRALoaded(f *dto.MetricFamily, out *picker.Metrics) bool {
	if f == nil {
		return false
	}
	var add []string
	for _, m := range f.GetMetric() {
		v, ok := value(m)
		if !ok || v <= 0 {
			continue
		}
		if lvl, _ := label(m, "level"); lvl != "gpu" {
			continue
		}
		name, _ := label(m, "adapter_name")
		if name == "" || slices.Contains(out.ActiveAdapters, name) || slices.Contains(add, name) {
			continue
		}
		add = append(add, name)
	}
	sort.Strings(add)
	if len(add) > 0 {
		out.ActiveAdapters = append(slices.Clip(out.ActiveAdapters), add...)
	}
	out.HasLoRA = true
	return true
}

// detect names the engine whose metrics appear in fams, or "".
func detect(fams map[string]*dto.MetricFamily) string {
	for _, d := range dialects {
		if d.marker != "" && fams[d.marker] != nil {
			return d.engine
		}
	}
	for name := range fams {
		if e := engineByPrefix(name); e != "" {
			return e
		}
	}
	return ""
}

// filterWanted copies the lines of r that belong to a wanted metric family
// (samples and their # HELP / # TYPE lines).
func filterWanted(r io.Reader) ([]byte, error) {
	br := bufio.NewReaderSize(r, 32<<10)
	var out bytes.Buffer
	for {
		line, err := br.ReadSlice('\n')
		if errors.Is(err, bufio.ErrBufferFull) {
			// A line longer than the buffer: read the rest and judge the whole.
			long := append([]byte(nil), line...)
			for errors.Is(err, bufio.ErrBufferFull) {
				line, err = br.ReadSlice('\n')
				long = append(long, line...)
			}
			line = long
		}
		if len(line) > 0 && wanted[lineFamily(line)] {
			out.Write(line)
			if line[len(line)-1] != '\n' {
				out.WriteByte('\n')
			}
		}
		if err != nil {
			if errors.Is(err, io.EOF) {
				return out.Bytes(), nil
			}
			return nil, err
		}
	}
}

// lineFamily returns the metric name a text-format line is about.
func lineFamily(line []byte) string {
	line = bytes.TrimLeft(line, " \t")
	if len(line) > 0 && line[0] == '#' {
		f := bytes.Fields(line)
		if len(f) >= 3 && (string(f[1]) == "HELP" || string(f[1]) == "TYPE") {
			return string(f[2])
		}
		return ""
	}
	end := bytes.IndexAny(line, "{ \t")
	if end < 0 {
		return ""
	}
	return string(line[:end])
}

func value(m *dto.Metric) (float64, bool) {
	var v float64
	switch {
	case m.GetGauge() != nil:
		v = m.GetGauge().GetValue()
	case m.GetCounter() != nil:
		v = m.GetCounter().GetValue()
	case m.GetUntyped() != nil:
		v = m.GetUntyped().GetValue()
	default:
		return 0, false
	}
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return 0, false
	}
	return v, true
}

// sum adds the finite series of f; a result that overflows is +Inf or -Inf,
// never NaN, and a negative total is 0.
func sum(f *dto.MetricFamily) (float64, bool) {
	if f == nil {
		return 0, false
	}
	var pos, neg float64
	var n int
	for _, m := range f.GetMetric() {
		if v, ok := value(m); ok {
			if v > 0 {
				pos += v
			} else {
				neg += v
			}
			n++
		}
	}
	total := pos + neg // Inf + -Inf would be NaN
	switch {
	case math.IsInf(pos, 1) && math.IsInf(neg, -1):
		total = 0
	case total < 0:
		total = 0
	}
	return total, n > 0
}

func mean(f *dto.MetricFamily) (float64, bool) {
	if f == nil {
		return 0, false
	}
	total, ok := sum(f)
	if !ok {
		return 0, false
	}
	var n int
	for _, m := range f.GetMetric() {
		if _, ok := value(m); ok {
			n++
		}
	}
	return total / float64(n), true
}

func label(m *dto.Metric, name string) (string, bool) {
	for _, lp := range m.GetLabel() {
		if lp.GetName() == name {
			return lp.GetValue(), true
		}
	}
	return "", false
}

// parseLoRA reads vllm:lora_requests_info. vLLM keeps one series per state
// it has seen (the label set) and sets its value to the time of the state's
// last update, so the series with the newest value is the current state.
//
// Several series can carry the same value: vLLM's timestamps are often whole
// seconds, and the last step of a burst (adapters running) and the idle state
// right after it land in the same second. The exposition order is no guide,
// so on a tie the series with the fewest running adapters wins (then fewest
// waiting, then the smallest label text, for determinism). While traffic
// runs vLLM refreshes the busy series every engine step, so it wins again
// within a second; once traffic stops nothing refreshes either series, and
// preferring the busy one would show adapters running forever. Under-stating
// for at most a second is the cheaper mistake: the lora-affinity scorer only
// loses a preference, while a stale "running" pins traffic to a pod whose
// adapter slots are in fact free.
func parseLoRA(f *dto.MetricFamily, out *picker.Metrics) bool {
	if f == nil {
		return false
	}
	var best *dto.Metric
	var bestRun, bestWait []string
	bestV := math.Inf(-1)
	for _, m := range f.GetMetric() {
		v, ok := value(m)
		if !ok || v < bestV {
			continue
		}
		run, _ := label(m, "running_lora_adapters")
		wait, _ := label(m, "waiting_lora_adapters")
		runL, waitL := splitList(run), splitList(wait)
		if best != nil && v == bestV && !loraLess(runL, waitL, m, bestRun, bestWait, best) {
			continue
		}
		best, bestV, bestRun, bestWait = m, v, runL, waitL
	}
	if best == nil {
		return false
	}
	out.ActiveAdapters = bestRun
	out.WaitingAdapters = bestWait
	if s, ok := label(best, "max_lora"); ok {
		if n, err := strconv.Atoi(strings.TrimSpace(s)); err == nil && n > 0 {
			out.MaxLoras = n
		}
	}
	out.HasLoRA = true
	return true
}

// loraLess orders two lora_requests_info series with the same timestamp:
// fewer running adapters first, then fewer waiting, then label text.
func loraLess(runA, waitA []string, a *dto.Metric, runB, waitB []string, b *dto.Metric) bool {
	if len(runA) != len(runB) {
		return len(runA) < len(runB)
	}
	if len(waitA) != len(waitB) {
		return len(waitA) < len(waitB)
	}
	return labelText(a) < labelText(b)
}

// labelText is m's labels as one string, sorted by name: the text format
// does not fix the order of labels within a series.
func labelText(m *dto.Metric) string {
	pairs := make([]string, 0, len(m.GetLabel()))
	for _, lp := range m.GetLabel() {
		pairs = append(pairs, lp.GetName()+"\x00"+lp.GetValue())
	}
	sort.Strings(pairs)
	return strings.Join(pairs, "\x00")
}

func parseCacheConfig(f *dto.MetricFamily, m *dialect, out *picker.Metrics) {
	if f == nil || len(f.GetMetric()) == 0 {
		return
	}
	mt := f.GetMetric()[0]
	if s, ok := label(mt, m.blockSizeLabel); ok {
		if n, err := strconv.Atoi(s); err == nil && n > 0 {
			out.BlockSize = n
		}
	}
	if s, ok := label(mt, m.numBlocksLabel); ok {
		if n, err := strconv.Atoi(s); err == nil && n > 0 {
			out.NumBlocks = n
		}
	}
}
