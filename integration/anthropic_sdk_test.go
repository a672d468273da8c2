package integration

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/anthropics/anthropic-sdk-go"
	aoption "github.com/anthropics/anthropic-sdk-go/option"

	"github.com/infergate/infergate/devstack"
)

// TestAnthropicSDK runs the official Anthropic Go SDK, unchanged, against
// the stack's Anthropic Messages endpoints: a message, a stream
// accumulated by the SDK, count_tokens, and an error it must decode.
func TestAnthropicSDK(t *testing.T) {
	st, _ := startOnePodStack(t)
	client := anthropic.NewClient(aoption.WithBaseURL("http://"+st.Addr), aoption.WithAPIKey(st.APIKey),
		aoption.WithMaxRetries(0), aoption.WithRequestTimeout(20*time.Second))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	params := anthropic.MessageNewParams{
		Model:     anthropic.Model(devstack.LlamaModel),
		MaxTokens: 8,
		System:    []anthropic.TextBlockParam{{Text: "You are terse."}},
		Messages:  []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("Say something about GPUs."))},
	}
	m, err := client.Messages.New(ctx, params)
	if err != nil {
		t.Fatal(err)
	}
	if len(m.Content) != 1 || m.Content[0].Text == "" || m.Usage.InputTokens == 0 || m.Usage.OutputTokens == 0 {
		t.Fatalf("message %+v", m)
	}

	stream := client.Messages.NewStreaming(ctx, params)
	var acc anthropic.Message
	for stream.Next() {
		if err := acc.Accumulate(stream.Current()); err != nil {
			t.Fatal(err)
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	if len(acc.Content) != 1 || acc.Content[0].Text == "" || acc.Usage.InputTokens != m.Usage.InputTokens || acc.Usage.OutputTokens == 0 {
		t.Fatalf("accumulated stream %+v", acc)
	}

	n, err := client.Messages.CountTokens(ctx, anthropic.MessageCountTokensParams{
		Model:    anthropic.Model(devstack.LlamaModel),
		System:   anthropic.MessageCountTokensParamsSystemUnion{OfTextBlockArray: params.System},
		Messages: params.Messages,
	})
	if err != nil || n.InputTokens != m.Usage.InputTokens {
		t.Fatalf("count_tokens %+v (%v), message counted %d", n, err, m.Usage.InputTokens)
	}

	params.Model = "no-such-model"
	_, err = client.Messages.New(ctx, params)
	var ae *anthropic.Error
	if !errors.As(err, &ae) || ae.StatusCode != 404 {
		t.Fatalf("unknown model: %v", err)
	}
	t.Logf("message %d+%d tokens, stream %q, count_tokens %d; error: %v", m.Usage.InputTokens, m.Usage.OutputTokens, acc.Content[0].Text, n.InputTokens, err)
}
