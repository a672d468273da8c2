// Package statusui is the status pages' user interface, shared by both
// tiers: one HTML shell and the CSS and JavaScript it loads, embedded, so
// a page needs nothing from outside the binary (no CDN, no framework).
// The shell holds no data: its script reads the tier's JSON with the
// token the operator gives in the URL fragment (/status#token=...), which
// the browser never sends to the server; it keeps it in sessionStorage
// and sends it as Authorization: Bearer, polling every couple of seconds.
//
// Tier 1 serves Tier1 on its metrics listener, reading /status/api/...;
// Tier 2 serves Tier2 on its admin listener, reading /admin/v1/...
// (docs/operations.md).
package statusui

import (
	"bytes"
	"embed"
	"html/template"
	"net/http"
	"strings"
)

// Path is the page's address; its assets are under AssetsPath.
const (
	Path       = "/status"
	AssetsPath = Path + "/ui/"
)

// Page is one tier's status page.
type Page struct {
	// Title heads the page.
	Title string
	// Script is the page's own script among the embedded assets; it
	// runs after common.js.
	Script string
}

// The tiers' pages.
var (
	Tier1 = Page{Title: "infergate Tier 1", Script: "tier1.js"}
	Tier2 = Page{Title: "infergate Tier 2", Script: "tier2.js"}
)

//go:embed assets
var assets embed.FS

var shell = template.Must(template.ParseFS(assets, "assets/index.html"))

// securityHeaders keep the page to its own origin: scripts and styles
// from the binary only, requests to the same listener only, never framed,
// and the address (fragment aside) never sent on as a referrer.
func securityHeaders(h http.Header) {
	h.Set("Content-Security-Policy", "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "+
		"img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("X-Frame-Options", "DENY")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("Cache-Control", "no-store")
}

// Handler serves p at Path and its assets under AssetsPath; any other
// path is 404.
func Handler(p Page) http.Handler {
	var html bytes.Buffer
	if err := shell.Execute(&html, p); err != nil {
		panic("statusui: " + err.Error()) // the embedded template and a Page: a programming error
	}
	page := html.Bytes()
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		securityHeaders(w.Header())
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			http.Error(w, "use GET", http.StatusMethodNotAllowed)
			return
		}
		switch name := strings.TrimPrefix(r.URL.Path, AssetsPath); {
		case r.URL.Path == Path:
			w.Header().Set("Content-Type", "text/html; charset=utf-8")
			_, _ = w.Write(page)
		case name != r.URL.Path && asset(name):
			b, _ := assets.ReadFile("assets/" + name)
			w.Header().Set("Content-Type", contentType(name))
			_, _ = w.Write(b)
		default:
			http.NotFound(w, r)
		}
	})
}

// Mount serves p's paths with Handler and passes every other request to
// next.
func Mount(next http.Handler, p Page) http.Handler {
	ui := Handler(p)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == Path || strings.HasPrefix(r.URL.Path, AssetsPath) {
			ui.ServeHTTP(w, r)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// asset reports whether name is a servable asset: a plain file name of
// the embedded folder, not the shell's template.
func asset(name string) bool {
	if name == "" || name == "index.html" || strings.ContainsAny(name, "/\\") {
		return false
	}
	_, err := assets.ReadFile("assets/" + name)
	return err == nil
}

func contentType(name string) string {
	switch {
	case strings.HasSuffix(name, ".js"):
		return "text/javascript; charset=utf-8"
	case strings.HasSuffix(name, ".css"):
		return "text/css; charset=utf-8"
	}
	return "application/octet-stream"
}
