package openai

import (
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
