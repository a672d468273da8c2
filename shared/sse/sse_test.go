package sse

import (
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
	"testing/iotest"

	"github.com/infergate/infergate/shared/openai"
)

func TestIsEventStream(t *testing.T) {
	for ct, want := range map[string]bool{
		"text/event-stream":                true,
		"text/event-stream; charset=utf-8": true,
		"Text/Event-Stream ;charset=utf-8": true,
		"text/event-streamx":               false,
		"application/json":                 false,
		"":                                 false,
	} {
		if got := IsEventStream(http.Header{"Content-Type": {ct}}); got != want {
			t.Errorf("%q: %v, want %v", ct, got, want)
		}
	}
}

// readAll reads every event of in, delivered by src.
func readAll(t *testing.T, src io.Reader, max int) ([]string, error) {
	t.Helper()
	r := NewReader(src, max)
	defer r.Release()
	var evs []string
	for {
		ev, err := r.Next()
		if err == io.EOF {
			return evs, nil
		}
		if err != nil {
			return evs, err
		}
		evs = append(evs, string(ev))
	}
}

func TestReader(t *testing.T) {
	long := strings.Repeat("x", 40000) // longer than the first buffer
	events := []string{
		"\n\ndata: a\n\n", // blank lines before an event belong to it
		"event: e\r\ndata: " + long + "\r\n\r\n",
		"data: one\ndata: two\n\n",
		": comment\n\n",
		"data: mixed\n\r\n",
		"data: last", // unterminated at the end of the stream
	}
	in := strings.Join(events, "")
	for name, src := range map[string]io.Reader{
		"whole":        strings.NewReader(in),
		"byte by byte": iotest.OneByteReader(strings.NewReader(in)),
		"halves":       iotest.HalfReader(strings.NewReader(in)),
	} {
		got, err := readAll(t, src, 0)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if len(got) != len(events) {
			t.Fatalf("%s: %d events, want %d: %.80q", name, len(got), len(events), got)
		}
		for i := range events {
			if got[i] != events[i] {
				t.Errorf("%s: event %d = %.60q, want %.60q", name, i, got[i], events[i])
			}
		}
	}
}

// An event over the bound is an error naming it, however it is split into
// lines; one at the bound is read; events before it are delivered.
func TestReaderMaxEvent(t *testing.T) {
	const max = 1000
	for _, tc := range []struct {
		name, in string
		ok       bool
	}{
		{"at the bound", "data: " + strings.Repeat("x", max-8) + "\n\n", true},
		{"one long line", "data: " + strings.Repeat("x", 5000) + "\n\n", false},
		{"many short lines", strings.Repeat("data: xxxxxxxx\n", 200) + "\n", false},
		{"no end at all", "data: " + strings.Repeat("x", 50000), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := readAll(t, iotest.HalfReader(strings.NewReader("data: first\n\n"+tc.in)), max)
			if len(got) == 0 || got[0] != "data: first\n\n" {
				t.Fatalf("events before it: %.60q", got)
			}
			if tc.ok {
				if err != nil || len(got) != 2 || got[1] != tc.in {
					t.Fatalf("got %d events, %v", len(got), err)
				}
				return
			}
			if !errors.Is(err, ErrEventTooLarge) || !strings.Contains(err.Error(), "1000 bytes") {
				t.Fatalf("err = %v; want ErrEventTooLarge naming the bound", err)
			}
		})
	}
}

// A source error ends the events after the whole ones read before it; the
// unfinished event is not returned.
func TestReaderSourceError(t *testing.T) {
	boom := errors.New("reset")
	src := io.MultiReader(strings.NewReader("data: a\n\ndata: cut"), iotest.ErrReader(boom))
	got, err := readAll(t, src, 0)
	if !errors.Is(err, boom) || len(got) != 1 || got[0] != "data: a\n\n" {
		t.Fatalf("%q, %v", got, err)
	}
}

func TestBuffered(t *testing.T) {
	r := NewReader(strings.NewReader("data: a\n\ndata: b\n\ndata: c"), 0)
	defer r.Release()
	if r.Buffered() {
		t.Fatal("buffered before a read")
	}
	if ev, _ := r.Next(); string(ev) != "data: a\n\n" || !r.Buffered() {
		t.Fatalf("%q, buffered %v", ev, r.Buffered())
	}
	if ev, _ := r.Next(); string(ev) != "data: b\n\n" || r.Buffered() {
		t.Fatalf("%q: an unterminated event counts as buffered", ev)
	}
}

