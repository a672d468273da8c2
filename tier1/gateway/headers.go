package gateway

import (
	"net/http"
	"time"
)

// IsInternalHeader reports whether a header name is one of the routing
// headers only infergate (or a GIE-style gateway) may set: x-infergate-*
// and x-gateway-*, in any case and with '_' in place of any '-'. Some
// proxies and servers fold underscores into dashes, so
// X_gateway_destination_endpoint must be treated as the real thing.
func IsInternalHeader(name string) bool {
	const a, b = "x-infergate-", "x-gateway-"
	return hasFoldedPrefix(name, a) || hasFoldedPrefix(name, b)
}

// hasFoldedPrefix reports whether name starts with prefix (lower case,
// dashes) ignoring case and reading '_' as '-'.
func hasFoldedPrefix(name, prefix string) bool {
	if len(name) < len(prefix) {
		return false
	}
	for i := 0; i < len(prefix); i++ {
		c := name[i]
		if c == '_' {
			c = '-'
		} else if 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		if c != prefix[i] {
			return false
		}
	}
	return true
}

// stripInternal returns h without internal headers (h itself when it has
// none, so the common case does not copy).
func stripInternal(h http.Header) http.Header {
	found := false
	for k := range h {
		if IsInternalHeader(k) {
			found = true
			break
		}
	}
	if !found {
		return h
	}
	out := make(http.Header, len(h))
	for k, v := range h {
		if !IsInternalHeader(k) {
			out[k] = v
		}
	}
	return out
}

// closeAfter marks an early answer (before the body was read): the
// connection closes after it, and the server does not wait to drain a
// body the client may never send. Connection: close alone is not enough:
// net/http still reads up to 256 KiB of unread body when the handler
// returns, so the read deadline is moved to now as well.
func closeAfter(w http.ResponseWriter) {
	w.Header().Set("Connection", "close")
	_ = http.NewResponseController(w).SetReadDeadline(time.Now())
}
