package scrape

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// pageClient fetches one pod's /metrics over one persistent HTTP/1.1
// connection: it writes a request built once, reads the whole response into
// a pooled buffer with as few read calls as the kernel allows and decodes a
// chunked body in place. It replaces net/http's client on the hot path, where
// the per-request cost of http.Request, the transport's connection pool and
// its reader and writer goroutines was most of the scraper's CPU (see
// docs/performance.md, "Idle scraping"). It speaks only what a metrics
// endpoint needs: GET, Content-Length, chunked or close-delimited bodies,
// identity encoding, keep-alive.
//
// One goroutine (the pod's scrape loop) calls get; abort may be called from
// any goroutine.
type pageClient struct {
	addr    string
	req     []byte
	dialer  net.Dialer
	maxBody int // bound on a page; maxPage

	mu      sync.Mutex // guards conn for abort; get writes conn only under it
	conn    net.Conn
	sock    io.ReadWriter // conn's socket I/O (sockio_*.go)
	aborted atomic.Bool
}

// Bounds on what a pod may send.
const (
	maxHeaderBytes = 64 << 10 // status line and headers, and the trailer
	maxChunkLine   = 4 << 10  // one chunk-size line, extensions included
	initialPageBuf = 64 << 10 // a vLLM page is ~50 KB
	pooledPageBuf  = 1 << 20  // larger buffers are not kept for reuse
)

var (
	errPageTooLarge = errors.New("metrics page too large")
	errHeader       = errors.New("malformed HTTP response header")
	errChunk        = errors.New("malformed chunked encoding")
	errAborted      = errors.New("scraping stopped")
)

// pageBufs holds response buffers: a pod's buffer is needed only while its
// scrape runs, so a pool of a few serves every pod.
var pageBufs = sync.Pool{New: func() any { b := make([]byte, 0, initialPageBuf); return &b }}

func newPageClient(addr string, timeout time.Duration) *pageClient {
	return &pageClient{
		addr: addr,
		req: []byte("GET /metrics HTTP/1.1\r\nHost: " + addr + "\r\nUser-Agent: infergate-scraper\r\n" +
			"Accept: text/plain;version=0.0.4\r\nAccept-Encoding: identity\r\n\r\n"),
		dialer:  net.Dialer{Timeout: timeout},
		maxBody: maxPage,
	}
}

// response is one fetched page. body points into *buf, which goes back to
// the pool with release.
type response struct {
	status int
	body   []byte
	buf    *[]byte
}

func (r *response) release() {
	if r.buf == nil {
		return
	}
	if cap(*r.buf) <= pooledPageBuf {
		*r.buf = (*r.buf)[:0]
		pageBufs.Put(r.buf)
	}
	r.buf, r.body = nil, nil
}

// get fetches the page, reusing the connection when the last response left
// it reusable. A reused connection that the pod had closed while idle (no
// byte of a response arrives) is redialled once, as net/http does for a GET.
// ctx cancels dialling; abort cancels an exchange in progress.
func (c *pageClient) get(ctx context.Context, deadline time.Time) (response, error) {
	bp := pageBufs.Get().(*[]byte)
	resp := response{buf: bp}
	for attempt := 0; ; attempt++ {
		reused := c.conn != nil
		if !reused {
			if err := c.dial(ctx, deadline); err != nil {
				resp.release()
				return response{}, err
			}
		}
		r := respReader{conn: c.sock, buf: (*bp)[:0], maxBody: c.maxBody}
		err := c.exchange(ctx, deadline, &r, &resp)
		*bp = r.buf[:0] // keep a grown buffer
		if err == nil {
			return resp, nil
		}
		c.close()
		if reused && attempt == 0 && len(r.buf) == 0 && idleClosed(err) && ctx.Err() == nil {
			continue
		}
		resp.release()
		return response{}, err
	}
}

// idleClosed reports whether err is how a write or the first read fails on
// a connection the server closed while it sat idle.
func idleClosed(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
}

