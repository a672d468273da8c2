// Package sse reads the server-sent event streams of the OpenAI, Responses
// and Anthropic APIs as both tiers relay them: whole events out of a
// reused, capped buffer (Reader), and what the relays need to know about
// each event — whether it carries the first token (IsToken), whether it is
// the stream's own end (IsEnd), and the usage it reports (Usage). Events
// are never re-encoded: a relay writes the bytes it read.
package sse

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"unicode/utf8"

	"github.com/infergate/infergate/shared/jsonkeys"
	"github.com/infergate/infergate/shared/openai"
)

// DefaultMaxEvent bounds one event when the caller names no bound.
const DefaultMaxEvent = 1 << 20

// ErrEventTooLarge is returned (wrapped) by Reader.Next for an event
// longer than the reader's bound.
var ErrEventTooLarge = errors.New("SSE event too large")

// IsEventStream reports whether a response header announces an event
// stream: media type text/event-stream, in any case, parameters allowed.
func IsEventStream(h http.Header) bool {
	ct := h.Get("Content-Type")
	const mt = "text/event-stream"
	if len(ct) < len(mt) || !strings.EqualFold(ct[:len(mt)], mt) {
		return false
	}
	rest := strings.TrimLeft(ct[len(mt):], " \t")
	return rest == "" || rest[0] == ';'
}

// bufSize is the reader's initial buffer: most events fit many times
// over, and a read returns what the upstream wrote at once.
const bufSize = 16 << 10

var bufs = sync.Pool{New: func() any { b := make([]byte, bufSize); return &b }}

// Reader reads whole events from an event stream. Its buffer comes from a
// pool and is reused from event to event; an event longer than the bound
// is an error rather than an unbounded buffer. Release gives the buffer
// back.
type Reader struct {
	src  io.Reader
	max  int
	pbuf *[]byte // the pooled buffer, while buf is it
	buf  []byte
	r, w int   // buf[r:w] is unread
	scan int   // buf[r:scan] holds no event end
	err  error // the source's error, returned once the buffer is drained
}

// NewReader reads events from src, each at most max bytes (0:
// DefaultMaxEvent).
func NewReader(src io.Reader, max int) *Reader {
	r := &Reader{}
	r.Reset(src, max)
	return r
}

// Reset makes r read from src, keeping its buffer.
func (r *Reader) Reset(src io.Reader, max int) {
	if max <= 0 {
		max = DefaultMaxEvent
	}
	if r.buf == nil {
		r.pbuf = bufs.Get().(*[]byte)
		r.buf = *r.pbuf
	}
	r.src, r.max, r.r, r.w, r.scan, r.err = src, max, 0, 0, 0, nil
}

// Release returns the buffer to the pool; the events Next returned are no
// longer valid, and r may not be used again.
func (r *Reader) Release() {
	if r.pbuf != nil {
		bufs.Put(r.pbuf)
	}
	r.pbuf, r.buf, r.src = nil, nil, nil
}

// Next returns the next event: its lines and the blank line that ends it
// (blank lines before it included), as read. It is valid until the next
// call. At the end of the source, what is left is returned as a last,
// unterminated event, then io.EOF. Any other error of the source is
// returned once the events before it are read; an event over the bound is
// an error wrapping ErrEventTooLarge.
func (r *Reader) Next() ([]byte, error) {
	for {
		if end := r.end(); end >= 0 {
			ev := r.buf[r.r:end]
			r.r, r.scan = end, end
			return ev, nil
		}
		if r.err != nil {
			if r.r < r.w && r.err == io.EOF {
				ev := r.buf[r.r:r.w]
				r.r, r.scan = r.w, r.w
				return ev, nil
			}
			return nil, r.err
		}
		if r.w-r.r >= r.max {
			r.err = fmt.Errorf("%w: over %d bytes", ErrEventTooLarge, r.max)
			return nil, r.err
		}
		r.fill()
	}
}

// Max is the reader's bound on one event.
func (r *Reader) Max() int { return r.max }

