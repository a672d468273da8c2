package openai

import (
	"net/http/httptest"
	"strings"
	"testing"
)

func TestRequestID(t *testing.T) {
	for _, tc := range []struct {
		in   string
		keep bool
	}{
		{"abc-123", true},
		{"req_01HZX~!@#$%^&*()", true},
		{strings.Repeat("a", MaxRequestIDLen), true},
		{strings.Repeat("a", MaxRequestIDLen+1), false},
		{"", false},
		{"has space", false},
		{"tab\there", false},
		{"new\nline", false},
		{"del\x7f", false},
		{"é", false},
	} {
		got := RequestID(tc.in)
		if (got == tc.in) != tc.keep {
			t.Errorf("RequestID(%q) = %q, keep %v", tc.in, got, tc.keep)
		}
		if !ValidRequestID(got) {
			t.Errorf("RequestID(%q) = %q is not valid itself", tc.in, got)
		}
	}
	if a, b := NewRequestID(), NewRequestID(); a == b || len(a) != 24 {
		t.Errorf("NewRequestID: %q, %q", a, b)
	}
}

func TestAnthropicErrors(t *testing.T) {
	for _, tc := range []struct {
		status int
		typ    string
	}{{400, "invalid_request_error"}, {401, "authentication_error"}, {404, "not_found_error"},
		{413, "request_too_large"}, {429, "rate_limit_error"}, {500, "api_error"}, {503, "overloaded_error"}} {
		rec := httptest.NewRecorder()
		Errorf(AnthropicWriter{rec}, tc.status, "some_code", "msg")
		want := `{"type":"error","error":{"type":"` + tc.typ + `","message":"msg"}}`
		if rec.Code != tc.status || rec.Body.String() != want {
			t.Errorf("%d: %d %s, want %s", tc.status, rec.Code, rec.Body, want)
		}
	}
	rec := httptest.NewRecorder()
	Errorf(rec, 404, "model_not_found", "msg")
	if !strings.Contains(rec.Body.String(), `"code":"model_not_found"`) {
		t.Errorf("plain writer: %s", rec.Body)
	}
}
