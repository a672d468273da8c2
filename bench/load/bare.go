package load

import (
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"sync/atomic"
	"time"

	"github.com/infergate/infergate/shared/cluster"
)

// BareProxy is the yardstick of the CPU comparison (RunCompare): a bare
// httputil.ReverseProxy that forwards every request to the next pod in
// turn, with the transport settings Tier 1 and Tier 2 use (keep-alive, 256
// idle connections per pod, no compression), flushing streamed answers as
// they come. It does nothing else: no auth, no parsing, no metrics.
//
// It also answers GET cluster.LoadPath with a static summary (every pod
// ready and idle), so that a Tier 2 placed in front of it sees a healthy
// Tier 1 cluster.
func BareProxy(addrs []string) http.Handler {
	targets := make([]*url.URL, len(addrs))
	for i, a := range addrs {
		targets[i] = &url.URL{Scheme: "http", Host: a}
	}
	var next atomic.Uint64
	rp := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(targets[(next.Add(1)-1)%uint64(len(targets))])
			if pr.Out.Body != nil && pr.Out.ContentLength > 0 {
				pr.Out.Body = &sizedBody{ReadCloser: pr.Out.Body, left: pr.Out.ContentLength}
			}
		},
		Transport: &http.Transport{
			Proxy:               nil,
			DialContext:         (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
			MaxIdleConns:        1024,
			MaxIdleConnsPerHost: 256,
			IdleConnTimeout:     90 * time.Second,
			DisableCompression:  true,
		},
		FlushInterval: -1,
	}
	summary, err := json.Marshal(cluster.LoadSummary{Cluster: "bare", Region: "bench",
		Models: map[string]cluster.ModelLoad{Model: {Pool: "bench", ReadyPods: len(addrs), Pods: len(addrs), KVHeadroom: 0.8}}})
	if err != nil {
		panic(err) // a fixed struct of plain fields always encodes
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == cluster.LoadPath {
			w.Header().Set("Content-Type", "application/json")
			// A failed write means the poller went away; nothing to do.
			_, _ = w.Write(summary)
			return
		}
		rp.ServeHTTP(w, r)
	})
}

// sizedBody ends a request body at its Content-Length without reading on.
// The transport makes one more read after the last byte to check that the
// body holds no more; when the body's length is a multiple of its write
// buffer, the pod has the whole request before that read, may answer, and
// the handler may return, closing the incoming body, before it happens.
// The read then fails ("invalid Read on closed Body") and the transport
// closes the pod connection under the next request using it (about 1 % of
// 32 KB requests on a busy machine broke so).
type sizedBody struct {
	io.ReadCloser
	left int64
}

func (b *sizedBody) Read(p []byte) (int, error) {
	if b.left <= 0 {
		return 0, io.EOF
	}
	if int64(len(p)) > b.left {
		p = p[:b.left]
	}
	n, err := b.ReadCloser.Read(p)
	b.left -= int64(n)
	if b.left <= 0 && err == nil {
		err = io.EOF
	}
	return n, err
}

// benchServer serves h with the timeouts every listener of the benchmark
// has.
func benchServer(h http.Handler) *http.Server {
	return &http.Server{
		Handler:           h,
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       time.Minute,
		WriteTimeout:      time.Minute,
		IdleTimeout:       2 * time.Minute,
	}
}
