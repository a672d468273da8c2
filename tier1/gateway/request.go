package gateway

import (
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/infergate/infergate/shared/cluster"
	"github.com/infergate/infergate/shared/openai"
)

// Internal headers (shared/cluster): set by infergate (or a GIE-style
// gateway) between its own hops, trusted from clients only as documented.
const (
	HeaderPriority = cluster.HeaderPriority // request priority, trusted clients only
	HeaderTTFTSLO  = cluster.HeaderTTFTSLO  // per-request TTFT objective in ms
)

// HeaderSessionID is the client's conversation key (AIBrix's and
// production-stack's x-session-id). It is an ordinary client header,
// forwarded as is; the router reads it only as a hint for the
// session-balance scorer.
const HeaderSessionID = "X-Session-Id"

// maxSessionKey bounds the session key kept per request; longer keys are
// cut (the picker hashes it anyway).
const maxSessionKey = 256

// sessionKey is the request's session key for the session-balance score:
// the x-session-id header, else the body's prompt_cache_key, else its
// user. Client-supplied, so it only ever feeds a soft score.
func sessionKey(hdr string, b *inferenceBody) string {
	k := hdr
	if k == "" {
		k = b.PromptCacheKey
	}
	if k == "" {
		k = b.User
	}
	if len(k) > maxSessionKey {
		k = k[:maxSessionKey]
	}
	return k
}

// errBodyTooLarge is returned by readBody when the body exceeds the limit.
var errBodyTooLarge = errors.New("request body too large")

// readBody reads the whole request body, at most limit bytes. With a known
// Content-Length it makes exactly one allocation and one copy (kernel to
// buffer); the returned slice is then shared read-only by the JSON decoder,
// the prefix hasher and every upstream attempt.
func readBody(w http.ResponseWriter, r *http.Request, limit int64) ([]byte, error) {
	if r.ContentLength > limit {
		return nil, errBodyTooLarge
	}
	body := http.MaxBytesReader(w, r.Body, limit)
	var buf []byte
	if r.ContentLength >= 0 {
		buf = make([]byte, r.ContentLength)
		if _, err := io.ReadFull(body, buf); err != nil {
			return nil, classifyReadErr(err)
		}
		return buf, nil
	}
	buf, err := io.ReadAll(body)
	if err != nil {
		return nil, classifyReadErr(err)
	}
	return buf, nil
}

func classifyReadErr(err error) error {
	var mbe *http.MaxBytesError
	if errors.As(err, &mbe) {
		return errBodyTooLarge
	}
	return fmt.Errorf("read request body: %w", err)
}

// bodyReadAnswer is the error code and message a client gets for a body
// that could not be read. The cause is a net.OpError that names both
// sockets ("read tcp 10.0.3.7:8000->...: i/o timeout"): it goes to the log,
// the client gets the plain reason.
func bodyReadAnswer(err error, timeout time.Duration) (code, msg string) {
	var ne net.Error
	if errors.Is(err, os.ErrDeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout()) {
		return "body_timeout", fmt.Sprintf("request body not received within %v", timeout)
	}
	return "invalid_body", "the request body could not be read in full"
}

// inferenceBody holds the only request fields the router reads; the rest of
// the body is forwarded untouched. The prompt-carrying fields alias the
// body: the prefix hasher reads them without a copy.
type inferenceBody struct {
	openai.Request
}

// endpoint kinds and the field each requires.
type endpoint struct {
	path  string
	field string // required prompt-carrying field
}

var (
	epChat        = endpoint{"/v1/chat/completions", "messages"}
	epCompletions = endpoint{"/v1/completions", "prompt"}
	epEmbeddings  = endpoint{"/v1/embeddings", "input"}
	epResponses   = endpoint{"/v1/responses", "input"}   // OpenAI Responses
	epMessages    = endpoint{"/v1/messages", "messages"} // Anthropic Messages
	epCountTokens = endpoint{"/v1/messages/count_tokens", "messages"}
)

// inferenceEndpoints are every endpoint the router proxies.
var inferenceEndpoints = []endpoint{epChat, epCompletions, epEmbeddings, epResponses, epMessages, epCountTokens}

