package gateway

import (
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/infergate/infergate/tier1/picker"
)

// refusal is a request refused on its way through the lifecycle; the HTTP
// front end writes it as an OpenAI error, ext_proc as an
// ImmediateResponse.
type refusal struct {
	model, pool  string
	status       int
	code, reason string
	retryAfter   time.Duration // set when shed (429)
}

// parse reads the request body and builds the scheduling request for it
// (c.req, c.pool): model and adapter resolution, per-model policy, and the
// internal headers, trusted only as documented (priority from
// authenticated clients when configured, the TTFT objective from any
// client that passed auth).
func (c *call) parse() (*inferenceBody, *refusal) {
	cfg := c.st.cfg
	body, err := parseBody(c.ep, c.data)
	if err != nil {
		return nil, &refusal{status: http.StatusBadRequest, code: requestErrorCode(err), reason: err.Error()}
	}
	rt, ok := c.resolve(body.Model)
	if !ok {
		return nil, &refusal{status: http.StatusNotFound, code: "model_not_found",
			reason: fmt.Sprintf("model %q is not served here", body.Model)}
	}
	pool, model := rt.pool, body.Model
	req := &picker.Request{
		ID:        c.id,
		Model:     model,
		BaseModel: pool.cfg.Model,
		Adapter:   rt.adapter,
		MaxTokens: body.maxTokens(c.ep),
		Pool:      pool.cfg.Name,
	}
	pol := c.st.policies[model]
	if pol.Name == "" && rt.adapter != "" {
		pol = c.st.policies[pool.cfg.Model] // adapters inherit their base's policy
	}
	req.Priority, req.Sheddable, req.TTFTSLO = pol.Priority, pol.Sheddable || pol.Priority < 0, pol.TTFTSLO
	if c.prioHdr != "" && c.trusted && cfg.Auth.TrustPriorityHeader {
		p, err := strconv.Atoi(c.prioHdr)
		if err != nil {
			return nil, &refusal{model: model, pool: pool.cfg.Name, status: http.StatusBadRequest,
				code: "invalid_priority", reason: HeaderPriority + " must be an integer"}
		}
		req.Priority, req.Sheddable = p, p < 0
	}
	if c.sloHdr != "" {
		ms, err := strconv.Atoi(c.sloHdr)
		if err != nil || ms <= 0 || ms > 3_600_000 {
			return nil, &refusal{model: model, pool: pool.cfg.Name, status: http.StatusBadRequest,
				code: "invalid_ttft_slo", reason: HeaderTTFTSLO + " must be milliseconds in (0, 3600000]"}
		}
		req.TTFTSLO = time.Duration(ms) * time.Millisecond
	}
	c.req, c.pool = req, pool
	return body, nil
}
