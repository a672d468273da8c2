package integration

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/infergate/infergate/devstack"
)

func (s *stack) client(key string) openai.Client {
	return openai.NewClient(option.WithBaseURL(s.tier2URL+"/v1"), option.WithAPIKey(key),
		option.WithMaxRetries(0), option.WithRequestTimeout(20*time.Second))
}

func chatParams(model string) openai.ChatCompletionNewParams {
	return openai.ChatCompletionNewParams{
		Model:     model,
		Messages:  []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Say something about GPUs.")},
		MaxTokens: openai.Int(8),
	}
}

// TestEndToEnd drives the whole topology (OpenAI client → Tier 2 → Tier 1 →
// simulated pod) with every component a separate process, Redis and Consul
// real. The subtests share one stack and run in order; the last one changes
// Consul and puts it back.
func TestEndToEnd(t *testing.T) {
	s := startStack(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	client := s.client(s.apiKey)

	t.Run("chat", func(t *testing.T) {
		var resp *http.Response
		c, err := client.Chat.Completions.New(ctx, chatParams(devstack.LlamaModel), option.WithResponseInto(&resp))
		if err != nil {
			t.Fatal(err)
		}
		if len(c.Choices) == 0 || c.Choices[0].Message.Content == "" {
			t.Fatalf("empty answer: %+v", c)
		}
		if c.Usage.CompletionTokens == 0 || c.Usage.PromptTokens == 0 {
			t.Errorf("usage %+v", c.Usage)
		}
		if got := resp.Header.Get("X-Infergate-Cluster"); got != "cluster-a" {
			t.Errorf("served by %q, want the cheapest cluster, cluster-a", got)
		}
	})

	t.Run("stream with usage", func(t *testing.T) {
		p := chatParams(devstack.LlamaModel)
		p.StreamOptions = openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)}
		stream := client.Chat.Completions.NewStreaming(ctx, p)
		var acc openai.ChatCompletionAccumulator
		chunks := 0
		for stream.Next() {
			acc.AddChunk(stream.Current())
			chunks++
		}
		if err := stream.Err(); err != nil {
			t.Fatal(err)
		}
		if chunks < 2 || len(acc.Choices) == 0 || acc.Choices[0].Message.Content == "" {
			t.Fatalf("%d chunks, accumulated %+v", chunks, acc.ChatCompletion)
		}
		if acc.Usage.CompletionTokens == 0 || acc.Usage.TotalTokens == 0 {
			t.Errorf("no usage in the stream: %+v", acc.Usage)
		}
	})

	t.Run("stream without usage", func(t *testing.T) {
		// Tier 2 asks Tier 1 for usage (for the limiter) but must not show
		// the client a chunk it did not ask for.
		stream := client.Chat.Completions.NewStreaming(ctx, chatParams(devstack.LlamaModel))
		content := ""
		for stream.Next() {
			ch := stream.Current()
			if len(ch.Choices) == 0 {
				t.Errorf("chunk without choices (usage chunk leaked?): %s", ch.RawJSON())
			} else {
				content += ch.Choices[0].Delta.Content
			}
		}
		if err := stream.Err(); err != nil {
			t.Fatal(err)
		}
		if content == "" {
			t.Error("no content streamed")
		}
	})

	t.Run("completions", func(t *testing.T) {
		c, err := client.Completions.New(ctx, openai.CompletionNewParams{
			Model: devstack.LlamaModel, Prompt: openai.CompletionNewParamsPromptUnion{OfString: openai.String("GPUs are")},
			MaxTokens: openai.Int(6),
		})
		if err != nil {
			t.Fatal(err)
		}
		if len(c.Choices) == 0 || c.Choices[0].Text == "" {
			t.Fatalf("empty completion: %+v", c)
		}
	})

	t.Run("models and adapters", func(t *testing.T) {
		page, err := client.Models.List(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var ids []string
		for _, m := range page.Data {
			ids = append(ids, m.ID)
		}
		for _, want := range []string{devstack.LlamaModel, devstack.QwenModel, devstack.SQLLoRA, devstack.SupportLoRA} {
			if !slices.Contains(ids, want) {
				t.Errorf("models %v lack %s", ids, want)
			}
		}
		// Qwen3-32B is served by cluster-b only; an adapter by its clusters.
		for model, clusters := range map[string][]string{
			devstack.QwenModel:   {"cluster-b"},
			devstack.SupportLoRA: {"cluster-a", "cluster-d"},
		} {
			var resp *http.Response
			if _, err := client.Chat.Completions.New(ctx, chatParams(model), option.WithResponseInto(&resp)); err != nil {
				t.Fatalf("%s: %v", model, err)
			}
			if got := resp.Header.Get("X-Infergate-Cluster"); !slices.Contains(clusters, got) {
				t.Errorf("%s served by %q, want one of %v", model, got, clusters)
			}
		}
	})

	t.Run("wrong key", func(t *testing.T) {
		wrong := s.client("sk-wrong")
		_, err := wrong.Chat.Completions.New(ctx, chatParams(devstack.LlamaModel))
		var apiErr *openai.Error
		if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusUnauthorized {
			t.Fatalf("err %v, want 401", err)
		}
	})

	t.Run("quota from admin API", func(t *testing.T) { testQuota(ctx, t, s) })
	t.Run("consul discovery", func(t *testing.T) { testConsulDiscovery(t, s) })
}

