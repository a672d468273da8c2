package server

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/infergate/infergate/shared/openai"
	"github.com/infergate/infergate/sim/engine"
	"github.com/infergate/infergate/sim/tokenize"
)

// progress is what the engine's callbacks hand to an HTTP handler. The
// callbacks run on the engine goroutine, so they only update counters
// under a mutex and poke wake without blocking.
type progress struct {
	mu     sync.Mutex
	tokens int
	done   bool
	doneAt time.Duration
	res    engine.Result
	wake   chan struct{} // capacity 1: coalesces wake-ups
}

func newProgress() *progress { return &progress{wake: make(chan struct{}, 1)} }

func (p *progress) onTokens(_ time.Duration, n int) {
	p.mu.Lock()
	p.tokens += n
	p.mu.Unlock()
	p.poke()
}

func (p *progress) onDone(at time.Duration, res engine.Result) {
	p.mu.Lock()
	p.done, p.doneAt, p.res = true, at, res
	p.mu.Unlock()
	p.poke()
}

func (p *progress) poke() {
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

func (p *progress) snapshot() (tokens int, done bool, doneAt time.Duration, res engine.Result) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.tokens, p.done, p.doneAt, p.res
}

// job is one accepted request in flight.
type job struct {
	chat         bool // the conversation is chat messages (every dialect but completions)
	dialect      dialect
	id           string
	model        string
	created      int64
	stream       bool
	includeUsage bool
	seed         uint64
	promptTokens int
	engineID     uint64
	arrival      time.Duration
	prog         *progress
}

func (s *Server) handleGenerate(w http.ResponseWriter, r *http.Request, d dialect) {
	chat := d != dCompletions
	var req *commonRequest
	var aerr *apiError
	if d == dChat || d == dCompletions {
		req, aerr = decodeRequest(w, r, chat, s.cfg.MaxBodyBytes)
	} else {
		var data []byte
		if data, aerr = readBody(w, r, s.cfg.MaxBodyBytes); aerr == nil {
			req, aerr = parseDialect(data, d)
		}
	}
	if aerr != nil {
		writeAPIError(w, aerr)
		return
	}
	adapter, ok := s.resolveModel(req.Model)
	if !ok {
		openai.Errorf(w, http.StatusNotFound, "model_not_found", fmt.Sprintf("The model `%s` does not exist.", req.Model))
		return
	}
	toks, aerr := req.promptTokens(chat)
	if aerr != nil {
		writeAPIError(w, aerr)
		return
	}
	maxTokens, outputTokens := 0, s.cfg.DefaultOutputTokens
	switch {
	case req.MaxCompletionTokens != nil:
		maxTokens, outputTokens = *req.MaxCompletionTokens, 0
	case req.MaxTokens != nil:
		maxTokens, outputTokens = *req.MaxTokens, 0
	}
	// Check the context length here too, for a message naming the numbers.
	// Compared as a difference: prompt + max_tokens can overflow an int
	// (the request would then pass the check and generate forever).
	if len(toks) >= s.maxLen || max(maxTokens, 1) > s.maxLen-len(toks) {
		total := len(toks) + maxTokens
		if maxTokens > math.MaxInt-len(toks) {
			total = math.MaxInt
		}
		openai.Errorf(w, http.StatusBadRequest, "context_length_exceeded", fmt.Sprintf(
			"This model's maximum context length is %d tokens. However, you requested %d tokens (%d in the messages, %d in the completion). Please reduce the length of the messages or completion.",
			s.maxLen, total, len(toks), maxTokens))
		return
	}
	if maxTokens == 0 {
		// Leave room so the default output never trips the context check.
		outputTokens = max(1, min(outputTokens, s.maxLen-len(toks)))
	}
	seedName := s.cfg.ServedModelName
	if adapter != "" {
		seedName = adapter
	}
	j := &job{
		chat:         chat,
		dialect:      d,
		model:        req.Model,
		created:      time.Now().Unix(),
		stream:       req.Stream,
		includeUsage: req.StreamOptions != nil && req.StreamOptions.IncludeUsage,
		seed:         fillerSeed(toks),
		promptTokens: len(toks),
		engineID:     s.nextID.Add(1),
		prog:         newProgress(),
	}
	switch d {
	case dResponses:
		j.id = "resp_" + strconv.FormatUint(j.engineID, 16)
	case dMessages:
		j.id = "msg_" + strconv.FormatUint(j.engineID, 16)
	case dChat:
		j.id = "chatcmpl-" + strconv.FormatUint(j.engineID, 16)
	default:
		j.id = "cmpl-" + strconv.FormatUint(j.engineID, 16)
	}
	er := &engine.Request{
		ID:           j.engineID,
		Adapter:      adapter,
		PromptTokens: len(toks),
		BlockHashes:  tokenize.BlockHashes(seedName, toks, engine.BlockSize),
		TokenIDs:     toks,
		MaxTokens:    maxTokens,
		OutputTokens: outputTokens,
		OnTokens:     j.prog.onTokens,
		OnDone:       j.prog.onDone,
	}
	var err error
	s.rt.Do(func(e *engine.Engine, now time.Duration) {
		j.arrival = now
		err = e.Submit(now, er)
	})
	if err != nil {
		writeSubmitError(w, err)
		return
	}
	s.metrics.observeArrival()
	s.log.Debug("request accepted", "id", j.id, "model", req.Model, "prompt_tokens", len(toks),
		"max_tokens", maxTokens, "stream", req.Stream, "traceparent", r.Header.Get("Traceparent"))
	if j.stream {
		s.streamJob(w, r, j)
	} else {
		s.finishJob(w, r, j)
	}
}