// parseBody decodes the routing fields of an OpenAI request body with
// openai.ParseRequest: exact keys, one spelling of each field the router
// reads (a body the engine would read differently is refused), counts
// within openai.MaxTokensLimit and openai.MaxN. Errors are
// *openai.RequestError; see requestErrorCode.
func parseBody(ep endpoint, data []byte) (*inferenceBody, error) {
	r, err := openai.ParseRequest(data)
	if err != nil {
		return nil, err
	}
	b := &inferenceBody{Request: *r}
	if b.Model == "" {
		return nil, &openai.RequestError{Code: "missing_model", Param: "model", Message: `field "model" is required`}
	}
	if len(b.promptBytes(ep)) == 0 {
		return nil, &openai.RequestError{Code: "missing_" + ep.field, Param: ep.field, Message: fmt.Sprintf("field %q is required", ep.field)}
	}
	return b, nil
}

// requestErrorCode is the OpenAI error code for a parseBody error.
func requestErrorCode(err error) string {
	var re *openai.RequestError
	if errors.As(err, &re) && re.Code != "" {
		return re.Code
	}
	return "invalid_request"
}

// promptBytes is the text the prefix hash and token estimate cover: the
// raw messages JSON (as GIE hashes it), or the prompt / input; for the
// Responses and Anthropic APIs the system text (instructions, system)
// comes first, as the engine's chat template puts it.
func (b *inferenceBody) promptBytes(ep endpoint) []byte {
	var sys, main []byte
	switch ep.field {
	case "messages":
		main = b.Messages
	case "prompt":
		main = b.Prompt
	default:
		main = b.Input
	}
	switch ep {
	case epResponses:
		sys = b.Instructions
	case epMessages, epCountTokens:
		sys = b.System
	}
	if len(sys) == 0 || len(main) == 0 {
		return main
	}
	return append(append(append(make([]byte, 0, len(sys)+1+len(main)), sys...), '\n'), main...)
}

// maxTokens is the most completion tokens the request may generate over
// its n choices (0 if it names no limit): openai.Request.OutputTokens, the
// rule Tier 2 applies too.
func (b *inferenceBody) maxTokens(ep endpoint) int {
	return b.OutputTokens(openai.APIForPath(ep.path), 0)
}

// hopHeaders are hop-by-hop headers (RFC 9110 §7.6.1), never forwarded.
var hopHeaders = []string{
	"Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authenticate",
	"Proxy-Authorization", "Te", "Trailer", "Transfer-Encoding", "Upgrade",
}

// copyResponseHeaders copies a pod's response headers minus hop-by-hop and
// internal ones (a pod must not be able to spoof the router's headers).
func copyResponseHeaders(dst, src http.Header) {
	for k, v := range src {
		if IsInternalHeader(k) {
			continue
		}
		dst[k] = v
	}
	removeHopHeaders(dst, src)
}

// removeHopHeaders deletes hop-by-hop headers from h, including those named
// in connSrc's Connection header.
func removeHopHeaders(h, connSrc http.Header) {
	for _, f := range connSrc["Connection"] {
		for _, name := range strings.Split(f, ",") {
			if name = strings.TrimSpace(name); name != "" {
				h.Del(name)
			}
		}
	}
	for _, k := range hopHeaders {
		delete(h, k)
	}
}

func clientIP(r *http.Request) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return ""
	}
	return host
}

// tokenSet holds SHA-256 digests of the accepted tokens, so comparison is
// constant-time and independent of token length.
type tokenSet [][sha256.Size]byte

func newTokenSet(tokens []string) tokenSet {
	s := make(tokenSet, len(tokens))
	for i, t := range tokens {
		s[i] = sha256.Sum256([]byte(t))
	}
	return s
}

// check reports whether the request carries an accepted bearer token. It
// compares against every token without an early exit.
func (s tokenSet) check(r *http.Request) bool {
	h := r.Header.Get("Authorization")
	const prefix = "Bearer "
	if len(h) <= len(prefix) || !strings.EqualFold(h[:len(prefix)], prefix) {
		return false
	}
	got := sha256.Sum256([]byte(strings.TrimSpace(h[len(prefix):])))
	ok := 0
	for i := range s {
		ok |= subtle.ConstantTimeCompare(got[:], s[i][:])
	}
	return ok == 1
}
