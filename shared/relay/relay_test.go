package relay

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/infergate/infergate/shared/openai"
)

func TestRetryable(t *testing.T) {
	for status, want := range map[int][3]any{ // retryable, target's fault, reason
		500: {true, true, "status_5xx"},
		503: {true, true, "status_5xx"},
		429: {true, false, "status_429"},
		404: {true, false, "status_404"},
		401: {true, true, "status_auth"},
		403: {true, true, "status_auth"},
		400: {false, false, ""},
		413: {false, false, ""},
		422: {false, false, ""},
		200: {false, false, ""},
	} {
		if Retryable(status) != want[0] || TargetFault(status) != want[1] {
			t.Errorf("%d: retryable %v, fault %v", status, Retryable(status), TargetFault(status))
		}
		if want[0] == true && StatusReason(status) != want[2] {
			t.Errorf("%d: reason %s", status, StatusReason(status))
		}
	}
}

// hooks records what the relay showed it; drop removes events containing
// the string.
type hooks struct {
	token int
	drop  string
}

func (h *hooks) Header(dst, src http.Header) {
	for k, v := range src {
		if k != "Content-Length" && k != "Date" {
			dst[k] = v
		}
	}
}
func (h *hooks) FirstToken() { h.token++ }
func (h *hooks) Event(ev []byte) []byte {
	if h.drop != "" && strings.Contains(string(ev), h.drop) {
		return nil
	}
	return ev
}

// breakConn ends a response abruptly: the connection is closed under it.
func breakConn(w http.ResponseWriter, _ *http.Request) {
	w.(http.Flusher).Flush()
	if conn, _, err := w.(http.Hijacker).Hijack(); err == nil {
		conn.Close()
	}
}

// waitGone flushes what was written and sends nothing more until the
// request is cancelled.
func waitGone(w http.ResponseWriter, r *http.Request) {
	w.(http.Flusher).Flush()
	<-r.Context().Done()
}

// setup is an upstream and a relay in front of it, both on real sockets.
// The relay answers 599 when Open fails (nothing was written), and sends
// each attempt's Result (or Open error) on results.
type setup struct {
	relayURL string
	results  chan any
	hooks    *hooks
}

func newSetup(t *testing.T, opts Options, deadline time.Duration, upstream http.HandlerFunc) *setup {
	t.Helper()
	up := httptest.NewServer(upstream)
	t.Cleanup(up.Close)
	s := &setup{results: make(chan any, 1), hooks: &hooks{}}
	tr := &http.Transport{DisableCompression: true}
	t.Cleanup(tr.CloseIdleConnections)
	rl := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		o := opts
		o.Client = r.Context()
		a := Start(r.Context(), o)
		defer a.Stop()
		req, _ := http.NewRequestWithContext(a.Context(), http.MethodGet, up.URL+r.URL.Path, nil)
		resp, err := tr.RoundTrip(req)
		if err != nil {
			s.results <- a.Err(err)
			w.WriteHeader(599)
			return
		}
		defer resp.Body.Close()
		if err := a.Open(resp); err != nil {
			s.results <- err
			w.WriteHeader(599)
			return
		}
		var dl time.Time
		if deadline > 0 {
			dl = time.Now().Add(deadline)
		}
		res := a.Relay(w, s.hooks, dl)
		s.results <- res
		if res.Abort {
			panic(http.ErrAbortHandler)
		}
	}))
	t.Cleanup(rl.Close)
	s.relayURL = rl.URL
	return s
}

func (s *setup) get(t *testing.T, path string) (*http.Response, string, error) {
	t.Helper()
	resp, err := http.Get(s.relayURL + path)
	if err != nil {
		return nil, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp, string(b), err
}

func (s *setup) result(t *testing.T) Result {
	t.Helper()
	select {
	case r := <-s.results:
		res, ok := r.(Result)
		if !ok {
			t.Fatalf("open failed: %v", r)
		}
		return res
	case <-time.After(10 * time.Second):
		t.Fatal("no result")
	}
	return Result{}
}

const (
	chunk = "data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\n"
	role  = "data: {\"choices\":[{\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n"
	done  = "data: [DONE]\n\n"
)

func sseHandler(body string, then func(w http.ResponseWriter, r *http.Request)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		w.Header().Set("X-Upstream", "1")
		io.WriteString(w, body)
		if then != nil {
			then(w, r)
		}
	}
}

func TestStreamWhole(t *testing.T) {
	s := newSetup(t, Options{FirstByte: 5 * time.Second}, 0, sseHandler(role+chunk+chunk+done, nil))
	resp, body, err := s.get(t, "/")
	if err != nil || resp.StatusCode != 200 || body != role+chunk+chunk+done || resp.Header.Get("X-Upstream") != "1" {
		t.Fatalf("%v %v %q", err, resp, body)
	}
	res := s.result(t)
	if !res.Ended || res.Events != 4 || res.Code != "" || res.ClientGone || s.hooks.token != 1 {
		t.Fatalf("result %+v, first token %d times", res, s.hooks.token)
	}
}

