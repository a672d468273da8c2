package scrape

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/infergate/infergate/shared/getjson"
)

// Model is one entry of a pod's /v1/models.
type Model struct {
	ID     string `json:"id"`
	Root   string `json:"root,omitempty"`
	Parent string `json:"parent,omitempty"` // base model of a LoRA adapter
	// The rest of the engine's model card, which Tier 1's /v1/models
	// passes on.
	Created     CardInt `json:"created,omitempty"`
	OwnedBy     string  `json:"owned_by,omitempty"`
	MaxModelLen CardInt `json:"max_model_len,omitempty"`
}

// CardInt is a model card's integer field. A value that is not a
// non-negative number (null, a string) reads as 0 rather than failing the
// whole model list.
type CardInt int64

// UnmarshalJSON implements json.Unmarshaler.
func (n *CardInt) UnmarshalJSON(b []byte) error {
	var f float64
	if json.Unmarshal(b, &f) == nil && f >= 0 && f < 1<<53 {
		*n = CardInt(f)
	} else {
		*n = 0
	}
	return nil
}

func (s *Scraper) scrapeModels(ctx context.Context, tg *target) {
	models, err := s.fetchModels(ctx, tg.t)
	if ctx.Err() != nil {
		return
	}
	if err != nil {
		// Keep the last good list: adapters rarely change and /metrics
		// already tracks liveness.
		s.opts.Logger.Debug("read /v1/models failed", "pod", tg.t.Name, "err", err)
		return
	}
	next := *tg.state.Load()
	next.Models = models
	next.ModelsAt = time.Now()
	tg.state.Store(&next)
}

func (s *Scraper) fetchModels(ctx context.Context, t Target) ([]Model, error) {
	ctx, cancel := context.WithTimeout(ctx, s.opts.Timeout)
	defer cancel()
	var list struct {
		Data []Model `json:"data"`
	}
	u := s.opts.Scheme + "://" + t.Address + "/v1/models"
	if err := getjson.Get(ctx, s.opts.Client, getjson.Request{URL: u, Token: s.opts.ModelsToken, Limit: 4 << 20}, &list); err != nil {
		return nil, fmt.Errorf("GET /v1/models: %w", err)
	}
	if list.Data == nil {
		list.Data = []Model{}
	}
	return list.Data, nil
}
