package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// binary is the production infergate binary (tier1, tier2, version) and
// labBinary the infergate-lab binary (sim, dev, bench, loadbench), both
// built once by TestMain ("" under -short).
var binary, labBinary string

// labCommands are the subcommands of infergate-lab; startProc runs them from
// labBinary.
var labCommands = map[string]bool{"sim": true, "dev": true, "bench": true, "experiment": true, "report": true, "loadbench": true}

func TestMain(m *testing.M) {
	flag.Parse()
	os.Exit(runMain(m))
}

func runMain(m *testing.M) int {
	if testing.Short() {
		return m.Run() // every test skips itself
	}
	dir, err := os.MkdirTemp("", "infergate-integration-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "integration:", err)
		return 1
	}
	defer os.RemoveAll(dir)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	for _, b := range []struct {
		path *string
		name string
	}{{&binary, "infergate"}, {&labBinary, "infergate-lab"}} {
		out := filepath.Join(dir, b.name)
		// The package directory is integration/; the commands are one level up.
		cmd := exec.CommandContext(ctx, "go", "build", "-o", out, "../cmd/"+b.name)
		cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
		if err := cmd.Run(); err != nil {
			fmt.Fprintf(os.Stderr, "integration: building %s: %v\n", b.name, err)
			return 1
		}
		*b.path = out
	}
	return m.Run()
}

// needBinary skips the test under -short.
func needBinary(t *testing.T) {
	t.Helper()
	if testing.Short() || binary == "" || labBinary == "" {
		t.Skip("integration suite: skipped under -short")
	}
}

// syncBuffer is a bytes.Buffer safe for a process writing while the test
// reads.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// proc is one running infergate process in its own process group.
type proc struct {
	name   string
	cmd    *exec.Cmd
	stdout *syncBuffer
	logs   *syncBuffer // stderr
	done   chan struct{}
	err    error // valid after done
}

// startProc runs the infergate binary with args, or infergate-lab for its
// subcommands (sim, dev, ...). It is killed (with its process group) at
// cleanup; on failure its output is logged.
func startProc(t *testing.T, name string, args ...string) *proc {
	t.Helper()
	p := &proc{name: name, stdout: &syncBuffer{}, logs: &syncBuffer{}, done: make(chan struct{})}
	bin := binary
	if len(args) > 0 && labCommands[args[0]] {
		bin = labBinary
	}
	p.cmd = exec.Command(bin, args...)
	p.cmd.Stdout, p.cmd.Stderr = p.stdout, p.logs
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	go func() {
		p.err = p.cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		p.kill(t)
		if t.Failed() {
			t.Logf("--- %s stdout:\n%s\n--- %s stderr (tail):\n%s", name, p.stdout.String(), name, tail(p.logs.String(), 40))
		}
	})
	return p
}

// kill SIGKILLs the process group and waits for the process.
func (p *proc) kill(t *testing.T) {
	t.Helper()
	select {
	case <-p.done:
		return
	default:
	}
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		t.Errorf("%s did not exit after SIGKILL", p.name)
	}
}

// interrupt sends SIGINT (Ctrl-C) and waits up to timeout for a clean exit.
func (p *proc) interrupt(t *testing.T, timeout time.Duration) error {
	t.Helper()
	if err := p.cmd.Process.Signal(os.Interrupt); err != nil {
		return err
	}
	select {
	case <-p.done:
		return p.err
	case <-time.After(timeout):
		return fmt.Errorf("%s still running %s after SIGINT", p.name, timeout)
	}
}

func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// waitFor polls cond every 50ms until it returns nil or timeout passes.
func waitFor(t *testing.T, what string, timeout time.Duration, cond func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		err := cond()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("waiting %s for %s: %v", timeout, what, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// waitOK waits until url answers 200, failing early if p exits.
func waitOK(t *testing.T, p *proc, url string, timeout time.Duration) {
	t.Helper()
	client := &http.Client{Timeout: time.Second}
	waitFor(t, url, timeout, func() error {
		if p != nil && p.exited() {
			t.Fatalf("%s exited: %v\n%s", p.name, p.err, tail(p.logs.String(), 20))
		}
		resp, err := client.Get(url)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			b, _ := io.ReadAll(resp.Body)
			return fmt.Errorf("%s: %s", resp.Status, b)
		}
		return nil
	})
}

// httpDo sends a JSON request and returns the response with its body read.
func httpDo(ctx context.Context, method, url, token string, body string) (*http.Response, []byte, error) {
	var r io.Reader
	if body != "" {
		r = strings.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, url, r)
	if err != nil {
		return nil, nil, err
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return resp, b, errors.Join(errors.New("reading body"), err)
	}
	return resp, b, nil
}

// adminGetAt GETs an admin API path (under /admin/v1) and decodes the JSON
// answer into v.
func adminGetAt(ctx context.Context, baseURL, token, path string, v any) error {
	resp, b, err := httpDo(ctx, http.MethodGet, baseURL+"/admin/v1"+path, token, "")
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s: %s", path, resp.Status, b)
	}
	return json.Unmarshal(b, v)
}
