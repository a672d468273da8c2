package gateway

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// Tests of issue 10's attacks on Tier 1's listener. Each talks raw HTTP/1.1
// over a real socket to a real gateway; the bounds below are how long a
// test waits before it fails, not timing asserts.

const attackWait = 10 * time.Second

// dialRaw opens a TCP connection to the gateway.
func (e *env) dialRaw(t *testing.T) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", strings.TrimPrefix(e.url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// closedByServer reports whether the server closes c (EOF or reset) within
// attackWait after whatever has been read through br.
func closedByServer(c net.Conn, br *bufio.Reader) bool {
	_ = c.SetReadDeadline(time.Now().Add(attackWait))
	_, err := io.Copy(io.Discard, br)
	var ne net.Error
	return !(errors.As(err, &ne) && ne.Timeout())
}

// An answer given before the body is read (401, 404, 405, 413) closes the
// connection instead of waiting to drain a body the client never sends.
func TestEarlyAnswersCloseConnection(t *testing.T) {
	e := newEnv(t, []*fakePod{newFakePod(t, "p0")}, "max_body_bytes: 100000\n")
	auth := "Authorization: Bearer " + testToken + "\r\n"
	tests := []struct {
		name, head string
		status     int
	}{
		{"401 without credential", "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 262144\r\n\r\n", 401},
		{"404 unknown path", "POST /v1/nope HTTP/1.1\r\nHost: x\r\n" + auth + "Content-Length: 262144\r\n\r\n", 404},
		{"405 wrong method", "PUT /v1/chat/completions HTTP/1.1\r\nHost: x\r\n" + auth + "Content-Length: 262144\r\n\r\n", 405},
		{"413 too large", "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n" + auth + "Content-Length: 200000\r\n\r\n", 413},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := e.dialRaw(t)
			if _, err := io.WriteString(c, tt.head); err != nil {
				t.Fatal(err)
			}
			_ = c.SetReadDeadline(time.Now().Add(attackWait))
			br := bufio.NewReader(c)
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				t.Fatal(err)
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			if resp.StatusCode != tt.status || !resp.Close {
				t.Errorf("status %d, Connection: %q; want %d and close", resp.StatusCode, resp.Header.Get("Connection"), tt.status)
			}
			if !closedByServer(c, br) {
				t.Error("connection still open: the server waits for the unread body")
			}
		})
	}
}

// timeouts.read_body cuts off a client trickling its body: it gets a 400
// and its connection is closed while it is still sending.
func TestReadBodyTimeoutCutsTrickle(t *testing.T) {
	e := newEnv(t, []*fakePod{newFakePod(t, "p0")}, "timeouts: {read_body: 300ms}\n")
	c := e.dialRaw(t)
	head := "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + testToken + "\r\nContent-Length: 1000\r\n\r\n{"
	if _, err := io.WriteString(c, head); err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		for {
			select {
			case <-stop:
				return
			case <-time.After(100 * time.Millisecond):
			}
			if _, err := c.Write([]byte(" ")); err != nil {
				return
			}
		}
	}()
	_ = c.SetReadDeadline(time.Now().Add(attackWait))
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	if resp.StatusCode != http.StatusBadRequest {
		t.Errorf("status %d, want 400", resp.StatusCode)
	}
	if !closedByServer(c, br) {
		t.Error("connection still open while the client trickles")
	}
}

// sseForever streams large events until the client goes away.
func sseForever(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "text/event-stream")
	ev := "data: {\"choices\":[{\"delta\":{\"content\":\"" + strings.Repeat("x", 16<<10) + "\"}}]}\n\n"
	for r.Context().Err() == nil {
		if _, err := io.WriteString(w, ev); err != nil {
			return
		}
		w.(http.Flusher).Flush()
	}
}