func TestData(t *testing.T) {
	for ev, want := range map[string]string{
		"data: x\n\n":                        "x",
		"data:x\r\n\r\n":                     "x",
		"event: e\ndata: one\ndata: two\n\n": "one\ntwo",
		"data: a\ndata:\ndata:  c\n\n":       "a\n\n c",
		": only a comment\n\n":               "",
	} {
		if got := string(Data([]byte(ev))); got != want {
			t.Errorf("Data(%q) = %q, want %q", ev, got, want)
		}
	}
}

func TestIsToken(t *testing.T) {
	for _, tc := range []struct {
		name, ev string
		want     bool
	}{
		{"compact content", "data: {\"choices\":[{\"delta\":{\"content\":\"Hi\"}}]}\n\n", true},
		{"spaced content", "data: {\"choices\": [{\"delta\": {\"content\": \"Hi\"}}]}\n\n", true},
		{"role only", "data: {\"choices\": [{\"delta\": {\"role\": \"assistant\", \"content\": \"\"}}]}\n\n", false},
		{"empty text", `data: {"choices":[{"text":"","index":0}]}`, false},
		{"text", "data: {\"choices\": [ {\"text\": \" the\"} ]}\n\n", true},
		{"reasoning", `data: {"choices":[{"delta":{"reasoning_content":"hmm"}}]}`, true},
		{"finish", "data: {\"choices\": [{\"delta\": {}, \"finish_reason\": \"stop\"}]}\n\n", true},
		{"null finish", "data: {\"choices\": [{\"delta\": {}, \"finish_reason\": null}]}\n\n", false},
		{"done", "data: [DONE]\n\n", true},
		{"no space after colon", "data:{\"choices\":[{\"delta\":{\"content\":\"x\"}}]}\n\n", true},
		{"content key inside a string", "data: {\"choices\": [{\"delta\": {\"role\": \"\\\"content\\\": \\\"x\"}}]}\n\n", false},
		{"comment", ": keep-alive\n\n", false},
		{"in-band error", "data: {\"error\": {\"message\": \"x\"}}\n\n", true},
		{"responses created", "event: response.created\ndata: {\"type\":\"response.created\",\"response\":{}}\n\n", false},
		{"responses delta", "event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"delta\":\"Hi\"}\n\n", true},
		{"anthropic start", "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{}}\n\n", false},
		{"anthropic delta", "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"delta\":{\"text\":\"Hi\"}}\n\n", true},
		{"empty", "", false},
	} {
		if got := IsToken([]byte(tc.ev)); got != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
}

// tokenEdgeCases are event data the fast rule (isTokenExact) must leave to
// encoding/json, or decide as it would: names that differ in case or
// fold to a read one, duplicates (the last wins there), values of another
// type (encoding/json then fails: no token), nulls, escapes, errors.
var tokenEdgeCases = []string{
	`{"choices":[{"delta":{"content":"x"}}],"Choices":null}`,
	`{"CHOICES":[{"delta":{"content":"x"}}]}`,
	`{"choices":[{"Delta":{"content":"x"}}]}`,
	`{"choices":[{"delta":{"Content":"x"}}]}`,
	`{"choices":[{"delta":{"content":"x"}}],"choices":[]}`,
	`{"choices":[{"delta":{"content":"x","content":""}}]}`,
	`{"choices":[{"text":"","text":"x"}]}`,
	`{"choices":[{"delta":{"content":5}}]}`,
	`{"choices":[{"delta":{"content":"x"}}],"type":5}`,
	`{"choices":[{"delta":{"content":"x"}}],"error":null}`,
	`{"choices":{"delta":{"content":"x"}}}`,
	`{"choices":[null,{"text":"x"}]}`,
	`{"choices":[1]}`,
	`{"choices":null,"type":null}`,
	`{"choices":[{"delta":null,"finish_reason":null,"text":null}]}`,
	`{"choices":[{"finish_reason":""}]}`,
	`{"choices":[{"finish_reason":"length"}]}`,
	`{"type":"message_\u0073top"}`,
	`{"typ\u0065":"message_stop"}`,
	`{"\u0063hoices":[{"text":"x"}]}`,
	`{"choiceſ":[{"text":"x"}]}`,
	`{"choices":[{"delta":{"reasoning_content":"\u0000"}}]}`,
	`{"error":false}`,
	`{"error":{}, "choices":[{"delta":5}]}`,
	`{"choices":[{"text":"x"}]} x`,
	`{"choices":[{"text":"\ud800"}]}`,
	"{\"choices\":[{\"text\":\"\xff\"}]}",
	`[{"text":"x"}]`,
	`"x"`,
	`{}`,
}

// TestIsTokenExact checks the fast rule against encoding/json's on the
// edge cases, and that it decides the events engines send itself.
func TestIsTokenExact(t *testing.T) {
	for _, d := range tokenEdgeCases {
		if tok, ok := isTokenExact([]byte(d)); ok && tok != isTokenJSON([]byte(d)) {
			t.Errorf("%s: fast %v, encoding/json %v", d, tok, !tok)
		}
	}
	for _, d := range []string{
		`{"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}`,
		`{"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":"Hi"},"logprobs":null,"finish_reason":null}]}`,
		`{"id":"c","object":"text_completion","choices":[{"index":0,"text":" the","finish_reason":null}]}`,
		`{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hi"}}`,
		`{"type":"response.output_text.delta","delta":"Hi"}`,
	} {
		if _, ok := isTokenExact([]byte(d)); !ok {
			t.Errorf("%s: left to encoding/json", d)
		}
	}
}

// FuzzIsToken: the fast rule, when it decides, agrees with encoding/json.
func FuzzIsToken(f *testing.F) {
	for _, d := range tokenEdgeCases {
		f.Add([]byte(d))
	}
	f.Add([]byte(`{"choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}`))
	f.Fuzz(func(t *testing.T, d []byte) {
		if tok, ok := isTokenExact(d); ok && tok != isTokenJSON(d) {
			t.Fatalf("%q: fast %v, encoding/json %v", d, tok, !tok)
		}
	})
}

// BenchmarkIsToken decides a vLLM stream's first two events: the
// role-only opening one and the first content.
func BenchmarkIsToken(b *testing.B) {
	evs := [][]byte{
		[]byte("data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"},\"finish_reason\":null}]}\n\n"),
		[]byte("data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"The answer\"},\"finish_reason\":null}]}\n\n"),
	}
	b.ReportAllocs()
	for b.Loop() {
		if IsToken(evs[0]) || !IsToken(evs[1]) {
			b.Fatal("wrong")
		}
	}
}

