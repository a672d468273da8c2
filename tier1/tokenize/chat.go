package tokenize

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"regexp"
	"strings"
	"unicode"

	"github.com/ardanlabs/jinja"
)

var (
	// ErrNoChatTemplate: the tokenizer has no chat template configured, so
	// a chat request's tokens are unknown.
	ErrNoChatTemplate = errors.New("no chat template configured")
	// ErrUnsupported: the request uses something whose tokens this package
	// does not reproduce (tools, images, a per-request template); its exact
	// tokens are off.
	ErrUnsupported = errors.New("not supported for exact tokens")
)

// ChatRequest is the part of an OpenAI /v1/chat/completions body (with
// vLLM's extensions) that decides the prompt. A request body decodes into it
// directly; other fields are ignored.
type ChatRequest struct {
	Messages []Message `json:"messages"`
	// Tools are not rendered here: a request with tools is ErrUnsupported.
	Tools []json.RawMessage `json:"tools,omitempty"`
	// AddGenerationPrompt: vLLM's default is true.
	AddGenerationPrompt *bool `json:"add_generation_prompt,omitempty"`
	// ContinueFinalMessage ends the prompt inside the last message instead
	// of closing it (vLLM's continue_final_message).
	ContinueFinalMessage bool `json:"continue_final_message,omitempty"`
	// AddSpecialTokens adds the post-processor's tokens on top of the
	// template's (vLLM's default is false: the template writes them).
	AddSpecialTokens bool `json:"add_special_tokens,omitempty"`
	// ChatTemplateKwargs are extra template variables (enable_thinking for
	// Qwen3, date_string for Llama-3.1).
	ChatTemplateKwargs map[string]any `json:"chat_template_kwargs,omitempty"`
	// ChatTemplate is a per-request template, which vLLM accepts only when
	// started to trust it: ErrUnsupported when set.
	ChatTemplate string `json:"chat_template,omitempty"`
}

// Message is one chat message. Content is a string, null, or a list of
// parts of which only "text" parts are supported.
type Message struct {
	Role             string          `json:"role"`
	Content          json.RawMessage `json:"content,omitempty"`
	Name             string          `json:"name,omitempty"`
	ToolCalls        json.RawMessage `json:"tool_calls,omitempty"`
	ReasoningContent *string         `json:"reasoning_content,omitempty"`
}

// TextMessage is a message with string content.
func TextMessage(role, text string) Message {
	content, _ := json.Marshal(text)
	return Message{Role: role, Content: content}
}

// chatTemplate is a compiled template with the tokenizer's special-token
// variables (bos_token, eos_token, ...).
type chatTemplate struct {
	tmpl   *jinja.Template
	source string
	vars   map[string]any
	// partsContent: the template loops over message content, so it gets
	// content as a list of {"type": "text", "text": ...} (vLLM's "openai"
	// content format) instead of a string.
	partsContent bool
}

// contentLoop spots a template that iterates over a message's content, as
// vLLM's content-format detection does for "openai"-format templates.
var contentLoop = regexp.MustCompile(`\{%-?\s*for\s+\w+\s+in\s+[\w.]*(\.content|\[\s*['"]content['"]\s*\])\s*-?%\}`)

func newChatTemplate(source string, vars map[string]any) (*chatTemplate, error) {
	tmpl, err := jinja.Compile(source)
	if err != nil {
		return nil, err
	}
	return &chatTemplate{tmpl: tmpl, source: source, vars: vars, partsContent: contentLoop.MatchString(source)}, nil
}

// SetChatTemplate compiles source as the tokenizer's chat template; vars
// are the special-token variables it may use (bos_token, eos_token, ...).
func (t *Tokenizer) SetChatTemplate(source string, vars map[string]string) error {
	v := make(map[string]any, len(vars))
	for k, s := range vars {
		v[k] = s
	}
	c, err := newChatTemplate(source, v)
	if err != nil {
		return fmt.Errorf("chat template: %w", err)
	}
	t.chat = c
	return nil
}

// HasChatTemplate reports whether chat requests can be rendered.
func (t *Tokenizer) HasChatTemplate() bool { return t.chat != nil }

