package scrape

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// rawPod is a real TCP server that answers each request line block with a
// scripted response, byte for byte, so the client meets framings net/http's
// server would never produce.
type rawPod struct {
	ln       net.Listener
	conns    atomic.Int32
	requests atomic.Int32
	// respond returns the bytes for the n-th request (from 0), whether to
	// close the connection after them, and whether to write them one byte
	// at a time.
	respond func(n int) (resp string, closeAfter, trickle bool)
	mu      sync.Mutex
	reqs    []string
}

func newRawPod(t *testing.T, respond func(n int) (string, bool, bool)) *rawPod {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &rawPod{ln: ln, respond: respond}
	var wg sync.WaitGroup
	var live sync.Map
	t.Cleanup(func() {
		_ = ln.Close()
		live.Range(func(k, _ any) bool { _ = k.(net.Conn).Close(); return true })
		wg.Wait()
	})
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			p.conns.Add(1)
			live.Store(c, true)
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				p.serve(c)
			}()
		}
	}()
	return p
}

func (p *rawPod) serve(c net.Conn) {
	br := bufio.NewReader(c)
	for {
		var req strings.Builder
		for {
			line, err := br.ReadString('\n')
			if err != nil {
				return
			}
			req.WriteString(line)
			if line == "\r\n" {
				break
			}
		}
		p.mu.Lock()
		p.reqs = append(p.reqs, req.String())
		p.mu.Unlock()
		resp, closeAfter, trickle := p.respond(int(p.requests.Add(1) - 1))
		if trickle {
			for i := range len(resp) {
				if _, err := c.Write([]byte{resp[i]}); err != nil {
					return
				}
			}
		} else if _, err := io.WriteString(c, resp); err != nil {
			return
		}
		if closeAfter {
			return
		}
	}
}

func (p *rawPod) addr() string { return p.ln.Addr().String() }

func (p *rawPod) request(i int) string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.reqs[i]
}

func fetchOnce(t *testing.T, c *pageClient) (int, string, error) {
	t.Helper()
	resp, err := c.get(context.Background(), time.Now().Add(5*time.Second))
	if err != nil {
		return 0, "", err
	}
	defer resp.release()
	return resp.status, string(resp.body), nil
}

