package server

import (
	"context"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"strings"
	"testing"
	"time"
)

type embeddingAnswer struct {
	Object string
	Model  string
	Data   []struct {
		Index     int
		Object    string
		Embedding json.RawMessage
	}
	Usage struct {
		PromptTokens int `json:"prompt_tokens"`
		TotalTokens  int `json:"total_tokens"`
	}
}

// floats decodes an embedding in either encoding.
func (a *embeddingAnswer) floats(t *testing.T, i int) []float32 {
	t.Helper()
	raw := a.Data[i].Embedding
	var v []float32
	if json.Unmarshal(raw, &v) == nil {
		return v
	}
	var s string
	if err := json.Unmarshal(raw, &s); err != nil {
		t.Fatalf("embedding %d: %s", i, raw)
	}
	b, err := base64.StdEncoding.DecodeString(s)
	if err != nil || len(b)%4 != 0 {
		t.Fatalf("embedding %d: bad base64 %q: %v", i, s, err)
	}
	for j := 0; j < len(b); j += 4 {
		v = append(v, math.Float32frombits(binary.LittleEndian.Uint32(b[j:])))
	}
	return v
}

func norm(v []float32) float64 {
	var n float64
	for _, x := range v {
		n += float64(x) * float64(x)
	}
	return math.Sqrt(n)
}

// TestEmbeddings: every input form vLLM accepts, usage counting the same
// tokens as the completions API, deterministic unit vectors, base64 equal
// to the floats, dimensions truncating, and errors in the OpenAI shape.
func TestEmbeddings(t *testing.T) {
	p := startPod(t, Config{ServedModelName: "m", TimeScale: 0.05})
	url := p.URL + "/v1/embeddings"
	full := p.eng.Config().Model.Hidden
	post := func(body string) *embeddingAnswer {
		t.Helper()
		code, b := postJSON(t, url, body)
		var a embeddingAnswer
		if code != 200 || json.Unmarshal(b, &a) != nil || a.Object != "list" || a.Model != "m" {
			t.Fatalf("%s: %d %.300s", body, code, b)
		}
		for i, d := range a.Data {
			if d.Index != i || d.Object != "embedding" {
				t.Fatalf("%s: data[%d] = %+v", body, i, d)
			}
		}
		return &a
	}
	// Token counts as the completions API counts them.
	_, b := postJSON(t, p.URL+"/v1/completions", `{"model":"m","prompt":"the quick brown fox","max_tokens":1}`)
	var c struct {
		Usage struct {
			PromptTokens int `json:"prompt_tokens"`
		}
	}
	if err := json.Unmarshal(b, &c); err != nil || c.Usage.PromptTokens == 0 {
		t.Fatalf("completions: %s", b)
	}
	one := post(`{"model":"m","input":"the quick brown fox"}`)
	if len(one.Data) != 1 || one.Usage.PromptTokens != c.Usage.PromptTokens || one.Usage.TotalTokens != one.Usage.PromptTokens {
		t.Fatalf("one input: %d items, usage %+v, completions counted %d", len(one.Data), one.Usage, c.Usage.PromptTokens)
	}
	v := one.floats(t, 0)
	if len(v) != full || math.Abs(norm(v)-1) > 1e-3 {
		t.Fatalf("vector of %d dims, norm %v; want %d, 1", len(v), norm(v), full)
	}
	// Deterministic, and different inputs differ.
	if again := post(`{"model":"m","input":["the quick brown fox","something else"]}`); again.floats(t, 0)[0] != v[0] ||
		again.floats(t, 1)[0] == v[0] || again.Usage.PromptTokens <= one.Usage.PromptTokens {
		t.Errorf("two inputs: %v %v vs %v, usage %+v", again.floats(t, 0)[0], again.floats(t, 1)[0], v[0], again.Usage)
	}
	// Token IDs, one array or several.
	ids := post(`{"model":"m","input":[1,2,3,4,5]}`)
	if len(ids.Data) != 1 || ids.Usage.PromptTokens != 5 {
		t.Errorf("token ids: %d items, usage %+v", len(ids.Data), ids.Usage)
	}
	idss := post(`{"model":"m","input":[[1,2,3],[4,5,6,7]]}`)
	if len(idss.Data) != 2 || idss.Usage.PromptTokens != 7 {
		t.Errorf("token id arrays: %d items, usage %+v", len(idss.Data), idss.Usage)
	}
	// base64 carries the same float32 values.
	b64 := post(`{"model":"m","input":"the quick brown fox","encoding_format":"base64"}`)
	if w := b64.floats(t, 0); len(w) != full || w[0] != v[0] || w[full-1] != v[full-1] {
		t.Errorf("base64 differs from float: %d dims, %v vs %v", len(w), w[0], v[0])
	}
	// dimensions: truncated and renormalised.
	d := post(`{"model":"m","input":"the quick brown fox","dimensions":64}`).floats(t, 0)
	if len(d) != 64 || math.Abs(norm(d)-1) > 1e-3 || (d[0] > 0) != (v[0] > 0) {
		t.Errorf("dimensions 64: %d dims, norm %v", len(d), norm(d))
	}
	// Exact keys: "Input" is not input.
	for _, tc := range []struct {
		body, code string
		status     int
	}{
		{`{"model":"m","Input":"x"}`, "missing_input", 400},
		{`{"model":"m","input":""}`, "invalid_value", 400},
		{`{"model":"m","input":[]}`, "invalid_value", 400},
		{`{"model":"m","input":[1,"a"]}`, "invalid_value", 400},
		{`{"model":"m","input":"x","encoding_format":"hex"}`, "invalid_value", 400},
		{`{"model":"m","input":"x","dimensions":0}`, "invalid_value", 400},
		{fmt.Sprintf(`{"model":"m","input":"x","dimensions":%d}`, full+1), "invalid_value", 400},
		{`{"model":"nope","input":"x"}`, "model_not_found", 404},
		{fmt.Sprintf(`{"model":"m","input":%q}`, longText("x", p.MaxModelLen()+10)), "context_length_exceeded", 400},
	} {
		code, b := postJSON(t, url, tc.body)
		var e errorBody
		if code != tc.status || json.Unmarshal(b, &e) != nil || e.Error.Code != tc.code || e.Error.Message == "" {
			t.Errorf("%.80s: %d %s, want %d %s", tc.body, code, b, tc.status, tc.code)
		}
	}
	fams := scrape(t, p)
	if gen := value(fams, "vllm:generation_tokens_total"); gen != 1 {
		t.Errorf("generation tokens %v: embeddings must generate none (the one completion token only)", gen)
	}
}

