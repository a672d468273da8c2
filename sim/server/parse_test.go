package server

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

func TestParseLoRAModule(t *testing.T) {
	tests := []struct {
		in      string
		want    LoRAModule
		wantErr bool
	}{
		{in: "sql=/adapters/sql", want: LoRAModule{Name: "sql", Path: "/adapters/sql"}},
		{in: "bare", want: LoRAModule{Name: "bare", Path: "bare"}},
		{in: " spaced = /p ", want: LoRAModule{Name: "spaced", Path: "/p"}},
		{in: "a=b=c", want: LoRAModule{Name: "a", Path: "b=c"}},
		{in: "", wantErr: true},
		{in: "=path", wantErr: true},
		{in: "name=", wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := ParseLoRAModule(tt.in)
			if (err != nil) != tt.wantErr || got != tt.want {
				t.Fatalf("ParseLoRAModule(%q) = %+v, %v", tt.in, got, err)
			}
		})
	}
}

func TestParseFlavor(t *testing.T) {
	for _, f := range Flavors() {
		if got, err := ParseFlavor(string(f)); err != nil || got != f {
			t.Errorf("ParseFlavor(%q) = %q, %v", f, got, err)
		}
	}
	for _, bad := range []string{"", "VLLM", "triton"} {
		if _, err := ParseFlavor(bad); err == nil {
			t.Errorf("ParseFlavor(%q) accepted", bad)
		}
	}
}

func TestNewRejectsBadConfig(t *testing.T) {
	tests := []struct {
		name string
		cfg  Config
	}{
		{"unknown model", Config{Model: "gpt-5"}},
		{"unknown gpu", Config{GPU: "tpu"}},
		{"unknown flavor", Config{Flavor: "triton"}},
		{"negative time scale", Config{TimeScale: -1}},
		{"adapter named like the model", Config{ServedModelName: "m", LoRAModules: []LoRAModule{{Name: "m"}}}},
		{"duplicate adapter", Config{LoRAModules: []LoRAModule{{Name: "a"}, {Name: "a"}}}},
		{"model does not fit", Config{Model: "llama-3.1-70b", GPU: "l4"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.cfg.Logger = quietLogger()
			if _, err := New(tt.cfg); err == nil {
				t.Fatal("New accepted a bad config")
			}
		})
	}
}

// TestRequestKeysExact: the simulator reads a body as vLLM does (Python
// json.loads, pydantic): exact keys, case variants ignored as unknown
// extras, the last of duplicate keys winning. encoding/json would read
// Max_tokens as max_tokens and Model as model.
func TestRequestKeysExact(t *testing.T) {
	p := startPod(t, Config{ServedModelName: "m"})
	c := &http.Client{Timeout: 30 * time.Second}
	post := func(body string) (int, []byte) {
		t.Helper()
		resp, err := c.Post(p.URL+"/v1/completions", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatalf("POST %s: %v", body, err)
		}
		defer resp.Body.Close()
		out, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, out
	}
	completion := func(body string) int {
		t.Helper()
		status, out := post(body)
		var res textCompletion
		if status != 200 || json.Unmarshal(out, &res) != nil || res.Usage == nil {
			t.Fatalf("%s: %d %s", body, status, out)
		}
		return res.Usage.CompletionTokens
	}
	for body, want := range map[string]int{
		`{"model":"m","prompt":"hi","max_tokens":5,"Max_tokens":50}`:  5,
		`{"model":"m","prompt":"hi","Max_tokens":50,"max_tokens":5}`:  5,
		`{"model":"m","prompt":"hi","max_tokens":50,"max_tokens":5}`:  5, // last wins
		`{"model":"m","prompt":"hi","max_tokens":5,"MAX_TOKENS":"x"}`: 5, // an ignored extra is not validated
	} {
		if got := completion(body); got != want {
			t.Errorf("%s: %d completion tokens, want %d", body, got, want)
		}
	}
	if status, out := post(`{"model":"other","Model":"m","prompt":"hi","max_tokens":1}`); status != http.StatusNotFound {
		t.Errorf("Model beside model: %d %s, want 404 for model \"other\"", status, out)
	}
	if status, out := post(`{"Model":"m","prompt":"hi"}`); status != http.StatusBadRequest || !strings.Contains(string(out), "missing_model") {
		t.Errorf("only Model: %d %s, want 400 missing_model", status, out)
	}
}

// TestContextLengthOverflow: prompt + max_tokens used to wrap negative,
// pass the context check and generate forever. vLLM answers 400.
func TestContextLengthOverflow(t *testing.T) {
	p := startPod(t, Config{ServedModelName: "m"})
	c := &http.Client{Timeout: 30 * time.Second}
	for _, mt := range []string{"9223372036854775807", "9223372036854775806", "4611686018427387904"} {
		body := `{"model":"m","prompt":"hello there","max_tokens":` + mt + `}`
		resp, err := c.Post(p.URL+"/v1/completions", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatalf("max_tokens %s: %v", mt, err)
		}
		out, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(out), "context_length_exceeded") {
			t.Errorf("max_tokens %s: %d %s, want 400 context_length_exceeded", mt, resp.StatusCode, out)
		}
	}
}

