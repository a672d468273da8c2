package config

import "testing"

func TestList(t *testing.T) {
	type pool struct{ name string }
	name := func(p pool) string { return p.name }
	for _, tc := range []struct {
		items []pool
		want  string
	}{
		{nil, "none configured"},
		{[]pool{{"a"}}, "a"},
		{[]pool{{"a"}, {"b"}, {""}}, "a, b, "},
	} {
		if got := List(tc.items, name, "none configured"); got != tc.want {
			t.Errorf("List(%v) = %q, want %q", tc.items, got, tc.want)
		}
	}
}