// Buffered reports whether an event is waiting in the buffer, so that
// Next returns without reading.
func (r *Reader) Buffered() bool { return r.end() >= 0 }

// fill reads once from the source into the free end of the buffer, first
// moving the unread bytes to the front or growing it (up to the bound).
func (r *Reader) fill() {
	if r.r > 0 && (r.w == len(r.buf) || r.r == r.w) {
		n := copy(r.buf, r.buf[r.r:r.w])
		r.scan -= r.r
		r.r, r.w = 0, n
	}
	if r.w == len(r.buf) {
		nb := make([]byte, min(2*len(r.buf), r.max+1))
		copy(nb, r.buf[:r.w])
		if r.pbuf != nil {
			bufs.Put(r.pbuf)
			r.pbuf = nil
		}
		r.buf = nb
	}
	n, err := r.src.Read(r.buf[r.w:min(len(r.buf), r.r+r.max+1)])
	r.w += n
	if err != nil {
		r.err = err
	}
}

// end returns the end of the first whole event in buf[r:w] (after its
// blank line), or -1, remembering how far it searched.
func (r *Reader) end() int {
	end, scanned := eventEnd(r.buf[:r.w], r.r, r.scan)
	if end < 0 {
		r.scan = scanned
	}
	return end
}

// eventEnd finds the end of the event starting at b[start:], searching
// from b[from:]: after the first blank line that follows a line with
// content (lines end in \n or \r\n). It returns -1 when b holds no whole
// event, and where the next search may start.
func eventEnd(b []byte, start, from int) (end, next int) {
	// Blank lines before the event belong to it, but do not end it.
	i := start
	for i < len(b) {
		if b[i] == '\n' {
			i++
		} else if b[i] == '\r' && i+1 < len(b) && b[i+1] == '\n' {
			i += 2
		} else {
			break
		}
	}
	from = max(from, i)
	for {
		j := bytes.IndexByte(b[from:], '\n')
		if j < 0 {
			return -1, len(b)
		}
		j += from
		switch {
		case j+1 < len(b) && b[j+1] == '\n':
			return j + 2, j + 2
		case j+2 < len(b) && b[j+1] == '\r' && b[j+2] == '\n':
			return j + 3, j + 3
		case j+1 >= len(b) || (b[j+1] == '\r' && j+2 >= len(b)):
			return -1, j // the blank line may still come
		}
		from = j + 1
	}
}

// field returns the value of the first line of ev named name ("data",
// "event"), without the one space after the colon; ok is false when ev
// has no such line.
func field(ev []byte, name string) (v []byte, ok bool) {
	for len(ev) > 0 {
		line := ev
		if i := bytes.IndexByte(ev, '\n'); i >= 0 {
			line, ev = ev[:i], ev[i+1:]
		} else {
			ev = nil
		}
		line = bytes.TrimSuffix(line, []byte("\r"))
		if len(line) > len(name) && line[len(name)] == ':' && string(line[:len(name)]) == name {
			v = line[len(name)+1:]
			if len(v) > 0 && v[0] == ' ' {
				v = v[1:]
			}
			return v, true
		}
	}
	return nil, false
}

// Data is the event's data: its data lines joined by newlines, nil when
// it has none. One line (the usual case) is returned without a copy.
func Data(ev []byte) []byte {
	first, ok := field(ev, "data")
	if !ok {
		return nil
	}
	var data []byte
	n := 0
	for line := range bytes.Lines(ev) {
		line = bytes.TrimRight(line, "\r\n")
		v, ok := bytes.CutPrefix(line, []byte("data:"))
		if !ok {
			continue
		}
		if n++; n == 2 {
			data = append(append(data, first...), '\n')
		} else if n > 2 {
			data = append(data, '\n')
		}
		if n > 1 {
			data = append(data, bytes.TrimPrefix(v, []byte(" "))...)
		}
	}
	if n == 1 {
		return first
	}
	return data
}