func TestParseRequest(t *testing.T) {
	tests := []struct {
		body string
		chat bool
		code string
		want func(*commonRequest) bool
	}{
		{`{"model":"m","prompt":"x","stream":true,"stream_options":{"include_usage":true,"Include_usage":false}}`, false, "",
			func(r *commonRequest) bool { return r.StreamOptions.IncludeUsage }},
		{`{"model":"m","prompt":"x","stream":true,"stream_options":{"Include_usage":true}}`, false, "",
			func(r *commonRequest) bool { return !r.StreamOptions.IncludeUsage }},
		{`{"model":"m","messages":[{"role":"user","content":"a"}],"Messages":null}`, true, "",
			func(r *commonRequest) bool { return string(r.Messages) == `[{"role":"user","content":"a"}]` }},
		{`{"model":"m","Prompt":"x"}`, false, "missing_prompt", nil},
		{`{"model":"m","prompt":"x","max_tokens":"5"}`, false, "invalid_value", nil},
		{`{"model":"m","prompt":"x","stream_options":[]}`, false, "invalid_value", nil},
		{"{\"model\":\"m\",\"pr\xffompt\":\"x\"}", false, "invalid_json", nil},
		{`{"model":"m","prompt":"x"} {}`, false, "invalid_json", nil},
	}
	for _, tt := range tests {
		r, aerr := parseRequest([]byte(tt.body), tt.chat)
		if tt.code != "" {
			if aerr == nil || aerr.code != tt.code {
				t.Errorf("%s: %+v, want %s", tt.body, aerr, tt.code)
			}
			continue
		}
		if aerr != nil || !tt.want(r) {
			t.Errorf("%s: %+v %v", tt.body, r, aerr)
		}
	}
	// Message roles and content parts are read with exact keys too.
	msgs, err := decodeMessages([]byte(`[{"Role":"system","role":"user","content":[{"type":"text","Text":"no","text":"yes"}]}]`))
	if err != nil || len(msgs) != 1 || msgs[0].Role != "user" {
		t.Fatalf("decodeMessages = %+v, %v", msgs, err)
	}
	if text, err := messageText(msgs[0].Content); err != nil || text != "yes" {
		t.Fatalf("messageText = %q, %v", text, err)
	}
}

// FuzzParseRequest: parseRequest never panics, and what it accepts reads
// the same model, max_tokens and stream as an exact-key decode with the
// last duplicate winning (encoding/json into a map: Python's semantics).
func FuzzParseRequest(f *testing.F) {
	for _, s := range []string{
		`{"model":"m","prompt":"hi","max_tokens":5,"Max_tokens":50}`,
		`{"model":"m","prompt":"hi","max_tokens":50,"max_tokens":5}`,
		`{"model":"other","Model":"m","prompt":"x"}`,
		`{"model":"m","prompt":"x","stream":true,"stream_options":{"include_usage":true}}`,
		`{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":9223372036854775807}`,
	} {
		f.Add([]byte(s), false)
	}
	f.Fuzz(func(t *testing.T, data []byte, chat bool) {
		r, aerr := parseRequest(data, chat)
		if aerr != nil {
			if aerr.status != http.StatusBadRequest || aerr.code == "" || aerr.msg == "" {
				t.Fatalf("bad error %+v", aerr)
			}
			return
		}
		var exact map[string]json.RawMessage
		if err := json.Unmarshal(data, &exact); err != nil {
			t.Fatalf("accepted %q, which encoding/json refuses: %v", data, err)
		}
		var model string
		var mt *int
		var stream bool
		_ = json.Unmarshal(exact["model"], &model)
		if v, ok := exact["max_tokens"]; ok {
			_ = json.Unmarshal(v, &mt)
		}
		if v, ok := exact["stream"]; ok {
			_ = json.Unmarshal(v, &stream)
		}
		if model != r.Model || stream != r.Stream || (mt == nil) != (r.MaxTokens == nil) || (mt != nil && *mt != *r.MaxTokens) {
			t.Fatalf("%q: read %q %v %v, exact %q %v %v", data, r.Model, r.MaxTokens, r.Stream, model, mt, stream)
		}
		if chat {
			_, _ = r.promptTokens(chat) // must not panic
		}
	})
}

func TestLoRARequestKeysExact(t *testing.T) {
	p := startPod(t, Config{ServedModelName: "m"})
	// lora_name is read exactly: "Lora_name" is an ignored extra.
	status, body := postJSON(t, p.URL+"/v1/load_lora_adapter", `{"lora_name":"sql","Lora_name":"m","lora_path":"/a/sql"}`)
	if status != http.StatusOK || !strings.Contains(string(body), "'sql'") {
		t.Fatalf("load: %d %s", status, body)
	}
	status, body = postJSON(t, p.URL+"/v1/unload_lora_adapter", `{"LORA_NAME":"sql"}`)
	if status != http.StatusBadRequest {
		t.Fatalf("unload with only LORA_NAME: %d %s, want 400", status, body)
	}
}
