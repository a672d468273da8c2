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

// clientOnlyHeaders are request headers a pod must never get from the
// client: credentials meant for infergate (the pod gets upstream.token, or
// nothing), and forwarding headers, which only a proxy may write about the
// hop it received; a pod, or a mesh sidecar in front of it, would
// otherwise log, rate-limit or authorise by a client's claim about its
// own address. Lower case, '-' separated; matched as IsInternalHeader
// matches (any case, '_' read as '-').
var clientOnlyHeaders = []string{
	"authorization", "proxy-authorization", "cookie", "x-api-key", "api-key",
	"forwarded", "x-real-ip", "x-client-ip", "true-client-ip",
}

// clientOnlyPrefixes extend clientOnlyHeaders: every X-Forwarded-* (For,
// Host, Proto, Port, Prefix...) and Envoy's x-envoy-* request headers,
// which steer a sidecar's routing and timeouts.
var clientOnlyPrefixes = []string{"x-forwarded-", "x-envoy-"}

// isClientOnly reports whether a request header is in clientOnlyHeaders
// or clientOnlyPrefixes.
func isClientOnly(name string) bool {
	for _, h := range clientOnlyHeaders {
		if len(name) == len(h) && hasFoldedPrefix(name, h) {
			return true
		}
	}
	for _, p := range clientOnlyPrefixes {
		if hasFoldedPrefix(name, p) {
			return true
		}
	}
	return false
}

// upstreamHeaders returns the headers to send to a pod: the client's minus
// hop-by-hop, internal (x-infergate-*, x-gateway-*), credential and
// forwarding headers. Like net/http/httputil.ReverseProxy with Rewrite
// and SetXForwarded, X-Forwarded-For is then set afresh to the address
// the request came from: a client's own X-Forwarded-For is not trusted,
// and none is kept. With upstreamToken, Authorization carries it.
func upstreamHeaders(in http.Header, clientIP, upstreamToken string) http.Header {
	out := make(http.Header, len(in)+1)
	for k, v := range in {
		if isInternal(k) || isClientOnly(k) {
			continue
		}
		out[k] = v
	}
	removeHopHeaders(out, in)
	if upstreamToken != "" {
		out["Authorization"] = []string{"Bearer " + upstreamToken}
	}
	if clientIP != "" {
		out["X-Forwarded-For"] = []string{clientIP}
	}
	return out
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
