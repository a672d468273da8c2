package integration

import (
	"context"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/responses"

	"github.com/infergate/infergate/devstack"
)

// TestOpenAISDK runs the official OpenAI Go SDK, unchanged, against the
// stack (Tier 2 → Tier 1 → simulator): chat and Responses, streaming and
// not, each with text and usage.
func TestOpenAISDK(t *testing.T) {
	st, _ := startOnePodStack(t)
	client := openai.NewClient(option.WithBaseURL(st.BaseURL), option.WithAPIKey(st.APIKey),
		option.WithMaxRetries(0), option.WithRequestTimeout(20*time.Second))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	c, err := client.Chat.Completions.New(ctx, chatParams(devstack.LlamaModel))
	if err != nil {
		t.Fatal(err)
	}
	if len(c.Choices) == 0 || c.Choices[0].Message.Content == "" || c.Usage.TotalTokens == 0 {
		t.Fatalf("chat answer %+v", c)
	}
	params := chatParams(devstack.LlamaModel)
	params.StreamOptions = openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)}
	cs := client.Chat.Completions.NewStreaming(ctx, params)
	var acc openai.ChatCompletionAccumulator
	for cs.Next() {
		acc.AddChunk(cs.Current())
	}
	if err := cs.Err(); err != nil || acc.Usage.TotalTokens == 0 || len(acc.Choices) == 0 || acc.Choices[0].Message.Content == "" {
		t.Fatalf("chat stream: %v %+v", err, acc.ChatCompletion)
	}

	rp := responses.ResponseNewParams{
		Model:           devstack.LlamaModel,
		Instructions:    openai.String("You are terse."),
		Input:           responses.ResponseNewParamsInputUnion{OfString: openai.String("Say something about GPUs.")},
		MaxOutputTokens: openai.Int(8),
	}
	r, err := client.Responses.New(ctx, rp)
	if err != nil {
		t.Fatal(err)
	}
	if r.OutputText() == "" || r.Usage.InputTokens == 0 || r.Usage.OutputTokens == 0 || r.Status != responses.ResponseStatusCompleted {
		t.Fatalf("response %+v", r)
	}
	rs := client.Responses.NewStreaming(ctx, rp)
	var text string
	var done *responses.Response
	for rs.Next() {
		ev := rs.Current()
		switch ev.Type {
		case "response.output_text.delta":
			text += ev.Delta
		case "response.completed":
			resp := ev.Response
			done = &resp
		}
	}
	if err := rs.Err(); err != nil {
		t.Fatal(err)
	}
	if done == nil || text == "" || text != done.OutputText() || done.Usage.OutputTokens == 0 {
		t.Fatalf("response stream: text %q, completed %+v", text, done)
	}
	t.Logf("chat %d tokens; responses %d+%d; streamed %q", c.Usage.TotalTokens, r.Usage.InputTokens, r.Usage.OutputTokens, text)
}