// Event names and JSON types that end a stream: the Anthropic Messages
// and Responses streams have no [DONE].
var endNames = []string{"message_stop", "response.completed", "response.failed", "response.incomplete", "error"}

// IsEnd reports whether an event is the stream's own end, after which a
// relay adds nothing: data: [DONE]; Anthropic's message_stop; the
// Responses API's response.completed, .failed and .incomplete; or an error
// the upstream reported in the stream (event: error, or data whose object
// starts with "error" or "type":"error"). It reads the event name and the
// start of the data only.
func IsEnd(ev []byte) bool {
	if name, ok := field(ev, "event"); ok {
		for _, n := range endNames {
			if string(name) == n {
				return true
			}
		}
	}
	data, ok := field(ev, "data")
	if !ok {
		return false
	}
	data = bytes.TrimSpace(data)
	if string(data) == "[DONE]" {
		return true
	}
	if t, ok := bytes.CutPrefix(data, []byte(`{"type":"`)); ok {
		if i := bytes.IndexByte(t, '"'); i >= 0 {
			for _, n := range endNames {
				if string(t[:i]) == n {
					return true
				}
			}
		}
		return false
	}
	return bytes.HasPrefix(data, []byte(`{"error"`))
}

// IsToken reports whether an event carries the first token, the moment a
// router counts time to first token from: generated text (a chat delta's
// content or reasoning_content, a completion's text), a finish reason,
// [DONE], an error, or a Responses or Anthropic event that carries text or
// ends the stream. A chat stream's opening role-only event does not: some
// servers send it before prefill ends. It decodes the event's data.
func IsToken(ev []byte) bool {
	data := bytes.TrimSpace(Data(ev))
	if len(data) == 0 {
		return false
	}
	if string(data) == "[DONE]" {
		return true
	}
	if tok, ok := isTokenExact(data); ok {
		return tok
	}
	return isTokenJSON(data)
}

