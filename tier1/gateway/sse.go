package gateway

import (
	"bytes"
	"encoding/json"
	"net/http"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/infergate/infergate/shared/openai"
	"github.com/infergate/infergate/tier1/picker"
)

// maxEventBytes bounds one buffered SSE event while looking for the first
// token; a longer event counts as carrying one (it cannot be a role-only
// preamble) and the buffer is dropped.
const maxEventBytes = 64 << 10

// tokenScanner finds the first event of an OpenAI event stream that
// carries generated text (or ends the stream). Events may be split across
// chunks; each event's data is parsed as JSON, so any spacing is read the
// way the client's parser reads it.
type tokenScanner struct {
	buf []byte // the current, unfinished event
}

// feed scans the next chunk of the stream and reports whether an event
// carrying a token has completed in it (or in what was buffered before).
func (s *tokenScanner) feed(chunk []byte) bool {
	s.buf = append(s.buf, chunk...)
	for {
		// An event ends at a blank line; accept \n\n and \r\n\r\n.
		end, skip := bytes.Index(s.buf, []byte("\n\n")), 2
		if i := bytes.Index(s.buf, []byte("\r\n\r\n")); i >= 0 && (end < 0 || i < end) {
			end, skip = i, 4
		}
		if end < 0 {
			break
		}
		if eventHasToken(s.buf[:end]) {
			s.buf = s.buf[:0]
			return true
		}
		n := copy(s.buf, s.buf[end+skip:])
		s.buf = s.buf[:n]
	}
	if len(s.buf) > maxEventBytes {
		s.buf = s.buf[:0]
		return true
	}
	return false
}

// eventHasToken reports whether one SSE event (without its terminating
// blank line) carries generated text, a finish reason or [DONE].
func eventHasToken(ev []byte) bool {
	var data []byte
	for line := range bytes.Lines(ev) {
		line = bytes.TrimRight(line, "\r\n")
		v, ok := bytes.CutPrefix(line, []byte("data:"))
		if !ok {
			continue
		}
		v = bytes.TrimPrefix(v, []byte(" "))
		if data != nil {
			data = append(data, '\n')
		}
		data = append(data, v...)
	}
	data = bytes.TrimSpace(data)
	if len(data) == 0 {
		return false
	}
	if bytes.Equal(data, []byte("[DONE]")) {
		return true
	}
	var msg struct {
		Type    string `json:"type"` // Responses and Anthropic events name themselves
		Choices []struct {
			Text         string  `json:"text"`
			FinishReason *string `json:"finish_reason"`
			Delta        struct {
				Content          string `json:"content"`
				ReasoningContent string `json:"reasoning_content"`
			} `json:"delta"`
		} `json:"choices"`
		Error json.RawMessage `json:"error"`
	}
	if err := json.Unmarshal(data, &msg); err != nil {
		return false
	}
	if len(msg.Error) > 0 {
		return true // an in-band error ends the wait for a token too
	}
	switch msg.Type {
	case "response.output_text.delta", "response.completed", "response.failed", "response.incomplete",
		"content_block_delta", "message_delta", "message_stop", "error":
		return true
	}
	for _, c := range msg.Choices {
		if c.Text != "" || c.Delta.Content != "" || c.Delta.ReasoningContent != "" ||
			(c.FinishReason != nil && *c.FinishReason != "") {
			return true
		}
	}
	return false
}

// hasToken reports whether a chunk holding whole SSE events carries
// generated text (or the end of the stream).
func hasToken(chunk []byte) bool {
	var s tokenScanner
	return s.feed(append(append([]byte(nil), chunk...), '\n', '\n'))
}

func isEventStream(h http.Header) bool {
	ct := h.Get("Content-Type")
	return len(ct) >= 17 && ct[:17] == "text/event-stream"
}

// firstToken records a request's time to first token once, for the proxy
// and for Pick alike: the first response byte, except in an event stream,
// where it is the first event carrying text (a chat stream may open with a
// role-only event before prefill ends).
type firstToken struct {
	g          *Gateway
	req        *picker.Request
	pool       string
	queue      *waitQueue // the pool's: woken when the prefill leaves the pod
	start      time.Time  // the client's request arrived
	dispatched time.Time  // sent to the pod
	sse        bool
	scan       tokenScanner
	seen       bool
	end        openai.StreamEnder // follows the stream to end a broken one in its shape
	span       trace.Span         // the attempt's, when tracing (trace.go)
}

// observe looks at the next response chunk; force counts it as the first
// token whatever it holds (an error status or an empty body).
func (f *firstToken) observe(pod string, chunk []byte, force bool) {
	if f.sse {
		f.end.Observe(chunk)
	}
	if f.seen {
		return
	}
	if !force && f.sse && !f.scan.feed(chunk) {
		return
	}
	if !force && !f.sse && len(chunk) == 0 {
		return
	}
	f.seen = true
	f.scan.buf = nil
	f.g.tracker.FirstToken(pod, f.req, time.Since(f.dispatched))
	if f.queue != nil {
		// The pod's queued prefill just shrank: a request held for it
		// (saturation.prefill_wait) may go now.
		f.queue.signal()
	}
	f.g.m.ttft.WithLabelValues(f.req.Model, f.pool).Observe(time.Since(f.start).Seconds())
	traceFirstToken(f.span, f.start)
}

// endsStream reports whether a chunk of an event stream ends with the
// OpenAI terminator event, data: [DONE].
func endsStream(chunk []byte) bool {
	chunk = bytes.TrimRight(chunk, "\r\n\t ")
	// The Responses and Anthropic streams have no [DONE]: their last
	// event is named.
	last := chunk
	if i := bytes.LastIndex(chunk, []byte("\n\n")); i >= 0 {
		last = chunk[i+2:]
	}
	for _, end := range [][]byte{[]byte("event: message_stop"), []byte("event: response.completed"),
		[]byte("event: response.failed"), []byte("event: response.incomplete")} {
		if bytes.HasPrefix(last, end) {
			return true
		}
	}
	for _, term := range [][]byte{[]byte("data: [DONE]"), []byte("data:[DONE]")} {
		if bytes.HasSuffix(chunk, term) {
			rest := chunk[:len(chunk)-len(term)]
			return len(rest) == 0 || rest[len(rest)-1] == '\n' || rest[len(rest)-1] == '\r'
		}
	}
	return false
}
