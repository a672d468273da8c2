package gateway

import (
	"net/http"
	"time"

	"github.com/infergate/infergate/shared/cluster"
	"github.com/infergate/infergate/shared/jsonkeys"
	"github.com/infergate/infergate/shared/sse"
)

// What Tier 2 adds to shared/relay's relay of an answer (relay.Hooks):
// the headers it passes on, the cluster's time to first token, and the
// usage read from a stream to settle the tenant's limits; when Tier 2
// asked for that usage on the client's behalf, it is kept from the client.

// Header passes on Tier 1's Content-Type and the pod that served the
// request (X-Infergate-Pod, Tier 1's default pod_header), beside the
// X-Infergate-Cluster and -Region Tier 2 sets itself; a stream is not to
// be cached.
func (x *exchange) Header(dst, src http.Header) {
	if ct := src.Get("Content-Type"); ct != "" {
		dst.Set("Content-Type", ct)
	}
	if pod := src.Get(cluster.HeaderPod); validPod(pod) {
		dst.Set(cluster.HeaderPod, pod)
	}
	if x.relay.Stream() {
		dst.Set("Cache-Control", "no-cache")
	}
}

// validPod: a pod name or address as Tier 1 writes it (visible ASCII, at
// most 256 bytes); anything else is not passed on.
func validPod(s string) bool {
	if s == "" || len(s) > 256 {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] <= ' ' || s[i] > '~' {
			return false
		}
	}
	return true
}

// FirstToken feeds the cluster's latency estimate: time to the first
// token of a stream (a non-streamed answer's time is its whole length).
func (x *exchange) FirstToken() {
	if x.relay.Stream() {
		x.attempt.FirstToken(time.Since(x.sent))
		x.g.mTTFT.WithLabelValues(x.w.lab.model, x.w.lab.cluster).Observe(time.Since(x.start).Seconds())
	}
}

var dataPrefix = []byte("data: ")

// Event records usage from a stream event and, when the gateway asked for
// usage on the client's behalf, keeps it from the client: the usage-only
// chunk is dropped, a usage riding on a content chunk is removed from it
// (its other bytes kept).
func (x *exchange) Event(ev []byte) []byte {
	u, usageOnly := sse.Usage(ev, x.usage)
	if u == nil {
		return ev
	}
	x.usage = u
	if !x.injected {
		return ev
	}
	if usageOnly {
		return nil
	}
	data, ok := jsonkeys.Remove(sse.Data(ev), "usage")
	if !ok {
		return ev
	}
	out := make([]byte, 0, len(dataPrefix)+len(data)+2)
	return append(append(append(out, dataPrefix...), data...), '\n', '\n')
}