// isTokenJSON is IsToken's rule on an event's data, decoded with
// encoding/json.
func isTokenJSON(data []byte) bool {
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

// errNotPlain stops isTokenExact on anything it leaves to encoding/json.
var errNotPlain = errors.New("not a plain event")

// isTokenExact is isTokenJSON without reflection, for the events engines
// send: it decides (ok) only when every member isTokenJSON reads is
// spelled exactly, once, with the type it expects, and the JSON is valid
// by jsonkeys' rules; for anything else (a member name equal to one of
// those but for case, a duplicate, a value of another type, which makes
// encoding/json fail, or JSON jsonkeys refuses) it leaves the answer to
// isTokenJSON, so the two always agree (FuzzIsToken). It is about ten
// times faster and does not allocate.
func isTokenExact(data []byte) (tok, ok bool) {
	var seen [3]bool // type, choices, error
	err := jsonkeys.Members(data, func(name, v []byte) error {
		switch i := memberIndex(name, "type", "choices", "error"); i {
		case -1:
			return nil
		case -2:
			return errNotPlain
		default:
			if seen[i] {
				return errNotPlain
			}
			seen[i] = true
		}
		switch string(name) {
		case "error":
			tok = true // any value, null included, is an error
		case "type":
			if v[0] == 'n' {
				return nil
			}
			if v[0] != '"' || bytes.IndexByte(v, '\\') >= 0 {
				return errNotPlain
			}
			switch string(v[1 : len(v)-1]) {
			case "response.output_text.delta", "response.completed", "response.failed", "response.incomplete",
				"content_block_delta", "message_delta", "message_stop", "error":
				tok = true
			}
		case "choices":
			if v[0] == 'n' {
				return nil
			}
			if v[0] != '[' {
				return errNotPlain
			}
			return jsonkeys.Elements(v, func(c []byte) error {
				if c[0] != '{' {
					return errNotPlain
				}
				t, err := choiceIsToken(c)
				tok = tok || t
				return err
			})
		}
		return nil
	})
	if err != nil {
		return false, false
	}
	return tok, true
}

// choiceIsToken is isTokenExact for one element of choices: text, a
// finish reason, or delta content or reasoning_content.
func choiceIsToken(c []byte) (tok bool, err error) {
	var seen [3]bool // text, finish_reason, delta
	err = jsonkeys.Members(c, func(name, v []byte) error {
		i := memberIndex(name, "text", "finish_reason", "delta")
		switch i {
		case -1:
			return nil
		case -2:
			return errNotPlain
		}
		if seen[i] {
			return errNotPlain
		}
		seen[i] = true
		if i < 2 { // a string or null; non-empty is a token
			t, err := nonEmptyString(v)
			tok = tok || t
			return err
		}
		if v[0] == 'n' {
			return nil
		}
		if v[0] != '{' {
			return errNotPlain
		}
		var dseen [2]bool
		return jsonkeys.Members(v, func(name, v []byte) error {
			j := memberIndex(name, "content", "reasoning_content")
			switch j {
			case -1:
				return nil
			case -2:
				return errNotPlain
			}
			if dseen[j] {
				return errNotPlain
			}
			dseen[j] = true
			t, err := nonEmptyString(v)
			tok = tok || t
			return err
		})
	})
	return tok, err
}

// nonEmptyString: v is a JSON string or null (else errNotPlain); true for
// a string that decodes to a non-empty one (any but "").
func nonEmptyString(v []byte) (bool, error) {
	switch v[0] {
	case 'n':
		return false, nil
	case '"':
		return len(v) > 2, nil
	}
	return false, errNotPlain
}

// memberIndex is the index of name among names, -1 when it matches none,
// or -2 when encoding/json might match it to one of them though it is not
// spelled the same (it matches names case-insensitively, with Unicode
// folding: 'ſ' is 's', 'K' is 'k').
func memberIndex(name []byte, names ...string) int {
	for i, n := range names {
		if string(name) == n {
			return i
		}
	}
	for _, n := range names {
		if bytes.EqualFold(name, []byte(n)) {
			return -2
		}
	}
	for _, c := range name {
		if c >= utf8.RuneSelf {
			return -2
		}
	}
	return -1
}

var usageKey = []byte(`"usage"`)

// Usage is what an event says about the answer's usage
// (openai.EventUsage), nil when nothing; usageOnly marks the chat chunk
// that carries usage and no choices. prev is the usage known so far
// (Anthropic reports input and output tokens in different events). Events
// that do not contain "usage" are not decoded.
func Usage(ev []byte, prev *openai.Usage) (u *openai.Usage, usageOnly bool) {
	// Any JSON spelling of the key contains this.
	if !bytes.Contains(ev, usageKey) {
		return nil, false
	}
	data := Data(ev)
	if data == nil {
		return nil, false
	}
	return openai.EventUsage(data, prev)
}

// TokenWatch finds the first token (IsToken) in a stream handed over in
// chunks split anywhere, as a data plane that relays the stream itself
// sees it. It buffers at most DefaultMaxEvent bytes of an unfinished
// event; a longer event counts as a token (no role-only preamble is that
// long). The zero value is ready.
type TokenWatch struct {
	buf  []byte
	scan int
}

// Feed looks at the next chunk and reports whether an event carrying a
// token completed in it (or in what was buffered before).
func (t *TokenWatch) Feed(chunk []byte) bool {
	t.buf = append(t.buf, chunk...)
	start := 0
	for {
		end, next := eventEnd(t.buf, start, max(t.scan, start))
		if end < 0 {
			t.scan = next
			break
		}
		if IsToken(t.buf[start:end]) {
			t.Reset()
			return true
		}
		start, t.scan = end, end
	}
	n := copy(t.buf, t.buf[start:])
	t.buf, t.scan = t.buf[:n], t.scan-start
	if len(t.buf) > DefaultMaxEvent {
		t.Reset()
		return true
	}
	return false
}

// Reset drops what is buffered.
func (t *TokenWatch) Reset() { t.buf, t.scan = nil, 0 }
