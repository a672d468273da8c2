package server

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// testScale runs simulated pods 50× faster than real GPUs.
const testScale = 0.02

func quietLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// startPod serves cfg on a free loopback port for the test's lifetime.
func startPod(t *testing.T, cfg Config) *Pod {
	t.Helper()
	if cfg.TimeScale == 0 {
		cfg.TimeScale = testScale
	}
	if cfg.Logger == nil {
		cfg.Logger = quietLogger()
	}
	p, err := Listen(context.Background(), cfg, "127.0.0.1:0")
	if err != nil {
		t.Fatalf("Listen: %v", err)
	}
	t.Cleanup(func() {
		if err := p.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return p
}

// postJSON posts body (a string or a value to marshal) and returns the
// status and the response body.
func postJSON(t *testing.T, url string, body any) (int, []byte) {
	t.Helper()
	var rd io.Reader
	switch b := body.(type) {
	case string:
		rd = strings.NewReader(b)
	case []byte:
		rd = bytes.NewReader(b)
	default:
		enc, err := json.Marshal(b)
		if err != nil {
			t.Fatal(err)
		}
		rd = bytes.NewReader(enc)
	}
	resp, err := http.Post(url, "application/json", rd)
	if err != nil {
		t.Fatalf("POST %s: %v", url, err)
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("read %s: %v", url, err)
	}
	return resp.StatusCode, out
}

// scrape fetches and parses a pod's /metrics.
func scrape(t *testing.T, p *Pod) map[string]*dto.MetricFamily {
	t.Helper()
	path := p.Server.Config().Flavor.MetricsPath()
	resp, err := http.Get(p.URL + path)
	if err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: status %d", path, resp.StatusCode)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("parse /metrics: %v", err)
	}
	return fams
}

// value returns the value of the first series of a gauge or counter family,
// or of a histogram's sum; -1 when absent.
func value(fams map[string]*dto.MetricFamily, name string) float64 {
	f, ok := fams[name]
	if !ok || len(f.Metric) == 0 {
		return -1
	}
	m := f.Metric[0]
	switch {
	case m.Gauge != nil:
		return m.Gauge.GetValue()
	case m.Counter != nil:
		return m.Counter.GetValue()
	case m.Histogram != nil:
		return m.Histogram.GetSampleSum()
	case m.Untyped != nil:
		return m.Untyped.GetValue()
	}
	return -1
}

func histCount(fams map[string]*dto.MetricFamily, name string) uint64 {
	f, ok := fams[name]
	if !ok || len(f.Metric) == 0 || f.Metric[0].Histogram == nil {
		return 0
	}
	return f.Metric[0].Histogram.GetSampleCount()
}

// eventually polls cond until it holds; the deadline only guards against a
// hang, it asserts nothing about speed.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// longText is a prompt of roughly n tokens that differs per salt.
func longText(salt string, n int) string {
	var b strings.Builder
	b.WriteString(salt)
	for i := 0; i < n; i++ {
		b.WriteString(" word")
	}
	return b.String()
}

type errorBody struct {
	Error struct {
		Message string `json:"message"`
		Type    string `json:"type"`
		Code    any    `json:"code"`
	} `json:"error"`
}

func errorAs(err error, target any) bool { return errors.As(err, target) }
