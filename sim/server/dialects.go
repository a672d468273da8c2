package server

import (
	"encoding/json"
	"net/http"
	"strings"

	"github.com/infergate/infergate/shared/openai"
	"github.com/infergate/infergate/sim/engine"
)

// dialect is the API a generation request came in on; it decides how the
// body is read and the answer written. vLLM serves all four.
type dialect int

const (
	dChat        dialect = iota // /v1/chat/completions
	dCompletions                // /v1/completions
	dResponses                  // /v1/responses (OpenAI Responses)
	dMessages                   // /v1/messages (Anthropic Messages)
)

// parseDialect reads a Responses or Anthropic Messages body (exact keys)
// into the common request, its conversation rewritten as chat messages so
// tokenization and the engine treat every API alike.
func parseDialect(data []byte, d dialect) (*commonRequest, *apiError) {
	names := []string{"model", "stream", "max_output_tokens", "input", "instructions"}
	if d == dMessages {
		names = []string{"model", "stream", "max_tokens", "messages", "system"}
	}
	v, err := members(data, names...)
	if err != nil {
		return nil, badRequest("invalid_json", "could not parse the JSON body: %v", err)
	}
	var req commonRequest
	var maxTok *int
	for _, f := range []struct {
		name string
		raw  []byte
		dst  any
	}{{"model", v[0], &req.Model}, {"stream", v[1], &req.Stream}, {names[2], v[2], &maxTok}} {
		if aerr := decodeField(f.name, f.raw, f.dst); aerr != nil {
			return nil, aerr
		}
	}
	if req.Model == "" {
		return nil, badRequest("missing_model", "you must provide a model parameter")
	}
	if maxTok != nil && *maxTok < 1 {
		return nil, badRequest("invalid_value", "%s must be at least 1, got %d", names[2], *maxTok)
	}
	if d == dMessages && maxTok == nil {
		return nil, badRequest("missing_max_tokens", "'max_tokens' is a required property")
	}
	req.MaxTokens = maxTok
	if isNullOrAbsent(v[3]) {
		return nil, badRequest("missing_"+names[3], "'%s' is a required property", names[3])
	}
	var msgs []json.RawMessage
	if !isNullOrAbsent(v[4]) {
		sys, err := messageText(v[4])
		if err != nil {
			return nil, badRequest("invalid_value", "'%s' %v", names[4], err)
		}
		msgs = append(msgs, chatMsg("system", sys))
	}
	var s string
	if d == dResponses && json.Unmarshal(v[3], &s) == nil {
		msgs = append(msgs, chatMsg("user", s))
	} else {
		var items []json.RawMessage
		if err := json.Unmarshal(v[3], &items); err != nil {
			return nil, badRequest("invalid_value", "'%s' must be an array of messages", names[3])
		}
		msgs = append(msgs, items...)
	}
	req.Messages, _ = json.Marshal(msgs)
	return &req, nil
}

func chatMsg(role, text string) json.RawMessage {
	b, _ := json.Marshal(map[string]string{"role": role, "content": text})
	return b
}

// Responses API shapes.
type respUsage struct {
	InputTokens        int `json:"input_tokens"`
	OutputTokens       int `json:"output_tokens"`
	TotalTokens        int `json:"total_tokens"`
	InputTokensDetails struct {
		CachedTokens int `json:"cached_tokens"`
	} `json:"input_tokens_details"`
	OutputTokensDetails struct {
		ReasoningTokens int `json:"reasoning_tokens"`
	} `json:"output_tokens_details"`
}

type respContent struct {
	Type        string `json:"type"`
	Text        string `json:"text"`
	Annotations []any  `json:"annotations"`
}

type respItem struct {
	Type    string        `json:"type"`
	ID      string        `json:"id"`
	Role    string        `json:"role"`
	Status  string        `json:"status"`
	Content []respContent `json:"content"`
}

type response struct {
	ID                string     `json:"id"`
	Object            string     `json:"object"`
	CreatedAt         int64      `json:"created_at"`
	Model             string     `json:"model"`
	Status            string     `json:"status"`
	Output            []respItem `json:"output"`
	IncompleteDetails any        `json:"incomplete_details"`
	Error             *respError `json:"error"`
	Usage             *respUsage `json:"usage"`
}