func TestIsEnd(t *testing.T) {
	for ev, want := range map[string]bool{
		"data: [DONE]\n\n":    true,
		"data:[DONE]\r\n\r\n": true,
		"data: [DONE]":        true,
		"event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n":             true,
		"event: response.completed\ndata: {\"type\":\"response.completed\"}\n\n": true,
		"event: response.incomplete\ndata: {}\n\n":                               true,
		"data: {\"type\":\"response.failed\",\"response\":{}}\n\n":               true, // no event line
		"event: error\ndata: {\"type\":\"error\",\"error\":{}}\n\n":              true,
		"data: {\"error\":{\"message\":\"x\"}}\n\n":                              true,
		"event: ping\ndata: {}\n\n":                                              false,
		"event: content_block_delta\ndata: {}\n\n":                               false,
		"data: {\"choices\":[{\"delta\":{\"content\":\"[DONE]\"}}]}\n\n":         false,
		"data: {\"choices\":[{\"delta\":{\"type\":\"message_stop\"}}]}\n\n":      false,
		": [DONE]\n\n": false,
	} {
		if got := IsEnd([]byte(ev)); got != want {
			t.Errorf("IsEnd(%q) = %v, want %v", ev, got, want)
		}
	}
}

func TestUsage(t *testing.T) {
	u, only := Usage([]byte("data: {\"choices\" : [],\ndata: \"usage\" :\t{\"total_tokens\": 9}}\n\n"), nil)
	if u == nil || u.Total() != 9 || !only {
		t.Errorf("spaced usage chunk: %+v %v", u, only)
	}
	prev := &openai.Usage{PromptTokens: 30}
	u, _ = Usage([]byte("event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{},\"usage\":{\"output_tokens\":9}}\n\n"), prev)
	if u == nil || *u != (openai.Usage{PromptTokens: 30, CompletionTokens: 9}) {
		t.Errorf("anthropic: %+v", u)
	}
	if u, _ := Usage([]byte("event: response.output_text.delta\ndata: {\"delta\":\"usage\"}\n\n"), nil); u != nil {
		t.Errorf("the word in text: %+v", u)
	}
}

