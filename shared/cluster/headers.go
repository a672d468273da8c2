package cluster

import "github.com/infergate/infergate/shared/openai"

// The headers the tiers exchange. Tier 2 sends Tier 1 the request ID and
// the tenant; Tier 1 answers with the pod that served the request, Tier 2
// its client with the cluster and region. Clients may set none of the
// X-Infergate-* headers: both tiers drop them (IsInternalHeader) and
// trust them only from a caller that authenticated as documented.
const (
	// HeaderRequestID is the request's ID on every hop and answer.
	HeaderRequestID = openai.HeaderRequestID
	// HeaderTenant names Tier 2's tenant on a request to Tier 1. Tier 1
	// reads it only from a caller that authenticated with one of its
	// tokens (Tier 2), and uses it in log lines and on the request's
	// trace span, never as a metric label (tenants are unbounded).
	HeaderTenant = "X-Infergate-Tenant"
	// HeaderCluster and HeaderRegion name, on Tier 2's answer, the
	// cluster that served it.
	HeaderCluster = "X-Infergate-Cluster"
	HeaderRegion  = "X-Infergate-Region"
	// HeaderPod names, on Tier 1's answer, the pod that served it (Tier
	// 1's pod_header, this by default).
	HeaderPod = "X-Infergate-Pod"
	// HeaderPriority is a request's priority (an integer), honoured by
	// Tier 1 from authenticated callers when auth.trust_priority_header
	// is set.
	HeaderPriority = "X-Infergate-Priority"
	// HeaderTTFTSLO is a request's time-to-first-token objective in
	// milliseconds.
	HeaderTTFTSLO = "X-Infergate-Ttft-Slo-Ms"
)

// IsInternalHeader reports whether a header name is one of the routing
// headers only infergate (or a GIE-style gateway) may set: x-infergate-*
// and x-gateway-*, in any case and with '_' in place of any '-'. Some
// proxies and servers fold underscores into dashes, so
// X_gateway_destination_endpoint must be treated as the real thing.
func IsInternalHeader(name string) bool {
	return HasFoldedPrefix(name, "x-infergate-") || HasFoldedPrefix(name, "x-gateway-")
}

// HasFoldedPrefix reports whether name starts with prefix (lower case,
// dashes) ignoring case and reading '_' as '-'.
func HasFoldedPrefix(name, prefix string) bool {
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