func (c *pageClient) exchange(ctx context.Context, deadline time.Time, r *respReader, resp *response) error {
	if err := c.conn.SetDeadline(deadline); err != nil {
		return err
	}
	// abort sets aborted before it moves the deadline to the past: either
	// that comes after the line above, or aborted is seen here.
	if c.aborted.Load() || ctx.Err() != nil {
		return errAborted
	}
	if _, err := c.sock.Write(c.req); err != nil {
		return fmt.Errorf("GET /metrics: %w", err)
	}
	keep, err := r.readResponse(resp)
	if err != nil {
		return fmt.Errorf("GET /metrics: %w", err)
	}
	if !keep {
		c.close()
	}
	return nil
}

func (c *pageClient) dial(ctx context.Context, deadline time.Time) error {
	d := c.dialer
	d.Deadline = deadline
	conn, err := d.DialContext(ctx, "tcp", c.addr)
	if err != nil {
		return fmt.Errorf("GET /metrics: %w", err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.aborted.Load() {
		_ = conn.Close()
		return errAborted
	}
	c.conn, c.sock = conn, newSockIO(conn)
	return nil
}

func (c *pageClient) close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.conn != nil {
		_ = c.conn.Close()
		c.conn, c.sock = nil, nil
	}
}

// abort makes an exchange in progress fail at once and the client unusable;
// the loop closes the connection on its way out.
func (c *pageClient) abort() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.aborted.Store(true)
	if c.conn != nil {
		_ = c.conn.SetDeadline(time.Unix(1, 0))
	}
}

// respReader reads one HTTP/1.1 response from conn into buf.
type respReader struct {
	conn    io.Reader
	buf     []byte // bytes received (the body is decoded in place)
	maxBody int
}

func (r *respReader) tooLarge() error {
	return fmt.Errorf("%w (over %d bytes)", errPageTooLarge, r.maxBody)
}

// more reads at least one more byte, growing buf up to the page bound.
func (r *respReader) more() error {
	if len(r.buf) == cap(r.buf) {
		limit := maxHeaderBytes + r.maxBody + maxChunkLine
		if cap(r.buf) >= limit {
			return r.tooLarge()
		}
		nb := make([]byte, len(r.buf), min(max(2*cap(r.buf), initialPageBuf), limit))
		copy(nb, r.buf)
		r.buf = nb
	}
	n, err := r.conn.Read(r.buf[len(r.buf):cap(r.buf)])
	r.buf = r.buf[:len(r.buf)+n]
	switch {
	case n > 0:
		return nil
	case err == nil:
		return io.ErrNoProgress
	}
	return err
}

// line finds the line starting at from, reading more as needed. It returns
// the end of its text (before CR LF or LF) and the start of the next line.
func (r *respReader) line(from, maxLen int) (end, next int, err error) {
	scanned := from
	for {
		if i := bytes.IndexByte(r.buf[scanned:], '\n'); i >= 0 {
			end = scanned + i
			next = end + 1
			if end > from && r.buf[end-1] == '\r' {
				end--
			}
			return end, next, nil
		}
		scanned = len(r.buf)
		if scanned-from > maxLen {
			return 0, 0, errHeader
		}
		if err := r.more(); err != nil {
			if errors.Is(err, io.EOF) && len(r.buf) > 0 {
				err = io.ErrUnexpectedEOF
			}
			return 0, 0, err
		}
	}
}

// header is what readResponse needs from a response's header.
type header struct {
	status        int
	contentLength int64 // -1: absent
	chunked       bool
	keep          bool
}