// A streaming client that stops reading is dropped after timeouts.write
// and the tracker frees the pod's in-flight slot while the client's
// connection is still open.
func TestStalledStreamingClientIsDropped(t *testing.T) {
	pod := newFakePod(t, "p0")
	pod.set(func(p *fakePod) { p.handler = sseForever })
	e := newEnv(t, []*fakePod{pod}, "timeouts: {write: 200ms}\n")
	c := e.dialRaw(t)
	body := `{"model":"llama","stream":true,"messages":[{"role":"user","content":"hi"}]}`
	fmt.Fprintf(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", testToken, len(body), body)
	// Never read. Wait for the request to reach the pod, then for the
	// tracker to let it go.
	deadline := time.Now().Add(attackWait)
	for pod.hits.Load() == 0 {
		if time.Now().After(deadline) {
			t.Fatal("request never reached the pod")
		}
		time.Sleep(5 * time.Millisecond)
	}
	for e.gw.tracker.InFlight("p0") != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("tracker still counts %d in flight for a client that stopped reading", e.gw.tracker.InFlight("p0"))
		}
		time.Sleep(10 * time.Millisecond)
	}
	// The call takes the request off its pod before it counts it (done:
	// release, then the counter), so the count may lag the tracker: wait
	// for it to the same deadline, then judge what was counted.
	for counterValue(t, e.gw, "infergate_tier1_requests_total", "status", "499") == 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if n := counterValue(t, e.gw, "infergate_tier1_requests_total", "status", "499"); n != 1 {
		t.Errorf("499s counted: %v, want 1", n)
	}
}

// timeouts.max_stream ends a response that streams for too long, with an
// in-band error event.
func TestMaxStreamEndsLongStream(t *testing.T) {
	pod := newFakePod(t, "p0")
	pod.set(func(p *fakePod) {
		p.handler = func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "text/event-stream")
			for r.Context().Err() == nil {
				_, _ = io.WriteString(w, "data: {\"choices\":[{\"delta\":{\"content\":\"x\"}}]}\n\n")
				w.(http.Flusher).Flush()
				time.Sleep(20 * time.Millisecond)
			}
		}
	})
	e := newEnv(t, []*fakePod{pod}, "timeouts: {max_stream: 300ms}\n")
	done := make(chan result, 1)
	go func() {
		done <- e.do(t, "POST", "/v1/chat/completions", `{"model":"llama","stream":true,"messages":[{"role":"user","content":"hi"}]}`, nil)
	}()
	select {
	case res := <-done:
		if res.status != 200 || !strings.Contains(res.body, `"code":"stream_too_long"`) {
			t.Errorf("status %d, tail %q", res.status, res.body[max(0, len(res.body)-200):])
		}
	case <-time.After(attackWait):
		t.Fatal("stream not cut at max_stream")
	}
	if n := counterValue(t, e.gw, "infergate_tier1_requests_total", "status", "504"); n != 1 {
		t.Errorf("504s counted: %v, want 1", n)
	}
}

