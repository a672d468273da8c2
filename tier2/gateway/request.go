package gateway

import (
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"

	"github.com/infergate/infergate/shared/openai"
)

// request is what the gateway reads from an inference request body (see
// openai.ParseRequest: exact keys, bounded counts).
type request = openai.Request

// readBody reads the request body up to MaxBodyBytes, answering 400 or 413
// itself when it cannot.
func (g *Gateway) readBody(w http.ResponseWriter, r *http.Request) ([]byte, bool) {
	var body []byte
	var err error
	switch n := r.ContentLength; {
	case n > g.opts.MaxBodyBytes:
		g.bodyTooLarge(w)
		return nil, false
	case n >= 0:
		// One allocation of the right size and one copy, where ReadAll
		// grows its buffer from 512 bytes (2.5 times the body in
		// allocations, copied over and over, for 32 KB). The spare
		// capacity lets include_usage be set in place (openai.Splice.Edit).
		body = make([]byte, n, n+int64(openai.MaxSpliceGrowth))
		_, err = io.ReadFull(r.Body, body)
	default:
		body, err = io.ReadAll(io.LimitReader(r.Body, g.opts.MaxBodyBytes+1))
	}
	if err != nil {
		closeAfter(w)
		// The cause names both sockets: the log gets it, the client a
		// plain reason.
		g.log.Debug("request body not read", "err", err)
		if errors.Is(err, os.ErrDeadlineExceeded) {
			openai.Errorf(w, http.StatusBadRequest, "body_timeout", fmt.Sprintf("the request body did not arrive within %v", g.opts.BodyReadTimeout))
			return nil, false
		}
		openai.Errorf(w, http.StatusBadRequest, "invalid_body", "could not read the request body")
		return nil, false
	}
	if int64(len(body)) > g.opts.MaxBodyBytes {
		g.bodyTooLarge(w)
		return nil, false
	}
	return body, true
}

// bodyTooLarge answers a body over MaxBodyBytes with 413.
func (g *Gateway) bodyTooLarge(w http.ResponseWriter) {
	closeAfter(w)
	openai.Errorf(w, http.StatusRequestEntityTooLarge, "body_too_large", fmt.Sprintf("request body exceeds %d bytes", g.opts.MaxBodyBytes))
}

// decodeRequest reads the routing fields of body for the endpoint
// ("chat/completions", "completions" or "embeddings"). The body reaches
// Tier 1 and the engine unchanged, so it is refused with a 400 naming the
// field when a field the gateway reads is spelled twice or in another case
// (encoding/json would match it case-insensitively and let the last
// spelling win, the engine matches exactly), and when max_tokens,
// max_completion_tokens or n is out of bounds (openai.MaxTokensLimit,
// openai.MaxN). With false the error has been written.
func decodeRequest(w http.ResponseWriter, body []byte, endpoint string) (request, bool) {
	r, err := openai.ParseRequest(body)
	if err != nil {
		code := "invalid_json"
		var re *openai.RequestError
		if errors.As(err, &re) {
			code = re.Code
		}
		openai.Errorf(w, http.StatusBadRequest, code, err.Error())
		return request{}, false
	}
	if r.Model == "" {
		openai.WriteError(w, http.StatusBadRequest, openai.TypeInvalidRequest, "missing_model", "you must provide a model parameter")
		return request{}, false
	}
	if r.Stream && (endpoint == "embeddings" || endpoint == "messages/count_tokens") {
		openai.Errorf(w, http.StatusBadRequest, "invalid_stream", endpoint+" cannot be streamed")
		return request{}, false
	}
	return *r, true
}

// estimateTokens guesses a request's tokens before it runs: about four
// bytes of JSON per prompt token, plus the completion it may generate
// over its n choices (openai.Request.OutputTokens: the bound the engine
// applies for the endpoint's API, defMax when the request names none).
// The arithmetic saturates: a huge value must count as huge, never wrap to
// a small or negative estimate.
func estimateTokens(body []byte, req request, defMax int, endpoint string) int {
	est := len(body)/4 + 1
	if endpoint == "embeddings" || endpoint == "messages/count_tokens" {
		return est
	}
	return satAdd(est, req.OutputTokens(openai.APIForPath("/v1/"+endpoint), max(defMax, 0)))
}

// cancelledTokens is what a request the client abandoned before its usage
// arrived is charged: the prompt estimate (as in estimateTokens) of the
// sent body's bodyLen bytes plus one token per stream event already
// relayed (engines send about one token per event). Tokens the engine
// never generated, because the cancel reached it first, are not charged; a
// buffered answer the client never received is charged its prompt only.
func cancelledTokens(bodyLen, relayed int) int {
	return satAdd(bodyLen/4+1, max(relayed, 0))
}

// satAdd adds non-negative ints, saturating at math.MaxInt.
func satAdd(a, b int) int {
	if a > math.MaxInt-b {
		return math.MaxInt
	}
	return a + b
}

// brokenUsage is what a stream cut mid-way (upstream broke off, or the
// stream outlived its maximum duration) is charged: like a cancelled
// request, the prompt plus one token per relayed event, never the whole
// max_tokens bound. The prompt count is the engine's when the stream gave
// one (Anthropic's message_start, or a usage chunk), else the estimate; a
// usage that already counts more is kept.
func brokenUsage(u *openai.Usage, bodyLen, relayed int) *openai.Usage {
	b := openai.Usage{PromptTokens: bodyLen/4 + 1, CompletionTokens: max(relayed, 0)}
	if u == nil {
		return &b
	}
	if u.PromptTokens > 0 {
		b.PromptTokens = u.PromptTokens
	}
	b.CompletionTokens = max(b.CompletionTokens, u.CompletionTokens)
	if u.Total() > b.Total() {
		return u
	}
	return &b
}
