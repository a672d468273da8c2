package scrape

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"
)

// NewTransport is the transport of the scraper's HTTP client, tuned for
// polling many pods; a caller scraping pods over https sets its TLS
// (DialTLSContext, TLSClientConfig) and keeps the rest.
func NewTransport() *http.Transport {
	return &http.Transport{
		Proxy: nil, // pods are cluster-local; never via HTTP_PROXY
		// The scrape timeout (the request's context) bounds dialling.
		DialContext:         (&net.Dialer{KeepAlive: 30 * time.Second}).DialContext,
		TLSHandshakeTimeout: 10 * time.Second,
		// One connection per pod: a pod's /metrics and /v1/models are
		// fetched one after the other by its scrape goroutine, and a
		// response read to its end puts the connection back in the pool
		// before the next request asks for one. No total limit: the
		// default of 100 idle connections would make a large pool redial.
		MaxConnsPerHost:     1,
		MaxIdleConnsPerHost: 1,
		MaxIdleConns:        0,
		// Longer than any sensible idle interval, so an idle pod's
		// connection survives between scrapes (model servers close theirs
		// sooner: uvicorn after 5s).
		IdleConnTimeout: 2 * time.Minute,
		// Pods sit on the cluster network; inflating a gzipped page costs
		// the router more CPU than the bytes it saves.
		DisableCompression: true,
		// A vLLM page (~50 KB) is read in one or two system calls, not
		// 4 KB ones.
		ReadBufferSize:         64 << 10,
		MaxResponseHeaderBytes: 64 << 10,
		// HTTP/1.1, as model servers speak it (no ALPN offered).
		ForceAttemptHTTP2: false,
	}
}

// fetchMetrics reads /metrics (base is the request, built once) and parses
// the page where it landed.
func (s *Scraper) fetchMetrics(ctx context.Context, tg *target, base *http.Request) (Sample, error) {
	ctx, cancel := context.WithTimeout(ctx, s.opts.Timeout)
	defer cancel()
	resp, err := s.opts.Client.Do(base.WithContext(ctx))
	if err != nil {
		return Sample{}, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		// Read a short error body so the connection is kept; a long one
		// is not worth it.
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
		return Sample{}, fmt.Errorf("GET /metrics: status %d", resp.StatusCode)
	}
	// identity was asked for; a compressed page would reach the parser as
	// bytes it cannot read.
	if ce := resp.Header.Get("Content-Encoding"); ce != "" && !strings.EqualFold(ce, "identity") {
		return Sample{}, fmt.Errorf("GET /metrics: unsupported Content-Encoding %q (identity was asked for)", ce)
	}
	bp := pageBufs.Get().(*[]byte)
	defer func() {
		if cap(*bp) <= pooledPageBuf {
			pageBufs.Put(bp)
		}
	}()
	page, err := readPage(resp.Body, (*bp)[:0], resp.ContentLength, maxPage)
	*bp = page[:0] // keep a grown buffer
	if err != nil {
		return Sample{}, fmt.Errorf("GET /metrics: %w", err)
	}
	return parsePage(tg.t.Engine, page, &tg.state.Load().Metrics)
}

// Bounds on a /metrics page.
const (
	maxPage        = 16 << 20 // larger pages fail the scrape
	initialPageBuf = 64 << 10 // a vLLM page is ~50 KB
	pooledPageBuf  = 1 << 20  // larger buffers are not kept for reuse
)

var errPageTooLarge = errors.New("metrics page too large")

// pageBufs holds page buffers: a pod's is needed only while its scrape
// runs, so a few serve every pod.
var pageBufs = sync.Pool{New: func() any { b := make([]byte, 0, initialPageBuf); return &b }}

// readPage appends r's bytes to buf up to EOF; a page over limit bytes (or
// announced as such by length, -1 when unknown) is an error.
func readPage(r io.Reader, buf []byte, length int64, limit int) ([]byte, error) {
	if length > int64(limit) {
		return buf, fmt.Errorf("%w (%d bytes, over %d)", errPageTooLarge, length, limit)
	}
	if length >= 0 {
		// One more byte than announced, so EOF is seen without a grow.
		buf = slices.Grow(buf, int(length)+1)
	}
	for {
		if len(buf) == cap(buf) {
			if len(buf) > limit {
				return buf, fmt.Errorf("%w (over %d bytes)", errPageTooLarge, limit)
			}
			buf = slices.Grow(buf, min(max(cap(buf), initialPageBuf), limit+1-len(buf)))
		}
		n, err := r.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if len(buf) > limit {
			return buf, fmt.Errorf("%w (over %d bytes)", errPageTooLarge, limit)
		}
		if err == io.EOF {
			return buf, nil
		}
		if err != nil {
			return buf, err
		}
	}
}
