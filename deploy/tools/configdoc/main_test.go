package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/infergate/infergate/shared/config"
)

const root = "../../.."

// TestGeneratedFilesCurrent fails when the configuration reference or a
// chart's config schema no longer matches the configuration types.
func TestGeneratedFilesCurrent(t *testing.T) {
	files, err := Generate(root)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range sortedKeys(files) {
		have, err := os.ReadFile(filepath.Join(root, name))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(have, files[name]) {
			t.Errorf("%s is out of date: run go generate ./deploy/tools/configdoc", name)
		}
	}
}

// TestReferenceComplete: every key of each configuration is in its
// reference with a type, a default and a description that reads as a
// sentence (a field without a doc comment fails here rather than
// shipping an empty row).
func TestReferenceComplete(t *testing.T) {
	files, err := Generate(root)
	if err != nil {
		t.Fatal(err)
	}
	row := regexp.MustCompile("(?m)^\\| `([^`]+)` \\| ([^|]*) \\| ([^|]*) \\| (.*) \\|$")
	for _, tr := range tiers {
		md := string(files[tr.doc])
		described := map[string]string{}
		for _, m := range row.FindAllStringSubmatch(md, -1) {
			described[m[1]] = m[4]
			if strings.TrimSpace(m[2]) == "" || strings.TrimSpace(m[3]) == "" {
				t.Errorf("%s: %s has no type or no default: %q", tr.doc, m[1], m[0])
			}
			if d := strings.TrimSpace(m[4]); d != "" && !sentenceLike.MatchString(d) {
				t.Errorf("%s: %s: the description is not a sentence: %q", tr.doc, m[1], d)
			}
		}
		for _, k := range config.Keys(tr.cfg) {
			desc, ok := described[k.Path]
			if !ok && k.Leaf {
				t.Errorf("%s: no row for %s", tr.doc, k.Path)
				continue
			}
			if ok && strings.TrimSpace(desc) == "" {
				t.Errorf("%s: %s has no description (add a doc comment to %s.%s)", tr.doc, k.Path, k.Owner, k.Field.Name)
			}
		}
		if n := strings.Count(md, "\n"); n > 600 {
			t.Errorf("%s has %d lines; split it", tr.doc, n)
		}
	}
}

// sentenceLike is a description starting with a capital or a key and
// ending with a full stop.
var sentenceLike = regexp.MustCompile("^([A-Z]|`).*[.?!]$")

func TestSentence(t *testing.T) {
	for in, want := range map[string]string{
		"dialling a pod; default 2s":     "Dialling a pod; default 2s.",
		"http, or https (the default)":   "`scheme` is http, or https (the default).",
		"connect (default) or bind":      "`scheme` is connect (default) or bind.",
		"host:port; required":            "`scheme` is host:port; required.",
		"Already one.":                   "Already one.",
		"`key` is where (see docs/x.md)": "`key` is where (see docs/x.md).",
	} {
		if got := sentence(in, "scheme"); got != want {
			t.Errorf("sentence(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestFallbackDefault(t *testing.T) {
	for _, tc := range []struct{ typ, desc, want string }{
		{"string", `"1.3" (default) or "1.2".`, `"1.3"`},
		{"string", "Http, or https (the default when tls is set).", "*see description*"},
		{"string", "Required, unique.", "*required*"},
		{"string", "A label selector; `port` is then required.", "*empty*"},
		{"integer", "The peer port; default the listener's.", "*the listener's*"},
		{"integer", "Requests per minute.", "0"},
		{"list of strings", "Served models.", "*none*"},
		{"mapping", "TLS to the agent.", "*see its keys*"},
		{"number", "The share recorded, in [0,1]; absent means 1.", "1"},
	} {
		if got := fallbackDefault(config.KeyInfo{Path: "a.b", Type: tc.typ}, tc.desc); got != tc.want {
			t.Errorf("fallbackDefault(%s, %q) = %q, want %q", tc.typ, tc.desc, got, tc.want)
		}
	}
}

func TestConfigSpan(t *testing.T) {
	in := []byte("{\n  \"properties\": {\n    \"config\": {\"a\": \"}\\\"{\", \"b\": {}},\n    \"x\": 1\n  }\n}\n")
	s, e, err := configSpan(in)
	if err != nil {
		t.Fatal(err)
	}
	if got := string(in[s:e]); got != `{"a": "}\"{", "b": {}}` {
		t.Errorf("span %q", got)
	}
	var v any
	out, err := withConfigSchema(in, tiers[0])
	if err != nil || json.Unmarshal(out, &v) != nil {
		t.Fatalf("rewritten file is not JSON: %v\n%s", err, out)
	}
}
