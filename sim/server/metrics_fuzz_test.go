package server

import (
	"bytes"
	"math"
	"slices"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/expfmt"

	"github.com/infergate/infergate/sim/engine"
	tier1scrape "github.com/infergate/infergate/tier1/scrape"
)

// adapterNames turns fuzz bytes into up to four distinct adapter names in
// the charset LoRA modules use.
func adapterNames(b []byte) []string {
	const chars = "abcdefghijklmnopqrstuvwxyz0123456789-_."
	var out []string
	for len(b) > 0 && len(out) < 4 {
		n := min(int(b[0])%12+1, len(b))
		name := make([]byte, n)
		for i, c := range b[:n] {
			name[i] = chars[int(c)%len(chars)]
		}
		b = b[n:]
		if !slices.Contains(out, string(name)) {
			out = append(out, string(name))
		}
	}
	slices.Sort(out)
	return out
}

// FuzzMetricsRoundTrip renders the simulator's /metrics for arbitrary
// engine states in every flavor and reads it back with Tier 1's scraper:
// what the router sees must be what the simulated engine reported, or the
// benchmarks would measure a different router from the one deployed.
func FuzzMetricsRoundTrip(f *testing.F) {
	f.Add(uint8(0), uint32(3), uint32(7), uint16(28672), uint16(16), uint32(27648), uint8(4), []byte("sql-lora"), []byte("x"))
	f.Add(uint8(1), uint32(0), uint32(2), uint16(58982), uint16(16), uint32(100), uint8(0), []byte(nil), []byte(nil))
	f.Add(uint8(2), uint32(1<<31), uint32(1), uint16(65535), uint16(64), uint32(1), uint8(0), []byte(nil), []byte(nil))
	f.Add(uint8(3), uint32(7), uint32(4), uint16(0), uint16(0), uint32(0), uint8(0), []byte(nil), []byte(nil))
	f.Add(uint8(0), uint32(9), uint32(0), uint16(1), uint16(1), uint32(1), uint8(255), []byte("\x05aaaaaa\x03bbb"), []byte("\x01c"))
	f.Fuzz(func(t *testing.T, flavor uint8, waiting, running uint32, kv, blockSize uint16, numBlocks uint32, maxLoras uint8, run, wait []byte) {
		fl := Flavors()[int(flavor)%len(Flavors())]
		st := engine.Stats{
			Waiting: int(waiting % 1e6), Running: int(running % 1e6), KVUsage: float64(kv) / math.MaxUint16,
			BlockSize: int(blockSize), NumBlocks: int(numBlocks % 1e7), MaxLoras: int(maxLoras),
			RunningAdapters: adapterNames(run), WaitingAdapters: adapterNames(wait),
		}
		// Resident in GPU slots: the running adapters and the first half
		// of the waiting ones (vllm:lora_adapter_loaded).
		st.LoadedAdapters = slices.Compact(slices.Sorted(slices.Values(append(slices.Clone(st.RunningAdapters), st.WaitingAdapters[:len(st.WaitingAdapters)/2]...))))
		c := newCollector(collectorConfig{flavor: fl, model: "llama-3.1-8b", maxLen: 8192, gpuMemUtil: 0.9,
			stats: func() engine.Stats { return st }, loraOn: func() bool { return st.MaxLoras > 0 }})
		reg := prometheus.NewRegistry()
		reg.MustRegister(c)
		fams, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		var buf bytes.Buffer
		for _, mf := range fams {
			if _, err := expfmt.MetricFamilyToText(&buf, mf); err != nil {
				t.Fatal(err)
			}
		}
		s, err := tier1scrape.Parse(string(fl), bytes.NewReader(buf.Bytes()))
		if err != nil {
			t.Fatalf("scrape of the simulator's own metrics: %v\n%s", err, buf.Bytes())
		}
		if detected, err := tier1scrape.Parse("", bytes.NewReader(buf.Bytes())); err != nil || detected.Engine != string(fl) {
			t.Fatalf("flavor %s detected as %q (%v)", fl, detected.Engine, err)
		}
		m := s.Metrics
		if m.Waiting != st.Waiting || m.Running != st.Running {
			t.Fatalf("%s: waiting/running %d/%d, engine said %d/%d", fl, m.Waiting, m.Running, st.Waiting, st.Running)
		}
		if fl == FlavorTGI || fl == FlavorDynamo {
			return // TGI exports neither KV usage nor LoRA state; a Dynamo frontend no KV usage
		}
		if !m.HasKV || math.Abs(m.KVUsage-st.KVUsage) > 1e-9 {
			t.Fatalf("%s: KV %v (has %v), engine said %v", fl, m.KVUsage, m.HasKV, st.KVUsage)
		}
		if st.BlockSize > 0 && m.BlockSize != st.BlockSize || st.NumBlocks > 0 && m.NumBlocks != st.NumBlocks {
			t.Fatalf("%s: blocks %d x %d, engine said %d x %d", fl, m.NumBlocks, m.BlockSize, st.NumBlocks, st.BlockSize)
		}
		if fl == FlavorSGLang || fl == FlavorTRTLLM || st.MaxLoras == 0 {
			return
		}
		// The current vLLM adds the GPU-resident adapters that run nothing
		// (sorted) after the running ones; the legacy one has no such metric.
		active := st.RunningAdapters
		if fl == FlavorVLLM {
			var idle []string
			for _, a := range st.LoadedAdapters {
				if !slices.Contains(active, a) {
					idle = append(idle, a)
				}
			}
			active = append(slices.Clip(active), idle...)
		}
		if !m.HasLoRA || m.MaxLoras != st.MaxLoras || !slices.Equal(m.ActiveAdapters, active) || !slices.Equal(m.WaitingAdapters, st.WaitingAdapters) {
			t.Fatalf("%s: LoRA %v %q %q max %d, engine said %q (+ resident %q) %q max %d", fl, m.HasLoRA, m.ActiveAdapters, m.WaitingAdapters, m.MaxLoras,
				st.RunningAdapters, st.LoadedAdapters, st.WaitingAdapters, st.MaxLoras)
		}
	})
}
