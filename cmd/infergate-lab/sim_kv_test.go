package main

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/infergate/infergate/tier1/kvevents"
)

// `infergate-lab sim --kv-events-*` publishes the pod's KV-cache events
// over real ZeroMQ, in either wire form, and Tier 1's subscriber indexes
// them: the blocks of a prompt sent to the pod are found by the prompt's
// token ids.
func TestSimKVEvents(t *testing.T) {
	for _, legacy := range []bool{false, true} {
		name := "tagged maps"
		if legacy {
			name = "positional arrays"
		}
		t.Run(name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			pr, pw := io.Pipe()
			var stderr syncBuffer
			// A wildcard host binds, as vLLM's tcp://*:5557 does.
			args := []string{"--port", "0", "--time-scale", "0.01", "--kv-events-endpoint", "tcp://*:0", "--kv-events-replay", "tcp://*:0"}
			if legacy {
				args = append(args, "--kv-events-legacy")
			}
			done := make(chan error, 1)
			go func() {
				err := runSim(ctx, args, pw, &stderr)
				pw.Close()
				done <- err
			}()
			defer func() {
				cancel()
				if err := <-done; err != nil {
					t.Errorf("runSim: %v", err)
				}
			}()
			rd := bufio.NewReader(pr)
			listening, err := rd.ReadString('\n')
			if err != nil {
				t.Fatalf("listening line: %v\n%s", err, stderr.String())
			}
			publishing, err := rd.ReadString('\n')
			if err != nil {
				t.Fatalf("publishing line: %v\n%s", err, stderr.String())
			}
			go io.Copy(io.Discard, pr)
			// "pod sim listening on http://127.0.0.1:PORT (...)"
			base := strings.Fields(listening)[4]
			// "pod sim publishing KV events on tcp://[::]:PORT (tagged maps, replay on tcp://[::]:PORT)"
			f := strings.Fields(publishing)
			if len(f) < 8 || f[2] != "publishing" || !strings.HasPrefix(f[6], "tcp://") {
				t.Fatalf("publishing line %q", publishing)
			}
			wantForm := "(tagged"
			if legacy {
				wantForm = "(positional"
			}
			if f[7] != wantForm || !strings.Contains(publishing, "replay on tcp://") {
				t.Errorf("publishing line %q: want the form %s and the replay address", publishing, wantForm)
			}
			_, port, _ := net.SplitHostPort(strings.TrimPrefix(f[6], "tcp://"))
			_, replayPort, _ := net.SplitHostPort(strings.TrimSuffix(strings.TrimPrefix(publishing[strings.Index(publishing, "replay on ")+len("replay on "):], "tcp://"), ")\n"))
			if port == "" || replayPort == "" {
				t.Fatalf("publishing line %q: no ports", publishing)
			}
			_, podPort, _ := net.SplitHostPort(strings.TrimPrefix(base, "http://"))

			cfg := kvevents.Config{Enabled: true}
			cfg.SetDefaults()
			idx := kvevents.NewIndex(cfg.IndexOptions())
			sub, err := kvevents.New(cfg, idx, kvevents.Options{Logger: slog.New(slog.DiscardHandler)})
			if err != nil {
				t.Fatal(err)
			}
			sub.SetTargets([]kvevents.Target{{Name: "sim", Address: "127.0.0.1:" + podPort,
				Endpoint: "tcp://127.0.0.1:" + port, ReplayEndpoint: "tcp://127.0.0.1:" + replayPort}})
			sctx, scancel := context.WithCancel(ctx)
			sdone := make(chan struct{})
			go func() { defer close(sdone); _ = sub.Run(sctx) }()
			defer func() { scancel(); <-sdone }()

			complete := func(prompt []uint32) {
				t.Helper()
				body, _ := json.Marshal(map[string]any{"model": "llama-3.1-8b", "prompt": prompt, "max_tokens": 1})
				resp, err := http.Post(base+"/v1/completions", "application/json", strings.NewReader(string(body)))
				if err != nil {
					t.Fatal(err)
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK {
					t.Fatalf("completion: %d", resp.StatusCode)
				}
			}
			tokens := func(first, n int) []uint32 {
				p := make([]uint32, n)
				for i := range p {
					p[i] = uint32(first + i)
				}
				return p
			}
			prompt := tokens(1000, 4*16+3)
			hashes := kvevents.HashTokens(prompt, 16, "")
			// The prompt is sent once: like vLLM, the pod publishes its
			// blocks when it stores them, not again on a cache hit. A
			// PUB drops what it sends before the subscription reaches it
			// (ZeroMQ's slow joiner), so that batch may never arrive
			// live; each later prompt of new tokens publishes a batch
			// whose sequence number shows the subscriber what it missed,
			// which it fetches from the pod's replay socket.
			complete(prompt)
			deadline := time.Now().Add(20 * time.Second)
			for i := 0; idx.Match(hashes, 16, []string{"sim"}, nil)[0] != len(hashes); i++ {
				if time.Now().After(deadline) {
					t.Fatalf("the prompt's blocks never reached the index (state %v)\n%s", idx.State("sim"), stderr.String())
				}
				time.Sleep(50 * time.Millisecond)
				complete(tokens(100000+i*32, 32))
			}
		})
	}
}

func TestSimKVEventsErrors(t *testing.T) {
	fleetFile := filepath.Join(t.TempDir(), "fleet.yaml")
	if err := os.WriteFile(fleetFile, []byte("pods:\n  - name: a\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"--port", "0", "--kv-events-replay", "tcp://*:5558"}, "endpoint: required"},
		{[]string{"--port", "0", "--kv-events-endpoint", "localhost:5557"}, "tcp://host:port"},
		{[]string{"--fleet", fleetFile, "--kv-events-endpoint", "tcp://*:5557"}, "--kv-events-endpoint"},
	} {
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		var stdout, stderr syncBuffer
		err := runSim(ctx, tt.args, &stdout, &stderr)
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%q: error %v, want it to contain %q", tt.args, err, tt.want)
		}
	}
}
