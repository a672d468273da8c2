package scrape

import (
	"bytes"
	"os"
	"reflect"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/infergate/infergate/tier1/picker"
)

func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func loadFixture(tb testing.TB) []byte {
	tb.Helper()
	b, err := os.ReadFile("testdata/vllm_metrics.txt")
	if err != nil {
		tb.Fatal(err)
	}
	return b
}

// sameAsReference parses page with both parsers and fails on any
// difference when the reference accepts the page.
func sameAsReference(t *testing.T, engine string, page []byte) {
	t.Helper()
	want, werr := parseExpfmt(engine, bytes.NewReader(page))
	got, gerr := Parse(engine, bytes.NewReader(page))
	if werr != nil {
		return // expfmt rejects it; the fast parser may be more lenient
	}
	if gerr != nil {
		t.Fatalf("engine %q: reference accepted, Parse failed: %v\npage:\n%q", engine, gerr, page)
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("engine %q:\n Parse     %+v\n reference %+v\npage:\n%q", engine, got, want, page)
	}
	// The in-memory path the scraper uses gives the same answers.
	inMem, err := parsePage(engine, page, nil)
	if err != nil || !reflect.DeepEqual(inMem, want) {
		t.Fatalf("engine %q:\n parsePage %+v (%v)\n reference %+v\npage:\n%q", engine, inMem, err, want, page)
	}
	// Given the last scrape's metrics (this page's, or another page's),
	// it still gives the same answer.
	for _, prev := range []*picker.Metrics{&inMem.Metrics, &otherMetrics} {
		again, err := parsePage(engine, page, prev)
		if err != nil || !reflect.DeepEqual(again, want) {
			t.Fatalf("engine %q, previous %+v:\n parsePage %+v (%v)\n reference %+v\npage:\n%q", engine, prev, again, err, want, page)
		}
	}
}

// otherMetrics is a previous scrape unlike any test page.
var otherMetrics = picker.Metrics{HasLoRA: true, ActiveAdapters: []string{"sql-lora"}, WaitingAdapters: []string{"a", "b"}}

func TestParseMatchesExpfmt(t *testing.T) {
	fixture := loadFixture(t)
	pages := map[string]string{
		"fixture": string(fixture), "vllm": vllmText, "legacy": vllmLegacyText, "sglang": sglangText, "tgi": tgiText,
		"timestamps and blanks": "  vllm:num_requests_waiting{a=\"b\"}   4   1700000000000\nvllm:num_requests_waiting\t2\n",
		"escapes":               `vllm:lora_requests_info{max_lora="2",running_lora_adapters="a\\b,c\"d",waiting_lora_adapters="x\ny"} 5` + "\n",
		"trailing comma":        "vllm:num_requests_running{a=\"1\",} 3\n",
		"quoted label":          "vllm:cache_config_info{\"block_size\"=\"32\",num_gpu_blocks=\"9\"} 1\n",
		"nan and inf":           "vllm:kv_cache_usage_perc{e=\"0\"} NaN\nvllm:kv_cache_usage_perc{e=\"1\"} +Inf\nvllm:kv_cache_usage_perc{e=\"2\"} 0.5\n",
		"only nan":              "vllm:kv_cache_usage_perc NaN\nvllm:gpu_cache_usage_perc 0.25\n",
		"no final newline":      "vllm:num_requests_waiting 7",
		"counter type":          "# TYPE vllm:num_requests_waiting counter\nvllm:num_requests_waiting 7\n",
		"crlf":                  "vllm:num_requests_waiting 7\r\n",
		"lora tie":              "vllm:lora_requests_info{running_lora_adapters=\"a\",waiting_lora_adapters=\"\"} 5\nvllm:lora_requests_info{waiting_lora_adapters=\"\",running_lora_adapters=\"b\"} 5\n",
		"cache config nan":      "vllm:cache_config_info{block_size=\"16\",num_gpu_blocks=\"100\"} NaN\n",
		"sglang cache":          "sglang:cache_config_info{page_size=\"64\",num_pages=\"12\"} 1\nsglang:token_usage 0.3\n",
		// Lines the inline skip must not drop: TYPE with extra blanks,
		// indented samples, short lines. (One engine only: on a page
		// mixing engines the reference detects in map order.)
		"odd spacing": "# TYPE  vllm:num_requests_running histogram\n#\tTYPE vllm:num_requests_waiting summary\n" +
			"\tvllm:num_requests_running 3\n  vllm:num_requests_waiting 2\n# HELP vllm:kv_cache_usage_perc x\nx 1\n",
	}
	for name, page := range pages {
		t.Run(name, func(t *testing.T) {
			for _, e := range append([]string{""}, Engines...) {
				sameAsReference(t, e, []byte(page))
			}
		})
	}
}

