package gateway

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/infergate/infergate/shared/openai"
	"github.com/infergate/infergate/shared/sse"
)

// TestEvent: usage is read from the stream; when Tier 2 asked for it, the
// usage-only chunk is dropped and a usage on a content chunk removed, the
// rest of the chunk's bytes kept.
func TestEvent(t *testing.T) {
	usageOnly := "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":3,\"total_tokens\":8}}\n\n"
	onContent := "data: {\"id\":\"x\",\"choices\":[{\"delta\":{\"content\":\"hi\"}}],\"usage\": {\"prompt_tokens\":1,\"completion_tokens\":1}}\n\n"
	plain := "data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}],\"usage\":null}\n\n"
	for _, tc := range []struct {
		name      string
		injected  bool
		ev        string
		wantDrop  bool
		wantUsage int
		wantField bool // "usage" still in the output
	}{
		{"usage chunk, client asked", false, usageOnly, false, 8, true},
		{"usage chunk, injected", true, usageOnly, true, 8, false},
		{"usage on content, injected", true, onContent, false, 2, false},
		{"usage on content, client asked", false, onContent, false, 2, true},
		{"null usage passes", true, plain, false, 0, true},
		{"done passes", true, "data: [DONE]\n\n", false, 0, false},
		// Any valid JSON spacing around the key's colon.
		{"spaced usage chunk, injected", true, "data: {\"choices\" : [],\ndata: \"usage\" :\t{\"total_tokens\": 9}}\n\n", true, 9, false},
		{"usage key then space, client asked", false, "data: {\"choices\":[],\"usage\" : {\"total_tokens\":4}}\n\n", false, 4, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			x := &exchange{injected: tc.injected}
			out := x.Event([]byte(tc.ev))
			if tc.wantDrop != (out == nil) {
				t.Fatalf("out = %q, drop want %v", out, tc.wantDrop)
			}
			got := 0
			if x.usage != nil {
				got = x.usage.Total()
			}
			if got != tc.wantUsage {
				t.Errorf("usage = %d, want %d", got, tc.wantUsage)
			}
			if out != nil {
				if strings.Contains(string(out), `"usage"`) != tc.wantField {
					t.Errorf("out = %q", out)
				}
				if d := sse.Data(out); string(d) != "[DONE]" {
					var v map[string]any
					if err := json.Unmarshal(d, &v); err != nil {
						t.Errorf("output is not JSON: %q", d)
					}
				}
			}
		})
	}
}

// Removing a usage riding on a content chunk keeps the chunk's other bytes.
func TestEventKeepsBytes(t *testing.T) {
	x := &exchange{injected: true}
	out := x.Event([]byte("data: {\"id\":\"x\", \"choices\":[{\"delta\":{\"content\":\"<b>é</b>\"}}],\"usage\": {\"total_tokens\":1}}\n\n"))
	if want := "data: {\"id\":\"x\", \"choices\":[{\"delta\":{\"content\":\"<b>é</b>\"}}]}\n\n"; string(out) != want {
		t.Fatalf("got  %q\nwant %q", out, want)
	}
}

// Usage in the Responses and Anthropic streams' own fields.
func TestEventNamedUsage(t *testing.T) {
	for _, tc := range []struct {
		name   string
		events []string
		want   openai.Usage
	}{
		{"responses", []string{
			"event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\"usage\":null}}\n\n",
			"event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"delta\":\"usage\"}\n\n",
			"event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"usage\":{\"input_tokens\":40,\"output_tokens\":7,\"total_tokens\":47}}}\n\n",
		}, openai.Usage{PromptTokens: 40, CompletionTokens: 7, TotalTokens: 47}},
		{"anthropic", []string{
			"event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":30,\"output_tokens\":1}}}\n\n",
			"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"delta\":{\"type\":\"text_delta\",\"text\":\"usage\"}}\n\n",
			"event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{},\"usage\":{\"output_tokens\":9}}\n\n",
		}, openai.Usage{PromptTokens: 30, CompletionTokens: 9}},
	} {
		x := &exchange{}
		for _, ev := range tc.events {
			if out := x.Event([]byte(ev)); string(out) != ev {
				t.Errorf("%s: event changed: %q", tc.name, out)
			}
		}
		if x.usage == nil || *x.usage != tc.want || x.usage.Total() != tc.want.PromptTokens+tc.want.CompletionTokens {
			t.Errorf("%s: usage %+v, want %+v", tc.name, x.usage, tc.want)
		}
	}
}