type respError struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

// Anthropic Messages shapes.
type msgUsage struct {
	InputTokens          int `json:"input_tokens"`
	OutputTokens         int `json:"output_tokens"`
	CacheReadInputTokens int `json:"cache_read_input_tokens"`
}

type msgContent struct {
	Type string `json:"type"`
	Text string `json:"text"`
}

type message struct {
	ID           string       `json:"id"`
	Type         string       `json:"type"`
	Role         string       `json:"role"`
	Model        string       `json:"model"`
	Content      []msgContent `json:"content"`
	StopReason   *string      `json:"stop_reason"`
	StopSequence *string      `json:"stop_sequence"`
	Usage        msgUsage     `json:"usage"`
}

func (j *job) respUsage(res engine.Result) *respUsage {
	u := j.usage(res)
	ru := &respUsage{InputTokens: u.PromptTokens, OutputTokens: u.CompletionTokens, TotalTokens: u.TotalTokens}
	ru.InputTokensDetails.CachedTokens = res.CachedTokens
	return ru
}

func (j *job) response(status, text string, u *respUsage) response {
	item := respItem{Type: "message", ID: "msg_" + j.id, Role: "assistant", Status: status,
		Content: []respContent{{Type: "output_text", Text: text, Annotations: []any{}}}}
	out := []respItem{item}
	if status == "in_progress" {
		out = []respItem{}
	}
	return response{ID: j.id, Object: "response", CreatedAt: j.created, Model: j.model, Status: status, Output: out, Usage: u}
}

// stopReason maps an engine finish reason to Anthropic's.
func stopReason(finish string) *string {
	r := "end_turn"
	if finish == "length" {
		r = "max_tokens"
	}
	return &r
}

// writeDialect answers a finished non-streaming Responses or Messages
// request.
func (j *job) writeDialect(w http.ResponseWriter, res engine.Result, text string) {
	if j.dialect == dResponses {
		writeJSON(w, http.StatusOK, j.response("completed", text, j.respUsage(res)))
		return
	}
	u := j.usage(res)
	writeJSON(w, http.StatusOK, message{ID: j.id, Type: "message", Role: "assistant", Model: j.model,
		Content: []msgContent{{Type: "text", Text: text}}, StopReason: stopReason(res.FinishReason),
		Usage: msgUsage{InputTokens: u.PromptTokens, OutputTokens: u.CompletionTokens, CacheReadInputTokens: res.CachedTokens}})
}

// namedSSE writes the named events of the Responses and Anthropic
// streams: "event: <type>" then the data, whose "type" repeats the name.
type namedSSE struct {
	*sseWriter
	seq int
}

func (s *namedSSE) send(typ string, v map[string]any) {
	v["type"] = typ
	if _, ok := v["sequence_number"]; !ok && strings.HasPrefix(typ, "response.") {
		v["sequence_number"] = s.seq
		s.seq++
	}
	s.named(typ, v)
}

// streamOpen sends the events before the first token.
func (j *job) streamOpen(s *namedSSE) {
	if j.dialect == dResponses {
		s.send("response.created", map[string]any{"response": j.response("in_progress", "", nil)})
		s.send("response.in_progress", map[string]any{"response": j.response("in_progress", "", nil)})
		s.send("response.output_item.added", map[string]any{"output_index": 0,
			"item": respItem{Type: "message", ID: "msg_" + j.id, Role: "assistant", Status: "in_progress", Content: []respContent{}}})
		s.send("response.content_part.added", map[string]any{"item_id": "msg_" + j.id, "output_index": 0, "content_index": 0,
			"part": respContent{Type: "output_text", Annotations: []any{}}})
		return
	}
	s.send("message_start", map[string]any{"message": message{ID: j.id, Type: "message", Role: "assistant", Model: j.model,
		Content: []msgContent{}, Usage: msgUsage{InputTokens: j.promptTokens, OutputTokens: 1}}})
	s.send("content_block_start", map[string]any{"index": 0, "content_block": msgContent{Type: "text"}})
}

// streamDelta sends one token.
func (j *job) streamDelta(s *namedSSE, text string) {
	if j.dialect == dResponses {
		s.send("response.output_text.delta", map[string]any{"item_id": "msg_" + j.id, "output_index": 0, "content_index": 0,
			"delta": text, "logprobs": []any{}})
		return
	}
	s.send("content_block_delta", map[string]any{"index": 0, "delta": map[string]string{"type": "text_delta", "text": text}})
}

