package server

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
)

func newClient(p *Pod) openai.Client {
	return openai.NewClient(
		option.WithBaseURL(p.URL+"/v1/"),
		option.WithAPIKey("sim"),
		option.WithMaxRetries(0),
	)
}

// TestOpenAIClient drives a pod with the official OpenAI Go SDK.
func TestOpenAIClient(t *testing.T) {
	p := startPod(t, Config{
		ServedModelName: "llama",
		LoRAModules:     []LoRAModule{{Name: "sql-lora", Path: "/adapters/sql"}},
		MaxLoras:        2,
	})
	c := newClient(p)
	ctx := context.Background()

	t.Run("chat", func(t *testing.T) {
		resp, err := c.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{
			Model:     "llama",
			Messages:  []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Say hello")},
			MaxTokens: openai.Int(12),
		})
		if err != nil {
			t.Fatal(err)
		}
		if len(resp.Choices) != 1 || resp.Choices[0].Message.Content == "" {
			t.Fatalf("choices = %+v", resp.Choices)
		}
		if got := resp.Choices[0].FinishReason; got != "length" {
			t.Errorf("finish_reason = %q, want length", got)
		}
		if resp.Usage.CompletionTokens != 12 || resp.Usage.PromptTokens == 0 ||
			resp.Usage.TotalTokens != resp.Usage.PromptTokens+12 {
			t.Errorf("usage = %+v", resp.Usage)
		}
		if n := len(strings.Fields(resp.Choices[0].Message.Content)); n != 12 {
			t.Errorf("content has %d words, want one per token (12)", n)
		}
		if resp.Model != "llama" || !strings.HasPrefix(resp.ID, "chatcmpl-") {
			t.Errorf("model %q id %q", resp.Model, resp.ID)
		}
	})

	t.Run("chat default length stops", func(t *testing.T) {
		resp, err := c.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{
			Model:    "llama",
			Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Say hello")},
		})
		if err != nil {
			t.Fatal(err)
		}
		if resp.Choices[0].FinishReason != "stop" || resp.Usage.CompletionTokens != DefaultOutputTokens {
			t.Errorf("finish %q tokens %d", resp.Choices[0].FinishReason, resp.Usage.CompletionTokens)
		}
	})

	t.Run("chat streaming with usage", func(t *testing.T) {
		stream := c.Chat.Completions.NewStreaming(ctx, openai.ChatCompletionNewParams{
			Model:               "llama",
			Messages:            []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Stream please")},
			MaxCompletionTokens: openai.Int(20),
			StreamOptions:       openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)},
		})
		var acc openai.ChatCompletionAccumulator
		chunks := 0
		for stream.Next() {
			acc.AddChunk(stream.Current())
			chunks++
		}
		if err := stream.Err(); err != nil {
			t.Fatal(err)
		}
		if len(acc.Choices) != 1 || len(strings.Fields(acc.Choices[0].Message.Content)) != 20 {
			t.Fatalf("accumulated %+v", acc.Choices)
		}
		if acc.Choices[0].FinishReason != "length" {
			t.Errorf("finish_reason = %q", acc.Choices[0].FinishReason)
		}
		if acc.Usage.CompletionTokens != 20 || acc.Usage.PromptTokens == 0 {
			t.Errorf("usage = %+v", acc.Usage)
		}
		// role chunk + 20 token chunks + finish chunk + usage chunk
		if chunks != 23 {
			t.Errorf("chunks = %d, want 23", chunks)
		}
	})

	t.Run("completion", func(t *testing.T) {
		resp, err := c.Completions.New(ctx, openai.CompletionNewParams{
			Model:     "llama",
			Prompt:    openai.CompletionNewParamsPromptUnion{OfString: openai.String("Once upon a time")},
			MaxTokens: openai.Int(7),
		})
		if err != nil {
			t.Fatal(err)
		}
		if len(resp.Choices) != 1 || len(strings.Fields(resp.Choices[0].Text)) != 7 {
			t.Fatalf("choices = %+v", resp.Choices)
		}
		if resp.Usage.CompletionTokens != 7 || resp.Object != "text_completion" {
			t.Errorf("usage %+v object %q", resp.Usage, resp.Object)
		}
	})

	t.Run("completion streaming", func(t *testing.T) {
		stream := c.Completions.NewStreaming(ctx, openai.CompletionNewParams{
			Model:         "llama",
			Prompt:        openai.CompletionNewParamsPromptUnion{OfString: openai.String("Once upon a time")},
			MaxTokens:     openai.Int(9),
			StreamOptions: openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)},
		})
		var text strings.Builder
		var finish string
		var completionTokens int64
		for stream.Next() {
			ch := stream.Current()
			for _, c := range ch.Choices {
				text.WriteString(c.Text)
				if c.FinishReason != "" {
					finish = string(c.FinishReason)
				}
			}
			if ch.Usage.CompletionTokens > 0 {
				completionTokens = ch.Usage.CompletionTokens
			}
		}
		if err := stream.Err(); err != nil {
			t.Fatal(err)
		}
		if len(strings.Fields(text.String())) != 9 || finish != "length" || completionTokens != 9 {
			t.Errorf("text %q finish %q usage %d", text.String(), finish, completionTokens)
		}
	})

	t.Run("models", func(t *testing.T) {
		page, err := c.Models.List(ctx)
		if err != nil {
			t.Fatal(err)
		}
		got := map[string]map[string]any{}
		for _, m := range page.Data {
			var raw map[string]any
			if err := json.Unmarshal([]byte(m.RawJSON()), &raw); err != nil {
				t.Fatal(err)
			}
			got[m.ID] = raw
		}
		base, ok := got["llama"]
		if !ok || base["parent"] != nil || base["root"] != "llama-3.1-8b" {
			t.Errorf("base card = %v", base)
		}
		lora, ok := got["sql-lora"]
		if !ok || lora["parent"] != "llama" || lora["root"] != "/adapters/sql" {
			t.Errorf("adapter card = %v", lora)
		}
	})

	t.Run("adapter", func(t *testing.T) {
		resp, err := c.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{
			Model:     "sql-lora",
			Messages:  []openai.ChatCompletionMessageParamUnion{openai.UserMessage("SELECT")},
			MaxTokens: openai.Int(3),
		})
		if err != nil {
			t.Fatal(err)
		}
		if resp.Model != "sql-lora" || resp.Usage.CompletionTokens != 3 {
			t.Errorf("model %q usage %+v", resp.Model, resp.Usage)
		}
		if st := p.Stats(); st.LoraLoads < 1 {
			t.Errorf("LoraLoads = %d, want the adapter loaded into a slot", st.LoraLoads)
		}
	})

	t.Run("unknown model is an API error", func(t *testing.T) {
		_, err := c.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{
			Model:    "nope",
			Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")},
		})
		var apiErr *openai.Error
		if err == nil || !errorAs(err, &apiErr) || apiErr.StatusCode != 404 {
			t.Fatalf("err = %v, want a 404 API error", err)
		}
	})
}
