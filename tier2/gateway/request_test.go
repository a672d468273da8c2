package gateway

import (
	"encoding/json"
	"math"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/infergate/infergate/shared/openai"
)

func intp(v int) *int { return &v }

func TestEstimateTokens(t *testing.T) {
	body := make([]byte, 400) // 101 prompt tokens
	tests := []struct {
		name     string
		req      request
		endpoint string
		want     int
	}{
		{"default", request{}, "chat/completions", 101 + 256},
		{"max_tokens × n", request{MaxTokens: intp(1000), N: intp(2)}, "chat/completions", 101 + 2000},
		// One rule with Tier 1 (openai.Request.OutputTokens).
		{"max_completion_tokens supersedes max_tokens", request{MaxTokens: intp(10), MaxCompletionTokens: intp(50)}, "completions", 101 + 50},
		{"even when smaller", request{MaxTokens: intp(70), MaxCompletionTokens: intp(50)}, "chat/completions", 101 + 50},
		{"responses: max_output_tokens", request{MaxTokens: intp(70), MaxOutputTokens: intp(9)}, "responses", 101 + 9},
		{"anthropic: max_tokens", request{MaxTokens: intp(70), MaxCompletionTokens: intp(9)}, "messages", 101 + 70},
		{"zero means default", request{MaxTokens: intp(0)}, "chat/completions", 101 + 256},
		{"embeddings", request{MaxTokens: intp(5)}, "embeddings", 101},
		// Values ParseRequest refuses, to show the arithmetic saturates
		// rather than wrapping (the old code returned a negative count).
		{"2^62 × 2 saturates", request{MaxTokens: intp(1 << 62), N: intp(2)}, "chat/completions", math.MaxInt},
		{"MaxInt + prompt saturates", request{MaxTokens: intp(math.MaxInt)}, "chat/completions", math.MaxInt},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := estimateTokens(body, tt.req, 256, tt.endpoint); got != tt.want {
				t.Errorf("estimateTokens = %d, want %d", got, tt.want)
			}
		})
	}
}

func TestDecodeRequest(t *testing.T) {
	tests := []struct {
		body, endpoint, code string
	}{
		{`{"model":"m","stream":true,"stream_options":{"include_usage":true},"n":2}`, "chat/completions", ""},
		{`{"model":"m","max_tokens":500,"Max_tokens":1}`, "chat/completions", "duplicate_key"},
		{`{"model":"m","stream":true,"stream_options":{"include_usage":true},"Stream_options":{}}`, "chat/completions", "duplicate_key"},
		{`{"model":"m","n":2,"n":3}`, "completions", "duplicate_key"},
		{`{"model":"m","max_completion_tokens":16777217}`, "chat/completions", "invalid_value"},
		{`{"model":"m","n":0}`, "chat/completions", "invalid_value"},
		{`{"model":"m"} {}`, "chat/completions", "invalid_json"},
		{`{"model":""}`, "chat/completions", "missing_model"},
		{`{"model":"m","stream":true}`, "embeddings", "invalid_stream"},
	}
	for _, tt := range tests {
		rec := httptest.NewRecorder()
		_, ok := decodeRequest(rec, []byte(tt.body), tt.endpoint)
		if ok != (tt.code == "") {
			t.Errorf("%s: ok = %v", tt.body, ok)
			continue
		}
		if ok {
			continue
		}
		var e struct{ Error openai.Error }
		if err := json.Unmarshal(rec.Body.Bytes(), &e); err != nil || rec.Code != http.StatusBadRequest || e.Error.Code != tt.code {
			t.Errorf("%s: %d %s, want 400 %s", tt.body, rec.Code, rec.Body, tt.code)
		}
	}
}

