package server

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"reflect"
	"strings"

	"github.com/infergate/infergate/shared/jsonkeys"
	"github.com/infergate/infergate/sim/tokenize"
)

// apiError is a request failure to report as an OpenAI-style JSON error.
type apiError struct {
	status int
	code   string
	msg    string
}

func (e *apiError) Error() string { return e.msg }

func badRequest(code, format string, args ...any) *apiError {
	return &apiError{status: http.StatusBadRequest, code: code, msg: fmt.Sprintf(format, args...)}
}

type streamOptions struct {
	IncludeUsage bool
}

// chatMessage keeps content raw: it may be a string, an array of content
// parts or null.
type chatMessage struct {
	Role    string
	Content json.RawMessage
}

// decodeMessages decodes a messages array with exact keys.
func decodeMessages(raw []byte) ([]chatMessage, error) {
	var items []json.RawMessage
	if err := json.Unmarshal(raw, &items); err != nil {
		return nil, err
	}
	msgs := make([]chatMessage, len(items))
	for i, it := range items {
		v, err := members(it, "role", "content")
		if err != nil {
			return nil, fmt.Errorf("messages[%d]: %w", i, err)
		}
		if aerr := decodeField("role", v[0], &msgs[i].Role); aerr != nil {
			return nil, fmt.Errorf("messages[%d]: %w", i, aerr)
		}
		msgs[i].Content = v[1]
	}
	return msgs, nil
}

// commonRequest holds the fields both completion endpoints share; see
// parseRequest.
type commonRequest struct {
	Model               string
	Stream              bool
	StreamOptions       *streamOptions
	MaxTokens           *int
	MaxCompletionTokens *int
	N                   *int
	Messages            json.RawMessage
	Prompt              json.RawMessage
}

// decodeRequest reads and validates a completion request body. It does
// not resolve the model; that needs server state.
func decodeRequest(w http.ResponseWriter, r *http.Request, chat bool, maxBody int64) (*commonRequest, *apiError) {
	data, aerr := readBody(w, r, maxBody)
	if aerr != nil {
		return nil, aerr
	}
	return parseRequest(data, chat)
}

// readBody reads a size-limited request body.
func readBody(w http.ResponseWriter, r *http.Request, maxBody int64) ([]byte, *apiError) {
	data, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBody))
	var tooBig *http.MaxBytesError
	switch {
	case errors.As(err, &tooBig):
		return nil, &apiError{status: http.StatusRequestEntityTooLarge, code: "request_too_large",
			msg: fmt.Sprintf("request body exceeds the limit of %d bytes", maxBody)}
	case err != nil:
		return nil, badRequest("invalid_json", "could not read the body: %v", err)
	}
	return data, nil
}

// members returns the raw values of the named members of the JSON object
// data, matched the way vLLM's Python json.loads and pydantic match them:
// keys are exact (a "Max_tokens" is an unknown extra field, ignored, not
// max_tokens) and of duplicate keys the last wins. nil means absent.
func members(data []byte, names ...string) ([][]byte, error) {
	vals := make([][]byte, len(names))
	err := jsonkeys.Members(data, func(name, value []byte) error {
		for i, n := range names {
			if string(name) == n {
				vals[i] = value
			}
		}
		return nil
	})
	return vals, err
}

// decodeField decodes one member's raw value into v; absent and null
// leave v alone.
func decodeField(name string, raw []byte, v any) *apiError {
	if isNullOrAbsent(raw) {
		return nil
	}
	if err := json.Unmarshal(raw, v); err != nil {
		return badRequest("invalid_value", "'%s': %v", name, err)
	}
	return nil
}

