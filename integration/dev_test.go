package integration

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/infergate/infergate/devstack"
)

var (
	exportRE = regexp.MustCompile(`(?m)^export (OPENAI_BASE_URL|OPENAI_API_KEY|INFERGATE_ADMIN_URL|INFERGATE_ADMIN_TOKEN|INFERGATE_TIER1_TOKEN)=(\S+)$`)
	// bannerURLRE is a URL line of the banner: a label, then the URL.
	bannerURLRE = regexp.MustCompile(`(?m)^ +(OpenAI API|admin API|status page|metrics|API|pod) +(?:(\S+) )?(http://\S+)`)
	anyURLRE    = regexp.MustCompile(`http://\S+`)
)

// freePortBase finds a base port whose dev-stack ports (base..base+2,
// base+10..base+17) are all free now. Another process could take one
// before the stack binds it; the ports are drawn at random from a range
// below Linux's ephemeral ports to make that unlikely.
func freePortBase(t *testing.T) int {
	t.Helper()
	offsets := []int{0, 1, 2}
	for i := 10; i < 18; i++ {
		offsets = append(offsets, i)
	}
	for range 50 {
		base := 20000 + 20*rand.IntN(600) // 20000..31980
		ok := true
		for _, o := range offsets {
			ln, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(base+o))
			if err != nil {
				ok = false
				break
			}
			ln.Close()
		}
		if ok {
			return base
		}
	}
	t.Fatal("no free port base")
	return 0
}

