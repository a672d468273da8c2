package openai

import (
	"math"
	"testing"
)

func TestOutputTokens(t *testing.T) {
	for _, tc := range []struct {
		name string
		body string
		api  API
		def  int
		want int
	}{
		{"none", `{}`, APIOpenAI, 0, 0},
		{"default", `{}`, APIOpenAI, 256, 256},
		{"max_tokens × n", `{"max_tokens":1000,"n":2}`, APIOpenAI, 256, 2000},
		{"max_completion_tokens supersedes max_tokens", `{"max_tokens":1000,"max_completion_tokens":50}`, APIOpenAI, 0, 50},
		{"even when smaller", `{"max_tokens":10,"max_completion_tokens":50}`, APIOpenAI, 0, 50},
		{"max_completion_tokens 0 falls back", `{"max_tokens":70,"max_completion_tokens":0}`, APIOpenAI, 0, 70},
		{"zero means the default", `{"max_tokens":0}`, APIOpenAI, 256, 256},
		{"chat ignores max_output_tokens", `{"max_tokens":7,"max_output_tokens":900}`, APIOpenAI, 0, 7},
		{"responses: max_output_tokens", `{"max_tokens":7,"max_output_tokens":900}`, APIResponses, 0, 900},
		{"responses ignores max_tokens", `{"max_tokens":7}`, APIResponses, 16, 16},
		{"anthropic: max_tokens", `{"max_tokens":7,"max_completion_tokens":900}`, APIAnthropic, 0, 7},
		{"bounds saturate nowhere near", `{"max_tokens":16777216,"n":128}`, APIOpenAI, 0, 1 << 31},
	} {
		r, err := ParseRequest([]byte(tc.body))
		if err != nil {
			t.Fatal(err)
		}
		if got := r.OutputTokens(tc.api, tc.def); got != tc.want {
			t.Errorf("%s: %d, want %d", tc.name, got, tc.want)
		}
	}
	// Values ParseRequest refuses, to show the arithmetic saturates.
	big, n := 1<<62, 2
	if got := (&Request{MaxTokens: &big, N: &n}).OutputTokens(APIOpenAI, 0); got != math.MaxInt {
		t.Errorf("2^62 × 2 = %d", got)
	}
	if satMul(math.MaxInt/2, 3) != math.MaxInt || satMul(-1, 5) != 0 || satMul(3, 0) != 0 {
		t.Error("satMul does not saturate")
	}
}

func TestBodyUsage(t *testing.T) {
	for body, want := range map[string]int{
		`{"usage":{"prompt_tokens":5,"completion_tokens":7,"total_tokens":12}}`: 12,
		`{"usage":{"input_tokens":40,"output_tokens":2}}`:                       42,
		`{"usage":null}`: -1,
		`{"id":"x"}`:     -1,
		`not json`:       -1,
	} {
		u := BodyUsage([]byte(body))
		if (u == nil) != (want < 0) || (u != nil && u.Total() != want) {
			t.Errorf("%s: %+v, want %d", body, u, want)
		}
	}
}

func TestEventUsage(t *testing.T) {
	prev := &Usage{PromptTokens: 30}
	for _, tc := range []struct {
		data      string
		prev      *Usage
		want      *Usage
		usageOnly bool
	}{
		{`{"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":3,"total_tokens":8}}`, nil, &Usage{5, 3, 8}, true},
		{`{"choices":[{"delta":{}}],"usage":{"prompt_tokens":1,"completion_tokens":1}}`, nil, &Usage{1, 1, 0}, false},
		{`{"choices":[{"delta":{"content":"hi"}}],"usage":null}`, nil, nil, false},
		{`{"type":"response.completed","response":{"usage":{"input_tokens":40,"output_tokens":7,"total_tokens":47}}}`, nil, &Usage{40, 7, 47}, false},
		{`{"type":"response.created","response":{"usage":null}}`, nil, nil, false},
		{`{"type":"message_start","message":{"usage":{"input_tokens":30,"output_tokens":1}}}`, nil, &Usage{30, 0, 0}, false},
		{`{"type":"message_delta","delta":{},"usage":{"output_tokens":9}}`, prev, &Usage{30, 9, 0}, false},
		{`[DONE]`, nil, nil, false},
	} {
		got, only := EventUsage([]byte(tc.data), tc.prev)
		if (got == nil) != (tc.want == nil) || (got != nil && *got != *tc.want) || only != tc.usageOnly {
			t.Errorf("%s: %+v %v, want %+v %v", tc.data, got, only, tc.want, tc.usageOnly)
		}
	}
}
