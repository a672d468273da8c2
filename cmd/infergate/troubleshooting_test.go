package main

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

var (
	// warnRE finds a WARN log line's message: log.Warn("msg", ...) or
	// log.Log(ctx, slog.LevelWarn, "msg", ...) and the gateway's c.log.
	warnRE = regexp.MustCompile(`(?:\.Warn\(|LevelWarn, )\s*"([^"]+)"`)
	// codeRE finds an error code the tiers answer: openai.Errorf(w,
	// status, "code", ...), WriteError(w, status, type, "code", ...),
	// Code: "code", code: "code" and the Code... = "code" constants.
	codeRE = regexp.MustCompile(`(?:openai\.Errorf\([^,]+, [^,]+, |openai\.WriteError\([^,]+, [^,]+, [^,]+, |\b[Cc]ode: |\bCode[A-Z]\w* += )"([a-z][a-z_]+)"`)
)

// TestTroubleshootingCoversEverything: docs/troubleshooting.md has an
// entry for every error code Tier 1 and Tier 2 answer and for every WARN
// log line they print, so a new one without its entry fails here.
func TestTroubleshootingCoversEverything(t *testing.T) {
	doc, err := os.ReadFile("../../docs/troubleshooting.md")
	if err != nil {
		t.Fatal(err)
	}
	text := string(doc)
	warns, codes := map[string]string{}, map[string]string{}
	for _, root := range []string{"../../tier1", "../../tier2", "../../shared/openai", "../../shared/relay", "../../tier1/server", "."} {
		err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
				return err
			}
			b, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			for _, m := range warnRE.FindAllStringSubmatch(string(b), -1) {
				warns[m[1]] = path
			}
			for _, m := range codeRE.FindAllStringSubmatch(string(b), -1) {
				codes[m[1]] = path
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	if len(warns) < 20 || len(codes) < 20 {
		t.Fatalf("found %d WARN lines and %d codes: the patterns no longer match the code", len(warns), len(codes))
	}
	for msg, path := range warns {
		// Long messages are quoted in the page up to a "..."; the first
		// words must be there as written.
		prefix := msg
		if len(prefix) > 28 {
			prefix = prefix[:28]
		}
		if !strings.Contains(text, "`"+prefix) {
			t.Errorf("docs/troubleshooting.md has no entry for the WARN line %q (%s)", msg, path)
		}
	}
	for code, path := range codes {
		if strings.HasSuffix(code, "_") { // a prefix: "missing_" + the endpoint's field, listed by field
			continue
		}
		if !strings.Contains(text, "`"+code+"`") {
			t.Errorf("docs/troubleshooting.md has no entry for the error code %q (%s)", code, path)
		}
	}
}
