package openai

import (
	"encoding/json"
	"strings"
	"testing"
)

func TestAPIForPath(t *testing.T) {
	for path, want := range map[string]API{
		"/v1/chat/completions": APIOpenAI, "/v1/completions": APIOpenAI, "/v1/embeddings": APIOpenAI,
		"/v1/responses": APIResponses, "/v1/messages": APIAnthropic, "/v1/messages/count_tokens": APIAnthropic,
	} {
		if got := APIForPath(path); got != want {
			t.Errorf("%s: %v, want %v", path, got, want)
		}
	}
}

// splitEvents returns each event's name and data.
func splitEvents(t *testing.T, s string) (names []string, datas []map[string]any) {
	t.Helper()
	if !strings.HasSuffix(s, "\n\n") {
		t.Fatalf("not terminated: %q", s)
	}
	for _, ev := range strings.Split(strings.TrimSuffix(s, "\n\n"), "\n\n") {
		name := ""
		var data map[string]any
		for _, line := range strings.Split(ev, "\n") {
			if v, ok := strings.CutPrefix(line, "event: "); ok {
				name = v
			} else if v, ok := strings.CutPrefix(line, "data: "); ok {
				if err := json.Unmarshal([]byte(v), &data); err != nil {
					t.Fatalf("data %q: %v", v, err)
				}
			} else {
				t.Fatalf("stray line %q", line)
			}
		}
		names, datas = append(names, name), append(datas, data)
	}
	return names, datas
}

func TestStreamEnderShapes(t *testing.T) {
	// OpenAI: one unnamed event with the error envelope.
	var s StreamEnder
	s.Observe([]byte("data: {\"choices\":[]}\n\n"))
	names, d := splitEvents(t, string(s.ErrorEvent(502, "upstream_interrupted", "cut")))
	e, _ := d[0]["error"].(map[string]any)
	if len(names) != 1 || names[0] != "" || e["type"] != TypeServer || e["code"] != "upstream_interrupted" || e["message"] != "cut" {
		t.Errorf("openai: %v %v", names, d)
	}

	// Anthropic: event: error, the type following the status.
	for status, typ := range map[int]string{502: "api_error", 503: "overloaded_error", 504: "timeout_error", 429: "rate_limit_error"} {
		s := StreamEnder{API: APIAnthropic}
		names, d := splitEvents(t, string(s.ErrorEvent(status, "x", "cut")))
		e, _ := d[0]["error"].(map[string]any)
		if len(names) != 1 || names[0] != "error" || d[0]["type"] != "error" || e["type"] != typ || e["message"] != "cut" || len(e) != 2 {
			t.Errorf("anthropic %d: %v %v", status, names, d)
		}
	}
}

// TestStreamEnderResponses: the error continues the stream's numbering
// and response.failed names the stream's response.
func TestStreamEnderResponses(t *testing.T) {
	stream := "event: response.created\ndata: {\"type\":\"response.created\",\"sequence_number\":0,\"response\":{\"id\":\"resp_1\",\"object\":\"response\",\"status\":\"in_progress\",\"output\":[],\"usage\":null}}\n\n" +
		"event: response.in_progress\r\ndata: {\"type\":\"response.in_progress\",\"sequence_number\":1,\"response\":{\"id\":\"resp_1\",\"object\":\"response\",\"status\":\"in_progress\",\"output\":[]}}\r\n\r\n"
	for i := 2; i < 12; i++ {
		stream += "event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"delta\":\" x\",\"sequence_number\": " + itoa(i) + "}\n\n"
	}
	for _, blank := range []bool{true, false} { // with or without the blank line
		s := StreamEnder{API: APIResponses}
		for _, ev := range strings.SplitAfter(strings.ReplaceAll(stream, "\r\n", "\n"), "\n\n") {
			if !blank {
				ev = strings.TrimSuffix(ev, "\n\n")
			}
			s.Observe([]byte(ev))
		}
		size := blank
		names, d := splitEvents(t, string(s.ErrorEvent(502, "upstream_interrupted", "cut")))
		if len(names) != 2 || names[0] != "error" || names[1] != "response.failed" {
			t.Fatalf("blank line %v: events %v", size, names)
		}
		if d[0]["type"] != "error" || d[0]["code"] != "upstream_interrupted" || d[0]["message"] != "cut" || d[0]["sequence_number"] != 12.0 {
			t.Errorf("blank line %v: error event %v", size, d[0])
		}
		if p, ok := d[0]["param"]; !ok || p != nil {
			t.Errorf("param %v, want null", p)
		}
		r, _ := d[1]["response"].(map[string]any)
		re, _ := r["error"].(map[string]any)
		if d[1]["type"] != "response.failed" || d[1]["sequence_number"] != 13.0 || r["id"] != "resp_1" || r["status"] != "failed" ||
			re["code"] != "server_error" || re["message"] != "cut" {
			t.Errorf("blank line %v: response.failed %v", size, d[1])
		}
	}
	// Before response.created: the error event alone, numbered from 0.
	s := StreamEnder{API: APIResponses}
	names, d := splitEvents(t, string(s.ErrorEvent(504, "stream_too_long", "long")))
	if len(names) != 1 || d[0]["sequence_number"] != 0.0 {
		t.Errorf("fresh stream: %v %v", names, d)
	}
}

func itoa(i int) string { b, _ := json.Marshal(i); return string(b) }
