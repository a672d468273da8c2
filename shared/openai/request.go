package openai

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"

	"github.com/infergate/infergate/shared/jsonkeys"
)

// Bounds on the counts a request may carry. Engines cap them lower still
// (by the model's context length); these bounds only keep every estimate
// far from integer overflow, so a huge max_tokens cannot wrap to a small
// or negative token count.
const (
	MaxTokensLimit = 1 << 24 // max_tokens, max_completion_tokens: 0..MaxTokensLimit
	MaxN           = 128     // n: 1..MaxN
)

// Request is what the routers read from an inference request body. The
// body itself is forwarded unchanged, so it must mean the same to the
// routers as to the engine: ParseRequest reads keys exactly and refuses
// bodies that spell a field it reads twice or in another case.
type Request struct {
	Model               string
	Stream              bool
	StreamOptions       *StreamOptions // nil when absent or null
	MaxTokens           *int           // nil when absent or null
	MaxCompletionTokens *int
	MaxOutputTokens     *int // Responses API
	N                   *int
	// Raw JSON of the prompt-carrying fields, aliasing the body; nil when
	// absent or null. Instructions is the Responses API's system text,
	// System the Anthropic Messages API's.
	Messages, Prompt, Input, Instructions, System []byte
	CacheSalt                                     string
	// User and PromptCacheKey are the client's end-user id and cache
	// routing key: hints for session affinity only, never trusted.
	User, PromptCacheKey string

	// Raw values aliasing the body, for IncludeUsage.
	rawStream, rawStreamOptions, rawIncludeUsage []byte
}

// StreamOptions is the request's stream_options object.
type StreamOptions struct {
	IncludeUsage bool
}

// RequestError is a request body refused by ParseRequest; it answers 400
// with its Code (such as "duplicate_key" or "invalid_json").
type RequestError struct {
	Code    string
	Param   string // the field concerned, if any
	Message string
}

func (e *RequestError) Error() string { return e.Message }

// RequestFields are the top-level fields the routers read, in the order of
// the values ParseRequest scans; every one is guarded against duplicate
// and case-variant spellings.
var RequestFields = jsonkeys.NewSet(
	"model", "stream", "stream_options", "max_tokens", "max_completion_tokens",
	"n", "messages", "prompt", "input", "cache_salt", "user", "prompt_cache_key",
	"max_output_tokens", "instructions", "system")

const (
	fModel = iota
	fStream
	fStreamOptions
	fMaxTokens
	fMaxCompletionTokens
	fN
	fMessages
	fPrompt
	fInput
	fCacheSalt
	fUser
	fPromptCacheKey
	fMaxOutputTokens
	fInstructions
	fSystem
	nFields
)

var streamOptionFields = jsonkeys.NewSet("include_usage")

// ParseRequest reads the routing fields of an inference request body. It
// refuses, with a *RequestError: anything but exactly one JSON object
// (valid UTF-8, no trailing data); a field it reads (or
// stream_options.include_usage) that appears twice or in another case;
// a field of the wrong JSON type; max_tokens or max_completion_tokens
// or max_output_tokens outside [0, MaxTokensLimit] and n outside [1, MaxN]. Integers must be
// written as JSON integers (1000, not 1e3 or 1000.0). It does not check
// which fields are required: that depends on the endpoint.
func ParseRequest(body []byte) (*Request, error) {
	var vals [nFields][]byte
	if err := RequestFields.Scan(body, vals[:]); err != nil {
		return nil, keysError(err, "")
	}
	var r Request
	var err error
	if r.Model, err = stringField("model", vals[fModel]); err != nil {
		return nil, err
	}
	if r.CacheSalt, err = stringField("cache_salt", vals[fCacheSalt]); err != nil {
		return nil, err
	}
	if r.User, err = stringField("user", vals[fUser]); err != nil {
		return nil, err
	}
	if r.PromptCacheKey, err = stringField("prompt_cache_key", vals[fPromptCacheKey]); err != nil {
		return nil, err
	}
	if r.Stream, err = boolField("stream", vals[fStream]); err != nil {
		return nil, err
	}
	r.rawStream, r.rawStreamOptions = vals[fStream], vals[fStreamOptions]
	if v := nonNull(vals[fStreamOptions]); v != nil {
		if v[0] != '{' {
			return nil, typeError("stream_options", "an object", v)
		}
		var so [1][]byte
		if err := streamOptionFields.Scan(v, so[:]); err != nil {
			return nil, keysError(err, "stream_options.")
		}
		r.rawIncludeUsage = so[0]
		r.StreamOptions = &StreamOptions{}
		if r.StreamOptions.IncludeUsage, err = boolField("stream_options.include_usage", so[0]); err != nil {
			return nil, err
		}
	}
	if r.MaxTokens, err = intField("max_tokens", vals[fMaxTokens], 0, MaxTokensLimit); err != nil {
		return nil, err
	}
	if r.MaxCompletionTokens, err = intField("max_completion_tokens", vals[fMaxCompletionTokens], 0, MaxTokensLimit); err != nil {
		return nil, err
	}
	if r.MaxOutputTokens, err = intField("max_output_tokens", vals[fMaxOutputTokens], 0, MaxTokensLimit); err != nil {
		return nil, err
	}
	if r.N, err = intField("n", vals[fN], 1, MaxN); err != nil {
		return nil, err
	}
	r.Messages, r.Prompt, r.Input = nonNull(vals[fMessages]), nonNull(vals[fPrompt]), nonNull(vals[fInput])
	r.Instructions, r.System = nonNull(vals[fInstructions]), nonNull(vals[fSystem])
	return &r, nil
}