// streamClose sends the closing events, usage included (both APIs always
// report it).
func (j *job) streamClose(s *namedSSE, res engine.Result, text string) {
	if j.dialect == dResponses {
		id := "msg_" + j.id
		s.send("response.output_text.done", map[string]any{"item_id": id, "output_index": 0, "content_index": 0, "text": text, "logprobs": []any{}})
		part := respContent{Type: "output_text", Text: text, Annotations: []any{}}
		s.send("response.content_part.done", map[string]any{"item_id": id, "output_index": 0, "content_index": 0, "part": part})
		s.send("response.output_item.done", map[string]any{"output_index": 0,
			"item": respItem{Type: "message", ID: id, Role: "assistant", Status: "completed", Content: []respContent{part}}})
		s.send("response.completed", map[string]any{"response": j.response("completed", text, j.respUsage(res))})
		return
	}
	s.send("content_block_stop", map[string]any{"index": 0})
	s.send("message_delta", map[string]any{"delta": map[string]any{"stop_reason": stopReason(res.FinishReason), "stop_sequence": nil},
		"usage": map[string]int{"output_tokens": res.CompletionTokens}})
	s.send("message_stop", map[string]any{})
}

// streamError ends a named stream that failed.
func (j *job) streamError(s *namedSSE, msg string) {
	if j.dialect == dResponses {
		// The error event is numbered like the rest; response.failed then
		// ends the response's lifecycle.
		s.send("error", map[string]any{"code": "generation_failed", "message": msg, "param": nil, "sequence_number": s.seq})
		s.seq++
		r := j.response("failed", "", nil)
		r.Error = &respError{Code: "server_error", Message: msg}
		s.send("response.failed", map[string]any{"response": r})
		return
	}
	s.send("error", map[string]any{"error": map[string]string{"type": "api_error", "message": msg}})
}

// handleCountTokens answers /v1/messages/count_tokens as vLLM and
// Anthropic do: {"input_tokens": N}.
func (s *Server) handleCountTokens(w http.ResponseWriter, r *http.Request) {
	data, aerr := readBody(w, r, s.cfg.MaxBodyBytes)
	if aerr != nil {
		writeAPIError(w, aerr)
		return
	}
	// count_tokens takes no max_tokens: supply one so the shared parser passes.
	req, aerr := parseDialect(data, dMessages)
	if aerr != nil && aerr.code == "missing_max_tokens" {
		var m map[string]json.RawMessage
		if json.Unmarshal(data, &m) == nil {
			m["max_tokens"] = json.RawMessage("1")
			data, _ = json.Marshal(m)
			req, aerr = parseDialect(data, dMessages)
		}
	}
	if aerr != nil {
		writeAPIError(w, aerr)
		return
	}
	if _, ok := s.resolveModel(req.Model); !ok {
		openai.Errorf(w, http.StatusNotFound, "model_not_found", "The model `"+req.Model+"` does not exist.")
		return
	}
	toks, aerr := req.promptTokens(true)
	if aerr != nil {
		writeAPIError(w, aerr)
		return
	}
	writeJSON(w, http.StatusOK, map[string]int{"input_tokens": len(toks)})
}

// streamNamed is streamJob for the Responses and Anthropic streams: one
// delta event per token, named events around them, no [DONE].
func (s *Server) streamNamed(r *http.Request, j *job, sse *namedSSE) {
	j.streamOpen(sse)
	sent := 0
	for sse.ok() {
		if !s.wait(r, j) {
			return
		}
		tokens, done, doneAt, res := j.prog.snapshot()
		if done {
			tokens = res.CompletionTokens
		}
		for ; sent < tokens && sse.ok(); sent++ {
			j.streamDelta(sse, fillerToken(j.seed, sent))
		}
		if done {
			s.done(j, doneAt, res)
			if res.Err != nil {
				j.streamError(sse, res.Err.Error())
				return
			}
			j.streamClose(sse, res, string(appendFiller(nil, j.seed, 0, res.CompletionTokens)))
			return
		}
	}
	s.cancel(j, "client disconnected")
}
