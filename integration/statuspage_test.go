package integration

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/infergate/infergate/internal/testservice"
)

// The status pages in a real browser: Debian's chromium, headless, driven
// over the DevTools protocol (chromedp). Each test loads a tier's page
// with the token in the URL fragment, as an operator would, changes the
// fleet under it (a pod process killed, then removed by a hot-reloaded
// config; a cluster drained through the admin API) and waits for the page
// to show it without a reload. Any console error or uncaught exception
// fails the test.

// chromium finds the browser; under CI its absence fails the test (CI
// installs it: .ci/run), elsewhere it skips.
func chromium(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	if os.Getenv("CI") != "" {
		t.Fatal("chromium is not installed (apt-get install chromium); the status page tests need it")
	}
	t.Skip("chromium is not installed (apt-get install chromium)")
	return ""
}

// browser is one headless chromium tab and what its console said.
type browser struct {
	ctx context.Context

	mu   sync.Mutex
	errs []string
}

func newBrowser(t *testing.T) *browser {
	t.Helper()
	path := chromium(t)
	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(path),
		chromedp.Headless, chromedp.NoSandbox, chromedp.DisableGPU, chromedp.NoFirstRun, chromedp.NoDefaultBrowserCheck,
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1400, 1000),
	}
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel := chromedp.NewContext(actx)
	b := &browser{ctx: ctx}
	// The first use starts the browser, for the context's whole life (no
	// timeout on it): the console subscription, which sees every message
	// from here on, errors and uncaught exceptions kept.
	console := chromedp.Console(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for m, err := range console {
			if err != nil {
				return
			}
			if m.Type == chromedp.ConsoleError || m.IsException() {
				b.mu.Lock()
				b.errs = append(b.errs, fmt.Sprintf("%s (%s:%d)", m, m.URL, m.Line))
				b.mu.Unlock()
			}
		}
	}()
	t.Cleanup(func() { cancel(); <-done; cancelAlloc() })
	if err := chromedp.Do(ctx); err != nil {
		t.Fatalf("starting %s: %v", path, err)
	}
	return b
}

func (b *browser) consoleErrors() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]string(nil), b.errs...)
}

// do runs actions with a bound.
func (b *browser) do(t *testing.T, what string, actions ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 30*time.Second)
	defer cancel()
	if err := chromedp.Do(ctx, actions...); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

// js evaluates a JavaScript expression.
func js[T any](t *testing.T, b *browser, expr string) T {
	t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 30*time.Second)
	defer cancel()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[T](expr))
	if err != nil {
		t.Fatalf("evaluate %s: %v", expr, err)
	}
	return v
}