func keysError(err error, prefix string) error {
	var ke *jsonkeys.Error
	if errors.As(err, &ke) {
		param := ""
		if ke.Key != "" {
			param = prefix + ke.Key
		}
		msg := ke.Error()
		if prefix != "" {
			msg = "stream_options: " + msg
		}
		return &RequestError{Code: ke.Code, Param: param, Message: msg}
	}
	return &RequestError{Code: jsonkeys.CodeInvalidJSON, Message: err.Error()}
}

func nonNull(v []byte) []byte {
	if string(v) == "null" {
		return nil
	}
	return v
}

func typeError(name, want string, got []byte) *RequestError {
	kind := "a number"
	switch got[0] {
	case '"':
		kind = "a string"
	case '{':
		kind = "an object"
	case '[':
		kind = "an array"
	case 't', 'f':
		kind = "a boolean"
	}
	return &RequestError{Code: "invalid_type", Param: name,
		Message: fmt.Sprintf("field %q must be %s, got %s", name, want, kind)}
}

func stringField(name string, v []byte) (string, error) {
	if v = nonNull(v); v == nil {
		return "", nil
	}
	if v[0] != '"' {
		return "", typeError(name, "a string", v)
	}
	if bytes.IndexByte(v, '\\') < 0 {
		// No escapes: the text between the quotes is the string (the
		// scanner refused invalid UTF-8 and control characters).
		return string(v[1 : len(v)-1]), nil
	}
	var s string
	if err := json.Unmarshal(v, &s); err != nil { // cannot fail: the scanner validated v
		return "", &RequestError{Code: jsonkeys.CodeInvalidJSON, Param: name, Message: err.Error()}
	}
	return s, nil
}

func boolField(name string, v []byte) (bool, error) {
	switch string(v) {
	case "", "null", "false":
		return false, nil
	case "true":
		return true, nil
	}
	return false, typeError(name, "a boolean", v)
}

func intField(name string, v []byte, lo, hi int) (*int, error) {
	if v = nonNull(v); v == nil {
		return nil, nil
	}
	if v[0] != '-' && (v[0] < '0' || v[0] > '9') {
		return nil, typeError(name, "an integer", v)
	}
	n, err := strconv.Atoi(string(v))
	if err != nil {
		var ne *strconv.NumError
		if errors.As(err, &ne) && errors.Is(ne.Err, strconv.ErrRange) {
			n = hi + 1 // out of range either way
			if v[0] == '-' {
				n = lo - 1
			}
		} else {
			return nil, &RequestError{Code: "invalid_type", Param: name,
				Message: fmt.Sprintf("field %q must be an integer, got %s", name, v)}
		}
	}
	if n < lo || n > hi {
		return nil, &RequestError{Code: "invalid_value", Param: name,
			Message: fmt.Sprintf("field %q must be between %d and %d, got %s", name, lo, hi, v)}
	}
	return &n, nil
}

// What IncludeUsage writes.
var (
	trueValue           = []byte("true")
	includeUsageMember  = []byte(`"include_usage":true`)
	includeUsageNext    = []byte(`,"include_usage":true`)
	streamOptionsMember = []byte(`"stream_options":{"include_usage":true}`)
	streamOptionsNext   = []byte(`,"stream_options":{"include_usage":true}`)
	streamOptionsValue  = streamOptionsMember[len(`"stream_options":`):]
)

// errOtherBody is IncludeUsage's answer for a body r was not parsed from.
var errOtherBody = errors.New("openai: the body is not the one the request was parsed from")