// readResponse reads a response (skipping 1xx ones) and reports whether the
// connection may carry the next request.
func (r *respReader) readResponse(resp *response) (keep bool, err error) {
	pos := 0
	var h header
	for {
		if h, pos, err = r.readHeader(pos); err != nil {
			return false, err
		}
		if h.status >= 200 || h.status == 101 {
			break
		}
		// 1xx informational: its header only; the real one follows.
	}
	if h.status == 101 {
		return false, fmt.Errorf("unexpected status %d", h.status)
	}
	resp.status = h.status
	switch {
	case h.status == 204 || h.status == 304:
		resp.body = r.buf[pos:pos]
	case h.chunked:
		if pos, err = r.readChunked(pos, resp); err != nil {
			return false, err
		}
	case h.contentLength >= 0:
		if h.contentLength > int64(r.maxBody) {
			return false, r.tooLarge()
		}
		end := pos + int(h.contentLength)
		for len(r.buf) < end {
			if err := r.more(); err != nil {
				if errors.Is(err, io.EOF) {
					err = io.ErrUnexpectedEOF
				}
				return false, err
			}
		}
		resp.body, pos = r.buf[pos:end:end], end
	default:
		// Delimited by the server closing the connection.
		for {
			if len(r.buf)-pos > r.maxBody {
				return false, r.tooLarge()
			}
			if err := r.more(); err != nil {
				if errors.Is(err, io.EOF) {
					break
				}
				return false, err
			}
		}
		resp.body, pos, h.keep = r.buf[pos:], len(r.buf), false
	}
	// Bytes past the response were never asked for: do not let them be
	// read as the next response.
	return h.keep && len(r.buf) == pos, nil
}

// readHeader parses a status line and header fields starting at pos and
// returns the position after the blank line.
func (r *respReader) readHeader(pos int) (h header, next int, err error) {
	start := pos
	end, next, err := r.line(pos, maxHeaderBytes)
	if err != nil {
		return h, 0, err
	}
	minor, status, ok := parseStatusLine(r.buf[pos:end])
	if !ok {
		return h, 0, fmt.Errorf("%w: status line %q", errHeader, truncate(r.buf[pos:end]))
	}
	h = header{status: status, contentLength: -1, keep: minor >= 1}
	for {
		pos = next
		if end, next, err = r.line(pos, maxHeaderBytes); err != nil {
			return h, 0, err
		}
		if next-start > maxHeaderBytes {
			return h, 0, fmt.Errorf("%w: larger than %d bytes", errHeader, maxHeaderBytes)
		}
		field := r.buf[pos:end]
		if len(field) == 0 {
			return h, next, nil
		}
		colon := bytes.IndexByte(field, ':')
		if colon <= 0 {
			return h, 0, fmt.Errorf("%w: field %q", errHeader, truncate(field))
		}
		name, value := field[:colon], bytes.Trim(field[colon+1:], " \t")
		switch {
		case asciiEqualFold(name, "content-length"):
			n, ok := parseContentLength(value)
			if !ok || (h.contentLength >= 0 && n != h.contentLength) {
				return h, 0, fmt.Errorf("%w: Content-Length %q", errHeader, truncate(value))
			}
			h.contentLength = n
		case asciiEqualFold(name, "transfer-encoding"):
			// Only chunked is understood; a compressed transfer coding
			// would hand the parser bytes it cannot read.
			if !asciiEqualFold(value, "chunked") {
				return h, 0, fmt.Errorf("unsupported Transfer-Encoding %q", truncate(value))
			}
			h.chunked = true
		case asciiEqualFold(name, "content-encoding"):
			if len(value) > 0 && !asciiEqualFold(value, "identity") {
				return h, 0, fmt.Errorf("unsupported Content-Encoding %q (identity was asked for)", truncate(value))
			}
		case asciiEqualFold(name, "connection"):
			for tok := range bytes.SplitSeq(value, []byte(",")) {
				switch tok = bytes.Trim(tok, " \t"); {
				case asciiEqualFold(tok, "close"):
					h.keep = false
				case asciiEqualFold(tok, "keep-alive") && minor == 0:
					h.keep = true
				}
			}
		}
	}
}

