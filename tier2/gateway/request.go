package gateway

import (
	"bytes"
	"encoding/json"
	"errors"
	"math"
	"net/http"

	"github.com/infergate/infergate/shared/openai"
)

// request is what the gateway reads from an inference request body (see
// openai.ParseRequest: exact keys, bounded counts).
type request = openai.Request

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
// over its n choices. The completion bound is the larger of max_tokens and
// max_completion_tokens (engines differ in which one wins), defMax when
// neither is set. The arithmetic saturates: a huge value must count as
// huge, never wrap to a small or negative estimate.
func estimateTokens(body []byte, req request, defMax int, endpoint string) int {
	est := len(body)/4 + 1
	if endpoint == "embeddings" || endpoint == "messages/count_tokens" {
		return est
	}
	out := 0
	for _, v := range []*int{req.MaxTokens, req.MaxCompletionTokens, req.MaxOutputTokens} {
		if v != nil && *v > out {
			out = *v
		}
	}
	if out == 0 {
		out = max(defMax, 0)
	}
	n := 1
	if req.N != nil && *req.N > 1 {
		n = *req.N
	}
	return satAdd(est, satMul(out, n))
}

// cancelledTokens is what a request the client abandoned before its usage
// arrived is charged: the prompt estimate (as in estimateTokens) plus one
// token per stream event already relayed (engines send about one token
// per event). Tokens the engine never generated, because the cancel
// reached it first, are not charged; a buffered answer the client never
// received is charged its prompt only.
func cancelledTokens(body []byte, relayed int) int {
	return satAdd(len(body)/4+1, max(relayed, 0))
}

// satAdd and satMul work on non-negative ints and saturate at math.MaxInt.
func satAdd(a, b int) int {
	if a > math.MaxInt-b {
		return math.MaxInt
	}
	return a + b
}

func satMul(a, b int) int {
	if a <= 0 || b <= 0 {
		return 0
	}
	if a > math.MaxInt/b {
		return math.MaxInt
	}
	return a * b
}

// withIncludeUsage sets stream_options.include_usage, keeping any other
// stream options the client sent. decodeRequest has already refused a
// body with two spellings of either key, so the exact-key map decode here
// sees the same stream_options the engine will.
func withIncludeUsage(body []byte) ([]byte, error) {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(body, &m); err != nil {
		return nil, err
	}
	so := map[string]json.RawMessage{}
	if raw, ok := m["stream_options"]; ok && !bytes.Equal(bytes.TrimSpace(raw), []byte("null")) {
		if err := json.Unmarshal(raw, &so); err != nil {
			return nil, err
		}
	}
	so["include_usage"] = json.RawMessage("true")
	raw, err := json.Marshal(so)
	if err != nil {
		return nil, err
	}
	m["stream_options"] = raw
	return json.Marshal(m)
}

// brokenUsage is what a stream cut mid-way (upstream broke off, or the
// stream outlived its maximum duration) is charged: like a cancelled
// request, the prompt plus one token per relayed event, never the whole
// max_tokens bound. The prompt count is the engine's when the stream gave
// one (Anthropic's message_start, or a usage chunk), else the estimate; a
// usage that already counts more is kept.
func brokenUsage(u *usage, body []byte, relayed int) *usage {
	b := usage{PromptTokens: len(body)/4 + 1, CompletionTokens: max(relayed, 0)}
	if u == nil {
		return &b
	}
	if u.PromptTokens > 0 {
		b.PromptTokens = u.PromptTokens
	}
	b.CompletionTokens = max(b.CompletionTokens, u.CompletionTokens)
	if u.total() > b.total() {
		return u
	}
	return &b
}