// The fixture is a realistic vLLM page; check what it says, not only that
// both parsers agree.
func TestParseFixture(t *testing.T) {
	s, err := Parse("", bytes.NewReader(loadFixture(t)))
	if err != nil {
		t.Fatal(err)
	}
	m := s.Metrics
	if s.Engine != EngineVLLM || m.Waiting != 3 || m.Running != 7 || m.KVUsage != 0.4375 || m.BlockSize != 16 || m.NumBlocks != 27648 ||
		!reflect.DeepEqual(m.ActiveAdapters, []string{"sql-lora", "chat-lora"}) || m.MaxLoras != 4 {
		t.Fatalf("fixture parsed as %+v", s)
	}
}

// A pooled parser must not leak state from one page into the next.
func TestParseReusesNothingAcrossPages(t *testing.T) {
	if _, err := Parse("", strings.NewReader(vllmText)); err != nil {
		t.Fatal(err)
	}
	s, err := Parse("", strings.NewReader(tgiText))
	if err != nil {
		t.Fatal(err)
	}
	if s.Engine != EngineTGI || s.Metrics.HasLoRA || s.Metrics.BlockSize != 0 {
		t.Fatalf("second page parsed as %+v", s)
	}
}

// FuzzParseMatchesExpfmt holds Parse to the expfmt-based reference: on any
// page the reference accepts, both give the same Sample for every engine.
func FuzzParseMatchesExpfmt(f *testing.F) {
	for _, s := range []string{vllmText, vllmLegacyText, sglangText, tgiText,
		"vllm:lora_requests_info{max_lora=\"4\",running_lora_adapters=\"a,b\",waiting_lora_adapters=\"\"} 1\n",
		"vllm:num_requests_waiting{a=\"\\\"\"} 1e308\nvllm:num_requests_waiting 1e308 12\n",
		"# TYPE vllm:num_requests_running histogram\nvllm:num_requests_running_bucket{le=\"+Inf\"} 1\n",
		"vllm:cache_config_info{block_size=\"16\"} 1\nvllm:cache_config_info{block_size=\"32\"} 1\n",
		"vllm:lora_adapter_loaded{adapter_name=\"c\",level=\"gpu\",pinned=\"false\"} 1\nvllm:lora_requests_info{max_lora=\"2\",running_lora_adapters=\"a\",waiting_lora_adapters=\"\"} 1\n",
		"sglang:num_queue_reqs{priority=\"\"} 3\nsglang:num_queue_reqs{priority=\"1\"} 2\nsglang:page_size 16\nsglang:num_pages 9\n",
		"trtllm_num_requests_running 2\ntrtllm_kv_cache_utilization 0.5\ntrtllm_kv_cache_tokens_per_block 32\n",
		"dynamo_frontend_inflight_requests{model=\"m\"} 4\ndynamo_frontend_queued_requests{model=\"m\"} 6\n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, page []byte) {
		for _, e := range Engines {
			sameAsReference(t, e, page)
		}
		// Detection: the reference picks among engines in map order when a
		// page mixes them, so compare only where it is deterministic.
		want, werr := parseExpfmt("", bytes.NewReader(page))
		if werr != nil {
			return
		}
		again, _ := parseExpfmt("", bytes.NewReader(page))
		got, gerr := Parse("", bytes.NewReader(page))
		if gerr != nil {
			t.Fatalf("detect: reference accepted, Parse failed: %v", gerr)
		}
		if want.Engine == again.Engine && !reflect.DeepEqual(got, want) && got.Engine == want.Engine {
			t.Fatalf("detect:\n Parse     %+v\n reference %+v", got, want)
		}
	})
}

// fixtureMetrics is the fixture page's parse, for BenchmarkParse.
var fixtureMetrics = func() picker.Metrics {
	b, err := os.ReadFile("testdata/vllm_metrics.txt")
	if err != nil {
		return picker.Metrics{}
	}
	s, _ := parsePage(EngineVLLM, b, nil)
	return s.Metrics
}()

// BenchmarkParse compares the two parsers on the fixture page.
func BenchmarkParse(b *testing.B) {
	page := loadFixture(b)
	for _, bc := range []struct {
		name  string
		parse func(string, *bytes.Reader) (Sample, error)
	}{
		{"expfmt", func(e string, r *bytes.Reader) (Sample, error) { return parseExpfmt(e, r) }},
		{"fast", func(e string, r *bytes.Reader) (Sample, error) { return Parse(e, r) }},
		{"page", func(e string, _ *bytes.Reader) (Sample, error) { return parsePage(e, page, nil) }},
		// As the scraper calls it: with the last scrape's metrics.
		{"page+prev", func(e string, _ *bytes.Reader) (Sample, error) { return parsePage(e, page, &fixtureMetrics) }},
	} {
		b.Run(bc.name, func(b *testing.B) {
			b.SetBytes(int64(len(page)))
			b.ReportAllocs()
			r := bytes.NewReader(page)
			cpu0 := processCPU()
			for b.Loop() {
				r.Reset(page)
				if _, err := bc.parse(EngineVLLM, r); err != nil {
					b.Fatal(err)
				}
			}
			// CPU time next to wall time: on a shared, oversubscribed
			// machine wall time includes waiting for a core.
			b.ReportMetric(float64(processCPU()-cpu0)/float64(b.N), "cpu-ns/op")
		})
	}
}
