package tokenize

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"sort"
)

// ErrNotConfigured: no tokenizer is configured for the model, so its exact
// tokens are off and callers fall back to an estimate.
var ErrNotConfigured = errors.New("no tokenizer configured for the model; exact tokens are off")

// Config names a model's tokenizer files, as shipped with the model on the
// Hugging Face Hub (a ConfigMap mounted as files works the same way). YAML:
//
//	tokenizer:
//	  file: /etc/infergate/tokenizers/llama-3.1/tokenizer.json
//	  config_file: /etc/infergate/tokenizers/llama-3.1/tokenizer_config.json
//	  chat_template_file: /etc/infergate/tokenizers/llama-3.1/chat_template.jinja
//
// The zero Config means no tokenizer: exact tokens are off for the model.
type Config struct {
	// File is the tokenizer.json. Required when any other field is set.
	File string `yaml:"file" json:"file"`
	// ConfigFile is the tokenizer_config.json: its chat_template and its
	// special tokens (bos_token, eos_token, ...), which templates use.
	ConfigFile string `yaml:"config_file" json:"config_file"`
	// ChatTemplateFile is a Jinja chat template; it takes precedence over
	// config_file's chat_template (newer models ship chat_template.jinja).
	ChatTemplateFile string `yaml:"chat_template_file" json:"chat_template_file"`
}

// IsZero reports whether no tokenizer is configured.
func (c Config) IsZero() bool { return c == Config{} }

// Load reads and parses the files c names. Errors name the key and the file.
func Load(c Config) (*Tokenizer, error) {
	if c.File == "" {
		return nil, errors.New("tokenizer.file: required (the model's tokenizer.json)")
	}
	data, err := os.ReadFile(c.File)
	if err != nil {
		return nil, fmt.Errorf("tokenizer.file: %w", err)
	}
	t, err := Parse(data)
	if err != nil {
		return nil, fmt.Errorf("tokenizer.file %s: %w", c.File, err)
	}
	var source string
	vars := map[string]string{}
	if c.ConfigFile != "" {
		data, err := os.ReadFile(c.ConfigFile)
		if err != nil {
			return nil, fmt.Errorf("tokenizer.config_file: %w", err)
		}
		if source, vars, err = parseTokenizerConfig(data); err != nil {
			return nil, fmt.Errorf("tokenizer.config_file %s: %w", c.ConfigFile, err)
		}
	}
	key, file := "tokenizer.config_file", c.ConfigFile
	if c.ChatTemplateFile != "" {
		data, err := os.ReadFile(c.ChatTemplateFile)
		if err != nil {
			return nil, fmt.Errorf("tokenizer.chat_template_file: %w", err)
		}
		source, key, file = string(data), "tokenizer.chat_template_file", c.ChatTemplateFile
	}
	if source != "" {
		if err := t.SetChatTemplate(source, vars); err != nil {
			return nil, fmt.Errorf("%s %s: %w", key, file, err)
		}
	}
	return t, nil
}

// parseTokenizerConfig returns tokenizer_config.json's chat template (the
// "default" one where it lists several) and its special-token variables.
func parseTokenizerConfig(data []byte) (template string, vars map[string]string, err error) {
	var f map[string]json.RawMessage
	if err := json.Unmarshal(data, &f); err != nil {
		return "", nil, fmt.Errorf("not a tokenizer_config.json: %w", err)
	}
	vars = map[string]string{}
	for _, k := range []string{"bos_token", "eos_token", "unk_token", "pad_token", "sep_token", "cls_token", "mask_token"} {
		raw, ok := f[k]
		if !ok || isNull(raw) {
			continue
		}
		var s string
		if json.Unmarshal(raw, &s) != nil {
			// The AddedToken form: {"content": "<s>", ...}.
			var tok struct {
				Content string `json:"content"`
			}
			if err := json.Unmarshal(raw, &tok); err != nil {
				return "", nil, fmt.Errorf("%s: want a string or {\"content\": ...}", k)
			}
			s = tok.Content
		}
		vars[k] = s
	}
	raw, ok := f["chat_template"]
	if !ok || isNull(raw) {
		return "", vars, nil
	}
	if json.Unmarshal(raw, &template) == nil {
		return template, vars, nil
	}
	var named []struct {
		Name     string `json:"name"`
		Template string `json:"template"`
	}
	if err := json.Unmarshal(raw, &named); err != nil {
		return "", nil, errors.New(`chat_template: want a string or a list of {"name", "template"}`)
	}
	for _, n := range named {
		if n.Name == "default" {
			return n.Template, vars, nil
		}
	}
	return "", nil, errors.New(`chat_template: a list without a "default" template`)
}

// Registry holds the loaded tokenizer of each model. Models configured
// with the same files share one Tokenizer. A nil or empty Registry has
// none: every Lookup is ErrNotConfigured.
type Registry struct {
	byModel map[string]*Tokenizer
}

// LoadRegistry loads the tokenizer of each model that has one configured;
// models with a zero Config are left without. An error names the model.
func LoadRegistry(models map[string]Config) (*Registry, error) {
	r := &Registry{byModel: map[string]*Tokenizer{}}
	loaded := map[Config]*Tokenizer{}
	names := make([]string, 0, len(models))
	for name := range models {
		names = append(names, name)
	}
	sort.Strings(names) // the first error is the same on every run
	for _, name := range names {
		c := models[name]
		if c.IsZero() {
			continue
		}
		t, ok := loaded[c]
		if !ok {
			var err error
			if t, err = Load(c); err != nil {
				return nil, fmt.Errorf("model %q: %w", name, err)
			}
			loaded[c] = t
		}
		r.byModel[name] = t
	}
	return r, nil
}

// Lookup returns the model's tokenizer, or an error wrapping
// ErrNotConfigured.
func (r *Registry) Lookup(model string) (*Tokenizer, error) {
	if r != nil {
		if t, ok := r.byModel[model]; ok {
			return t, nil
		}
	}
	return nil, fmt.Errorf("model %q: %w", model, ErrNotConfigured)
}
