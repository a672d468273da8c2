package gateway

import (
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/infergate/infergate/tier1/picker"
)

// refusal is a request refused while it is being turned into a scheduling
// request; the HTTP listener writes it as an OpenAI error, ext_proc as an
// ImmediateResponse.
type refusal struct {
	model, pool  string
	status       int
	code, reason string
	retryAfter   time.Duration // set when shed (429)
}

// schedRequest parses data and builds the scheduling request for it: model
// and adapter resolution, per-model policy, and the internal headers, trusted
// only as documented (priority from authenticated clients when configured,
// the TTFT objective from any client that passed auth). Both the proxy and
// Pick go through here so they cannot drift apart.
func (g *Gateway) schedRequest(st *state, ep endpoint, data []byte, id, prioHdr, sloHdr string, trusted bool) (*picker.Request, *inferenceBody, route, *refusal) {
	cfg := st.cfg
	body, err := parseBody(ep, data)
	if err != nil {
		return nil, nil, route{}, &refusal{status: http.StatusBadRequest, code: requestErrorCode(err), reason: err.Error()}
	}
	rt, ok := g.resolve(st, body.Model)
	if !ok {
		return nil, nil, route{}, &refusal{status: http.StatusNotFound, code: "model_not_found",
			reason: fmt.Sprintf("model %q is not served here", body.Model)}
	}
	pool, model := rt.pool, body.Model
	req := &picker.Request{
		ID:        id,
		Model:     model,
		BaseModel: pool.cfg.Model,
		Adapter:   rt.adapter,
		MaxTokens: body.maxTokens(),
		Pool:      pool.cfg.Name,
	}
	if req.ID == "" {
		req.ID = strconv.FormatUint(g.nextID.Add(1), 36)
	}
	pol := st.policies[model]
	if pol.Name == "" && rt.adapter != "" {
		pol = st.policies[pool.cfg.Model] // adapters inherit their base's policy
	}
	req.Priority, req.Sheddable, req.TTFTSLO = pol.Priority, pol.Sheddable || pol.Priority < 0, pol.TTFTSLO
	if prioHdr != "" && trusted && cfg.Auth.TrustPriorityHeader {
		p, err := strconv.Atoi(prioHdr)
		if err != nil {
			return nil, nil, route{}, &refusal{model: model, pool: pool.cfg.Name, status: http.StatusBadRequest,
				code: "invalid_priority", reason: HeaderPriority + " must be an integer"}
		}
		req.Priority, req.Sheddable = p, p < 0
	}
	if sloHdr != "" {
		ms, err := strconv.Atoi(sloHdr)
		if err != nil || ms <= 0 || ms > 3_600_000 {
			return nil, nil, route{}, &refusal{model: model, pool: pool.cfg.Name, status: http.StatusBadRequest,
				code: "invalid_ttft_slo", reason: HeaderTTFTSLO + " must be milliseconds in (0, 3600000]"}
		}
		req.TTFTSLO = time.Duration(ms) * time.Millisecond
	}
	return req, body, rt, nil
}
