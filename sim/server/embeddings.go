package server

import (
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"time"

	"github.com/infergate/infergate/shared/openai"
	"github.com/infergate/infergate/sim/engine"
	"github.com/infergate/infergate/sim/tokenize"
)

// maxEmbeddingInputs caps the inputs of one embeddings request, as
// OpenAI's API does (2048).
const maxEmbeddingInputs = 2048

// embeddingRequest is a validated /v1/embeddings body.
type embeddingRequest struct {
	Model      string
	Inputs     [][]uint32 // tokenized, one per input
	Base64     bool       // encoding_format "base64"
	Dimensions int        // 0: the model's own
}

// parseEmbeddingRequest reads an embeddings body with exact keys (see
// members). input may be a string, an array of strings, an array of token
// IDs or an array of such arrays, as vLLM accepts it.
func parseEmbeddingRequest(data []byte) (*embeddingRequest, *apiError) {
	v, err := members(data, "model", "input", "encoding_format", "dimensions")
	if err != nil {
		return nil, badRequest("invalid_json", "could not parse the JSON body: %v", err)
	}
	var req embeddingRequest
	var format string
	var dims *int
	for _, f := range []struct {
		name string
		raw  []byte
		dst  any
	}{{"model", v[0], &req.Model}, {"encoding_format", v[2], &format}, {"dimensions", v[3], &dims}} {
		if aerr := decodeField(f.name, f.raw, f.dst); aerr != nil {
			return nil, aerr
		}
	}
	if req.Model == "" {
		return nil, badRequest("missing_model", "you must provide a model parameter")
	}
	switch format {
	case "", "float":
	case "base64":
		req.Base64 = true
	default:
		return nil, badRequest("invalid_value", "'encoding_format' must be \"float\" or \"base64\", got %q", format)
	}
	if dims != nil {
		if *dims < 1 {
			return nil, badRequest("invalid_value", "'dimensions' must be at least 1, got %d", *dims)
		}
		req.Dimensions = *dims
	}
	if isNullOrAbsent(v[1]) {
		return nil, badRequest("missing_input", "'input' is a required property")
	}
	if req.Inputs, err = embeddingInputs(v[1]); err != nil {
		return nil, badRequest("invalid_value", "'input' %v", err)
	}
	if len(req.Inputs) == 0 {
		return nil, badRequest("invalid_value", "'input' must not be empty")
	}
	if len(req.Inputs) > maxEmbeddingInputs {
		return nil, badRequest("invalid_value", "'input' holds %d inputs, at most %d are allowed", len(req.Inputs), maxEmbeddingInputs)
	}
	for i, in := range req.Inputs {
		if len(in) == 0 {
			return nil, badRequest("invalid_value", "input %d is empty", i)
		}
	}
	return &req, nil
}

// embeddingInputs tokenizes the accepted forms of input.
func embeddingInputs(raw json.RawMessage) ([][]uint32, error) {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return [][]uint32{tokenize.Tokens(s)}, nil
	}
	var ss []string
	if json.Unmarshal(raw, &ss) == nil {
		out := make([][]uint32, len(ss))
		for i, s := range ss {
			out[i] = tokenize.Tokens(s)
		}
		return out, nil
	}
	var ids []uint32
	if json.Unmarshal(raw, &ids) == nil {
		return [][]uint32{ids}, nil
	}
	var idss [][]uint32
	if json.Unmarshal(raw, &idss) == nil {
		return idss, nil
	}
	return nil, fmt.Errorf("must be a string, an array of strings, an array of token IDs or an array of token ID arrays")
}

type embeddingData struct {
	Index     int    `json:"index"`
	Object    string `json:"object"`
	Embedding any    `json:"embedding"` // []float32, or a base64 string
}

type embeddingUsage struct {
	PromptTokens     int `json:"prompt_tokens"`
	TotalTokens      int `json:"total_tokens"`
	CompletionTokens int `json:"completion_tokens"`
}

type embeddingList struct {
	ID      string          `json:"id"`
	Object  string          `json:"object"`
	Created int64           `json:"created"`
	Model   string          `json:"model"`
	Data    []embeddingData `json:"data"`
	Usage   embeddingUsage  `json:"usage"`
}

// handleEmbeddings serves /v1/embeddings as vLLM's pooling runner does:
// every input is a prefill-only engine request (engine.Request.Pooling),
// so an embedding costs its prefill on the simulated GPU and holds a
// running slot meanwhile; the answer comes when all are done. The vectors
// are deterministic (a function of the model and the input's tokens) and
// unit length, truncated to dimensions and renormalised when asked.
func (s *Server) handleEmbeddings(w http.ResponseWriter, r *http.Request) {
	data, aerr := readBody(w, r, s.cfg.MaxBodyBytes)
	if aerr == nil {
		var req *embeddingRequest
		if req, aerr = parseEmbeddingRequest(data); aerr == nil {
			s.embed(w, r, req)
			return
		}
	}
	writeAPIError(w, aerr)
}

