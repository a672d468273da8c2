package gateway

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// clientHeaderCases are headers a client sends that a pod must never see:
// credentials, forwarding claims, hop-by-hop and routing headers, in the
// spellings a client might try.
var clientHeaderCases = []struct{ name, value string }{
	{"X-Api-Key", "sk-client-secret"},
	{"Api-Key", "sk-client-secret"},
	{"Api_Key", "sk-client-secret"},
	{"X_API_KEY", "sk-client-secret"},
	{"Proxy-Authorization", "Basic c2VjcmV0"},
	{"Cookie", "session=secret"},
	{"Forwarded", "for=6.6.6.6;host=evil;proto=https"},
	{"X-Real-Ip", "6.6.6.6"},
	{"X_Real_IP", "6.6.6.6"},
	{"X-Client-Ip", "6.6.6.6"},
	{"True-Client-Ip", "6.6.6.6"},
	{"X-Forwarded-Host", "admin.internal"},
	{"X-Forwarded-Proto", "https"},
	{"X-Forwarded-Port", "443"},
	{"X-Forwarded-Prefix", "/admin"},
	{"X_Forwarded_Host", "admin.internal"},
	{"X-Envoy-Original-Dst-Host", "10.0.0.9:8000"},
	{"X-Envoy-Upstream-Rq-Timeout-Ms", "0"},
	{"X-Infergate-Priority", "100"},
	{"X-Infergate-Pod", "p9"},
	{"X-Gateway-Destination-Endpoint", "10.0.0.9:8000"},
	{"X_gateway_destination_endpoint", "10.0.0.9:8000"},
	{"Keep-Alive", "timeout=600"},
	{"X-Hop-Named-In-Connection", "hop"},
}

// A request through the real listener to a recording pod: none of the
// client's credential, forwarding, hop-by-hop or routing headers reach
// it; X-Forwarded-For is the router's own (the client's address, not the
// client's claim); Authorization is the upstream token or nothing.
func TestClientHeadersNeverReachPod(t *testing.T) {
	for _, tc := range []struct {
		name, extra, wantAuth string
	}{
		{"no upstream token", "", ""},
		{"upstream token", "upstream: {token_env: TEST_HDR_UPSTREAM_TOKEN}\n", "Bearer pod-secret"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("TEST_HDR_UPSTREAM_TOKEN", "pod-secret")
			pod := newFakePod(t, "p0")
			e := newEnv(t, []*fakePod{pod}, tc.extra)
			hdr := map[string]string{
				"X-Forwarded-For": "6.6.6.6, 7.7.7.7",
				"Connection":      "X-Hop-Named-In-Connection",
				"X-Custom":        "kept",
				"Content-Type":    "application/json",
				"X-Session-Id":    "conv-1",
			}
			for _, h := range clientHeaderCases {
				hdr[h.name] = h.value
			}
			res := e.do(t, "POST", "/v1/chat/completions", chatBody("llama", "hi"), hdr)
			if res.status != http.StatusOK {
				t.Fatalf("status %d %s", res.status, res.body)
			}
			pod.mu.Lock()
			got := pod.lastReq.Header
			pod.mu.Unlock()
			for _, h := range clientHeaderCases {
				for k, v := range got {
					if strings.EqualFold(strings.ReplaceAll(k, "_", "-"), strings.ReplaceAll(h.name, "_", "-")) {
						t.Errorf("pod received %s: %q", k, v)
					}
				}
			}
			for k, v := range got {
				if strings.Contains(strings.Join(v, ","), "secret") && k != "Authorization" {
					t.Errorf("pod received a client secret in %s: %q", k, v)
				}
			}
			if got.Get("Authorization") != tc.wantAuth {
				t.Errorf("pod Authorization %q, want %q (never the client's)", got.Get("Authorization"), tc.wantAuth)
			}
			if xff := got.Values("X-Forwarded-For"); len(xff) != 1 || xff[0] != "127.0.0.1" {
				t.Errorf("pod X-Forwarded-For %q, want the router's own \"127.0.0.1\"", xff)
			}
			if got.Get("X-Custom") != "kept" || got.Get("X-Session-Id") != "conv-1" || got.Get("Content-Type") == "" {
				t.Errorf("end-to-end headers lost: %v", got)
			}
		})
	}
}

func TestUpstreamHeadersTable(t *testing.T) {
	for _, h := range clientHeaderCases {
		t.Run(h.name, func(t *testing.T) {
			in := http.Header{h.name: {h.value}, "Connection": {"X-Hop-Named-In-Connection"}, "Content-Type": {"application/json"}}
			out := upstreamHeaders(stripInternal(in), "192.0.2.7", "")
			for k := range out {
				if strings.EqualFold(strings.ReplaceAll(k, "_", "-"), strings.ReplaceAll(h.name, "_", "-")) {
					t.Fatalf("%s forwarded", k)
				}
			}
			if out.Get("Content-Type") != "application/json" || out.Get("X-Forwarded-For") != "192.0.2.7" {
				t.Fatalf("out = %v", out)
			}
		})
	}
	// Ordinary headers that merely look alike pass.
	for _, k := range []string{"X-Api-Version", "Api-Keys-Count", "X-Forwarded", "Cookies-Accepted", "X-Envoy", "Authorization-Hint"} {
		if out := upstreamHeaders(http.Header{k: {"v"}}, "", ""); out.Get(k) != "v" {
			t.Errorf("%s dropped", k)
		}
	}
}

// A body that does not arrive within timeouts.read_body gets a 400 that
// says so, without the listener's or the client's socket address (the
// net.OpError behind it names both).
func TestBodyTimeoutNamesNoAddress(t *testing.T) {
	e := newEnv(t, []*fakePod{newFakePod(t, "p0")}, "timeouts: {read_body: 200ms}\n")
	c := e.dialRaw(t)
	head := "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + testToken + "\r\nContent-Length: 1000\r\n\r\n{\"model\":"
	if _, err := io.WriteString(c, head); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(attackWait))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	body := string(b)
	if resp.StatusCode != http.StatusBadRequest || errorCode(t, body) != "body_timeout" || !strings.Contains(body, "not received within 200ms") {
		t.Fatalf("status %d body %s", resp.StatusCode, body)
	}
	_, srvPort, _ := net.SplitHostPort(c.RemoteAddr().String())
	_, cliPort, _ := net.SplitHostPort(c.LocalAddr().String())
	for _, leak := range []string{"127.0.0.1", ":" + srvPort, ":" + cliPort, "tcp", "i/o timeout"} {
		if strings.Contains(body, leak) {
			t.Errorf("error body names %q: %s", leak, body)
		}
	}
}
