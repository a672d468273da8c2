package openai

import (
	"encoding/json"
	"math"
)

// Usage is an answer's token counts, whichever API spelled them:
// prompt_tokens/completion_tokens (chat, completions, embeddings) or
// input_tokens/output_tokens (Responses, Anthropic Messages).
type Usage struct {
	PromptTokens     int
	CompletionTokens int
	TotalTokens      int // 0 when the answer gave none
}

// Total is the answer's total tokens: its own total when it gave one.
func (u *Usage) Total() int {
	if u.TotalTokens > 0 {
		return u.TotalTokens
	}
	return u.PromptTokens + u.CompletionTokens
}

// wireUsage is a usage object in any of the APIs' spellings.
type wireUsage struct {
	PromptTokens     int `json:"prompt_tokens"`
	CompletionTokens int `json:"completion_tokens"`
	TotalTokens      int `json:"total_tokens"`
	InputTokens      int `json:"input_tokens"`
	OutputTokens     int `json:"output_tokens"`
}

func (w *wireUsage) usage() *Usage {
	if w == nil {
		return nil
	}
	u := &Usage{PromptTokens: w.PromptTokens, CompletionTokens: w.CompletionTokens, TotalTokens: w.TotalTokens}
	if u.PromptTokens == 0 && u.CompletionTokens == 0 {
		u.PromptTokens, u.CompletionTokens = w.InputTokens, w.OutputTokens
	}
	return u
}

// BodyUsage is the usage of a whole (non-streamed) answer, nil when it
// names none: the top-level "usage" of every API's answer.
func BodyUsage(body []byte) *Usage {
	var b struct {
		Usage *wireUsage `json:"usage"`
	}
	if json.Unmarshal(body, &b) != nil {
		return nil
	}
	return b.Usage.usage()
}

// EventUsage is what one streamed event's data says about usage: for chat
// and completions a chunk's "usage" (usageOnly when the chunk has no
// choices: the chunk include_usage asks for); for Responses the usage of
// response.completed, .incomplete or .failed; for Anthropic Messages the
// input tokens of message_start or the counts of message_delta, merged
// into prev. It returns nil when data carries no usage.
func EventUsage(data []byte, prev *Usage) (u *Usage, usageOnly bool) {
	var ev struct {
		Type     string            `json:"type"`
		Choices  []json.RawMessage `json:"choices"`
		Usage    *wireUsage        `json:"usage"`
		Response *struct {
			Usage *wireUsage `json:"usage"`
		} `json:"response"`
		Message *struct {
			Usage *wireUsage `json:"usage"`
		} `json:"message"`
	}
	if json.Unmarshal(data, &ev) != nil {
		return nil, false
	}
	switch ev.Type {
	case "response.completed", "response.incomplete", "response.failed":
		if ev.Response != nil {
			return ev.Response.Usage.usage(), false
		}
		return nil, false
	case "message_start":
		// Input tokens here; the output count comes in message_delta.
		if ev.Message != nil && ev.Message.Usage != nil {
			return &Usage{PromptTokens: ev.Message.Usage.InputTokens}, false
		}
		return nil, false
	case "message_delta":
		if ev.Usage == nil {
			return nil, false
		}
		u := &Usage{}
		if prev != nil {
			u.PromptTokens = prev.PromptTokens
		}
		if ev.Usage.InputTokens > 0 {
			u.PromptTokens = ev.Usage.InputTokens
		}
		u.CompletionTokens = ev.Usage.OutputTokens
		return u, false
	}
	return ev.Usage.usage(), ev.Usage != nil && len(ev.Choices) == 0
}

// OutputTokens is the most tokens the request may generate over its n
// choices, for an endpoint of api: the per-choice bound the engine
// applies, times n. The bound is, for the Responses API,
// max_output_tokens; for Anthropic Messages, max_tokens; for chat and
// completions, max_completion_tokens, which supersedes the deprecated
// max_tokens (as in OpenAI's API and vLLM). A bound that is absent or 0
// counts as none: def per choice is used (0 for no bound). Saturating,
// though ParseRequest's limits keep it far below.
func (r *Request) OutputTokens(api API, def int) int {
	var per *int
	switch api {
	case APIResponses:
		per = r.MaxOutputTokens
	case APIAnthropic:
		per = r.MaxTokens
	default:
		per = r.MaxCompletionTokens
		if per == nil || *per == 0 {
			per = r.MaxTokens
		}
	}
	out := def
	if per != nil && *per > 0 {
		out = *per
	}
	n := 1
	if r.N != nil && *r.N > 1 {
		n = *r.N
	}
	return satMul(out, n)
}

// satMul multiplies non-negative ints, saturating at math.MaxInt (0 when
// either is not positive).
func satMul(a, b int) int {
	if a <= 0 || b <= 0 {
		return 0
	}
	if a > math.MaxInt/b {
		return math.MaxInt
	}
	return a * b
}