// TestEmbeddingsCost: an embedding holds a running slot for its prefill,
// then frees it; a client that leaves cancels it.
func TestEmbeddingsCost(t *testing.T) {
	// Slow time: a long prompt's prefill is then seconds of wall time.
	p := startPod(t, Config{ServedModelName: "m", GPU: "a10g", TimeScale: 20})
	ctx, cancel := context.WithCancel(context.Background())
	body := fmt.Sprintf(`{"model":"m","input":%q}`, longText("cost", 4000))
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, p.URL+"/v1/embeddings", strings.NewReader(body))
	errc := make(chan error, 1)
	go func() {
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
			err = fmt.Errorf("answered %s before the cancel", resp.Status)
		}
		errc <- err
	}()
	eventually(t, "the embedding to run", func() bool { return p.Stats().Running == 1 })
	cancel()
	eventually(t, "the cancelled embedding to leave the engine", func() bool { st := p.Stats(); return st.Running == 0 && st.Waiting == 0 })
	if err := <-errc; err == nil || !strings.Contains(err.Error(), "context canceled") {
		t.Errorf("client: %v", err)
	}
	if st := p.Stats(); st.FinishedRequests != 0 || st.GenerationTokens != 0 {
		t.Errorf("stats after cancel %+v", st)
	}
	// Uncancelled, it finishes and its slot is freed.
	fast := startPod(t, Config{ServedModelName: "m", TimeScale: 0.05})
	start := time.Now()
	if code, b := postJSON(t, fast.URL+"/v1/embeddings", body); code != 200 {
		t.Fatalf("%d %.200s", code, b)
	}
	if st := fast.Stats(); st.FinishedRequests != 1 || st.Running != 0 || st.PromptTokens == 0 || st.GenerationTokens != 0 {
		t.Errorf("stats %+v after %v", st, time.Since(start))
	}
}
