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

// WriteError writes an OpenAI-style JSON error with the given status.
// code is a short machine-readable string such as "model_not_found".
func WriteError(w http.ResponseWriter, status int, typ, code, message string) {
	body, _ := json.Marshal(envelope{Error: Error{Message: message, Type: typ, Code: code}})
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(status)
	_, _ = w.Write(body)
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

// Errorf is a shorthand for WriteError with the type derived from status.
func Errorf(w http.ResponseWriter, status int, code, message string) {
	WriteError(w, status, TypeForStatus(status), code, message)
}