// testQuota creates a tenant and a key through the admin API, sets a
// requests-per-minute limit there, and checks Tier 2 enforces it with a 429
// carrying Retry-After.
func testQuota(ctx context.Context, t *testing.T, s *stack) {
	admin := func(method, path, body string, want int) []byte {
		t.Helper()
		resp, b, err := httpDo(ctx, method, s.adminURL+"/admin/v1"+path, s.adminToken, body)
		if err != nil {
			t.Fatalf("%s %s: %v", method, path, err)
		}
		if resp.StatusCode != want {
			t.Fatalf("%s %s: %s, want %d: %s", method, path, resp.Status, want, b)
		}
		return b
	}
	admin("POST", "/tenants", `{"id":"quota-it","name":"Quota test"}`, http.StatusCreated)
	var key struct {
		Key string `json:"key"`
	}
	if err := json.Unmarshal(admin("POST", "/tenants/quota-it/keys", `{"name":"it"}`, http.StatusCreated), &key); err != nil || key.Key == "" {
		t.Fatalf("created key: %q, %v", key.Key, err)
	}
	// Unlimited at first: the new key works.
	if resp, b, err := s.chat(ctx, key.Key, devstack.LlamaModel); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("first request with the new key: %v %v %s", err, resp, b)
	}
	const rpm = 2
	admin("PUT", "/tenants/quota-it/limits", fmt.Sprintf(`{"limits":{"rpm":%d}}`, rpm), http.StatusOK)

	ok := 0
	for i := range 2*rpm + 4 {
		resp, b, err := s.chat(ctx, key.Key, devstack.LlamaModel)
		if err != nil {
			t.Fatal(err)
		}
		switch resp.StatusCode {
		case http.StatusOK:
			ok++
			continue
		case http.StatusTooManyRequests:
		default:
			t.Fatalf("request %d: %s: %s", i, resp.Status, b)
		}
		var e struct {
			Error struct{ Code string } `json:"error"`
		}
		_ = json.Unmarshal(b, &e)
		ra, err := strconv.Atoi(resp.Header.Get("Retry-After"))
		// A minute's window plus the limiter's lease time, at most.
		if err != nil || ra <= 0 || ra > 120 {
			t.Errorf("Retry-After %q, want whole seconds, at most about a minute", resp.Header.Get("Retry-After"))
		}
		if e.Error.Code != "rate_limit_exceeded" {
			t.Errorf("429 code %q, want rate_limit_exceeded: %s", e.Error.Code, b)
		}
		if ok > rpm {
			t.Errorf("%d requests admitted after setting rpm %d", ok, rpm)
		}
		// The usage endpoint sees the same limit.
		var u struct {
			Scopes []struct {
				RPM struct{ Used, Limit int } `json:"rpm"`
			} `json:"scopes"`
		}
		if err := json.Unmarshal(admin("GET", "/tenants/quota-it/usage", "", http.StatusOK), &u); err != nil || len(u.Scopes) == 0 || u.Scopes[0].RPM.Limit != rpm {
			t.Errorf("usage %+v (%v), want an rpm limit of %d", u, err, rpm)
		}
		return
	}
	t.Fatalf("no 429 after %d requests with rpm %d (%d admitted)", 2*rpm+4, rpm, ok)
}

// testConsulDiscovery stops the cheapest cluster's Tier 1 cleanly (it
// deregisters from Consul) and starts a new one: Tier 2, which has no static
// cluster list, follows Consul both ways.
func testConsulDiscovery(t *testing.T, s *stack) {
	if err := s.tier1["cluster-a"].interrupt(t, 40*time.Second); err != nil {
		t.Fatalf("stopping cluster-a's tier1: %v", err)
	}
	waitFor(t, "traffic to leave cluster-a", 20*time.Second, func() error {
		rctx, rcancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer rcancel()
		resp, b, err := s.chat(rctx, s.apiKey, devstack.LlamaModel)
		if err != nil {
			return err
		}
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("request while cluster-a leaves: %s: %s", resp.Status, b)
		}
		if got := resp.Header.Get("X-Infergate-Cluster"); got == "cluster-a" {
			return fmt.Errorf("still served by %s", got)
		}
		return nil
	})
	s.runTier1(t, "cluster-a")
	s.waitServedBy(t, "cluster-a", 30*time.Second)
}