// FuzzDecodeRequest: decodeRequest and estimateTokens never panic; a
// refused body gets a 400 OpenAI error; an accepted body reads the same
// model, max_tokens and n as an exact-key decode, has no case variant of a
// field the gateway reads, and its estimate is positive and at least its
// completion bound (no wrap-around).
func FuzzDecodeRequest(f *testing.F) {
	for _, s := range []string{
		`{"model":"m","max_tokens":500,"stream":true}`,
		`{"model":"m","max_tokens":500,"Max_tokens":1,"Stream_options":{"include_usage":true}}`,
		`{"model":"a","Model":"b"}`,
		`{"model":"m","max_tokens":4611686018427387904,"n":2}`,
		`{"model":"m","n":128,"max_completion_tokens":16777216}`,
		`{"model":"m","stream_options":{"include_usage":true,"x":[1]}}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		rec := httptest.NewRecorder()
		req, ok := decodeRequest(rec, data, "chat/completions")
		if !ok {
			var e struct{ Error openai.Error }
			if rec.Code != http.StatusBadRequest || json.Unmarshal(rec.Body.Bytes(), &e) != nil || e.Error.Message == "" {
				t.Fatalf("refusal %d %q", rec.Code, rec.Body)
			}
			return
		}
		var exact map[string]json.RawMessage
		if err := json.Unmarshal(data, &exact); err != nil {
			t.Fatalf("accepted %q, which encoding/json refuses: %v", data, err)
		}
		for k := range exact {
			for _, name := range openai.RequestFields.Names() {
				if k != name && strings.EqualFold(k, name) {
					t.Fatalf("accepted %q beside %q", k, name)
				}
			}
		}
		var model string
		if json.Unmarshal(exact["model"], &model) != nil || model != req.Model {
			t.Fatalf("model %q, exact %q", req.Model, model)
		}
		for name, got := range map[string]*int{"max_tokens": req.MaxTokens, "n": req.N} {
			var want *int
			if v, ok := exact[name]; ok {
				if err := json.Unmarshal(v, &want); err != nil {
					t.Fatalf("%s: exact decode of %s: %v", name, v, err)
				}
			}
			if (got == nil) != (want == nil) || (got != nil && *got != *want) {
				t.Fatalf("%s: read %v, exact %v", name, got, want)
			}
		}
		est := estimateTokens(data, req, 256, "chat/completions")
		if est <= 0 || (req.MaxTokens != nil && req.MaxCompletionTokens == nil && est < *req.MaxTokens) {
			t.Fatalf("estimate %d for %+v", est, req)
		}
		if _, _, err := req.IncludeUsage(data); err != nil {
			t.Fatalf("IncludeUsage: %v", err)
		}
	})
}

func TestCancelledTokens(t *testing.T) {
	body := make([]byte, 400)
	for _, tc := range []struct {
		body    []byte
		relayed int
		want    int
	}{
		{body, 0, 101},
		{body, 25, 126},
		{nil, 0, 1},
		{body, -3, 101},
	} {
		if got := cancelledTokens(len(tc.body), tc.relayed); got != tc.want {
			t.Errorf("cancelledTokens(%d bytes, %d) = %d, want %d", len(tc.body), tc.relayed, got, tc.want)
		}
	}
}

func TestBrokenUsage(t *testing.T) {
	body := make([]byte, 400) // estimate 101
	for _, tc := range []struct {
		name    string
		u       *openai.Usage
		relayed int
		want    int
	}{
		{"no usage", nil, 5, 106},
		{"engine's prompt count", &openai.Usage{PromptTokens: 40, CompletionTokens: 1}, 5, 45},
		{"more completion than events", &openai.Usage{PromptTokens: 40, CompletionTokens: 9}, 5, 49},
		{"full usage kept", &openai.Usage{PromptTokens: 40, CompletionTokens: 30, TotalTokens: 70}, 5, 70},
		{"negative relayed", nil, -2, 101},
	} {
		if got := brokenUsage(tc.u, len(body), tc.relayed).Total(); got != tc.want {
			t.Errorf("%s: %d, want %d", tc.name, got, tc.want)
		}
	}
}