func TestPageClientFraming(t *testing.T) {
	const page = "vllm:num_requests_waiting 3\nvllm:num_requests_running 7\n" // 56 bytes
	for _, tc := range []struct {
		name    string
		resp    string
		status  int
		body    string
		err     string // substring of the error, "" for none
		reused  bool   // the second request rides the first connection
		trickle bool
	}{
		{name: "content-length", resp: "HTTP/1.1 200 OK\r\nContent-Length: 56\r\n\r\n" + page, status: 200, body: page, reused: true},
		{name: "no reason phrase, LF only", resp: "HTTP/1.1 200\nContent-Length: 56\n\n" + page, status: 200, body: page, reused: true},
		{name: "chunked in one chunk", resp: "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n38\r\n" + page + "\r\n0\r\n\r\n", status: 200, body: page, reused: true},
		{name: "chunked in pieces with extensions and trailer", resp: "HTTP/1.1 200 OK\r\ntransfer-encoding: Chunked\r\n\r\n" +
			"a;x=1\r\n" + page[:10] + "\r\n1F \r\n" + page[10:41] + "\r\nf\r\n" + page[41:] + "\r\n0\r\nX-Trailer: 1\r\n\r\n",
			status: 200, body: page, reused: true},
		{name: "trickled byte by byte", resp: "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n7\r\n" + page[:7] + "\r\n31\r\n" + page[7:] + "\r\n0\r\n\r\n",
			status: 200, body: page, reused: true, trickle: true},
		{name: "informational first", resp: "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: x\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 56\r\n\r\n" + page,
			status: 200, body: page, reused: true},
		{name: "connection close", resp: "HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 56\r\n\r\n" + page, status: 200, body: page},
		{name: "http/1.0 close-delimited", resp: "HTTP/1.0 200 OK\r\n\r\n" + page, status: 200, body: page},
		{name: "http/1.0 keep-alive", resp: "HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nContent-Length: 56\r\n\r\n" + page, status: 200, body: page, reused: true},
		{name: "identity encoding", resp: "HTTP/1.1 200 OK\r\nContent-Encoding: identity\r\nContent-Length: 56\r\n\r\n" + page, status: 200, body: page, reused: true},
		{name: "error status keeps the connection", resp: "HTTP/1.1 503 Service Unavailable\r\nContent-Length: 4\r\n\r\nbusy", status: 503, body: "busy", reused: true},
		{name: "no content", resp: "HTTP/1.1 204 No Content\r\n\r\n", status: 204, body: "", reused: true},
		{name: "bytes past the response", resp: "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello extra", status: 200, body: "hello"},
		{name: "gzip", resp: "HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nContent-Length: 56\r\n\r\n" + page, err: "Content-Encoding"},
		{name: "compressed transfer coding", resp: "HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n", err: "Transfer-Encoding"},
		{name: "not http", resp: "SSH-2.0-OpenSSH\r\n\r\n", err: "status line"},
		{name: "bad status code", resp: "HTTP/1.1 2x0 OK\r\n\r\n", err: "status line"},
		{name: "switching protocols", resp: "HTTP/1.1 101 Switching Protocols\r\n\r\n", err: "101"},
		{name: "signed content length", resp: "HTTP/1.1 200 OK\r\nContent-Length: +5\r\n\r\nhello", err: "Content-Length"},
		{name: "conflicting content lengths", resp: "HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nhello!", err: "Content-Length"},
		{name: "header line without colon", resp: "HTTP/1.1 200 OK\r\nbogus\r\n\r\n", err: "field"},
		{name: "bad chunk size", resp: "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", err: "chunk size"},
		{name: "no CRLF after chunk", resp: "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nabc\r\n0\r\n\r\n", err: "CRLF"},
		{name: "truncated body", resp: "HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nshort", err: "unexpected EOF"},
		{name: "truncated chunk", resp: "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n10\r\nshort", err: "unexpected EOF"},
		{name: "truncated header", resp: "HTTP/1.1 200 OK\r\nContent-Len", err: "unexpected EOF"},
		{name: "closed without a response", resp: "", err: "EOF"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			closeAfter := !tc.reused
			pod := newRawPod(t, func(int) (string, bool, bool) { return tc.resp, closeAfter, tc.trickle })
			c := newPageClient(pod.addr(), time.Second)
			defer c.close()
			for i := range 2 {
				status, body, err := fetchOnce(t, c)
				if tc.err != "" {
					if err == nil || !strings.Contains(err.Error(), tc.err) {
						t.Fatalf("fetch %d: err = %v, want it to mention %q", i, err, tc.err)
					}
					if c.conn != nil {
						t.Fatal("connection kept after an error")
					}
					continue
				}
				if err != nil {
					t.Fatalf("fetch %d: %v", i, err)
				}
				if status != tc.status || body != tc.body {
					t.Fatalf("fetch %d: status %d body %q, want %d %q", i, status, body, tc.status, tc.body)
				}
			}
			if tc.err == "" {
				wantConns := int32(2)
				if tc.reused {
					wantConns = 1
				}
				if n := pod.conns.Load(); n != wantConns {
					t.Errorf("connections = %d, want %d", n, wantConns)
				}
			}
		})
	}
}

// The request is fixed: the path, the Host header, identity encoding.
func TestPageClientRequest(t *testing.T) {
	pod := newRawPod(t, func(int) (string, bool, bool) { return "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n", false, false })
	c := newPageClient(pod.addr(), time.Second)
	defer c.close()
	if _, _, err := fetchOnce(t, c); err != nil {
		t.Fatal(err)
	}
	raw := pod.request(0)
	req, err := http.ReadRequest(bufio.NewReader(strings.NewReader(raw)))
	if err != nil {
		t.Fatalf("request %q: %v", raw, err)
	}
	if req.Method != http.MethodGet || req.URL.Path != "/metrics" || req.Host != pod.addr() ||
		req.Header.Get("Accept-Encoding") != "identity" || !strings.HasPrefix(req.Header.Get("Accept"), "text/plain") {
		t.Fatalf("request = %q", raw)
	}
}

