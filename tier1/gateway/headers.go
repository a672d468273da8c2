package gateway

import (
	"net/http"
	"time"

	"github.com/infergate/infergate/shared/cluster"
)

// IsInternalHeader reports whether a header name is one of the routing
// headers only infergate (or a GIE-style gateway) may set
// (cluster.IsInternalHeader: x-infergate-* and x-gateway-*, in any case,
// '_' read as '-').
func IsInternalHeader(name string) bool { return cluster.IsInternalHeader(name) }

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
		if len(name) == len(h) && cluster.HasFoldedPrefix(name, h) {
			return true
		}
	}
	for _, p := range clientOnlyPrefixes {
		if cluster.HasFoldedPrefix(name, p) {
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
		if IsInternalHeader(k) || isClientOnly(k) {
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
