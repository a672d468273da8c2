package gateway

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/infergate/infergate/shared/openai"
	"github.com/infergate/infergate/tier2/route"
)

// errEventTooLarge is returned (wrapped) by readEvent for an SSE event
// longer than Options.MaxEventBytes.
var errEventTooLarge = errors.New("SSE event too large")

// relayStream relays an SSE response event by event. Until the first event
// has been read nothing is written, so a cluster that dies before its first
// token still fails over. After that the stream is the client's: each
// write must finish within StreamWriteTimeout (a client that stops reading
// is dropped), the whole stream within MaxStreamDuration, and a stream
// that breaks ends with an error event in its API's shape, as Tier 1's do
// (openai.StreamEnder).
func (x *exchange) relayStream(tr *try, resp *http.Response) (attemptResult, error) {
	opts := &x.g.opts
	br := bufio.NewReaderSize(resp.Body, 4<<10) // longer lines are handled by readEvent
	ev, err := readEvent(br, opts.MaxEventBytes)
	if err != nil {
		if x.r.Context().Err() != nil {
			return resultDone, route.ErrClientCanceled
		}
		if tr.ctx.Err() != nil {
			return resultRetry, fmt.Errorf("no first event within %v", opts.FirstByteTimeout)
		}
		return resultRetry, fmt.Errorf("stream ended before its first event: %w", err)
	}
	tr.timer.Stop()
	tr.a.FirstToken(time.Since(tr.sent))
	var expired atomic.Bool
	limit := time.AfterFunc(opts.MaxStreamDuration, func() { expired.Store(true); tr.cancel() })
	defer limit.Stop()

	h := x.w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	h.Del("Content-Length")
	x.w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(x.w.ResponseWriter)
	// The deadline would outlive the response on a kept-alive connection.
	defer func() { _ = rc.SetWriteDeadline(time.Time{}) }()
	// A broken stream ends in its own API's error shape.
	end := openai.StreamEnder{API: openai.APIForPath(x.r.URL.Path)}
	for {
		if out := x.filterEvent(ev); len(out) > 0 {
			if err := x.writeEvent(rc, out); err != nil {
				return resultDone, route.ErrClientCanceled
			}
			end.Observe(out)
			x.relayed++
		}
		ev, err = readEvent(br, opts.MaxEventBytes)
		switch {
		case err == nil:
			continue
		case err == io.EOF:
			return resultDone, nil
		case x.r.Context().Err() != nil:
			return resultDone, route.ErrClientCanceled
		case expired.Load():
			// The client's doing, not the cluster's: not held against it.
			x.broken = true
			_ = x.writeEvent(rc, end.ErrorEvent(http.StatusGatewayTimeout, "stream_too_long", fmt.Sprintf("the stream exceeded its maximum duration of %v", opts.MaxStreamDuration)))
			return resultDone, nil
		}
		// Bytes already reached the client: no retry; the stream ends with
		// an error event and the cluster is charged with the failure.
		code, msg := "upstream_interrupted", "upstream stream interrupted"
		if errors.Is(err, errEventTooLarge) {
			code, msg = "upstream_event_too_large", fmt.Sprintf("upstream sent an event over %d bytes", opts.MaxEventBytes)
		}
		x.broken = true
		_ = x.writeEvent(rc, end.ErrorEvent(http.StatusBadGateway, code, msg))
		return resultDone, fmt.Errorf("stream broken: %w", err)
	}
}

// writeEvent writes and flushes one event within StreamWriteTimeout.
func (x *exchange) writeEvent(rc *http.ResponseController, ev []byte) error {
	if d := x.g.opts.StreamWriteTimeout; d > 0 {
		_ = rc.SetWriteDeadline(time.Now().Add(d))
	}
	if _, err := x.w.Write(ev); err != nil {
		return err
	}
	return rc.Flush()
}