// parseRequest parses and validates a completion request body with
// exact-key matching (see members): like vLLM, the simulator ignores
// case-variant keys rather than refusing them, so it reads a body exactly
// as the engines infergate routes to do.
func parseRequest(data []byte, chat bool) (*commonRequest, *apiError) {
	v, err := members(data, "model", "stream", "stream_options", "max_tokens", "max_completion_tokens", "n", "messages", "prompt")
	if err != nil {
		return nil, badRequest("invalid_json", "could not parse the JSON body: %v", err)
	}
	var req commonRequest
	req.Messages, req.Prompt = v[6], v[7]
	for _, f := range []struct {
		name string
		raw  []byte
		dst  any
	}{{"model", v[0], &req.Model}, {"stream", v[1], &req.Stream}, {"max_tokens", v[3], &req.MaxTokens},
		{"max_completion_tokens", v[4], &req.MaxCompletionTokens}, {"n", v[5], &req.N}} {
		if aerr := decodeField(f.name, f.raw, f.dst); aerr != nil {
			return nil, aerr
		}
	}
	if !isNullOrAbsent(v[2]) {
		so, err := members(v[2], "include_usage")
		if err != nil {
			return nil, badRequest("invalid_value", "'stream_options' must be an object")
		}
		req.StreamOptions = &streamOptions{}
		if aerr := decodeField("stream_options.include_usage", so[0], &req.StreamOptions.IncludeUsage); aerr != nil {
			return nil, aerr
		}
	}
	if req.Model == "" {
		return nil, badRequest("missing_model", "you must provide a model parameter")
	}
	if chat && isNullOrAbsent(req.Messages) {
		return nil, badRequest("missing_messages", "'messages' is a required property")
	}
	if !chat && isNullOrAbsent(req.Prompt) {
		return nil, badRequest("missing_prompt", "'prompt' is a required property")
	}
	if req.StreamOptions != nil && !req.Stream {
		return nil, badRequest("invalid_value", "stream_options can only be defined when stream=true")
	}
	if req.N != nil && *req.N != 1 {
		return nil, badRequest("invalid_value", "the simulator supports only n=1")
	}
	for _, p := range []struct {
		name string
		v    *int
	}{{"max_tokens", req.MaxTokens}, {"max_completion_tokens", req.MaxCompletionTokens}} {
		if p.v != nil && *p.v < 1 {
			return nil, badRequest("invalid_value", "%s must be at least 1, got %d", p.name, *p.v)
		}
	}
	return &req, nil
}

// decodeJSON reads one JSON object from a size-limited body into the
// struct *v with exact keys (see members): only members named exactly
// like a field's json tag are decoded.
func decodeJSON(w http.ResponseWriter, r *http.Request, maxBody int64, v any) *apiError {
	data, aerr := readBody(w, r, maxBody)
	if aerr != nil {
		return aerr
	}
	rv := reflect.ValueOf(v).Elem()
	names := make([]string, rv.NumField())
	for i := range names {
		names[i], _, _ = strings.Cut(rv.Type().Field(i).Tag.Get("json"), ",")
	}
	vals, err := members(data, names...)
	if err != nil {
		return badRequest("invalid_json", "could not parse the JSON body: %v", err)
	}
	for i, raw := range vals {
		if aerr := decodeField(names[i], raw, rv.Field(i).Addr().Interface()); aerr != nil {
			return aerr
		}
	}
	return nil
}

func isNullOrAbsent(raw json.RawMessage) bool {
	s := strings.TrimSpace(string(raw))
	return s == "" || s == "null"
}

// promptTokens tokenizes the prompt or messages of a validated request.
func (req *commonRequest) promptTokens(chat bool) ([]uint32, *apiError) {
	if chat {
		msgs, err := decodeMessages(req.Messages)
		if err != nil {
			return nil, badRequest("invalid_value", "'messages' must be an array of message objects: %v", err)
		}
		if len(msgs) == 0 {
			return nil, badRequest("invalid_value", "'messages' must contain at least one message")
		}
		var toks []uint32
		for i, m := range msgs {
			if m.Role == "" {
				return nil, badRequest("invalid_value", "messages[%d].role is required", i)
			}
			text, err := messageText(m.Content)
			if err != nil {
				return nil, badRequest("invalid_value", "messages[%d].content: %v", i, err)
			}
			// A rough stand-in for a chat template: role marker, content, end.
			toks = tokenize.AppendTokens(toks, "<|"+m.Role+"|>\n")
			toks = tokenize.AppendTokens(toks, text)
			toks = tokenize.AppendTokens(toks, "<|end|>\n")
		}
		toks = tokenize.AppendTokens(toks, "<|assistant|>\n")
		return toks, nil
	}
	return promptTokens(req.Prompt)
}