func (s *Server) embed(w http.ResponseWriter, r *http.Request, req *embeddingRequest) {
	adapter, ok := s.resolveModel(req.Model)
	if !ok {
		openai.Errorf(w, http.StatusNotFound, "model_not_found", fmt.Sprintf("The model `%s` does not exist.", req.Model))
		return
	}
	full := s.eng.Config().Model.Hidden
	dims := full
	if req.Dimensions > 0 {
		if req.Dimensions > full {
			openai.Errorf(w, http.StatusBadRequest, "invalid_value", fmt.Sprintf("'dimensions' is %d, the model's embeddings have %d", req.Dimensions, full))
			return
		}
		dims = req.Dimensions
	}
	prompt := 0
	for _, toks := range req.Inputs {
		if len(toks) > s.maxLen {
			openai.Errorf(w, http.StatusBadRequest, "context_length_exceeded", fmt.Sprintf(
				"This model's maximum context length is %d tokens. However, you requested %d tokens in the input for embedding generation. Please reduce the length of the input.",
				s.maxLen, len(toks)))
			return
		}
		prompt += len(toks)
	}
	seedName := s.cfg.ServedModelName
	if adapter != "" {
		seedName = adapter
	}
	jobs := make([]*job, len(req.Inputs))
	ids := make([]uint64, len(req.Inputs))
	var err error
	s.rt.Do(func(e *engine.Engine, now time.Duration) {
		for i, toks := range req.Inputs {
			j := &job{engineID: s.nextID.Add(1), promptTokens: len(toks), arrival: now, prog: newProgress()}
			j.id = "embd-" + strconv.FormatUint(j.engineID, 16)
			err = e.Submit(now, &engine.Request{ID: j.engineID, Adapter: adapter, PromptTokens: len(toks),
				BlockHashes: tokenize.BlockHashes(seedName, toks, engine.BlockSize), TokenIDs: toks, Pooling: true, OnDone: j.prog.onDone})
			if err != nil {
				for _, id := range ids[:i] {
					e.Cancel(now, id)
				}
				return
			}
			jobs[i], ids[i] = j, j.engineID
		}
	})
	if err != nil {
		writeSubmitError(w, err)
		return
	}
	for range jobs {
		s.metrics.observeArrival()
	}
	s.log.Debug("embeddings accepted", "id", jobs[0].id, "model", req.Model, "inputs", len(jobs), "prompt_tokens", prompt)
	out := embeddingList{ID: jobs[0].id, Object: "list", Created: time.Now().Unix(), Model: req.Model,
		Data: make([]embeddingData, len(jobs)), Usage: embeddingUsage{PromptTokens: prompt, TotalTokens: prompt}}
	for i, j := range jobs {
		res, ok := s.awaitPooled(r, j)
		if !ok {
			for _, rest := range jobs[i:] {
				s.rt.Cancel(rest.engineID)
			}
			s.log.Debug("embeddings cancelled", "id", jobs[0].id)
			if r.Context().Err() == nil {
				openai.Errorf(w, http.StatusServiceUnavailable, "shutting_down", "the pod is shutting down")
			}
			return
		}
		if res.Err != nil {
			for _, rest := range jobs[i+1:] {
				s.rt.Cancel(rest.engineID)
			}
			openai.Errorf(w, http.StatusInternalServerError, "embedding_failed", res.Err.Error())
			return
		}
		vec := embedding(seedName, req.Inputs[i], full, dims)
		out.Data[i] = embeddingData{Index: i, Object: "embedding", Embedding: vec}
		if req.Base64 {
			out.Data[i].Embedding = float32Base64(vec)
		}
	}
	writeJSON(w, http.StatusOK, out)
}

// awaitPooled waits for one pooling job; false when the client left or
// the pod is closing.
func (s *Server) awaitPooled(r *http.Request, j *job) (engine.Result, bool) {
	for {
		select {
		case <-j.prog.wake:
		case <-r.Context().Done():
			return engine.Result{}, false
		case <-s.closing:
			return engine.Result{}, false
		}
		if _, done, doneAt, res := j.prog.snapshot(); done {
			s.metrics.observeDone(res, res.FirstTokenAt-j.arrival, doneAt-j.arrival)
			return res, true
		}
	}
}

// embedding is the deterministic unit vector of an input: the model's
// full-size vector, from a generator seeded by the model and the tokens,
// cut to dims and renormalised (as a Matryoshka model is truncated).
func embedding(model string, toks []uint32, full, dims int) []float32 {
	seed := fillerSeed(toks)
	for _, c := range []byte(model) {
		seed = (seed ^ uint64(c)) * 1099511628211
	}
	v := make([]float64, full)
	for i := range v {
		seed += 0x9E3779B97F4A7C15
		z := seed
		z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9
		z = (z ^ (z >> 27)) * 0x94D049BB133111EB
		z ^= z >> 31
		v[i] = float64(z>>11)/(1<<53)*2 - 1
	}
	v = v[:dims]
	var norm float64
	for _, x := range v {
		norm += x * x
	}
	norm = math.Sqrt(norm)
	out := make([]float32, dims)
	for i, x := range v {
		if norm > 0 {
			out[i] = float32(x / norm)
		}
	}
	return out
}

// float32Base64 is encoding_format "base64": the little-endian float32
// bytes, base64-encoded, as OpenAI and vLLM send them.
func float32Base64(v []float32) string {
	b := make([]byte, 4*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(x))
	}
	return base64.StdEncoding.EncodeToString(b)
}