// A pod that closes the kept-alive connection between scrapes (its idle
// timeout) costs a redial, not a failed scrape.
func TestPageClientRedialsClosedIdleConnection(t *testing.T) {
	pod := newRawPod(t, func(int) (string, bool, bool) {
		return "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", true, false // closes after answering, without saying so
	})
	c := newPageClient(pod.addr(), time.Second)
	defer c.close()
	for i := range 3 {
		if _, body, err := fetchOnce(t, c); err != nil || body != "ok" {
			t.Fatalf("fetch %d: %q, %v", i, body, err)
		}
		time.Sleep(10 * time.Millisecond) // let the FIN arrive
	}
	if n := pod.conns.Load(); n != 3 {
		t.Errorf("connections = %d, want 3", n)
	}
}

func TestPageClientTooLarge(t *testing.T) {
	big := strings.Repeat("x", 200)
	for name, resp := range map[string]string{
		"content-length": "HTTP/1.1 200 OK\r\nContent-Length: 200\r\n\r\n" + big,
		"chunked":        "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n64\r\n" + big[:100] + "\r\n64\r\n" + big[100:] + "\r\n0\r\n\r\n",
		"close":          "HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n" + big,
	} {
		t.Run(name, func(t *testing.T) {
			pod := newRawPod(t, func(int) (string, bool, bool) { return resp, true, false })
			c := newPageClient(pod.addr(), time.Second)
			c.maxBody = 150
			defer c.close()
			if _, _, err := fetchOnce(t, c); !errors.Is(err, errPageTooLarge) {
				t.Fatalf("err = %v, want errPageTooLarge", err)
			}
		})
	}
}

// A pod that accepts the request and never answers fails the scrape at the
// deadline; stopping the scraper (abort) ends the wait at once.
func TestPageClientDeadlineAndAbort(t *testing.T) {
	stop := make(chan struct{})
	pod := newRawPod(t, func(int) (string, bool, bool) {
		<-stop // never answers
		return "", true, false
	})
	t.Cleanup(func() { close(stop) }) // runs before the pod's cleanup
	c := newPageClient(pod.addr(), time.Second)
	defer c.close()
	start := time.Now()
	_, err := c.get(context.Background(), time.Now().Add(100*time.Millisecond))
	if !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("err = %v, want a timeout", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("deadline of 100ms took %v", d)
	}
	done := make(chan error, 1)
	go func() {
		_, err := c.get(context.Background(), time.Now().Add(time.Hour))
		done <- err
	}()
	time.Sleep(50 * time.Millisecond)
	c.abort()
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("aborted fetch succeeded")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("abort did not end the fetch")
	}
	if _, err := c.get(context.Background(), time.Now().Add(time.Second)); err == nil {
		t.Fatal("fetch after abort succeeded")
	}
}

// FuzzReadResponse feeds arbitrary bytes to the response reader: it must
// not panic or read past its bounds, and where net/http reads the same bytes
// as a complete HTTP/1.1 response, both give the same status and body.
func FuzzReadResponse(f *testing.F) {
	for _, s := range []string{
		"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello",
		"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5;a=b\r\nhello\r\n3\r\n!!!\r\n0\r\nT: 1\r\n\r\n",
		"HTTP/1.1 404 Not Found\r\n\r\nnope",
		"HTTP/1.0 200 OK\r\n\r\nall of it",
		"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
		"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n1\r\nx\r\n0\r\n\r\n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		r := respReader{conn: bytes.NewReader(data), buf: make([]byte, 0, 16), maxBody: 1 << 16}
		var resp response
		_, err := r.readResponse(&resp)
		if err != nil {
			return
		}
		if len(r.buf) > maxHeaderBytes+r.maxBody+maxChunkLine || len(resp.body) > r.maxBody {
			t.Fatalf("read %d bytes, body %d", len(r.buf), len(resp.body))
		}
		if !bytes.HasPrefix(data, []byte("HTTP/1.1 ")) || resp.status < 200 {
			return
		}
		hr, herr := http.ReadResponse(bufio.NewReader(bytes.NewReader(data)), nil)
		if herr != nil || hr.StatusCode < 200 {
			return
		}
		body, herr := io.ReadAll(hr.Body)
		if herr != nil {
			return
		}
		if hr.StatusCode != resp.status || !bytes.Equal(body, resp.body) {
			t.Fatalf("net/http: %d %q\npageClient: %d %q", hr.StatusCode, body, resp.status, resp.body)
		}
	})
}