// messageText flattens string or content-part message content.
func messageText(raw json.RawMessage) (string, error) {
	if isNullOrAbsent(raw) {
		return "", nil
	}
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		return s, nil
	}
	var parts []json.RawMessage
	if err := json.Unmarshal(raw, &parts); err != nil {
		return "", errors.New("must be a string or an array of content parts")
	}
	var b strings.Builder
	for _, p := range parts {
		v, err := members(p, "type", "text")
		if err != nil {
			return "", errors.New("must be a string or an array of content parts")
		}
		var typ, text string
		if decodeField("type", v[0], &typ) != nil || decodeField("text", v[1], &text) != nil {
			return "", errors.New("content parts need string type and text")
		}
		if typ == "text" || typ == "input_text" || typ == "output_text" {
			b.WriteString(text)
		}
	}
	return b.String(), nil
}

// promptTokens accepts the /v1/completions prompt forms for one prompt: a
// string, a one-element string array, or an array of token IDs.
func promptTokens(raw json.RawMessage) ([]uint32, *apiError) {
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		if s == "" {
			return nil, badRequest("invalid_value", "'prompt' must not be empty")
		}
		return tokenize.Tokens(s), nil
	}
	var ss []string
	if err := json.Unmarshal(raw, &ss); err == nil {
		if len(ss) != 1 || ss[0] == "" {
			return nil, badRequest("invalid_value", "the simulator supports exactly one non-empty prompt per request")
		}
		return tokenize.Tokens(ss[0]), nil
	}
	var ids []uint32
	if err := json.Unmarshal(raw, &ids); err == nil {
		if len(ids) == 0 {
			return nil, badRequest("invalid_value", "'prompt' must not be empty")
		}
		return ids, nil
	}
	return nil, badRequest("invalid_value", "'prompt' must be a string, an array of one string, or an array of token IDs")
}

// Response shapes, as OpenAI (and vLLM) send them.

type usage struct {
	PromptTokens        int           `json:"prompt_tokens"`
	CompletionTokens    int           `json:"completion_tokens"`
	TotalTokens         int           `json:"total_tokens"`
	PromptTokensDetails *promptDetail `json:"prompt_tokens_details,omitempty"`
}

type promptDetail struct {
	CachedTokens int `json:"cached_tokens"`
}

type chatMessageOut struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

type chatChoice struct {
	Index        int            `json:"index"`
	Message      chatMessageOut `json:"message"`
	Logprobs     *struct{}      `json:"logprobs"`
	FinishReason string         `json:"finish_reason"`
}

type chatCompletion struct {
	ID      string       `json:"id"`
	Object  string       `json:"object"`
	Created int64        `json:"created"`
	Model   string       `json:"model"`
	Choices []chatChoice `json:"choices"`
	Usage   usage        `json:"usage"`
}

type chatDelta struct {
	Role    string  `json:"role,omitempty"`
	Content *string `json:"content,omitempty"`
}

type chatChunkChoice struct {
	Index        int       `json:"index"`
	Delta        chatDelta `json:"delta"`
	Logprobs     *struct{} `json:"logprobs"`
	FinishReason *string   `json:"finish_reason"`
}

type chatChunk struct {
	ID      string            `json:"id"`
	Object  string            `json:"object"`
	Created int64             `json:"created"`
	Model   string            `json:"model"`
	Choices []chatChunkChoice `json:"choices"`
	Usage   *usage            `json:"usage,omitempty"`
}

type textChoice struct {
	Index        int       `json:"index"`
	Text         string    `json:"text"`
	Logprobs     *struct{} `json:"logprobs"`
	FinishReason *string   `json:"finish_reason"`
}

type textCompletion struct {
	ID      string       `json:"id"`
	Object  string       `json:"object"`
	Created int64        `json:"created"`
	Model   string       `json:"model"`
	Choices []textChoice `json:"choices"`
	Usage   *usage       `json:"usage,omitempty"`
}

type modelCard struct {
	ID          string  `json:"id"`
	Object      string  `json:"object"`
	Created     int64   `json:"created"`
	OwnedBy     string  `json:"owned_by"`
	Root        string  `json:"root"`
	Parent      *string `json:"parent"`
	MaxModelLen int     `json:"max_model_len,omitempty"`
}

type modelList struct {
	Object string      `json:"object"`
	Data   []modelCard `json:"data"`
}

type loraRequest struct {
	LoraName string `json:"lora_name"`
	LoraPath string `json:"lora_path"`
}