// parseStatusLine reads "HTTP/1.x NNN reason".
func parseStatusLine(b []byte) (minor, status int, ok bool) {
	if len(b) < 12 || string(b[:7]) != "HTTP/1." || b[7] < '0' || b[7] > '9' || b[8] != ' ' ||
		(len(b) > 12 && b[12] != ' ') {
		return 0, 0, false
	}
	for _, c := range b[9:12] {
		if c < '0' || c > '9' {
			return 0, 0, false
		}
		status = status*10 + int(c-'0')
	}
	return int(b[7] - '0'), status, status >= 100
}

// readChunked decodes a chunked body starting at pos in place: chunk data is
// moved down over the framing, so the body is one slice of r.buf (with a
// single chunk nothing moves). It returns the position after the trailer.
func (r *respReader) readChunked(pos int, resp *response) (int, error) {
	start, out := pos, pos // body is r.buf[start:out]
	for {
		end, next, err := r.line(pos, maxChunkLine)
		if err != nil {
			return 0, err
		}
		size, ok := parseChunkSize(r.buf[pos:end])
		if !ok {
			return 0, fmt.Errorf("%w: chunk size %q", errChunk, truncate(r.buf[pos:end]))
		}
		pos = next
		if size == 0 {
			break
		}
		if int64(out-start)+size > int64(r.maxBody) {
			return 0, r.tooLarge()
		}
		for n := int(size); n > 0; {
			if pos == len(r.buf) {
				// Everything received is consumed: drop the framing
				// so the buffer holds little more than the body.
				r.buf, pos = r.buf[:out], out
				if err := r.more(); err != nil {
					if errors.Is(err, io.EOF) {
						err = io.ErrUnexpectedEOF
					}
					return 0, err
				}
			}
			k := min(n, len(r.buf)-pos)
			if out != pos {
				copy(r.buf[out:], r.buf[pos:pos+k])
			}
			out, pos, n = out+k, pos+k, n-k
		}
		end, next, err = r.line(pos, maxChunkLine)
		if err != nil {
			return 0, err
		}
		if end != pos {
			return 0, fmt.Errorf("%w: no CRLF after chunk data", errChunk)
		}
		pos = next
	}
	// Trailer fields, up to a blank line; nothing in them is read.
	for trailer := pos; ; {
		end, next, err := r.line(pos, maxHeaderBytes)
		if err != nil {
			return 0, err
		}
		if next-trailer > maxHeaderBytes {
			return 0, fmt.Errorf("%w: trailer larger than %d bytes", errChunk, maxHeaderBytes)
		}
		if end == pos {
			pos = next
			break
		}
		pos = next
	}
	resp.body = r.buf[start:out:out]
	return pos, nil
}

// parseContentLength reads a Content-Length value: decimal digits only.
func parseContentLength(b []byte) (int64, bool) {
	if len(b) == 0 || len(b) > 18 {
		return 0, false
	}
	var n int64
	for _, c := range b {
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + int64(c-'0')
	}
	return n, true
}

// parseChunkSize reads the hexadecimal size before any chunk extension.
func parseChunkSize(b []byte) (int64, bool) {
	if i := bytes.IndexByte(b, ';'); i >= 0 {
		b = b[:i]
	}
	b = bytes.TrimRight(b, " \t")
	if len(b) == 0 || len(b) > 15 {
		return 0, false
	}
	var n int64
	for _, c := range b {
		switch {
		case c >= '0' && c <= '9':
			n = n<<4 | int64(c-'0')
		case c >= 'a' && c <= 'f':
			n = n<<4 | int64(c-'a'+10)
		case c >= 'A' && c <= 'F':
			n = n<<4 | int64(c-'A'+10)
		default:
			return 0, false
		}
	}
	return n, true
}

// asciiEqualFold compares b with the lower-case ASCII s, ignoring case.
func asciiEqualFold(b []byte, s string) bool {
	if len(b) != len(s) {
		return false
	}
	for i := range len(b) {
		c := b[i]
		if 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		if c != s[i] {
			return false
		}
	}
	return true
}

// truncate bounds what a pod sent before it goes into an error message.
func truncate(b []byte) string {
	const n = 64
	if len(b) > n {
		return string(b[:n]) + "..."
	}
	return string(b)
}