func writeSubmitError(w http.ResponseWriter, err error) {
	switch {
	case errors.Is(err, engine.ErrUnknownAdapter):
		openai.Errorf(w, http.StatusNotFound, "model_not_found", err.Error())
	case errors.Is(err, engine.ErrContextLength):
		openai.Errorf(w, http.StatusBadRequest, "context_length_exceeded", err.Error())
	case errors.Is(err, engine.ErrKVCapacity), errors.Is(err, engine.ErrInvalidRequest):
		openai.Errorf(w, http.StatusBadRequest, "invalid_value", err.Error())
	default:
		openai.Errorf(w, http.StatusInternalServerError, "internal_error", err.Error())
	}
}

// cancel frees the request's engine slot after the client went away or the
// pod shut down.
func (s *Server) cancel(j *job, why string) {
	s.rt.Cancel(j.engineID)
	s.log.Debug("request cancelled", "id", j.id, "reason", why)
}

// wait blocks until the job progresses, the client leaves or the pod
// closes; false means stop (the request was cancelled).
func (s *Server) wait(r *http.Request, j *job) bool {
	select {
	case <-j.prog.wake:
		return true
	case <-r.Context().Done():
		s.cancel(j, "client disconnected")
	case <-s.closing:
		s.cancel(j, "pod shutting down")
	}
	return false
}

func (s *Server) done(j *job, doneAt time.Duration, res engine.Result) {
	s.metrics.observeDone(res, res.FirstTokenAt-j.arrival, doneAt-j.arrival)
	s.log.Debug("request finished", "id", j.id, "prompt_tokens", res.PromptTokens,
		"cached_tokens", res.CachedTokens, "completion_tokens", res.CompletionTokens,
		"finish_reason", res.FinishReason, "ttft", res.FirstTokenAt-j.arrival, "e2e", doneAt-j.arrival)
}

func (j *job) usage(res engine.Result) usage {
	prompt := res.PromptTokens
	if prompt == 0 {
		prompt = j.promptTokens
	}
	return usage{
		PromptTokens:        prompt,
		CompletionTokens:    res.CompletionTokens,
		TotalTokens:         prompt + res.CompletionTokens,
		PromptTokensDetails: &promptDetail{CachedTokens: res.CachedTokens},
	}
}

// finishJob answers a non-streaming request once the engine is done.
func (s *Server) finishJob(w http.ResponseWriter, r *http.Request, j *job) {
	for {
		if !s.wait(r, j) {
			if r.Context().Err() == nil {
				openai.Errorf(w, http.StatusServiceUnavailable, "shutting_down", "the pod is shutting down")
			}
			return
		}
		_, done, doneAt, res := j.prog.snapshot()
		if !done {
			continue
		}
		s.done(j, doneAt, res)
		if res.Err != nil {
			openai.Errorf(w, http.StatusInternalServerError, "generation_failed", res.Err.Error())
			return
		}
		text := string(appendFiller(nil, j.seed, 0, res.CompletionTokens))
		if j.dialect >= dResponses {
			j.writeDialect(w, res, text)
			return
		}
		u := j.usage(res)
		if j.chat {
			writeJSON(w, http.StatusOK, chatCompletion{
				ID: j.id, Object: "chat.completion", Created: j.created, Model: j.model,
				Choices: []chatChoice{{Message: chatMessageOut{Role: "assistant", Content: text}, FinishReason: res.FinishReason}},
				Usage:   u,
			})
		} else {
			reason := res.FinishReason
			writeJSON(w, http.StatusOK, textCompletion{
				ID: j.id, Object: "text_completion", Created: j.created, Model: j.model,
				Choices: []textChoice{{Text: text, FinishReason: &reason}},
				Usage:   &u,
			})
		}
		return
	}
}