// An upstream that sends [DONE] (or another API's last event) and then
// breaks: the client sees the stream end exactly once, with no error event
// after it.
func TestStreamEndThenBreak(t *testing.T) {
	for name, tc := range map[string]struct {
		api  openai.API
		body string
	}{
		"chat":      {openai.APIOpenAI, chunk + done},
		"anthropic": {openai.APIAnthropic, "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"delta\":{\"text\":\"hi\"}}\n\nevent: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"},
		"responses": {openai.APIResponses, "event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"sequence_number\":1,\"delta\":\"hi\"}\n\nevent: response.completed\ndata: {\"type\":\"response.completed\",\"sequence_number\":2,\"response\":{}}\n\n"},
	} {
		t.Run(name, func(t *testing.T) {
			s := newSetup(t, Options{FirstByte: 5 * time.Second, API: tc.api}, 0, sseHandler(tc.body, breakConn))
			_, body, err := s.get(t, "/")
			if err != nil || body != tc.body {
				t.Fatalf("client got %q (%v), want the stream once, nothing after its end", body, err)
			}
			if res := s.result(t); !res.Ended || res.Code != "" || res.Err != nil {
				t.Fatalf("result %+v", res)
			}
		})
	}
}

// A stream broken mid-way ends with one error event in its API's shape;
// the unfinished event is not relayed (it would corrupt the error event).
func TestStreamBroken(t *testing.T) {
	s := newSetup(t, Options{FirstByte: 5 * time.Second}, 0, sseHandler(chunk+"data: {\"choi", breakConn))
	_, body, err := s.get(t, "/")
	want := chunk + `data: {"error":{"message":"upstream stream interrupted","type":"server_error","param":null,"code":"upstream_interrupted"}}` + "\n\n"
	if err != nil || body != want {
		t.Fatalf("client got %q (%v), want %q", body, err, want)
	}
	if res := s.result(t); res.Ended || res.Code != CodeInterrupted || res.CutStatus != 502 || res.Err == nil || res.Abort {
		t.Fatalf("result %+v", res)
	}
}

// Until the first event nothing reaches the client: an upstream that
// sends headers and then nothing, or a role-less empty stream, fails the
// attempt, and the caller answers instead.
func TestHeldUntilFirstEvent(t *testing.T) {
	for name, tc := range map[string]struct {
		h    http.HandlerFunc
		want error
	}{
		"silent":            {sseHandler("", waitGone), ErrTimeout},
		"empty stream":      {sseHandler("", nil), ErrNoEvent},
		"broken before one": {sseHandler("data: {\"cho", breakConn), nil},
	} {
		t.Run(name, func(t *testing.T) {
			s := newSetup(t, Options{FirstByte: 200 * time.Millisecond}, 0, tc.h)
			resp, _, _ := s.get(t, "/")
			if resp == nil || resp.StatusCode != 599 || resp.Header.Get("X-Upstream") != "" {
				t.Fatalf("the client saw the upstream's answer: %v", resp)
			}
			err, _ := (<-s.results).(error)
			if err == nil || (tc.want != nil && !errors.Is(err, tc.want)) {
				t.Fatalf("open error %v, want %v", err, tc.want)
			}
		})
	}
}

// A body that is not a stream and breaks after commit is aborted: the
// client cannot take it for whole.
func TestBodyBrokenAborts(t *testing.T) {
	s := newSetup(t, Options{FirstByte: 5 * time.Second}, 0, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Content-Length", "100")
		io.WriteString(w, `{"partial":`)
		breakConn(w, r)
	})
	_, body, err := s.get(t, "/")
	if err == nil {
		t.Fatalf("the client read %q as a whole body", body)
	}
	if res := s.result(t); !res.Abort || res.Ended {
		t.Fatalf("result %+v", res)
	}
}

// Hold buffers a body so a failure while reading it can still be retried;
// a whole held body gets its Content-Length.
func TestHold(t *testing.T) {
	s := newSetup(t, Options{FirstByte: 5 * time.Second, Hold: 1 << 20}, 0, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		if r.URL.Path == "/break" {
			io.WriteString(w, `{"partial":`)
			breakConn(w, r)
			return
		}
		w.(http.Flusher).Flush() // chunked: no length from the upstream
		io.WriteString(w, `{"ok":true}`)
	})
	resp, body, err := s.get(t, "/")
	if err != nil || body != `{"ok":true}` || resp.ContentLength != int64(len(body)) {
		t.Fatalf("%v %q length %d", err, body, resp.ContentLength)
	}
	s.result(t)
	if resp, _, _ := s.get(t, "/break"); resp == nil || resp.StatusCode != 599 {
		t.Fatalf("a body broken before the commit point reached the client: %v", resp)
	}
	<-s.results
}

