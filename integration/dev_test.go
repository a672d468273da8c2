package integration

import (
	"context"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/infergate/infergate/devstack"
)

var exportRE = regexp.MustCompile(`(?m)^export (OPENAI_BASE_URL|OPENAI_API_KEY|INFERGATE_ADMIN_URL|INFERGATE_ADMIN_TOKEN)=(\S+)$`)

// TestDev runs `infergate-lab dev` as a developer would, takes the exports it
// prints, and points the OpenAI client at them through the environment
// alone, as `export` then a script would. Ctrl-C must stop it cleanly.
func TestDev(t *testing.T) {
	needBinary(t)
	p := startProc(t, "dev", "dev", "--port", "0", "--admin-port", "0", "--time-scale", "0.05")
	vars := map[string]string{}
	waitFor(t, "infergate-lab dev to print its exports", 60*time.Second, func() error {
		if p.exited() {
			t.Fatalf("infergate-lab dev exited: %v\n%s", p.err, tail(p.logs.String(), 20))
		}
		for _, m := range exportRE.FindAllStringSubmatch(p.stdout.String(), -1) {
			vars[m[1]] = m[2]
		}
		if len(vars) < 4 {
			return fmt.Errorf("got %v", vars)
		}
		return nil
	})
	if !strings.HasPrefix(vars["OPENAI_BASE_URL"], "http://127.0.0.1:") || !strings.HasSuffix(vars["OPENAI_BASE_URL"], "/v1") {
		t.Errorf("OPENAI_BASE_URL=%s", vars["OPENAI_BASE_URL"])
	}
	if !strings.Contains(p.stdout.String(), "curl ") {
		t.Errorf("no sample curl printed:\n%s", p.stdout.String())
	}
	t.Setenv("OPENAI_BASE_URL", vars["OPENAI_BASE_URL"])
	t.Setenv("OPENAI_API_KEY", vars["OPENAI_API_KEY"])
	client := openai.NewClient(option.WithMaxRetries(0), option.WithRequestTimeout(20*time.Second))

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
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
