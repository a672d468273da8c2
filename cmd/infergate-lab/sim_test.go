package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// syncBuffer is a bytes.Buffer safe for the concurrent writes of runSim's
// logger and the reads of the test.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func TestSimErrors(t *testing.T) {
	fleetFile := filepath.Join(t.TempDir(), "fleet.yaml")
	if err := os.WriteFile(fleetFile, []byte("pods:\n  - name: a\n    gpu: h100\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	// pod gives single-pod args port 0, so that a case that wrongly gets
	// as far as listening cannot collide with anything.
	pod := func(args ...string) []string { return append([]string{"--port", "0"}, args...) }
	tests := []struct {
		name string
		args []string
		// wantIs is checked with errors.Is; otherwise every wantText
		// substring must be in the error.
		wantIs   error
		wantText []string
	}{
		{name: "help", args: []string{"--help"}, wantIs: flag.ErrHelp},
		{name: "bad gpu", args: pod("--gpu", "b200x"), wantText: []string{`"b200x"`, "h100", "a10g"}},
		{name: "bad model", args: pod("--model", "gpt-9"), wantText: []string{`"gpt-9"`, "llama-3.1-8b", "qwen3-32b"}},
		{name: "bad engine", args: pod("--engine", "triton"), wantText: []string{`"triton"`, "vllm", "sglang", "tgi"}},
		{name: "fleet with --gpu", args: []string{"--fleet", fleetFile, "--gpu", "a10g"}, wantText: []string{"--gpu", fleetFile}},
		{name: "fleet with --model", args: []string{"--fleet", fleetFile, "--model", "llama-3.1-8b"}, wantText: []string{"--model", fleetFile}},
		{name: "fleet with --engine", args: []string{"--fleet", fleetFile, "--engine", "tgi"}, wantText: []string{"--engine", fleetFile}},
		{name: "fleet with --port", args: []string{"--fleet", fleetFile, "--port", "0"}, wantText: []string{"--port", fleetFile}},
		{name: "fleet with --lora-modules", args: []string{"--fleet", fleetFile, "--lora-modules", "sql"}, wantText: []string{"--lora-modules", fleetFile}},
		{name: "zero time scale", args: pod("--time-scale", "0"), wantText: []string{"--time-scale"}},
		{name: "stray argument", args: pod("extra"), wantText: []string{"extra"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// A cancelled context: a case that wrongly starts a pod returns
			// (and fails below) instead of serving forever.
			ctx, cancel := context.WithCancel(context.Background())
			cancel()
			var stdout, stderr syncBuffer
			err := runSim(ctx, tt.args, &stdout, &stderr)
			if err == nil {
				t.Fatalf("runSim %q succeeded; stdout:\n%s", tt.args, stdout.String())
			}
			if tt.wantIs != nil && !errors.Is(err, tt.wantIs) {
				t.Errorf("error = %v, want %v", err, tt.wantIs)
			}
			for _, want := range tt.wantText {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q does not mention %q", err, want)
				}
			}
			if s := stdout.String(); s != "" {
				t.Errorf("stdout = %q, want nothing (no pod should have started)", s)
			}
		})
	}
}

// TestSimServes starts real pods on free ports, talks to them over HTTP and
// stops them by cancelling the context, as Ctrl-C does.
func TestSimServes(t *testing.T) {
	tests := []struct {
		name      string
		args      []string
		model     string // what clients send
		wantBlurb string // in the "listening" line
	}{
		{"defaults", nil, "llama-3.1-8b", "(model llama-3.1-8b, gpu h100 x1, engine vllm)"},
		{"sglang on a10g, served name", []string{"--engine", "sglang", "--gpu", "a10g", "--served-model-name", "my-llama"}, "my-llama", "(model my-llama, gpu a10g x1, engine sglang)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			// A pipe rather than a buffer: the test reads the address as
			// soon as runSim prints it, without polling.
			pr, pw := io.Pipe()
			var stderr syncBuffer
			// The time scale makes the simulated generation 100× faster
			// than real time so the request returns quickly.
			args := append([]string{"--port", "0", "--time-scale", "0.01"}, tt.args...)
			done := make(chan error, 1)
			go func() {
				err := runSim(ctx, args, pw, &stderr)
				pw.Close()
				done <- err
			}()

			line, err := bufio.NewReader(pr).ReadString('\n')
			if err != nil {
				cancel()
				t.Fatalf("reading the listening line: %v (runSim: %v)\nstderr:\n%s", err, <-done, stderr.String())
			}
			// Keep draining so that a later write cannot block runSim.
			go io.Copy(io.Discard, pr)
			if !strings.Contains(line, tt.wantBlurb) {
				t.Errorf("listening line %q lacks %q", line, tt.wantBlurb)
			}
			// "pod sim listening on http://127.0.0.1:PORT (...)"
			f := strings.Fields(line)
			if len(f) < 5 || !strings.HasPrefix(f[4], "http://127.0.0.1:") || strings.HasSuffix(f[4], ":0") {
				t.Fatalf("no address in %q", line)
			}
			base := f[4]

			resp, err := http.Get(base + "/health")
			if err != nil {
				t.Fatalf("GET /health: %v", err)
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				t.Errorf("GET /health = %d, want 200", resp.StatusCode)
			}

			body := `{"model":"` + tt.model + `","messages":[{"role":"user","content":"hello"}],"max_tokens":4}`
			resp, err = http.Post(base+"/v1/chat/completions", "application/json", strings.NewReader(body))
			if err != nil {
				t.Fatalf("POST /v1/chat/completions: %v", err)
			}
			var chat struct {
				Model   string `json:"model"`
				Choices []struct {
					Message struct {
						Role    string `json:"role"`
						Content string `json:"content"`
					} `json:"message"`
				} `json:"choices"`
				Usage struct {
					CompletionTokens int `json:"completion_tokens"`
				} `json:"usage"`
			}
			err = json.NewDecoder(resp.Body).Decode(&chat)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK || err != nil {
				t.Fatalf("chat completion: status %d, decode: %v", resp.StatusCode, err)
			}
			if chat.Model != tt.model || len(chat.Choices) != 1 || chat.Choices[0].Message.Role != "assistant" ||
				chat.Choices[0].Message.Content == "" || chat.Usage.CompletionTokens != 4 {
				t.Errorf("chat completion = %+v", chat)
			}

			cancel()
			// The bound only keeps a broken shutdown from hanging the
			// suite; it asserts nothing about speed.
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("runSim after cancel: %v", err)
				}
			case <-time.After(time.Minute):
				t.Fatal("runSim did not return after its context was cancelled")
			}
			// Stopped cleanly means the listener is gone too.
			if resp, err := http.Get(base + "/health"); err == nil {
				resp.Body.Close()
				t.Errorf("%s still answers after shutdown", base)
			}
		})
	}
}