// readEvent reads one SSE event (lines up to a blank line), including its
// terminating blank line, of at most maxBytes (0: unbounded). io.EOF means
// a clean end between events; a longer event is an error wrapping
// errEventTooLarge.
func readEvent(br *bufio.Reader, maxBytes int) ([]byte, error) {
	var ev []byte
	midLine := false // the last read ended inside a line longer than the buffer
	for {
		line, err := br.ReadSlice('\n')
		if maxBytes > 0 && len(ev)+len(line) > maxBytes {
			return nil, fmt.Errorf("gateway: %w: over %d bytes", errEventTooLarge, maxBytes)
		}
		if err == bufio.ErrBufferFull {
			// A long line: keep reading it.
			ev = append(ev, line...)
			midLine = true
			continue
		}
		if err != nil {
			if err == io.EOF && len(ev)+len(line) > 0 {
				ev = append(ev, line...)
				if len(bytes.TrimSpace(ev)) == 0 {
					return nil, io.EOF
				}
				return append(ev, '\n', '\n'), nil // unterminated last event
			}
			return nil, err
		}
		ev = append(ev, line...)
		blank := !midLine && len(bytes.TrimRight(line, "\r\n")) == 0
		midLine = false
		if blank {
			if len(bytes.TrimSpace(ev)) == 0 {
				ev = ev[:0] // stray blank line
				continue
			}
			return ev, nil
		}
	}
}

var usageKey = []byte(`"usage"`)

// filterEvent records usage from a stream chunk and, when the gateway asked
// for usage on the client's behalf, keeps the usage chunk from the client.
func (x *exchange) filterEvent(ev []byte) []byte {
	// Cheap test first: any JSON spelling of the key contains this
	// (spacing around the colon is the decoder's business).
	if !bytes.Contains(ev, usageKey) {
		return ev
	}
	data := eventData(ev)
	if data == nil {
		return ev
	}
	var chunk struct {
		Type     string            `json:"type"`
		Choices  []json.RawMessage `json:"choices"`
		Usage    *usage            `json:"usage"`
		Response *struct {         // Responses: response.completed
			Usage *usage `json:"usage"`
		} `json:"response"`
		Message *struct { // Anthropic: message_start
			Usage *usage `json:"usage"`
		} `json:"message"`
	}
	if json.Unmarshal(data, &chunk) != nil {
		return ev
	}
	switch chunk.Type {
	case "response.completed", "response.incomplete", "response.failed":
		if chunk.Response != nil && chunk.Response.Usage != nil {
			x.usage = chunk.Response.Usage.normalize()
		}
		return ev
	case "message_start":
		// Input tokens here; the output count comes in message_delta.
		if chunk.Message != nil && chunk.Message.Usage != nil {
			x.usage = &usage{PromptTokens: chunk.Message.Usage.InputTokens}
		}
		return ev
	case "message_delta":
		if chunk.Usage != nil {
			if x.usage == nil {
				x.usage = &usage{}
			}
			if chunk.Usage.InputTokens > 0 {
				x.usage.PromptTokens = chunk.Usage.InputTokens
			}
			x.usage.CompletionTokens = chunk.Usage.OutputTokens
			x.usage.TotalTokens = 0
		}
		return ev
	}
	if chunk.Usage == nil {
		return ev
	}
	x.usage = chunk.Usage.normalize()
	if !x.injected {
		return ev
	}
	if len(chunk.Choices) == 0 {
		return nil // the usage-only chunk the client did not ask for
	}
	// Usage riding on a content chunk: drop just the field.
	var m map[string]json.RawMessage
	if json.Unmarshal(data, &m) != nil {
		return ev
	}
	delete(m, "usage")
	nb, err := json.Marshal(m)
	if err != nil {
		return ev
	}
	return append(append([]byte("data: "), nb...), '\n', '\n')
}

// eventData joins an event's data lines (nil if it has none).
func eventData(ev []byte) []byte {
	var data []byte
	found := false
	for _, line := range bytes.Split(ev, []byte("\n")) {
		line = bytes.TrimRight(line, "\r")
		if v, ok := bytes.CutPrefix(line, []byte("data:")); ok {
			v = bytes.TrimPrefix(v, []byte(" "))
			if found {
				data = append(data, '\n')
			}
			data = append(data, v...)
			found = true
		}
	}
	if !found {
		return nil
	}
	return data
}
