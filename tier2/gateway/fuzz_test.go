package gateway

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"testing"
)

// FuzzReadEvent: whatever Tier 1 sends, readEvent never returns more than
// the cap (plus the two newlines it adds to an unterminated last event),
// every event it returns ends with a blank line, and the reader always
// makes progress to io.EOF or an error.
func FuzzReadEvent(f *testing.F) {
	for _, s := range []string{"data: a\n\n", "\n\n\r\n", "event: e\r\ndata: x\r\n\r\ndata: y", "data: " + string(bytes.Repeat([]byte("x"), 300)) + "\n\n"} {
		f.Add([]byte(s), 64)
	}
	f.Fuzz(func(t *testing.T, in []byte, maxBytes int) {
		maxBytes = 1 + abs(maxBytes)%512
		br := bufio.NewReaderSize(bytes.NewReader(in), 16)
		for range len(in) + 1 {
			ev, err := readEvent(br, maxBytes)
			if err == io.EOF {
				return
			}
			if err != nil {
				if !errors.Is(err, errEventTooLarge) {
					t.Fatalf("unexpected error %v", err)
				}
				return
			}
			if len(ev) > maxBytes+2 {
				t.Fatalf("event of %d bytes with cap %d", len(ev), maxBytes)
			}
			if !endsBlank(ev) {
				t.Fatalf("event %q does not end with a blank line", ev)
			}
		}
		t.Fatal("readEvent made no progress")
	})
}

// endsBlank: ev ends with a line holding nothing but line-end characters.
func endsBlank(ev []byte) bool {
	body, ok := bytes.CutSuffix(ev, []byte("\n"))
	if !ok {
		return false
	}
	last := body[bytes.LastIndexByte(body, '\n')+1:]
	return len(bytes.Trim(last, "\r")) == 0 && len(body) > 0
}

func abs(n int) int {
	if n < 0 {
		return -n
	}
	return n
}

// FuzzFilterEvent: rewriting usage never panics; an event is passed
// through unchanged, dropped, or rewritten to one data event of valid JSON
// without a usage key, and only when the gateway injected include_usage
// and the event carried usage.
func FuzzFilterEvent(f *testing.F) {
	for _, s := range []string{
		"data: {\"choices\":[],\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":3,\"total_tokens\":8}}\n\n",
		"data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}],\"usage\" : {\"total_tokens\":2}}\n\n",
		"data: {\"choices\":[],\ndata: \"usage\":{\"total_tokens\":1}}\n\n",
		"data: [DONE]\n\n",
		"data: {\"usage\":null}\n\n",
	} {
		f.Add([]byte(s), true)
		f.Add([]byte(s), false)
	}
	f.Fuzz(func(t *testing.T, ev []byte, injected bool) {
		in := bytes.Clone(ev)
		x := &exchange{injected: injected}
		out := x.filterEvent(ev)
		if bytes.Equal(out, in) {
			return
		}
		if !injected || x.usage == nil {
			t.Fatalf("event changed without injected usage: %q -> %q", in, out)
		}
		if out == nil {
			return // the usage-only chunk
		}
		var m map[string]json.RawMessage
		if err := json.Unmarshal(eventData(out), &m); err != nil {
			t.Fatalf("rewritten event is not JSON: %q", out)
		}
		if _, ok := m["usage"]; ok {
			t.Fatalf("rewritten event still has usage: %q", out)
		}
	})
}
