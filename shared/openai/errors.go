// Package openai holds the pieces of the OpenAI HTTP API that every
// infergate server speaks: the JSON error envelope and the request fields
// the routers read.
package openai

import (
	"encoding/json"
	"net/http"
	"strconv"
)

// Error is the body of an OpenAI-style error response:
// {"error":{"message":...,"type":...,"code":...}}.
type Error struct {
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    any     `json:"code"`
}

type envelope struct {
	Error Error `json:"error"`
}

// Error types used across infergate, following OpenAI's vocabulary.
const (
	TypeInvalidRequest = "invalid_request_error"
	TypeAuthentication = "authentication_error"
	TypeNotFound       = "not_found_error"
	TypeRateLimit      = "rate_limit_error"
	TypeServer         = "server_error"
	TypeUnavailable    = "service_unavailable"
)

// AnthropicShaper is implemented by a ResponseWriter serving the Anthropic
// Messages API (/v1/messages): WriteError then answers in that API's error
// shape, so every error path of a server speaks the endpoint's dialect
// without knowing it.
type AnthropicShaper interface {
	AnthropicErrors() bool
}

// anthropicEnvelope is {"type":"error","error":{"type":...,"message":...}}.
type anthropicEnvelope struct {
	Type  string `json:"type"`
	Error struct {
		Type    string `json:"type"`
		Message string `json:"message"`
	} `json:"error"`
}

// AnthropicErrorType is the Anthropic error type for an HTTP status.
func AnthropicErrorType(status int) string {
	switch status {
	case http.StatusUnauthorized:
		return "authentication_error"
	case http.StatusForbidden:
		return "permission_error"
	case http.StatusNotFound:
		return "not_found_error"
	case http.StatusRequestEntityTooLarge:
		return "request_too_large"
	case http.StatusTooManyRequests:
		return "rate_limit_error"
	case http.StatusServiceUnavailable, 529:
		return "overloaded_error"
	case http.StatusGatewayTimeout:
		return "timeout_error"
	}
	if status >= 500 {
		return "api_error"
	}
	return "invalid_request_error"
}

// WriteError writes an OpenAI-style JSON error with the given status.
// code is a short machine-readable string such as "model_not_found". On
// an AnthropicShaper that asks for it, the error takes Anthropic's shape
// (the code is then dropped: that shape has no place for it).
func WriteError(w http.ResponseWriter, status int, typ, code, message string) {
	api := APIOpenAI
	if as, ok := w.(AnthropicShaper); ok && as.AnthropicErrors() {
		api = APIAnthropic
	}
	body := ErrorBody(api, status, typ, code, message)
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(status)
	_, _ = w.Write(body)
}

// ErrorBody is the JSON body of an error answered with status, in api's
// shape: Anthropic's {"type":"error","error":{"type":...,"message":...}}
// (typ and code dropped: the type follows the status), else OpenAI's
// envelope (the Responses API shares it).
func ErrorBody(api API, status int, typ, code, message string) []byte {
	var body []byte
	if api == APIAnthropic {
		var e anthropicEnvelope
		e.Type, e.Error.Type, e.Error.Message = "error", AnthropicErrorType(status), message
		body, _ = json.Marshal(e)
	} else {
		body, _ = json.Marshal(envelope{Error: Error{Message: message, Type: typ, Code: code}})
	}
	return body
}

// TypeForStatus returns the conventional error type for an HTTP status.
func TypeForStatus(status int) string {
	switch {
	case status == http.StatusUnauthorized || status == http.StatusForbidden:
		return TypeAuthentication
	case status == http.StatusNotFound:
		return TypeNotFound
	case status == http.StatusTooManyRequests:
		return TypeRateLimit
	case status == http.StatusServiceUnavailable:
		return TypeUnavailable
	case status >= 500:
		return TypeServer
	default:
		return TypeInvalidRequest
	}
}

// AnthropicWriter wraps a ResponseWriter so WriteError answers in the
// Anthropic shape; Unwrap keeps http.ResponseController working.
type AnthropicWriter struct{ http.ResponseWriter }

// AnthropicErrors implements AnthropicShaper.
func (AnthropicWriter) AnthropicErrors() bool { return true }

// Unwrap returns the wrapped writer.
func (a AnthropicWriter) Unwrap() http.ResponseWriter { return a.ResponseWriter }

// Flush flushes the wrapped writer when it can.
func (a AnthropicWriter) Flush() {
	if f, ok := a.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// IsAnthropicPath reports whether path is an Anthropic Messages API path.
func IsAnthropicPath(path string) bool {
	return path == "/v1/messages" || path == "/v1/messages/count_tokens"
}

// Errorf is a shorthand for WriteError with the type derived from status.
func Errorf(w http.ResponseWriter, status int, code, message string) {
	WriteError(w, status, TypeForStatus(status), code, message)
}