// IncludeUsage is the edit that sets stream_options.include_usage to true
// in body, the body r was parsed from; changed is false when there is
// nothing to edit: include_usage is already true, or the request does not
// stream (engines refuse stream_options without stream). The edit is made
// at the bytes ParseRequest found, never by re-encoding: every other byte
// reaches the engine as the client sent it, so the prompt (and the prefix
// hash Tier 1 computes from it) is the same with or without the option.
//
//   - include_usage false or null: that value becomes true;
//   - stream_options without include_usage: the member is added as its
//     last one;
//   - stream_options null: its value becomes {"include_usage":true};
//   - no stream_options: the member is added as the body's last one.
func (r *Request) IncludeUsage(body []byte) (s Splice, changed bool, err error) {
	if !r.Stream || (r.StreamOptions != nil && r.StreamOptions.IncludeUsage) {
		return Splice{}, false, nil
	}
	switch v := r.rawStreamOptions; {
	case r.rawIncludeUsage != nil: // false or null
		s = Splice{Off: jsonkeys.Offset(body, r.rawIncludeUsage), N: len(r.rawIncludeUsage), Insert: trueValue}
	case v != nil && v[0] == 'n': // stream_options null
		s = Splice{Off: jsonkeys.Offset(body, v), N: len(v), Insert: streamOptionsValue}
	case v != nil: // an object: before its closing brace, after its last member
		at := len(trimSpaceRight(v[:len(v)-1]))
		s = Splice{Off: -1, Insert: includeUsageNext}
		if off := jsonkeys.Offset(body, v); off >= 0 {
			s.Off = off + at
		}
		if v[at-1] == '{' {
			s.Insert = includeUsageMember
		}
	default:
		// The object's last '}' ends the body: ParseRequest allows only
		// whitespace after it.
		if jsonkeys.Offset(body, r.rawStream) < 0 {
			return Splice{}, false, errOtherBody
		}
		end := trimSpaceRight(body)
		at := len(trimSpaceRight(end[:len(end)-1]))
		s = Splice{Off: at, Insert: streamOptionsNext}
		if body[at-1] == '{' {
			s.Insert = streamOptionsMember
		}
	}
	if s.Off < 0 {
		return Splice{}, false, errOtherBody
	}
	return s, true, nil
}

// Splice is an edit of a body: the N bytes at Off replaced by Insert.
type Splice struct {
	Off, N int
	Insert []byte
}

// Len is the length of body after the edit.
func (s Splice) Len(body []byte) int { return len(body) - s.N + len(s.Insert) }

// Apply returns body after the edit, as a new slice.
func (s Splice) Apply(body []byte) []byte {
	out := make([]byte, 0, s.Len(body))
	return append(append(append(out, body[:s.Off]...), s.Insert...), body[s.Off+s.N:]...)
}

// MaxSpliceGrowth is the most an edit from IncludeUsage lengthens a body:
// a buffer with this much spare capacity can be edited in place (Edit).
const MaxSpliceGrowth = len(`,"stream_options":{"include_usage":true}`)

// Edit returns body after the edit, made in place when body has the
// capacity for it (MaxSpliceGrowth spare bytes always suffice), else in a
// new slice as Apply. In place, the bytes after the edit move, so the
// Request parsed from body no longer points at its values; the point is a
// body net/http sends from memory: a *bytes.Reader over it goes out with
// its headers in one write, where any other reader (Reader) makes the
// transport flush the headers first and copy the body through a buffer
// it allocates (tier2/gateway's BenchmarkTransportSend32K).
func (s Splice) Edit(body []byte) []byte {
	n := s.Len(body)
	if n > cap(body) {
		return s.Apply(body)
	}
	out := body[:n]
	copy(out[s.Off+len(s.Insert):], body[s.Off+s.N:]) // copy moves overlapping bytes correctly
	copy(out[s.Off:], s.Insert)
	return out
}

// Reader reads body after the edit without copying it.
func (s Splice) Reader(body []byte) io.Reader {
	return &spliceReader{parts: [3][]byte{body[:s.Off], s.Insert, body[s.Off+s.N:]}}
}

// spliceReader reads its parts in turn. Unlike io.MultiReader it writes
// itself out (WriteTo) without a buffer: net/http copies a request body
// with io.Copy once more after its Content-Length to check that nothing
// is left, and MultiReader's WriteTo allocates 32 KB for that each time.
type spliceReader struct {
	parts [3][]byte
	i     int
}

func (r *spliceReader) Read(p []byte) (int, error) {
	for r.i < len(r.parts) {
		if n := copy(p, r.parts[r.i]); n > 0 || len(p) == 0 {
			r.parts[r.i] = r.parts[r.i][n:]
			return n, nil
		}
		r.i++
	}
	return 0, io.EOF
}

func (r *spliceReader) WriteTo(w io.Writer) (int64, error) {
	var total int64
	for ; r.i < len(r.parts); r.i++ {
		if len(r.parts[r.i]) == 0 {
			continue
		}
		n, err := w.Write(r.parts[r.i])
		total += int64(n)
		r.parts[r.i] = r.parts[r.i][n:]
		if err != nil {
			return total, err
		}
	}
	return total, nil
}

func trimSpaceRight(b []byte) []byte {
	for len(b) > 0 {
		switch b[len(b)-1] {
		case ' ', '\t', '\n', '\r':
			b = b[:len(b)-1]
		default:
			return b
		}
	}
	return b
}
