package gateway

import (
	"bufio"
	"encoding/json"
	"errors"
	"io"
	"strings"
	"testing"
)

func TestReadEvent(t *testing.T) {
	long := strings.Repeat("x", 10000) // longer than the reader's buffer
	in := "\n\ndata: a\n\n" + "event: e\r\ndata: " + long + "\r\n\r\n" + "data: one\ndata: two\n\n" + "data: last"
	br := bufio.NewReaderSize(strings.NewReader(in), 4096)
	var got []string
	for {
		ev, err := readEvent(br, 0)
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, string(ev))
	}
	want := []string{"data: a\n\n", "event: e\r\ndata: " + long + "\r\n\r\n", "data: one\ndata: two\n\n", "data: last\n\n"}
	if len(got) != len(want) {
		t.Fatalf("got %d events, want %d: %q", len(got), len(want), got)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("event %d = %.60q, want %.60q", i, got[i], want[i])
		}
	}
	if d := eventData([]byte(got[2])); string(d) != "one\ntwo" {
		t.Errorf("eventData = %q", d)
	}
}

func TestFilterEvent(t *testing.T) {
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
			out := x.filterEvent([]byte(tc.ev))
			if tc.wantDrop != (out == nil) {
				t.Fatalf("out = %q, drop want %v", out, tc.wantDrop)
			}
			got := 0
			if x.usage != nil {
				got = x.usage.total()
			}
			if got != tc.wantUsage {
				t.Errorf("usage = %d, want %d", got, tc.wantUsage)
			}
			if out != nil {
				if strings.Contains(string(out), `"usage"`) != tc.wantField {
					t.Errorf("out = %q", out)
				}
				if d := eventData(out); string(d) != "[DONE]" {
					var v map[string]any
					if err := json.Unmarshal(d, &v); err != nil {
						t.Errorf("output is not JSON: %q", d)
					}
				}
			}
		})
	}
}

func TestWithIncludeUsage(t *testing.T) {
	for in, want := range map[string]string{
		`{"model":"m","stream":true}`:                                                `{"include_usage":true}`,
		`{"model":"m","stream":true,"stream_options":null}`:                          `{"include_usage":true}`,
		`{"model":"m","stream":true,"stream_options":{"include_usage":false,"x":1}}`: `{"include_usage":true,"x":1}`,
	} {
		out, err := withIncludeUsage([]byte(in))
		if err != nil {
			t.Fatal(err)
		}
		var m map[string]json.RawMessage
		_ = json.Unmarshal(out, &m)
		if string(m["stream_options"]) != want || string(m["model"]) != `"m"` {
			t.Errorf("%s → %s", in, out)
		}
	}
}

// TestReadEventMaxBytes: an event longer than the cap is an error naming
// the cap, however it is split into lines; one at the cap is read.
func TestReadEventMaxBytes(t *testing.T) {
	const maxBytes = 1000
	for _, tc := range []struct {
		name, in string
		ok       bool
	}{
		{"at the cap", "data: " + strings.Repeat("x", maxBytes-8) + "\n\n", true},
		{"one long line", "data: " + strings.Repeat("x", 5000) + "\n\n", false},
		{"many short lines", strings.Repeat("data: xxxxxxxx\n", 200) + "\n", false},
		{"no end at all", "data: " + strings.Repeat("x", 50000), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ev, err := readEvent(bufio.NewReaderSize(strings.NewReader(tc.in), 64), maxBytes)
			if tc.ok {
				if err != nil || string(ev) != tc.in {
					t.Fatalf("got %d bytes, %v", len(ev), err)
				}
				return
			}
			if !errors.Is(err, errEventTooLarge) || !strings.Contains(err.Error(), "1000 bytes") {
				t.Fatalf("err = %v; want errEventTooLarge naming the cap", err)
			}
		})
	}
}

// Usage in the Responses and Anthropic streams' own fields.
func TestFilterEventNamedUsage(t *testing.T) {
	for _, tc := range []struct {
		name   string
		events []string
		want   usage
	}{
		{"responses", []string{
			"event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\"usage\":null}}\n\n",
			"event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"delta\":\"usage\"}\n\n",
			"event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"usage\":{\"input_tokens\":40,\"output_tokens\":7,\"total_tokens\":47}}}\n\n",
		}, usage{PromptTokens: 40, CompletionTokens: 7, TotalTokens: 47}},
		{"anthropic", []string{
			"event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":30,\"output_tokens\":1}}}\n\n",
			"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"delta\":{\"type\":\"text_delta\",\"text\":\"usage\"}}\n\n",
			"event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{},\"usage\":{\"output_tokens\":9}}\n\n",
		}, usage{PromptTokens: 30, CompletionTokens: 9}},
	} {
		x := &exchange{}
		for _, ev := range tc.events {
			if out := x.filterEvent([]byte(ev)); string(out) != ev {
				t.Errorf("%s: event changed: %q", tc.name, out)
			}
		}
		if x.usage == nil || *x.usage != tc.want || x.usage.total() != tc.want.PromptTokens+tc.want.CompletionTokens {
			t.Errorf("%s: usage %+v, want %+v", tc.name, x.usage, tc.want)
		}
	}
}
