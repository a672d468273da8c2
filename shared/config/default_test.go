package config

import (
	"testing"
	"time"
)

func TestDefault(t *testing.T) {
	for _, tc := range []struct {
		name      string
		v, d, out time.Duration
	}{
		{"zero", 0, time.Second, time.Second},
		{"negative", -5 * time.Millisecond, time.Second, time.Second},
		{"set", 2 * time.Minute, time.Second, 2 * time.Minute},
		{"smallest positive", 1, time.Second, 1},
	} {
		v := tc.v
		Default(&v, tc.d)
		if v != tc.out {
			t.Errorf("%s: Default(%v, %v) = %v, want %v", tc.name, tc.v, tc.d, v, tc.out)
		}
	}
	for _, tc := range []struct{ v, d, out float64 }{
		{0, 0.8, 0.8}, {-0.1, 0.8, 0.8}, {0.5, 0.8, 0.5},
	} {
		v := tc.v
		Default(&v, tc.d)
		if v != tc.out {
			t.Errorf("Default(%v, %v) = %v, want %v", tc.v, tc.d, v, tc.out)
		}
	}
	for _, tc := range []struct{ v, d, out string }{
		{"", "http", "http"}, {"https", "http", "https"}, {" ", "http", " "},
	} {
		v := tc.v
		Default(&v, tc.d)
		if v != tc.out {
			t.Errorf("Default(%q, %q) = %q, want %q", tc.v, tc.d, v, tc.out)
		}
	}
}