// TestDev runs `infergate-lab dev` as a developer would, on ports given to
// it (--port-base; `make run PORT_BASE=...` passes it), and checks what it
// prints: it starts quietly (nothing on stderr: warnings are summarised in
// the banner), every URL it prints answers as printed (the status pages
// with the token in their fragment, which then opens their JSON), and the
// exports it prints work with the OpenAI client through the environment
// alone. Ctrl-C must stop it cleanly.
func TestDev(t *testing.T) {
	needBinary(t)
	base := freePortBase(t)
	p := startProc(t, "dev", "dev", "--port-base", strconv.Itoa(base), "--time-scale", "0.05")
	vars := map[string]string{}
	waitFor(t, "infergate-lab dev to print its exports", 60*time.Second, func() error {
		if p.exited() {
			t.Fatalf("infergate-lab dev exited: %v\n%s", p.err, tail(p.logs.String(), 20))
		}
		for _, m := range exportRE.FindAllStringSubmatch(p.stdout.String(), -1) {
			vars[m[1]] = m[2]
		}
		if len(vars) < 5 {
			return fmt.Errorf("got %v", vars)
		}
		return nil
	})
	banner := p.stdout.String()
	if logs := strings.TrimSpace(p.logs.String()); logs != "" {
		t.Errorf("stderr at start, want nothing (warnings belong in the banner's summary):\n%s", logs)
	}
	if want := fmt.Sprintf("http://127.0.0.1:%d/v1", base); vars["OPENAI_BASE_URL"] != want {
		t.Errorf("OPENAI_BASE_URL=%s, want %s", vars["OPENAI_BASE_URL"], want)
	}
	if !strings.Contains(banner, "curl ") {
		t.Errorf("no sample curl printed:\n%s", banner)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	get := func(u, token string) (*http.Response, string) {
		t.Helper()
		resp, b, err := httpDo(ctx, http.MethodGet, u, token, "")
		if err != nil {
			t.Fatalf("GET %s: %v", u, err)
		}
		if resp.StatusCode != http.StatusOK {
			t.Errorf("GET %s: %s: %.300s", u, resp.Status, b)
		}
		return resp, string(b)
	}
	basePorts := map[int]bool{base: true, base + 1: true, base + 2: true}
	for i := range 4 {
		basePorts[base+10+2*i], basePorts[base+11+2*i] = true, true
	}
	printed := map[int]bool{}
	count := map[string]int{}
	for _, m := range bannerURLRE.FindAllStringSubmatch(banner, -1) {
		label, raw := m[1], m[3]
		count[label]++
		u, err := url.Parse(raw)
		if err != nil {
			t.Fatalf("%s %q: %v", label, raw, err)
		}
		port, _ := strconv.Atoi(u.Port())
		if label != "pod" { // pods take free ports; everything else is laid out from the base
			if !basePorts[port] {
				t.Errorf("%s %s: port %d is not one of the base's", label, raw, port)
			}
			printed[port] = true
		}
		switch label {
		case "OpenAI API":
			if _, b := get(raw+"/models", vars["OPENAI_API_KEY"]); !strings.Contains(b, devstack.QwenModel) {
				t.Errorf("%s/models: %.300s", raw, b)
			}
		case "admin API":
			get(raw+"clusters", vars["INFERGATE_ADMIN_TOKEN"])
			get(vars["INFERGATE_ADMIN_URL"]+"/openapi.json", "")
		case "status page":
			token, ok := strings.CutPrefix(u.Fragment, "token=")
			if !ok || token == "" {
				t.Errorf("status page %s: no token in the fragment", raw)
			}
			// The browser sends the address without its fragment.
			resp, b := get(strings.TrimSuffix(raw, "#"+u.Fragment), "")
			if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/html") || !strings.Contains(b, "<script") {
				t.Errorf("status page %s: %s %.200s", raw, ct, b)
			}
			// The page's script reads its JSON with the fragment's token.
			root := u.Scheme + "://" + u.Host
			if root == vars["INFERGATE_ADMIN_URL"] {
				get(root+"/admin/v1/clusters", token)
			} else {
				get(root+"/status/api/summary", token)
			}
		case "metrics":
			if _, b := get(raw, ""); !strings.Contains(b, "infergate_") {
				t.Errorf("%s: no infergate_ series", raw)
			}
		case "API":
			if _, b := get(raw+"/models", vars["INFERGATE_TIER1_TOKEN"]); !strings.Contains(b, devstack.LlamaModel) {
				t.Errorf("%s/models: %.300s", raw, b)
			}
		case "pod":
			get(raw+"/v1/models", "")
		}
	}
	if count["OpenAI API"] != 1 || count["admin API"] != 1 || count["status page"] != 5 || count["metrics"] != 5 || count["API"] != 4 || count["pod"] < 8 {
		t.Errorf("banner URLs by label %v, want 1 OpenAI API, 1 admin API, 5 status pages, 5 metrics, 4 Tier 1 APIs, 8+ pods:\n%s", count, banner)
	}
	if len(printed) != len(basePorts) {
		t.Errorf("printed ports %v, want all of %v", printed, basePorts)
	}
	// Every URL printed above the exports is one of those checked.
	listed := 0
	for _, line := range strings.Split(banner, "\n") {
		if strings.HasPrefix(line, "export ") || strings.HasPrefix(line, "curl ") {
			continue
		}
		listed += len(anyURLRE.FindAllString(line, -1))
	}
	if checked := len(bannerURLRE.FindAllString(banner, -1)); listed != checked+1 { // +1: admin API's openapi.json
		t.Errorf("%d URLs printed, %d checked:\n%s", listed, checked+1, banner)
	}

	t.Setenv("OPENAI_BASE_URL", vars["OPENAI_BASE_URL"])
	t.Setenv("OPENAI_API_KEY", vars["OPENAI_API_KEY"])
	client := openai.NewClient(option.WithMaxRetries(0), option.WithRequestTimeout(20*time.Second))
	c, err := client.Chat.Completions.New(ctx, chatParams(devstack.LlamaModel))
	if err != nil {
		t.Fatal(err)
	}
	if len(c.Choices) == 0 || c.Choices[0].Message.Content == "" || c.Usage.TotalTokens == 0 {
		t.Fatalf("answer %+v", c)
	}
	params := chatParams(devstack.LlamaModel)
	params.StreamOptions = openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)}
	stream := client.Chat.Completions.NewStreaming(ctx, params)
	var acc openai.ChatCompletionAccumulator
	for stream.Next() {
		acc.AddChunk(stream.Current())
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	if acc.Usage.TotalTokens == 0 {
		t.Errorf("stream without usage")
	}

	// The printed admin URL and token work.
	var tenant struct{ ID string }
	if err := adminGetAt(ctx, vars["INFERGATE_ADMIN_URL"], vars["INFERGATE_ADMIN_TOKEN"], "/tenants/"+devstack.TenantID, &tenant); err != nil || tenant.ID != devstack.TenantID {
		t.Errorf("admin tenant %+v: %v", tenant, err)
	}

	if err := p.interrupt(t, 20*time.Second); err != nil {
		t.Fatalf("infergate-lab dev after Ctrl-C: %v\n%s", err, tail(p.logs.String(), 20))
	}
}