// A client that closes its connection right after data: [DONE] got the
// whole stream: the request counts with the pod's status, not as 499.
func TestCloseAfterDoneIsNotClientClosed(t *testing.T) {
	pod := newFakePod(t, "p0")
	release := make(chan struct{})
	defer close(release)
	pod.set(func(p *fakePod) {
		p.handler = func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "text/event-stream")
			_, _ = io.WriteString(w, "data: {\"choices\": [{\"delta\": {\"content\": \"Hi\"}}]}\n\ndata: [DONE]\n\n")
			w.(http.Flusher).Flush()
			// Some servers keep the connection a moment after [DONE].
			select {
			case <-release:
			case <-r.Context().Done():
			}
		}
	})
	e := newEnv(t, []*fakePod{pod}, "")
	req, _ := http.NewRequest("POST", e.url+"/v1/chat/completions",
		strings.NewReader(`{"model":"llama","stream":true,"messages":[{"role":"user","content":"hi"}]}`))
	req.Header.Set("Authorization", "Bearer "+testToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(resp.Body)
	for {
		line, err := br.ReadString('\n')
		if strings.HasPrefix(line, "data: [DONE]") {
			break
		}
		if err != nil {
			t.Fatalf("no [DONE]: %v", err)
		}
	}
	resp.Body.Close() // hang up at once
	deadline := time.Now().Add(attackWait)
	for counterValue(t, e.gw, "infergate_tier1_requests_total", "pod", "p0") == 0 {
		if time.Now().After(deadline) {
			t.Fatal("request never counted")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if n := counterValue(t, e.gw, "infergate_tier1_requests_total", "status", "499"); n != 0 {
		t.Errorf("counted as 499 (%v)", n)
	}
	if n := counterValue(t, e.gw, "infergate_tier1_requests_total", "status", "200"); n != 1 {
		t.Errorf("200s counted: %v, want 1", n)
	}
}

// Internal headers spelled with underscores are stripped both ways.
func TestUnderscoreInternalHeadersStripped(t *testing.T) {
	pod := newFakePod(t, "p0")
	pod.set(func(p *fakePod) {
		p.handler = func(w http.ResponseWriter, r *http.Request) {
			w.Header()["X_infergate_pod"] = []string{"spoofed"}
			w.Header()["X_gateway_destination_endpoint"] = []string{"10.0.0.1:1"}
			w.Header().Set("Content-Type", "application/json")
			_, _ = io.WriteString(w, `{"id":"x"}`)
		}
	})
	e := newEnv(t, []*fakePod{pod}, "")
	req, _ := http.NewRequest("POST", e.url+"/v1/chat/completions", strings.NewReader(chatBody("llama", "hi")))
	req.Header.Set("Authorization", "Bearer "+testToken)
	req.Header["X_gateway_destination_endpoint"] = []string{"10.0.0.66:8000"}
	req.Header["X_Infergate_Priority"] = []string{"9"}
	req.Header["x-gateway_model_name"] = []string{"evil"}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	pod.mu.Lock()
	got := pod.lastReq.Header
	pod.mu.Unlock()
	for k := range got {
		if IsInternalHeader(k) {
			t.Errorf("pod received internal header %s", k)
		}
	}
	for k := range resp.Header {
		if IsInternalHeader(k) && !strings.EqualFold(k, DefaultPodHeader) {
			t.Errorf("client received internal header %s from the pod", k)
		}
	}
}

func FuzzInternalHeaderFilter(f *testing.F) {
	for _, s := range []string{"X_gateway_destination_endpoint", "x-infergate-priority", "X-Gateway-Foo", "X_INFERGATE_", "Content-Type", "X-Gateway", "x_gatewayx"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, name string) {
		if name == "" || strings.ContainsAny(name, " \t\r\n:") {
			return
		}
		ascii := true
		for i := 0; i < len(name); i++ {
			ascii = ascii && name[i] < 0x80
		}
		folded := strings.ReplaceAll(strings.ToLower(name), "_", "-")
		internal := strings.HasPrefix(folded, "x-infergate-") || strings.HasPrefix(folded, "x-gateway-")
		if ascii && IsInternalHeader(name) != internal {
			t.Fatalf("IsInternalHeader(%q) = %v, want %v", name, !internal, internal)
		}
		in := http.Header{name: {"v"}, "Content-Type": {"application/json"}}
		up := upstreamHeaders(stripInternal(in), "127.0.0.1", "")
		down := http.Header{}
		copyResponseHeaders(down, stripInternal(in))
		for _, h := range []http.Header{up, down} {
			for k := range h {
				if IsInternalHeader(k) {
					t.Fatalf("internal header %q passed the filter", k)
				}
			}
		}
		if !IsInternalHeader(name) && len(down[name]) == 0 && !isHop(name) {
			t.Fatalf("ordinary header %q dropped", name)
		}
	})
}

// isHop reports headers removed as hop-by-hop (not the filter's doing).
func isHop(name string) bool {
	for _, h := range hopHeaders {
		if h == name {
			return true
		}
	}
	return name == "Connection"
}

// timeouts.read_header and timeouts.client_idle close connections that
// send headers too slowly or sit idle between requests.
func TestHeaderAndIdleTimeouts(t *testing.T) {
	e := newEnv(t, []*fakePod{newFakePod(t, "p0")}, "timeouts: {read_header: 200ms, client_idle: 200ms}\n")
	t.Run("slow headers", func(t *testing.T) {
		c := e.dialRaw(t)
		if _, err := io.WriteString(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"); err != nil {
			t.Fatal(err)
		}
		if !closedByServer(c, bufio.NewReader(c)) {
			t.Error("connection with unfinished headers still open")
		}
	})
	t.Run("idle keep-alive", func(t *testing.T) {
		c := e.dialRaw(t)
		if _, err := io.WriteString(c, "GET /health HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
			t.Fatal(err)
		}
		_ = c.SetReadDeadline(time.Now().Add(attackWait))
		br := bufio.NewReader(c)
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		if resp.StatusCode != 200 || resp.Close {
			t.Fatalf("status %d close %v", resp.StatusCode, resp.Close)
		}
		if !closedByServer(c, br) {
			t.Error("idle keep-alive connection still open")
		}
	})
}
