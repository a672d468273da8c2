package openai

import (
	"encoding/json"
	"errors"
	"testing"
)

func TestRequestFieldsOrder(t *testing.T) {
	names := RequestFields.Names()
	if len(names) != nFields || names[fModel] != "model" || names[fN] != "n" || names[fCacheSalt] != "cache_salt" ||
		names[fUser] != "user" || names[fPromptCacheKey] != "prompt_cache_key" {
		t.Fatalf("field indexes out of step with %v", names)
	}
}

func TestParseRequest(t *testing.T) {
	tests := []struct {
		name, body  string
		code, param string // want error
		check       func(*Request) bool
	}{
		{name: "full", body: `{"model":"m","stream":true,"stream_options":{"include_usage":true},"max_tokens":5,"max_completion_tokens":6,"n":2,"messages":[{"role":"user","content":"hi"}],"cache_salt":"s"}`,
			check: func(r *Request) bool {
				return r.Model == "m" && r.Stream && r.StreamOptions.IncludeUsage && *r.MaxTokens == 5 &&
					*r.MaxCompletionTokens == 6 && *r.N == 2 && string(r.Messages) == `[{"role":"user","content":"hi"}]` && r.CacheSalt == "s"
			}},
		{name: "nulls", body: `{"model":"m","stream":null,"stream_options":null,"max_tokens":null,"n":null,"prompt":null}`,
			check: func(r *Request) bool {
				return r.StreamOptions == nil && r.MaxTokens == nil && r.N == nil && r.Prompt == nil && !r.Stream
			}},
		{name: "escaped model", body: `{"model":"ll\u0061ma"}`, check: func(r *Request) bool { return r.Model == "llama" }},
		{name: "bounds inclusive", body: `{"max_tokens":16777216,"max_completion_tokens":0,"n":128}`,
			check: func(r *Request) bool { return *r.MaxTokens == MaxTokensLimit && *r.N == MaxN }},
		{name: "max_tokens attack", body: `{"max_tokens":500,"Max_tokens":1,"Stream_options":{"include_usage":true}}`, code: "duplicate_key", param: "max_tokens"},
		{name: "model attack", body: `{"model":"unlisted-expensive-model","Model":"llama"}`, code: "duplicate_key", param: "model"},
		{name: "stream_options variant", body: `{"stream_options":{"include_usage":false},"Stream_options":{}}`, code: "duplicate_key", param: "stream_options"},
		{name: "nested variant", body: `{"stream_options":{"include_usage":false,"Include_usage":true}}`, code: "duplicate_key", param: "stream_options.include_usage"},
		{name: "nested duplicate", body: `{"stream_options":{"include_usage":true,"include_usage":false}}`, code: "duplicate_key", param: "stream_options.include_usage"},
		{name: "duplicate messages", body: `{"messages":[],"messages":[]}`, code: "duplicate_key", param: "messages"},
		{name: "cache_salt variant", body: `{"cache_salt":"a","CACHE_SALT":"b"}`, code: "duplicate_key", param: "cache_salt"},
		{name: "session hints", body: `{"user":"u-1","prompt_cache_key":"conv-9"}`,
			check: func(r *Request) bool { return r.User == "u-1" && r.PromptCacheKey == "conv-9" }},
		{name: "user variant", body: `{"user":"a","User":"b"}`, code: "duplicate_key", param: "user"},
		{name: "prompt_cache_key duplicate", body: `{"prompt_cache_key":"a","prompt_cache_key":"b"}`, code: "duplicate_key", param: "prompt_cache_key"},
		{name: "prompt_cache_key variant", body: `{"Prompt_Cache_Key":"a"}`, code: "duplicate_key", param: "prompt_cache_key"},
		{name: "user number", body: `{"user":7}`, code: "invalid_type", param: "user"},
		{name: "n variant", body: `{"N":2}`, code: "duplicate_key", param: "n"},
		{name: "responses", body: `{"model":"m","instructions":"be brief","input":"hi","max_output_tokens":7}`,
			check: func(r *Request) bool {
				return string(r.Instructions) == `"be brief"` && string(r.Input) == `"hi"` && *r.MaxOutputTokens == 7
			}},
		{name: "anthropic", body: `{"model":"m","system":[{"type":"text","text":"s"}],"messages":[],"max_tokens":3}`,
			check: func(r *Request) bool { return string(r.System) == `[{"type":"text","text":"s"}]` && *r.MaxTokens == 3 }},
		{name: "max_output_tokens variant", body: `{"max_output_tokens":5,"Max_Output_Tokens":99999}`, code: "duplicate_key", param: "max_output_tokens"},
		{name: "system variant", body: `{"system":"a","SYSTEM":"b"}`, code: "duplicate_key", param: "system"},
		{name: "instructions variant", body: `{"instructions":"a","Instructions":"b"}`, code: "duplicate_key", param: "instructions"},
		{name: "max_output_tokens bound", body: `{"max_output_tokens":16777217}`, code: "invalid_value", param: "max_output_tokens"},
		{name: "huge max_tokens", body: `{"max_tokens":4611686018427387904}`, code: "invalid_value", param: "max_tokens"},
		{name: "beyond int64", body: `{"max_tokens":99999999999999999999999}`, code: "invalid_value", param: "max_tokens"},
		{name: "negative", body: `{"max_completion_tokens":-1}`, code: "invalid_value", param: "max_completion_tokens"},
		{name: "n zero", body: `{"n":0}`, code: "invalid_value", param: "n"},
		{name: "n huge", body: `{"n":129}`, code: "invalid_value", param: "n"},
		{name: "float", body: `{"max_tokens":1e3}`, code: "invalid_type", param: "max_tokens"},
		{name: "string int", body: `{"max_tokens":"5"}`, code: "invalid_type", param: "max_tokens"},
		{name: "model number", body: `{"model":5}`, code: "invalid_type", param: "model"},
		{name: "stream string", body: `{"stream":"true"}`, code: "invalid_type", param: "stream"},
		{name: "stream_options array", body: `{"stream_options":[]}`, code: "invalid_type", param: "stream_options"},
		{name: "not object", body: `[]`, code: "invalid_json"},
		{name: "trailing", body: `{"model":"a"}{"model":"b"}`, code: "invalid_json"},
		{name: "bad utf8 key", body: "{\"mod\xe9l\":1}", code: "invalid_json"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, err := ParseRequest([]byte(tt.body))
			if tt.code == "" {
				if err != nil || !tt.check(r) {
					t.Fatalf("ParseRequest = %+v, %v", r, err)
				}
				return
			}
			var re *RequestError
			if !errors.As(err, &re) || re.Code != tt.code || re.Param != tt.param || re.Message == "" {
				t.Fatalf("err = %#v, want code %q param %q", err, tt.code, tt.param)
			}
		})
	}
}

// TestStringFieldMatchesJSON: a string field reads as encoding/json reads
// it, with escapes (decoded) or without (taken as is).
func TestStringFieldMatchesJSON(t *testing.T) {
	for _, raw := range []string{`""`, `"llama"`, `"a b/c"`, `"déjà ✓ 🎉"`, `"a\"b"`, `"\u00e9\n"`, `"\\"`, `"\/x"`} {
		got, err := stringField("model", []byte(raw))
		var want string
		if jerr := json.Unmarshal([]byte(raw), &want); err != nil || jerr != nil || got != want {
			t.Errorf("%s: %q (%v), encoding/json %q (%v)", raw, got, err, want, jerr)
		}
	}
}