// waitJS waits until expr is true in the page.
func (b *browser) waitJS(t *testing.T, what, expr string, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		ctx, cancel := context.WithTimeout(b.ctx, 10*time.Second)
		ok, err := chromedp.Run(ctx, chromedp.Evaluate[bool](expr))
		cancel()
		if err == nil && ok {
			return
		}
		if time.Now().After(deadline) {
			text := js[string](t, b, `document.body.innerText.slice(0, 3000)`)
			t.Fatalf("waiting %s for %s (%s): err %v\npage:\n%s\nconsole errors: %q", timeout, what, expr, err, text, b.consoleErrors())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// open loads url and marks the window, so that a later check can tell the
// page was never reloaded.
func (b *browser) open(t *testing.T, url string) {
	t.Helper()
	b.do(t, "open "+url, chromedp.Navigate(url), chromedp.WaitReady(chromedp.CSS("#main")))
	js[bool](t, b, `window.__notReloaded = true`)
}

func (b *browser) checkNotReloaded(t *testing.T) {
	t.Helper()
	if !js[bool](t, b, `window.__notReloaded === true`) {
		t.Error("the page was reloaded")
	}
}

func (b *browser) checkNoConsoleErrors(t *testing.T) {
	t.Helper()
	if errs := b.consoleErrors(); len(errs) > 0 {
		t.Errorf("console errors:\n%s", strings.Join(errs, "\n"))
	}
}

// rowState is the JavaScript for the state of a table row with
// data-<attr>=name ("" when there is none).
func rowState(attr, name string) string {
	return fmt.Sprintf(`(document.querySelector('tr[data-%s=%q]') || {dataset: {state: ''}}).dataset.state`, attr, name)
}

// Tier 1's page on its metrics listener: two simulated pods (their own
// processes) and 998 configured pods that never come up, as a fleet of a
// thousand.
func TestStatusPageTier1(t *testing.T) {
	needBinary(t)
	br := newBrowser(t)
	dir := t.TempDir()
	const token = "status-page-token"
	ports := map[string]int{"sim-a": testservice.FreePort(t), "sim-b": testservice.FreePort(t)}
	sims := map[string]*proc{}
	for name, port := range ports {
		sims[name] = startProc(t, name, "sim", "--port", strconv.Itoa(port), "--time-scale", "0.05", "--log-level", "warn")
	}
	for name, port := range ports {
		waitOK(t, sims[name], fmt.Sprintf("http://127.0.0.1:%d/health", port), 30*time.Second)
	}
	addr := "127.0.0.1:" + strconv.Itoa(testservice.FreePort(t))
	metrics := "127.0.0.1:" + strconv.Itoa(testservice.FreePort(t))
	config := func(withB bool) string {
		var b strings.Builder
		fmt.Fprintf(&b, "listen: %s\nmetrics_listen: %s\ncluster: browser\nregion: lab\nauth: {tokens: [%s]}\n", addr, metrics, token)
		b.WriteString("scrape: {interval: 100ms, idle_interval: 1s, timeout: 300ms}\nreload_interval: 200ms\n")
		b.WriteString("pools:\n  - {name: llama, model: llama-3.1-8b}\n  - {name: spare, model: spare-model}\npods:\n")
		fmt.Fprintf(&b, "  - {name: sim-a, address: \"127.0.0.1:%d\", pool: llama, engine: vllm, gpu: h100}\n", ports["sim-a"])
		if withB {
			fmt.Fprintf(&b, "  - {name: sim-b, address: \"127.0.0.1:%d\", pool: llama, engine: vllm, gpu: h100}\n", ports["sim-b"])
		}
		// A closed port, each on its own loopback address (the config
		// refuses two pods on one server): these stay "not scraped", as
		// pods not up yet.
		for i := range 998 {
			fmt.Fprintf(&b, "  - {name: spare-%04d, address: \"127.1.%d.%d:1\", pool: spare, engine: vllm, gpu: a10g}\n", i, i/250, i%250+1)
		}
		return b.String()
	}
	path := dir + "/tier1.yaml"
	if err := os.WriteFile(path, []byte(config(true)), 0o600); err != nil {
		t.Fatal(err)
	}
	tier1 := startProc(t, "tier1", "tier1", "--config", path, "--log-level", "error")
	waitOK(t, tier1, "http://"+addr+"/ready", 30*time.Second)

	// A few requests, so that there are routing decisions to show.
	for i := range 3 {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		resp, body, err := httpDo(ctx, http.MethodPost, "http://"+addr+"/v1/chat/completions", token,
			fmt.Sprintf(`{"model":"llama-3.1-8b","messages":[{"role":"user","content":"hello %d"}],"max_tokens":4}`, i))
		cancel()
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("request %d: %v %v %s", i, err, resp, body)
		}
	}

	br.open(t, "http://"+metrics+"/status#token="+token)
	if hash := js[string](t, br, `location.hash`); hash != "" {
		t.Errorf("the token stayed in the address bar: %q", hash)
	}
	br.waitJS(t, "both pods listed ready", rowState("pod", "sim-a")+` === 'ready' && `+rowState("pod", "sim-b")+` === 'ready'`, 30*time.Second)
	br.waitJS(t, "a page of 50 of the 1000 pods", `document.querySelector('#pods .pager span').textContent === '1–50 of 1000' &&
		document.querySelectorAll('#pods tbody tr[data-pod]').length === 50`, 10*time.Second)
	br.waitJS(t, "pools aggregated", `document.querySelector('#pools tr[data-pool="spare"]') !== null &&
		document.querySelector('#pools tr[data-pool="spare"] td:nth-child(2)').textContent === '998'`, 10*time.Second)
	br.waitJS(t, "routing decisions listed", `document.querySelectorAll('#decision-list details[data-outcome="dispatched"]').length >= 3`, 10*time.Second)

	// The score breakdown of a decision opens in place.
	br.do(t, "open a decision", chromedp.Click(chromedp.CSS(`#decision-list details summary`), chromedp.NodeVisible))
	br.waitJS(t, "score breakdown shown", `[...document.querySelectorAll('#decision-list details[open] th')].some(th => th.textContent === 'total') &&
		[...document.querySelectorAll('#decision-list details[open] td')].some(td => td.textContent.startsWith('sim-'))`, 10*time.Second)

	// The filter box narrows the thousand pods on the server.
	br.do(t, "filter pods", chromedp.SendKeys(chromedp.CSS(`#pod-filter`), "spare-0997"))
	br.waitJS(t, "filtered to one pod", `document.querySelectorAll('#pods tbody tr[data-pod]').length === 1 && `+
		rowState("pod", "spare-0997")+` === 'not_scraped'`, 10*time.Second)
	js[bool](t, br, `(e => { e.value = ''; return e.dispatchEvent(new Event('input')); })(document.getElementById('pod-filter'))`)
	br.waitJS(t, "filter cleared", rowState("pod", "sim-b")+` === 'ready'`, 10*time.Second)

	// Kill sim-b's process: the page shows it unready, then, once the
	// config no longer lists it, gone.
	sims["sim-b"].kill(t)
	br.waitJS(t, "killed pod shown unready", rowState("pod", "sim-b")+` === 'unready'`, 30*time.Second)
	br.waitJS(t, "problem shown", `[...document.querySelectorAll('#pods tr[data-pod="sim-b"] td')].some(td => /refused|connect/.test(td.textContent))`, 10*time.Second)
	if err := os.WriteFile(path, []byte(config(false)), 0o600); err != nil {
		t.Fatal(err)
	}
	br.waitJS(t, "removed pod gone", rowState("pod", "sim-b")+` === '' && `+rowState("pod", "sim-a")+` === 'ready' &&
		document.querySelector('#pods .pager span').textContent === '1–50 of 999'`, 30*time.Second)

	br.checkNotReloaded(t)
	br.checkNoConsoleErrors(t)
}

// Tier 2's page on its admin listener: two static clusters, each a Tier 1
// with one simulated pod; one is drained through the admin API and
// restored.
func TestStatusPageTier2(t *testing.T) {
	needBinary(t)
	br := newBrowser(t)
	dir := t.TempDir()
	const tier1Token, adminToken, apiKey = "t1-token", "admin-token", "sk-browser"
	type cl struct{ name, region, addr string }
	clusters := []cl{{name: "east-a", region: "us-east"}, {name: "west-a", region: "us-west"}}
	for i := range clusters {
		c := &clusters[i]
		port := testservice.FreePort(t)
		sim := startProc(t, "sim "+c.name, "sim", "--port", strconv.Itoa(port), "--time-scale", "0.05", "--log-level", "warn")
		waitOK(t, sim, fmt.Sprintf("http://127.0.0.1:%d/health", port), 30*time.Second)
		c.addr = "127.0.0.1:" + strconv.Itoa(testservice.FreePort(t))
		cfg := fmt.Sprintf(`listen: %s
metrics_listen: "-"
cluster: %s
region: %s
auth: {tokens: [%s]}
scrape: {interval: 100ms}
pools:
  - {name: llama, model: llama-3.1-8b}
pods:
  - {name: pod-0, address: "127.0.0.1:%d", pool: llama, engine: vllm, gpu: h100}
`, c.addr, c.name, c.region, tier1Token, port)
		path := dir + "/tier1-" + c.name + ".yaml"
		if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
			t.Fatal(err)
		}
		p := startProc(t, "tier1 "+c.name, "tier1", "--config", path, "--log-level", "error")
		waitOK(t, p, "http://"+c.addr+"/ready", 30*time.Second)
	}
	addr := "127.0.0.1:" + strconv.Itoa(testservice.FreePort(t))
	admin := "http://127.0.0.1:" + strconv.Itoa(testservice.FreePort(t))
	var list strings.Builder
	for i, c := range clusters {
		fmt.Fprintf(&list, "  - {name: %s, region: %s, address: \"http://%s\", models: [llama-3.1-8b], cost: %d, cost_unit: gpu-hour, capacity: 64}\n",
			c.name, c.region, c.addr, 2+i)
	}
	cfg := fmt.Sprintf(`listen: %s
region: us-east
region_order: [us-west]
clusters:
%s
tier1:
  token: %s
  poll_interval: 200ms
admin:
  listen: %s
  token: %s
tenants:
  - id: acme
    name: ACME Corp
    limits: {rpm: 1000, concurrent: 8}
keys:
  - {tenant: acme, name: browser, key: %s}
`, addr, list.String(), tier1Token, strings.TrimPrefix(admin, "http://"), adminToken, apiKey)
	path := dir + "/tier2.yaml"
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	tier2 := startProc(t, "tier2", "tier2", "--config", path, "--log-level", "error")
	waitOK(t, tier2, "http://"+addr+"/ready", 30*time.Second)

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	resp, body, err := httpDo(ctx, http.MethodPost, "http://"+addr+"/v1/chat/completions", apiKey,
		`{"model":"llama-3.1-8b","messages":[{"role":"user","content":"hello"}],"max_tokens":4}`)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("request through tier2: %v %v %s", err, resp, body)
	}

	br.open(t, admin+"/status#token="+adminToken)
	br.waitJS(t, "both clusters listed and serving", rowState("cluster", "east-a")+` === 'ok' && `+rowState("cluster", "west-a")+` === 'ok'`, 30*time.Second)
	br.waitJS(t, "clusters grouped by region", `document.querySelector('#regions [data-region="us-east"] tr[data-cluster="east-a"]') !== null &&
		document.querySelector('#regions [data-region="us-west"] tr[data-cluster="west-a"]') !== null`, 10*time.Second)
	br.waitJS(t, "tenant usage listed", `document.querySelector('#tenants tr[data-tenant="acme"]') !== null`, 10*time.Second)
	br.waitJS(t, "services shown", `/Redis/.test(document.getElementById('services').textContent) && /Consul/.test(document.getElementById('services').textContent)`, 10*time.Second)

	// Drain east-a through the admin API: the page follows, then undo.
	resp, body, err = httpDo(ctx, http.MethodPut, admin+"/admin/v1/clusters/east-a/override", adminToken, `{"drain":true}`)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("drain: %v %v %s", err, resp, body)
	}
	br.waitJS(t, "drained cluster shown drained", rowState("cluster", "east-a")+` === 'drained' && `+rowState("cluster", "west-a")+` === 'ok'`, 20*time.Second)
	br.waitJS(t, "override shown", `/drained/.test(document.querySelector('tr[data-cluster="east-a"]').textContent)`, 10*time.Second)
	resp, body, err = httpDo(ctx, http.MethodDelete, admin+"/admin/v1/clusters/east-a/override", adminToken, "")
	if err != nil || resp.StatusCode != http.StatusNoContent {
		t.Fatalf("undrain: %v %v %s", err, resp, body)
	}
	br.waitJS(t, "cluster back in service", rowState("cluster", "east-a")+` === 'ok'`, 20*time.Second)

	br.checkNotReloaded(t)
	br.checkNoConsoleErrors(t)
}