func TestTokenWatch(t *testing.T) {
	for _, tc := range []struct {
		name   string
		chunks []string
		want   bool
	}{
		{"whole", []string{"data: {\"choices\":[{\"delta\":{\"content\":\"Hi\"}}]}\n\n"}, true},
		{"crlf split", []string{"data: {\"choices\":[{\"delta\":{\"content\":\"x\"}}]}\r\n", "\r\n"}, true},
		{"split event", []string{"data: {\"choices\": [{\"delta\": {\"con", "tent\": \"Hi\"}}]}", "\n\n"}, true},
		{"after a role-only event", []string{"data: {\"choices\":[{\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\ndata: {\"choi", "ces\":[{\"delta\":{\"content\":\"x\"}}]}\n\n"}, true},
		{"unfinished event", []string{"data: {\"choices\": [{\"delta\": {\"content\": \"Hi\"}}]}\n"}, false},
		{"oversized event", []string{"data: " + strings.Repeat("x", DefaultMaxEvent+1)}, true},
	} {
		var w TokenWatch
		got := false
		for _, c := range tc.chunks {
			if w.Feed([]byte(c)) {
				got = true
				break
			}
		}
		if got != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
		if len(w.buf) > DefaultMaxEvent {
			t.Errorf("%s: buffered %d bytes", tc.name, len(w.buf))
		}
	}
}

// FuzzTokenWatch: any split of a stream gives the answer of feeding it
// whole, and the buffer stays bounded.
func FuzzTokenWatch(f *testing.F) {
	f.Add([]byte("data: {\"choices\": [{\"delta\": {\"content\": \"Hi\"}}]}\n\n"), 7)
	f.Add([]byte("data: [DONE]\r\n\r\n"), 3)
	f.Add([]byte(": ping\n\ndata: {\"choices\":[{\"text\":\"\"}]}\n\n"), 1)
	f.Fuzz(func(t *testing.T, stream []byte, split int) {
		var whole TokenWatch
		want := whole.Feed(stream)
		if split < 0 {
			split = -split
		}
		split %= len(stream) + 1
		var parts TokenWatch
		got := parts.Feed(stream[:split]) || parts.Feed(stream[split:])
		if len(stream) <= DefaultMaxEvent && got != want {
			t.Fatalf("split at %d: %v, whole: %v", split, got, want)
		}
		if len(parts.buf) > DefaultMaxEvent || len(whole.buf) > DefaultMaxEvent {
			t.Fatal("buffer beyond bound")
		}
	})
}

// FuzzReader: any delivery of a stream gives the same events, and they
// add up to the stream.
func FuzzReader(f *testing.F) {
	f.Add([]byte("data: a\n\n\r\ndata: b\r\n\r\nevent: x\ndata: c"), uint8(3))
	f.Add([]byte("\n\n\n"), uint8(1))
	f.Fuzz(func(t *testing.T, stream []byte, chunk uint8) {
		whole, err := readAll(t, strings.NewReader(string(stream)), 1<<16)
		if err != nil {
			return
		}
		src := &chunked{b: stream, n: int(chunk)%17 + 1}
		parts, err := readAll(t, src, 1<<16)
		if err != nil || strings.Join(parts, "") != string(stream) || strings.Join(whole, "") != string(stream) {
			t.Fatalf("events %q / %q (%v) do not add up to %q", parts, whole, err, stream)
		}
		if len(parts) != len(whole) {
			t.Fatalf("%d events in chunks of %d, %d whole", len(parts), src.n, len(whole))
		}
	})
}

type chunked struct {
	b []byte
	n int
}

func (c *chunked) Read(p []byte) (int, error) {
	if len(c.b) == 0 {
		return 0, io.EOF
	}
	n := copy(p[:min(len(p), c.n)], c.b)
	c.b = c.b[n:]
	return n, nil
}

// BenchmarkReader reads a stream of 200 chat chunks.
func BenchmarkReader(b *testing.B) {
	var sb strings.Builder
	for range 200 {
		sb.WriteString("data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\" token\"}}]}\n\n")
	}
	stream := sb.String()
	b.SetBytes(int64(len(stream)))
	b.ReportAllocs()
	var r Reader
	for b.Loop() {
		r.Reset(strings.NewReader(stream), 0)
		n := 0
		for {
			ev, err := r.Next()
			if err != nil {
				break
			}
			if IsEnd(ev) {
				b.Fatal("not the end")
			}
			n++
		}
		if n != 200 {
			b.Fatal(n)
		}
	}
}
