package integration

import (
	"context"
	"encoding/base64"
	le "encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/infergate/infergate/devstack"
)

type embeddingList struct {
	Object, Model string
	Data          []struct {
		Object    string
		Index     int
		Embedding json.RawMessage
	}
	Usage struct {
		PromptTokens int `json:"prompt_tokens"`
		TotalTokens  int `json:"total_tokens"`
	}
}

func (l *embeddingList) vector(t *testing.T, i int) []float64 {
	t.Helper()
	var v []float64
	if json.Unmarshal(l.Data[i].Embedding, &v) == nil {
		return v
	}
	var s string
	if err := json.Unmarshal(l.Data[i].Embedding, &s); err != nil {
		t.Fatalf("embedding %d: %.100s", i, l.Data[i].Embedding)
	}
	b, err := base64.StdEncoding.DecodeString(s)
	if err != nil {
		t.Fatal(err)
	}
	for j := 0; j+4 <= len(b); j += 4 {
		v = append(v, float64(math.Float32frombits(le.LittleEndian.Uint32(b[j:]))))
	}
	return v
}

func unitNorm(v []float64) bool {
	var n float64
	for _, x := range v {
		n += x * x
	}
	return math.Abs(math.Sqrt(n)-1) < 1e-3
}

// TestEmbeddings sends embeddings through Tier 2, Tier 1 and the simulator
// (make run's stack): every input form, float and base64, the answer's
// usage charged to the tenant's TPM exactly, the same vectors straight
// from Tier 1, errors in the OpenAI shape; then through the official
// OpenAI Go SDK's Embeddings.New.
func TestEmbeddings(t *testing.T) {
	st := startDevStack(t)
	inputs := []string{
		`"The router picks a pod."`,
		`["The router picks a pod.","Prefill costs GPU time."]`,
		`[791, 9457, 22657, 264, 7661, 13]`,
		`[[791, 9457],[22657, 264, 7661, 13]]`,
	}
	var first []float64
	for i, in := range inputs {
		for _, format := range []string{"float", "base64"} {
			body := fmt.Sprintf(`{"model":%q,"input":%s,"encoding_format":%q}`, devstack.LlamaModel, in, format)
			before := tpmUsed(t, st)
			resp, b := post(t, st, "/v1/embeddings", body)
			var l embeddingList
			if resp.StatusCode != 200 || json.Unmarshal(b, &l) != nil || l.Object != "list" || l.Model != devstack.LlamaModel || len(l.Data) == 0 {
				t.Fatalf("%s: %s %.300s", body, resp.Status, b)
			}
			if resp.Header.Get("X-Request-Id") == "" {
				t.Error("no X-Request-Id")
			}
			for j, d := range l.Data {
				if v := l.vector(t, j); d.Index != j || d.Object != "embedding" || len(v) == 0 || !unitNorm(v) {
					t.Fatalf("%s: item %d: index %d object %q, %d dims", body, j, d.Index, d.Object, len(v))
				}
			}
			if l.Usage.PromptTokens <= 0 || l.Usage.TotalTokens != l.Usage.PromptTokens {
				t.Fatalf("%s: usage %+v", body, l.Usage)
			}
			if i == 0 && format == "float" {
				first = l.vector(t, 0)
			} else if i <= 1 && float32(l.vector(t, 0)[0]) != float32(first[0]) {
				t.Errorf("%s: the same text embeds differently (%v vs %v)", body, l.vector(t, 0)[0], first[0])
			}
			var delta int64
			waitFor(t, "the tenant's TPM to be charged", 5*time.Second, func() error {
				if delta = tpmUsed(t, st) - before; delta != int64(l.Usage.PromptTokens) {
					return fmt.Errorf("TPM charged %d, usage says %d", delta, l.Usage.PromptTokens)
				}
				return nil
			})
		}
	}

	// Straight at the Tier 1 that served it: the same vector, the same count.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	resp, b, err := httpDo(ctx, http.MethodPost, st.Clusters[0].URL+"/v1/embeddings", st.Tier1Token,
		fmt.Sprintf(`{"model":%q,"input":"The router picks a pod."}`, devstack.LlamaModel))
	var l embeddingList
	if err != nil || resp.StatusCode != 200 || json.Unmarshal(b, &l) != nil || l.vector(t, 0)[0] != first[0] {
		t.Fatalf("tier 1: %v %v %.200s", err, resp, b)
	}

	// Errors, OpenAI-shaped, from Tier 2 and from the engine through both tiers.
	for _, tc := range []struct {
		body, code string
		status     int
	}{
		{fmt.Sprintf(`{"model":%q,"input":"x","stream":true}`, devstack.LlamaModel), "invalid_stream", 400},
		{fmt.Sprintf(`{"model":%q,"input":"x","Input":"y"}`, devstack.LlamaModel), "duplicate_key", 400},
		{`{"model":"nope","input":"x"}`, "model_not_found", 404},
		{fmt.Sprintf(`{"model":%q,"input":""}`, devstack.LlamaModel), "invalid_value", 400},
	} {
		resp, b := post(t, st, "/v1/embeddings", tc.body)
		var e struct {
			Error struct{ Message, Type, Code string }
		}
		if json.Unmarshal(b, &e) != nil || resp.StatusCode != tc.status || e.Error.Code != tc.code || e.Error.Message == "" || e.Error.Type == "" {
			t.Errorf("%s: %s %s, want %d %s", tc.body, resp.Status, b, tc.status, tc.code)
		}
	}

	// The official SDK, unchanged.
	client := openai.NewClient(option.WithBaseURL(st.BaseURL), option.WithAPIKey(st.APIKey),
		option.WithMaxRetries(0), option.WithRequestTimeout(20*time.Second))
	before := tpmUsed(t, st)
	e, err := client.Embeddings.New(ctx, openai.EmbeddingNewParams{
		Model: devstack.LlamaModel,
		Input: openai.EmbeddingNewParamsInputUnion{OfArrayOfStrings: []string{"The router picks a pod.", "Prefill costs GPU time."}},
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(e.Data) != 2 || e.Data[0].Embedding[0] != first[0] || !unitNorm(e.Data[1].Embedding) || e.Usage.PromptTokens == 0 {
		t.Fatalf("SDK embeddings: %d items, usage %+v", len(e.Data), e.Usage)
	}
	waitFor(t, "the SDK request to be charged", 5*time.Second, func() error {
		if d := tpmUsed(t, st) - before; d != e.Usage.TotalTokens {
			return fmt.Errorf("TPM charged %d, usage says %d", d, e.Usage.TotalTokens)
		}
		return nil
	})
	small, err := client.Embeddings.New(ctx, openai.EmbeddingNewParams{
		Model:      devstack.LlamaModel,
		Input:      openai.EmbeddingNewParamsInputUnion{OfArrayOfTokens: []int64{791, 9457, 22657}},
		Dimensions: openai.Int(256),
	})
	if err != nil || len(small.Data) != 1 || len(small.Data[0].Embedding) != 256 || !unitNorm(small.Data[0].Embedding) || small.Usage.PromptTokens != 3 {
		t.Fatalf("SDK embeddings with dimensions: %v %+v", err, small)
	}
	_, err = client.Embeddings.New(ctx, openai.EmbeddingNewParams{Model: "nope", Input: openai.EmbeddingNewParamsInputUnion{OfString: openai.String("x")}})
	var apiErr *openai.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != 404 || apiErr.Code != "model_not_found" {
		t.Errorf("SDK error: %v", err)
	}
	t.Logf("%d dims; SDK usage %d tokens", len(first), e.Usage.TotalTokens)
}
