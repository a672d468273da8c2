package statusui

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

func TestHandler(t *testing.T) {
	next := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = io.WriteString(w, "next") })
	h := Mount(next, Tier2)
	tests := []struct {
		method, path string
		wantStatus   int
		wantType     string
		wantBody     string
	}{
		{"GET", "/status", 200, "text/html; charset=utf-8", `<script src="/status/ui/tier2.js">`},
		{"HEAD", "/status", 200, "text/html; charset=utf-8", ""},
		{"GET", "/status/ui/common.js", 200, "text/javascript; charset=utf-8", "const IG"},
		{"GET", "/status/ui/tier1.js", 200, "text/javascript; charset=utf-8", "/status/api/"},
		{"GET", "/status/ui/tier2.js", 200, "text/javascript; charset=utf-8", "/admin/v1/"},
		{"GET", "/status/ui/style.css", 200, "text/css; charset=utf-8", ":root"},
		{"GET", "/status/ui/index.html", 404, "", ""}, // the template is not an asset
		{"GET", "/status/ui/", 404, "", ""},
		{"GET", "/status/ui/nope.js", 404, "", ""},
		{"GET", "/status/ui/../statusui.go", 404, "", ""},
		{"GET", "/status/ui/assets/common.js", 404, "", ""},
		{"POST", "/status", 405, "", ""},
		{"GET", "/status/", 200, "", "next"}, // not the page's: passed on
		{"GET", "/admin/v1/clusters", 200, "", "next"},
	}
	for _, tt := range tests {
		t.Run(tt.method+" "+tt.path, func(t *testing.T) {
			rec := httptest.NewRecorder()
			req := httptest.NewRequest(tt.method, "http://x"+tt.path, nil)
			h.ServeHTTP(rec, req)
			if rec.Code != tt.wantStatus {
				t.Fatalf("status %d, want %d", rec.Code, tt.wantStatus)
			}
			if tt.wantType != "" && rec.Header().Get("Content-Type") != tt.wantType {
				t.Errorf("Content-Type %q, want %q", rec.Header().Get("Content-Type"), tt.wantType)
			}
			if !strings.Contains(rec.Body.String(), tt.wantBody) {
				t.Errorf("body lacks %q:\n%.300s", tt.wantBody, rec.Body.String())
			}
			if tt.wantBody != "next" {
				if csp := rec.Header().Get("Content-Security-Policy"); !strings.Contains(csp, "default-src 'none'") || !strings.Contains(csp, "connect-src 'self'") {
					t.Errorf("CSP %q", csp)
				}
				if rec.Header().Get("X-Content-Type-Options") != "nosniff" || rec.Header().Get("Cache-Control") != "no-store" {
					t.Errorf("headers %v", rec.Header())
				}
			}
		})
	}
}

// The pages load nothing from outside the binary.
func TestNoExternalAssets(t *testing.T) {
	entries, err := assets.ReadDir("assets")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		b, _ := assets.ReadFile("assets/" + e.Name())
		s := string(b)
		for _, bad := range []string{"http://", "https://", "//cdn", "innerHTML", "outerHTML", "eval(", "new Function", "style=\"", "<script>"} {
			if strings.Contains(s, bad) {
				t.Errorf("%s contains %q", e.Name(), bad)
			}
		}
	}
}

func TestTier1Page(t *testing.T) {
	rec := httptest.NewRecorder()
	Handler(Tier1).ServeHTTP(rec, httptest.NewRequest("GET", "http://x/status", nil))
	body := rec.Body.String()
	if !strings.Contains(body, "<title>infergate Tier 1 — status</title>") || !strings.Contains(body, `src="/status/ui/tier1.js"`) || !strings.Contains(body, `src="/status/ui/common.js"`) {
		t.Errorf("tier 1 page:\n%s", body)
	}
}
