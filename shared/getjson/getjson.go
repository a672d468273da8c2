// Package getjson reads a JSON document with an HTTP GET: the way the
// tiers poll what they route to (Tier 1 a pod's /v1/models, Tier 2 a
// cluster's load summary) and an identity provider's discovery document.
package getjson

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
)

// drainLimit is how much of a refused response's body is read so that
// its connection can be reused; a longer one closes the connection.
const drainLimit = 64 << 10

// StatusError is a response other than 200 OK.
type StatusError struct{ Code int }

func (e *StatusError) Error() string { return fmt.Sprintf("HTTP %d", e.Code) }

// Request is one GET.
type Request struct {
	URL string
	// Token is sent as "Authorization: Bearer <Token>" when set.
	Token string
	// Limit is the most of the body decoded; a longer document fails to
	// decode (unexpected EOF). Default 1 MiB.
	Limit int64
}

// Get sends r with c within ctx and decodes the 200 response's JSON body
// into v. Any other status is a *StatusError.
func Get(ctx context.Context, c *http.Client, r Request, v any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, r.URL, nil)
	if err != nil {
		return err
	}
	req.Header.Set("Accept", "application/json")
	if r.Token != "" {
		req.Header.Set("Authorization", "Bearer "+r.Token)
	}
	resp, err := c.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, drainLimit)) // only for connection reuse: its error cannot matter
		return &StatusError{Code: resp.StatusCode}
	}
	limit := r.Limit
	if limit <= 0 {
		limit = 1 << 20
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, limit)).Decode(v); err != nil {
		return fmt.Errorf("decode: %w", err)
	}
	return nil
}