// RenderChat renders req with the chat template into the prompt string
// vLLM's /v1/chat/completions would tokenize.
func (t *Tokenizer) RenderChat(req *ChatRequest) (string, error) {
	if t.chat == nil {
		return "", ErrNoChatTemplate
	}
	switch {
	case len(req.Tools) > 0:
		return "", fmt.Errorf("tools: %w", ErrUnsupported)
	case req.ChatTemplate != "":
		return "", fmt.Errorf("chat_template: %w", ErrUnsupported)
	case len(req.Messages) == 0:
		return "", errors.New("messages: empty")
	}
	addGen := req.AddGenerationPrompt == nil || *req.AddGenerationPrompt
	if addGen && req.ContinueFinalMessage {
		return "", errors.New("add_generation_prompt and continue_final_message cannot both be true")
	}
	messages := make([]any, len(req.Messages))
	var lastText string
	for i, m := range req.Messages {
		if len(m.ToolCalls) > 0 && string(m.ToolCalls) != "null" && string(m.ToolCalls) != "[]" {
			return "", fmt.Errorf("messages[%d].tool_calls: %w", i, ErrUnsupported)
		}
		text, err := messageText(m.Content)
		if err != nil {
			return "", fmt.Errorf("messages[%d].content: %w", i, err)
		}
		lastText = text
		msg := map[string]any{"role": m.Role, "content": text}
		if t.chat.partsContent {
			msg["content"] = []any{map[string]any{"type": "text", "text": text}}
		}
		if m.Name != "" {
			msg["name"] = m.Name
		}
		if m.ReasoningContent != nil {
			msg["reasoning_content"] = *m.ReasoningContent
		}
		messages[i] = msg
	}
	data := make(map[string]any, len(t.chat.vars)+len(req.ChatTemplateKwargs)+4)
	maps.Copy(data, t.chat.vars)
	maps.Copy(data, req.ChatTemplateKwargs)
	data["messages"] = messages
	data["add_generation_prompt"] = addGen
	data["tools"] = nil
	data["documents"] = nil
	out, err := t.chat.tmpl.Render(data)
	if err != nil {
		return "", fmt.Errorf("chat template: %w", err)
	}
	if req.ContinueFinalMessage {
		return cutAfterFinal(out, lastText)
	}
	return out, nil
}

// cutAfterFinal ends the prompt right after the final message's text, as
// transformers' apply_chat_template(continue_final_message=True) does.
func cutAfterFinal(rendered, final string) (string, error) {
	stripped := strings.TrimFunc(final, isPySpace)
	loc := strings.LastIndex(rendered, stripped)
	if loc < 0 {
		return "", errors.New("continue_final_message: the final message does not appear in the rendered chat")
	}
	n := len(strings.TrimLeftFunc(final, isPySpace))
	if rendered[loc:min(len(rendered), loc+n)] == final {
		return rendered[:loc+n], nil
	}
	return rendered[:loc+len(stripped)], nil
}

// isPySpace is Python's str.isspace for one character, which is what
// str.strip() removes: Go's unicode.IsSpace plus the separators U+001C-1F.
func isPySpace(r rune) bool { return unicode.IsSpace(r) || (r >= 0x1c && r <= 0x1f) }

// messageText flattens content as vLLM does for string-format templates:
// text parts joined by newlines.
func messageText(raw json.RawMessage) (string, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return "", nil
	}
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		return s, nil
	}
	var parts []struct {
		Type string  `json:"type"`
		Text *string `json:"text"`
	}
	if err := json.Unmarshal(raw, &parts); err != nil {
		return "", errors.New("want a string or a list of content parts")
	}
	texts := make([]string, 0, len(parts))
	for i, p := range parts {
		if p.Type != "text" || p.Text == nil {
			return "", fmt.Errorf("[%d] type %q: %w (text parts only)", i, p.Type, ErrUnsupported)
		}
		texts = append(texts, *p.Text)
	}
	return strings.Join(texts, "\n"), nil
}

// EncodeChat renders req and encodes the prompt: the token ids vLLM's
// /v1/chat/completions would feed the model.
func (t *Tokenizer) EncodeChat(req *ChatRequest) ([]uint32, error) {
	prompt, err := t.RenderChat(req)
	if err != nil {
		return nil, err
	}
	return t.Encode(prompt, req.AddSpecialTokens), nil
}