func TestTrailers(t *testing.T) {
	s := newSetup(t, Options{FirstByte: 5 * time.Second}, 0, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Trailer", "X-Checksum, X-Infergate-Pod")
		io.WriteString(w, `{"ok":true}`)
		w.Header().Set("X-Checksum", "abc")
		w.Header().Set("X-Infergate-Pod", "spoofed")
	})
	resp, err := http.Get(s.relayURL)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.Trailer.Get("X-Checksum") != "abc" || resp.Trailer.Get("X-Infergate-Pod") != "" {
		t.Fatalf("trailers %v", resp.Trailer)
	}
	s.result(t)
}

func TestStreamTooLong(t *testing.T) {
	s := newSetup(t, Options{FirstByte: 5 * time.Second, API: openai.APIAnthropic}, 300*time.Millisecond, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		for r.Context().Err() == nil {
			io.WriteString(w, "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"delta\":{\"text\":\"x\"}}\n\n")
			w.(http.Flusher).Flush()
			time.Sleep(20 * time.Millisecond)
		}
	})
	_, body, _ := s.get(t, "/")
	if !strings.HasSuffix(body, "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"timeout_error\",\"message\":\"the response exceeded its maximum duration\"}}\n\n") ||
		strings.Count(body, "event: error") != 1 {
		t.Fatalf("stream ends %q", body[max(0, len(body)-200):])
	}
	if res := s.result(t); !res.TooLong || res.Code != CodeTooLong || res.CutStatus != 504 {
		t.Fatalf("result %+v", res)
	}
}

func TestIdle(t *testing.T) {
	s := newSetup(t, Options{FirstByte: 5 * time.Second, Idle: 200 * time.Millisecond}, 0, sseHandler(chunk, waitGone))
	_, body, _ := s.get(t, "/")
	if !strings.HasPrefix(body, chunk) || !strings.Contains(body, CodeInterrupted) {
		t.Fatalf("body %q", body)
	}
	if res := s.result(t); !res.TimedOut || res.Code != CodeInterrupted {
		t.Fatalf("result %+v", res)
	}
}

func TestEventTooLarge(t *testing.T) {
	s := newSetup(t, Options{FirstByte: 5 * time.Second, MaxEvent: 1000}, 0, sseHandler(chunk+"data: "+strings.Repeat("x", 5000)+"\n\n"+done, nil))
	_, body, _ := s.get(t, "/")
	if !strings.HasPrefix(body, chunk+"data: {\"error\"") || !strings.Contains(body, `"code":"upstream_event_too_large"`) || !strings.Contains(body, "over 1000 bytes") {
		t.Fatalf("body %q", body)
	}
	if res := s.result(t); res.Code != CodeEventTooLarge {
		t.Fatalf("result %+v", res)
	}
}

// An event the hook drops is not written; the rest are.
func TestEventHook(t *testing.T) {
	usage := "data: {\"choices\":[],\"usage\":{\"total_tokens\":3}}\n\n"
	s := newSetup(t, Options{FirstByte: 5 * time.Second}, 0, sseHandler(chunk+usage+done, nil))
	s.hooks.drop = `"usage"`
	if _, body, _ := s.get(t, "/"); body != chunk+done {
		t.Fatalf("body %q", body)
	}
	if res := s.result(t); res.Events != 2 || !res.Ended {
		t.Fatalf("result %+v", res)
	}
}

// A client that stops reading is dropped once a write outlasts Write.
func TestStalledClient(t *testing.T) {
	big := "data: {\"choices\":[{\"delta\":{\"content\":\"" + strings.Repeat("y", 16<<10) + "\"}}]}\n\n"
	s := newSetup(t, Options{FirstByte: 5 * time.Second, Write: 200 * time.Millisecond}, 0, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		for r.Context().Err() == nil {
			if _, err := io.WriteString(w, big); err != nil {
				return
			}
			w.(http.Flusher).Flush()
		}
	})
	conn, err := net.Dial("tcp", strings.TrimPrefix(s.relayURL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if tc, ok := conn.(*net.TCPConn); ok {
		_ = tc.SetReadBuffer(4 << 10)
	}
	fmt.Fprint(conn, "GET / HTTP/1.1\r\nHost: x\r\n\r\n")
	if _, err := http.ReadResponse(bufio.NewReader(io.LimitReader(conn, 1<<10)), nil); err != nil {
		t.Fatal(err)
	}
	// Never read further.
	if res := s.result(t); !res.ClientGone || res.Code != "" {
		t.Fatalf("result %+v", res)
	}
}

// The client going away is not an upstream failure.
func TestClientGone(t *testing.T) {
	s := newSetup(t, Options{FirstByte: 5 * time.Second}, 0, sseHandler(chunk, waitGone))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, s.relayURL, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	// Hang up once the first event is here, so the relay has committed
	// (a fixed pause after the upstream's first write could end before
	// Open on a loaded machine, and Open would fail instead).
	if _, err := resp.Body.Read(make([]byte, 1)); err != nil {
		t.Fatalf("first byte: %v", err)
	}
	cancel()
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if res := s.result(t); !res.ClientGone || res.Code != "" {
		t.Fatalf("result %+v", res)
	}
}