// streamJob answers with server-sent events: one chunk per token, flushed
// as the engine produces them, then the finish chunk, the optional usage
// chunk and [DONE].
func (s *Server) streamJob(w http.ResponseWriter, r *http.Request, j *job) {
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	h.Set("Connection", "keep-alive")
	h.Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	sse := &sseWriter{w: w, rc: rc}
	if j.dialect >= dResponses {
		s.streamNamed(r, j, &namedSSE{sseWriter: sse})
		return
	}
	if j.chat {
		// OpenAI opens a chat stream with the assistant role.
		empty := ""
		sse.event(j.chatChunk(chatDelta{Role: "assistant", Content: &empty}, nil))
	}
	if !sse.ok() {
		s.cancel(j, "client disconnected")
		return
	}
	sent := 0
	for {
		if !s.wait(r, j) {
			return
		}
		tokens, done, doneAt, res := j.prog.snapshot()
		if done {
			// Use the final count: it is authoritative.
			tokens = res.CompletionTokens
		}
		for ; sent < tokens && sse.ok(); sent++ {
			text := fillerToken(j.seed, sent)
			if j.chat {
				sse.event(j.chatChunk(chatDelta{Content: &text}, nil))
			} else {
				sse.event(j.textChunk(text, nil))
			}
		}
		if done {
			s.done(j, doneAt, res)
			if res.Err != nil {
				sse.event(map[string]openai.Error{"error": {Message: res.Err.Error(), Type: openai.TypeServer, Code: "generation_failed"}})
			} else {
				reason := res.FinishReason
				if j.chat {
					sse.event(j.chatChunk(chatDelta{}, &reason))
				} else {
					sse.event(j.textChunk("", &reason))
				}
				if j.includeUsage {
					u := j.usage(res)
					if j.chat {
						sse.event(chatChunk{ID: j.id, Object: "chat.completion.chunk", Created: j.created, Model: j.model,
							Choices: []chatChunkChoice{}, Usage: &u})
					} else {
						sse.event(textCompletion{ID: j.id, Object: "text_completion", Created: j.created, Model: j.model,
							Choices: []textChoice{}, Usage: &u})
					}
				}
			}
			sse.raw("data: [DONE]\n\n")
			return
		}
		if !sse.ok() {
			s.cancel(j, "client disconnected")
			return
		}
	}
}

func (j *job) chatChunk(d chatDelta, finish *string) chatChunk {
	return chatChunk{ID: j.id, Object: "chat.completion.chunk", Created: j.created, Model: j.model,
		Choices: []chatChunkChoice{{Delta: d, FinishReason: finish}}}
}

func (j *job) textChunk(text string, finish *string) textCompletion {
	return textCompletion{ID: j.id, Object: "text_completion", Created: j.created, Model: j.model,
		Choices: []textChoice{{Text: text, FinishReason: finish}}}
}

// sseWriter writes and flushes one event at a time, so each token reaches
// the client as soon as the engine produces it. It remembers the first
// error: a vanished client is then noticed by ok.
type sseWriter struct {
	w   http.ResponseWriter
	rc  *http.ResponseController
	buf []byte
	err error
}

func (s *sseWriter) event(v any) { s.named("", v) }

// named writes v as one SSE event, preceded by "event: name" when name is
// not empty (the Responses and Anthropic streams name their events).
func (s *sseWriter) named(name string, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		s.err = err
		return
	}
	s.buf = s.buf[:0]
	if name != "" {
		s.buf = append(s.buf, "event: "...)
		s.buf = append(s.buf, name...)
		s.buf = append(s.buf, '\n')
	}
	s.buf = append(s.buf, "data: "...)
	s.buf = append(s.buf, b...)
	s.buf = append(s.buf, "\n\n"...)
	s.write(s.buf)
}

func (s *sseWriter) raw(line string) { s.write([]byte(line)) }

func (s *sseWriter) write(b []byte) {
	if s.err != nil {
		return
	}
	if _, err := s.w.Write(b); err != nil {
		s.err = err
		return
	}
	s.err = s.rc.Flush()
}

// ok reports whether every write so far reached the connection.
func (s *sseWriter) ok() bool { return s.err == nil }

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		openai.Errorf(w, http.StatusInternalServerError, "internal_error", err.Error())
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(b)))
	w.WriteHeader(status)
	_, _ = w.Write(b)
}

func writeText(w http.ResponseWriter, status int, s string) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.WriteHeader(status)
	_, _ = w.Write([]byte(s))
}

func writeAPIError(w http.ResponseWriter, e *apiError) {
	openai.Errorf(w, e.status, e.code, e.msg)
}
