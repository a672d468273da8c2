package gateway

import (
	"strings"
	"testing"
)

func TestTokenScanner(t *testing.T) {
	tests := []struct {
		name   string
		chunks []string
		want   bool
	}{
		{"compact content", []string{"data: {\"choices\":[{\"delta\":{\"content\":\"Hi\"}}]}\n\n"}, true},
		{"spaced content", []string{"data: {\"choices\": [{\"delta\": {\"content\": \"Hi\"}}]}\n\n"}, true},
		{"spaced role only", []string{"data: {\"choices\": [{\"delta\": {\"role\": \"assistant\", \"content\": \"\"}}]}\n\n"}, false},
		{"spaced text", []string{"data: {\"choices\": [ {\"text\": \" the\"} ]}\n\n"}, true},
		{"spaced finish", []string{"data: {\"choices\": [{\"delta\": {}, \"finish_reason\": \"stop\"}]}\n\n"}, true},
		{"null finish", []string{"data: {\"choices\": [{\"delta\": {}, \"finish_reason\": null}]}\n\n"}, false},
		{"done", []string{"data: [DONE]\n\n"}, true},
		{"no space after colon", []string{"data:{\"choices\":[{\"delta\":{\"content\":\"x\"}}]}\n\n"}, true},
		{"crlf", []string{"data: {\"choices\":[{\"delta\":{\"content\":\"x\"}}]}\r\n\r\n"}, true},
		{"crlf split", []string{"data: {\"choices\":[{\"delta\":{\"content\":\"x\"}}]}\r\n", "\r\n"}, true},
		{"split event", []string{"data: {\"choices\": [{\"delta\": {\"con", "tent\": \"Hi\"}}]}", "\n\n"}, true},
		{"unfinished event", []string{"data: {\"choices\": [{\"delta\": {\"content\": \"Hi\"}}]}\n"}, false},
		{"content key inside a string", []string{"data: {\"choices\": [{\"delta\": {\"role\": \"\\\"content\\\": \\\"x\"}}]}\n\n"}, false},
		{"comment", []string{": keep-alive\n\n"}, false},
		{"in-band error", []string{"data: {\"error\": {\"message\": \"x\"}}\n\n"}, true},
		{"responses created", []string{"event: response.created\ndata: {\"type\":\"response.created\",\"response\":{}}\n\n"}, false},
		{"responses delta", []string{"event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"delta\":\"Hi\"}\n\n"}, true},
		{"anthropic start", []string{"event: message_start\ndata: {\"type\":\"message_start\",\"message\":{}}\n\n"}, false},
		{"anthropic delta", []string{"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"delta\":{\"text\":\"Hi\"}}\n\n"}, true},
		{"oversized event", []string{"data: " + strings.Repeat("x", maxEventBytes+1)}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var s tokenScanner
			got := false
			for _, c := range tt.chunks {
				if s.feed([]byte(c)) {
					got = true
					break
				}
			}
			if got != tt.want {
				t.Errorf("token = %v, want %v", got, tt.want)
			}
			if len(s.buf) > maxEventBytes {
				t.Errorf("buffered %d bytes, bound %d", len(s.buf), maxEventBytes)
			}
		})
	}
}

func FuzzTokenScanner(f *testing.F) {
	f.Add([]byte("data: {\"choices\": [{\"delta\": {\"content\": \"Hi\"}}]}\n\n"), 7)
	f.Add([]byte("data: [DONE]\r\n\r\n"), 3)
	f.Add([]byte(": ping\n\ndata: {\"choices\":[{\"text\":\"\"}]}\n\n"), 1)
	f.Fuzz(func(t *testing.T, stream []byte, split int) {
		// Any split of the stream gives the same answer as feeding it whole,
		// and the buffer stays bounded.
		var whole tokenScanner
		want := whole.feed(stream)
		if split < 0 {
			split = -split
		}
		if len(stream) > 0 {
			split %= len(stream) + 1
		} else {
			split = 0
		}
		var parts tokenScanner
		got := parts.feed(stream[:split]) || parts.feed(stream[split:])
		if len(stream) <= maxEventBytes && got != want {
			t.Fatalf("split at %d: %v, whole: %v", split, got, want)
		}
		if len(parts.buf) > maxEventBytes || len(whole.buf) > maxEventBytes {
			t.Fatal("buffer beyond bound")
		}
	})
}

func TestEndsStreamNamed(t *testing.T) {
	for chunk, want := range map[string]bool{
		"data: [DONE]\n\n": true,
		"event: content_block_stop\ndata: {}\n\nevent: message_stop\ndata: {\"type\":\"message_stop\"}\n\n": true,
		"event: response.completed\ndata: {\"type\":\"response.completed\"}\n\n":                            true,
		"event: message_stop\ndata: {}\n\nevent: ping\ndata: {}\n\n":                                        false,
		"event: content_block_delta\ndata: {}\n\n":                                                          false,
	} {
		if got := endsStream([]byte(chunk)); got != want {
			t.Errorf("endsStream(%q) = %v, want %v", chunk, got, want)
		}
	}
}
