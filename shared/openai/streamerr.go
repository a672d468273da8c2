package openai

import (
	"bytes"
	"encoding/json"
	"net/http"
	"strconv"
)

// API is the family of an inference endpoint; its errors, in a body or
// mid-stream, take that family's shape.
type API uint8

const (
	// APIOpenAI is chat and text completions and embeddings:
	// {"error":{"message":...,"type":...,"code":...}}.
	APIOpenAI API = iota
	// APIResponses is the OpenAI Responses API: the same body errors, but a
	// stream ends with an "error" event and "response.failed".
	APIResponses
	// APIAnthropic is the Anthropic Messages API:
	// {"type":"error","error":{"type":...,"message":...}}.
	APIAnthropic
)

// APIForPath is the API family of a request path.
func APIForPath(path string) API {
	switch {
	case IsAnthropicPath(path):
		return APIAnthropic
	case path == "/v1/responses":
		return APIResponses
	}
	return APIOpenAI
}

// StreamEnder follows an event stream on its way to a client so that a
// relay whose upstream breaks off can end it with an error event in the
// stream's own shape. Show it every relayed event with Observe, then call
// ErrorEvent. Only Responses streams need following: their events are
// numbered, and the failed response is announced with the id
// response.created gave it. The zero value follows an OpenAI (chat,
// completions) stream.
type StreamEnder struct {
	API API

	nextSeq int             // sequence number of the next event
	resp    json.RawMessage // the response object of response.created or response.in_progress
}

var (
	seqKey       = []byte(`"sequence_number"`)
	respOpenKeys = [][]byte{[]byte(`response.created`), []byte(`response.in_progress`)}
)

// Observe records one whole relayed event (its lines, with or without the
// blank line that ends it).
func (s *StreamEnder) Observe(ev []byte) {
	if s.API == APIResponses {
		s.event(ev)
	}
}

// event records one complete event.
func (s *StreamEnder) event(ev []byte) {
	for _, k := range respOpenKeys {
		if bytes.Contains(ev, k) {
			var e struct {
				Type           string          `json:"type"`
				SequenceNumber *int            `json:"sequence_number"`
				Response       json.RawMessage `json:"response"`
			}
			if json.Unmarshal(eventData(ev), &e) == nil {
				if e.Type == "response.created" || e.Type == "response.in_progress" {
					if len(e.Response) > 0 && e.Response[0] == '{' {
						s.resp = e.Response
					}
				}
				if e.SequenceNumber != nil {
					s.nextSeq = *e.SequenceNumber + 1
				}
				return
			}
		}
	}
	// The common case, a delta: read the number without decoding the event.
	i := bytes.LastIndex(ev, seqKey)
	if i < 0 {
		return
	}
	rest := bytes.TrimLeft(ev[i+len(seqKey):], " \t")
	rest, ok := bytes.CutPrefix(rest, []byte(":"))
	if !ok {
		return
	}
	rest = bytes.TrimLeft(rest, " \t")
	n := 0
	for n < len(rest) && rest[n] >= '0' && rest[n] <= '9' {
		n++
	}
	if v, err := strconv.Atoi(string(rest[:n])); err == nil && n > 0 {
		s.nextSeq = v + 1
	}
}

// eventData joins an event's data lines.
func eventData(ev []byte) []byte {
	var data []byte
	for line := range bytes.Lines(ev) {
		line = bytes.TrimRight(line, "\r\n")
		if v, ok := bytes.CutPrefix(line, []byte("data:")); ok {
			if data != nil {
				data = append(data, '\n')
			}
			data = append(data, bytes.TrimPrefix(v, []byte(" "))...)
		}
	}
	return data
}

// ErrorEvent is the SSE text that ends the stream after a failure that
// would have had the given HTTP status before the stream began:
//
//   - OpenAI: data: {"error":{"message":...,"type":...,"code":...}}
//   - Responses: event: error, data: {"type":"error","code":...,
//     "message":...,"param":null,"sequence_number":N}; then, once the
//     stream named its response, event: response.failed with that
//     response, its status "failed" and its error set.
//   - Anthropic: event: error, data: {"type":"error","error":{"type":...,
//     "message":...}}, the error type following the status as in a body.
func (s *StreamEnder) ErrorEvent(status int, code, msg string) []byte {
	var out []byte
	switch s.API {
	case APIAnthropic:
		var e anthropicEnvelope
		e.Type, e.Error.Type, e.Error.Message = "error", AnthropicErrorType(status), msg
		out = appendEvent(out, "error", e)
	case APIResponses:
		out = appendEvent(out, "error", struct {
			Type    string  `json:"type"`
			Code    string  `json:"code"`
			Message string  `json:"message"`
			Param   *string `json:"param"`
			Seq     int     `json:"sequence_number"`
		}{"error", code, msg, nil, s.nextSeq})
		s.nextSeq++
		if failed := s.failedResponse(status, msg); failed != nil {
			out = appendEvent(out, "response.failed", struct {
				Type     string          `json:"type"`
				Seq      int             `json:"sequence_number"`
				Response json.RawMessage `json:"response"`
			}{"response.failed", s.nextSeq, failed})
			s.nextSeq++
		}
	default:
		out = appendEvent(out, "", envelope{Error: Error{Message: msg, Type: TypeForStatus(status), Code: code}})
	}
	return out
}

// failedResponse is the response response.created announced, now failed;
// nil when the stream named none.
func (s *StreamEnder) failedResponse(status int, msg string) json.RawMessage {
	var r map[string]json.RawMessage
	if s.resp == nil || json.Unmarshal(s.resp, &r) != nil {
		return nil
	}
	// The Responses API's error codes: server_error, rate_limit_exceeded, ...
	code := "server_error"
	if status == http.StatusTooManyRequests {
		code = "rate_limit_exceeded"
	}
	r["status"] = json.RawMessage(`"failed"`)
	r["error"], _ = json.Marshal(map[string]string{"code": code, "message": msg})
	b, err := json.Marshal(r)
	if err != nil {
		return nil
	}
	return b
}

func appendEvent(out []byte, name string, v any) []byte {
	b, _ := json.Marshal(v)
	if name != "" {
		out = append(append(append(out, "event: "...), name...), '\n')
	}
	out = append(append(out, "data: "...), b...)
	return append(out, '\n', '\n')
}
