// Package admin is Tier 2's admin API: tenants, API keys, limits, cluster
// overrides, usage and breaker states, the clusters' state and the
// replica's status (the JSON behind the status page), on its own listener
// behind its own bearer token. Errors use OpenAI's JSON error shape; validation errors
// name the offending field in "param".
package admin

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/infergate/infergate/shared/openai"
	"github.com/infergate/infergate/tier2/discovery"
	"github.com/infergate/infergate/tier2/ratelimit"
	"github.com/infergate/infergate/tier2/tenant"
)

// Store is what the admin API needs from the tenant store; *tenant.Store
// implements it.
type Store interface {
	Tenant(id string) (*tenant.Tenant, bool)
	Tenants() []*tenant.Tenant
	CreateTenant(ctx context.Context, t tenant.Tenant) error
	UpdateTenant(ctx context.Context, t tenant.Tenant) error
	DeleteTenant(ctx context.Context, id string) error
	CreateKey(ctx context.Context, tenantID, name string) (string, tenant.KeyInfo, error)
	Keys(tenantID string) []tenant.KeyInfo
	DeleteKey(ctx context.Context, tenantID, keyID string) error
	Overrides() map[string]tenant.ClusterOverride
	SetOverride(ctx context.Context, cluster string, o tenant.ClusterOverride) error
	DeleteOverride(ctx context.Context, cluster string) error
}

// UsageReader reports a tenant's current use; *ratelimit.Limiter implements it.
type UsageReader interface {
	Usage(ctx context.Context, t *tenant.Tenant) (ratelimit.Usage, error)
}

// BreakerState is one circuit breaker as the gateway reports it.
type BreakerState struct {
	Cluster             string    `json:"cluster"`
	Model               string    `json:"model,omitempty"`
	State               string    `json:"state"` // closed, half-open, open
	ConsecutiveFailures uint32    `json:"consecutive_failures"`
	Since               time.Time `json:"since,omitzero"`
}

// BreakerReporter is implemented by the gateway to expose its breakers.
type BreakerReporter interface {
	Breakers() []BreakerState
}

// ClusterRegistry says which clusters discovery knows, so overrides are not
// set for a mistyped name; Tier 2's server adapts its discovery to it.
type ClusterRegistry interface {
	KnownCluster(name string) bool
}

// ClusterLister lists the discovered clusters; *discovery.Discovery
// implements it.
type ClusterLister interface {
	Clusters() []discovery.Cluster
}

// DiscoveryClusters adapts discovery's cluster list to a ClusterRegistry:
// a cluster is known while some discovered instance carries its name.
func DiscoveryClusters(l ClusterLister) ClusterRegistry { return discoveryClusters{l} }

type discoveryClusters struct{ l ClusterLister }

func (d discoveryClusters) KnownCluster(name string) bool {
	for _, c := range d.l.Clusters() {
		if c.Name == name {
			return true
		}
	}
	return false
}

// MaxBodyBytes bounds an admin request body; a larger one gets 413.
const MaxBodyBytes = 1 << 20

// Options configure the admin server.
type Options struct {
	Store Store
	// Limiter answers usage queries; optional.
	Limiter UsageReader
	// Token is the admin bearer token. Required: with an empty token every
	// request is refused.
	Token string
	// Breakers is optional.
	Breakers BreakerReporter
	// Clusters, when set, makes PUT /clusters/:name/override answer 404 for
	// a cluster discovery does not know (unless ?force=true).
	Clusters ClusterRegistry
	// Router, when set, fills GET /clusters with every cluster and its
	// state; without it that lists the overrides alone. *route.Router.
	Router ClusterReporter
	// Status answers GET /status; without it that answers 501.
	Status StatusReporter
	Logger *slog.Logger
}

// Server is the admin HTTP API.
type Server struct {
	opts     Options
	e        *echo.Echo
	tokenSum [32]byte
}

// New builds the server. Serve it with Handler or Serve.
func New(opts Options) *Server {
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	s := &Server{opts: opts, tokenSum: sha256.Sum256([]byte(opts.Token))}
	if opts.Token == "" {
		opts.Logger.Error("admin: no token configured; refusing every request")
	}
	e := echo.New()
	e.HideBanner, e.HidePort = true, true
	e.HTTPErrorHandler = s.errorHandler
	e.GET("/openapi.json", s.openAPI)
	g := e.Group("/admin/v1", s.auth)
	g.GET("/tenants", s.listTenants)
	g.POST("/tenants", s.createTenant)
	g.GET("/tenants/:id", s.getTenant)
	g.PUT("/tenants/:id", s.putTenant)
	g.DELETE("/tenants/:id", s.deleteTenant)
	g.GET("/tenants/:id/limits", s.getLimits)
	g.PUT("/tenants/:id/limits", s.putLimits)
	g.GET("/tenants/:id/usage", s.usage)
	g.GET("/tenants/:id/keys", s.listKeys)
	g.POST("/tenants/:id/keys", s.createKey)
	g.DELETE("/tenants/:id/keys/:key", s.deleteKey)
	g.GET("/clusters", s.clusters)
	g.GET("/clusters/:name/override", s.getOverride)
	g.PUT("/clusters/:name/override", s.putOverride)
	g.DELETE("/clusters/:name/override", s.deleteOverride)
	g.GET("/breakers", s.breakers)
	g.GET("/usage", s.usageList)
	g.GET("/status", s.status)
	s.e = e
	return s
}

// Handler serves the admin API.
func (s *Server) Handler() http.Handler { return s.e }

// Serve serves on ln until ctx ends, then shuts down gracefully.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	srv := &http.Server{Handler: s.e, ReadHeaderTimeout: 10 * time.Second}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
		// Serve returns ErrServerClosed once Shutdown has begun; anything
		// else is a failure of its own.
		if err := <-errc; !errors.Is(err, http.ErrServerClosed) {
			return err
		}
		return nil
	}
}

// apiError carries an OpenAI-shaped error through echo's error path.
type apiError struct {
	status      int
	code, param string
	msg         string
	cause       error // logged, never sent: it may name sockets
}

func (e *apiError) Error() string { return e.msg }

func errf(status int, code, param, format string, a ...any) error {
	return &apiError{status: status, code: code, param: param, msg: fmt.Sprintf(format, a...)}
}

func (s *Server) errorHandler(err error, c echo.Context) {
	if c.Response().Committed {
		return
	}
	if r := c.Request(); r.ContentLength != 0 && c.Get(bodyReadKey) == nil {
		// Answered before the body was read: close the connection rather
		// than wait for a body that may never come.
		closeAfter(c.Response())
	}
	var ae *apiError
	var he *echo.HTTPError
	var fe *tenant.FieldError
	switch {
	case errors.As(err, &ae):
		if ae.cause != nil {
			s.opts.Logger.Warn("admin: request failed", "method", c.Request().Method, "path", c.Path(), "code", ae.code, "err", ae.cause)
		}
	case errors.As(err, &fe):
		ae = &apiError{status: http.StatusBadRequest, code: "invalid_field", param: fe.Field, msg: fe.Error()}
	case errors.Is(err, tenant.ErrNotFound):
		ae = &apiError{status: http.StatusNotFound, code: "not_found", msg: err.Error()}
	case errors.Is(err, tenant.ErrExists):
		ae = &apiError{status: http.StatusConflict, code: "already_exists", msg: err.Error()}
	case errors.Is(err, tenant.ErrUnavailable):
		// Redis is down or cannot serve: the caller may retry. The cause
		// (addresses, Redis replies) goes to the log, not to the client.
		s.opts.Logger.Warn("admin: tenant store unavailable", "method", c.Request().Method, "path", c.Path(), "err", err)
		c.Response().Header().Set("Retry-After", "1")
		ae = &apiError{status: http.StatusServiceUnavailable, code: "store_unavailable", msg: "tenant store unavailable; retry later"}
	case errors.As(err, &he):
		ae = &apiError{status: he.Code, code: strings.ToLower(strings.ReplaceAll(http.StatusText(he.Code), " ", "_")), msg: fmt.Sprint(he.Message)}
	default:
		s.opts.Logger.Error("admin: request failed", "method", c.Request().Method, "path", c.Path(), "err", err)
		ae = &apiError{status: http.StatusInternalServerError, code: "internal_error", msg: "internal error"}
	}
	writeError(c.Response(), ae)
}

func writeError(w http.ResponseWriter, ae *apiError) {
	e := openai.Error{Message: ae.msg, Type: openai.TypeForStatus(ae.status), Code: ae.code}
	if ae.param != "" {
		p := ae.param
		e.Param = &p
	}
	body, _ := json.Marshal(map[string]openai.Error{"error": e})
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(ae.status)
	_, _ = w.Write(body)
}

// bodyReadKey marks, in the echo context, a request whose body a handler
// has started to read.
const bodyReadKey = "infergate.admin.body_read"

// closeAfter marks an answer given before the request body was read: the
// connection closes after it, and reading ends now. Without both, net/http
// drains up to 256 KiB of unread body before the answer goes out, so a
// client that sends headers and stalls would get its 401 only at the
// listener's read timeout.
func closeAfter(w http.ResponseWriter) {
	w.Header().Set("Connection", "close")
	_ = http.NewResponseController(w).SetReadDeadline(time.Now())
}

// auth checks the bearer token, before anything reads the body. Comparing
// SHA-256 digests keeps the comparison constant-time even when lengths
// differ.
func (s *Server) auth(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		tok, ok := bearerToken(c.Request().Header.Get("Authorization"))
		sum := sha256.Sum256([]byte(tok))
		if !ok || s.opts.Token == "" || subtle.ConstantTimeCompare(sum[:], s.tokenSum[:]) != 1 {
			c.Response().Header().Set("WWW-Authenticate", `Bearer realm="infergate-admin"`)
			return errf(http.StatusUnauthorized, "invalid_admin_token", "", "missing or invalid admin token")
		}
		return next(c)
	}
}

// bearerToken returns the credential of a "Bearer" Authorization header.
// The scheme is case-insensitive (RFC 7235 section 2.1) and may be followed
// by more than one space.
func bearerToken(h string) (string, bool) {
	scheme, tok, ok := strings.Cut(h, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return "", false
	}
	tok = strings.TrimLeft(tok, " ")
	return tok, tok != ""
}

// decode reads a JSON body strictly, with exact keys as the API bodies
// are read (shared/jsonkeys): an unknown key, a key in another case, a
// key given twice and null for a field that is not optional are 400s
// naming the field (checkKeys); so are type mismatches; anything after
// the JSON value is a 400, and a body over MaxBodyBytes is a 413.
func decode(c echo.Context, v any) error {
	tooLarge := errf(http.StatusRequestEntityTooLarge, "body_too_large", "", "request body over %d bytes", MaxBodyBytes)
	if c.Request().ContentLength > MaxBodyBytes {
		return tooLarge
	}
	c.Set(bodyReadKey, true)
	data, err := io.ReadAll(http.MaxBytesReader(c.Response(), c.Request().Body, MaxBodyBytes))
	var mbe *http.MaxBytesError
	switch {
	case errors.As(err, &mbe):
		return tooLarge
	case err != nil:
		// A body that stopped arriving (the listener's read timeout) or
		// broke off: the cause names sockets, so it stays in the log.
		ae := errf(http.StatusBadRequest, "invalid_body", "", "the request body could not be read in full").(*apiError)
		ae.cause = err
		return ae
	case len(bytes.TrimSpace(data)) == 0:
		return errf(http.StatusBadRequest, "invalid_json", "", "empty body")
	}
	if err := checkBody(data, v); err != nil {
		return err
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err = dec.Decode(v); err != nil {
		var te *json.UnmarshalTypeError
		var se *json.SyntaxError
		switch {
		case errors.As(err, &te):
			return errf(http.StatusBadRequest, "invalid_field", te.Field, "field %s: expected %s", te.Field, te.Type)
		case errors.As(err, &se):
			return errf(http.StatusBadRequest, "invalid_json", "", "invalid JSON at offset %d", se.Offset)
		}
		if f, ok := strings.CutPrefix(err.Error(), "json: unknown field "); ok {
			f = strings.Trim(f, `"`)
			return errf(http.StatusBadRequest, "unknown_field", f, "unknown field %q", f)
		}
		return errf(http.StatusBadRequest, "invalid_json", "", "invalid JSON: %v", err)
	}
	return nil
}

func (s *Server) tenant(c echo.Context) (*tenant.Tenant, error) {
	id := c.Param("id")
	t, ok := s.opts.Store.Tenant(id)
	if !ok {
		return nil, errf(http.StatusNotFound, "tenant_not_found", "id", "tenant %q not found", id)
	}
	return t, nil
}

type listResp[T any] struct {
	Object string `json:"object"`
	Data   []T    `json:"data"`
}

func (s *Server) listTenants(c echo.Context) error {
	ts := s.opts.Store.Tenants()
	if ts == nil {
		ts = []*tenant.Tenant{}
	}
	return c.JSON(http.StatusOK, listResp[*tenant.Tenant]{Object: "list", Data: ts})
}

func (s *Server) createTenant(c echo.Context) error {
	var t tenant.Tenant
	if err := decode(c, &t); err != nil {
		return err
	}
	if err := s.opts.Store.CreateTenant(c.Request().Context(), t); err != nil {
		return err
	}
	got, _ := s.opts.Store.Tenant(t.ID)
	s.opts.Logger.Info("admin: tenant created", "tenant", t.ID)
	return c.JSON(http.StatusCreated, got)
}

func (s *Server) getTenant(c echo.Context) error {
	t, err := s.tenant(c)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, t)
}

func (s *Server) putTenant(c echo.Context) error {
	var t tenant.Tenant
	if err := decode(c, &t); err != nil {
		return err
	}
	id := c.Param("id")
	if t.ID == "" {
		t.ID = id
	}
	if t.ID != id {
		return errf(http.StatusBadRequest, "invalid_field", "id", "id in body (%q) differs from path (%q)", t.ID, id)
	}
	if err := s.opts.Store.UpdateTenant(c.Request().Context(), t); err != nil {
		return err
	}
	got, _ := s.opts.Store.Tenant(id)
	s.opts.Logger.Info("admin: tenant updated", "tenant", id)
	return c.JSON(http.StatusOK, got)
}

func (s *Server) deleteTenant(c echo.Context) error {
	if err := s.opts.Store.DeleteTenant(c.Request().Context(), c.Param("id")); err != nil {
		return err
	}
	s.opts.Logger.Info("admin: tenant deleted", "tenant", c.Param("id"))
	return c.NoContent(http.StatusNoContent)
}

// LimitsDoc is the body of /tenants/:id/limits.
type LimitsDoc struct {
	Limits      tenant.Limits            `json:"limits"`
	ModelLimits map[string]tenant.Limits `json:"model_limits,omitempty"`
}

func (s *Server) getLimits(c echo.Context) error {
	t, err := s.tenant(c)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, LimitsDoc{Limits: t.Limits, ModelLimits: t.ModelLimits})
}

func (s *Server) putLimits(c echo.Context) error {
	t, err := s.tenant(c)
	if err != nil {
		return err
	}
	var d LimitsDoc
	if err := decode(c, &d); err != nil {
		return err
	}
	t.Limits, t.ModelLimits = d.Limits, d.ModelLimits
	if err := s.opts.Store.UpdateTenant(c.Request().Context(), *t); err != nil {
		return err
	}
	got, _ := s.opts.Store.Tenant(t.ID)
	s.opts.Logger.Info("admin: limits updated", "tenant", t.ID)
	return c.JSON(http.StatusOK, LimitsDoc{Limits: got.Limits, ModelLimits: got.ModelLimits})
}

func (s *Server) usage(c echo.Context) error {
	t, err := s.tenant(c)
	if err != nil {
		return err
	}
	if s.opts.Limiter == nil {
		return errf(http.StatusNotImplemented, "usage_unavailable", "", "no limiter configured")
	}
	u, err := s.opts.Limiter.Usage(c.Request().Context(), t)
	if err != nil {
		// The cause may name Redis addresses: logged, not sent.
		ae := errf(http.StatusServiceUnavailable, "usage_unavailable", "", "usage unavailable; retry later").(*apiError)
		ae.cause = err
		return ae
	}
	return c.JSON(http.StatusOK, u)
}

func (s *Server) listKeys(c echo.Context) error {
	t, err := s.tenant(c)
	if err != nil {
		return err
	}
	keys := s.opts.Store.Keys(t.ID)
	if keys == nil {
		keys = []tenant.KeyInfo{}
	}
	return c.JSON(http.StatusOK, listResp[tenant.KeyInfo]{Object: "list", Data: keys})
}

// CreateKeyRequest is the optional body of POST /tenants/:id/keys.
type CreateKeyRequest struct {
	Name string `json:"name"`
}

// CreatedKey is returned once when a key is made; Key is never shown again.
type CreatedKey struct {
	tenant.KeyInfo
	Key string `json:"key"`
}

func (s *Server) createKey(c echo.Context) error {
	t, err := s.tenant(c)
	if err != nil {
		return err
	}
	var req CreateKeyRequest
	if c.Request().ContentLength != 0 {
		if err := decode(c, &req); err != nil {
			return err
		}
	}
	raw, info, err := s.opts.Store.CreateKey(c.Request().Context(), t.ID, req.Name)
	if err != nil {
		return err
	}
	s.opts.Logger.Info("admin: api key created", "tenant", t.ID, "key_prefix", info.Prefix)
	c.Response().Header().Set("Cache-Control", "no-store")
	return c.JSON(http.StatusCreated, CreatedKey{KeyInfo: info, Key: raw})
}

func (s *Server) deleteKey(c echo.Context) error {
	t, err := s.tenant(c)
	if err != nil {
		return err
	}
	if err := s.opts.Store.DeleteKey(c.Request().Context(), t.ID, c.Param("key")); err != nil {
		if errors.Is(err, tenant.ErrNotFound) {
			return errf(http.StatusNotFound, "key_not_found", "key", "key %q not found", c.Param("key"))
		}
		return err
	}
	s.opts.Logger.Info("admin: api key deleted", "tenant", t.ID, "key_id", c.Param("key"))
	return c.NoContent(http.StatusNoContent)
}

func (s *Server) getOverride(c echo.Context) error {
	o, ok := s.opts.Store.Overrides()[c.Param("name")]
	if !ok {
		return errf(http.StatusNotFound, "override_not_found", "name", "no override for cluster %q", c.Param("name"))
	}
	return c.JSON(http.StatusOK, o)
}

func (s *Server) putOverride(c echo.Context) error {
	var o tenant.ClusterOverride
	if err := decode(c, &o); err != nil {
		return err
	}
	// An override for a mistyped name would be stored and silently never
	// apply. force=true lets an operator prepare one (say, drain) for a
	// cluster that has not registered yet.
	name := c.Param("name")
	// Invalid names fall through to the store's 400.
	if s.opts.Clusters != nil && tenant.ValidID(name) && !s.opts.Clusters.KnownCluster(name) && c.QueryParam("force") != "true" {
		return errf(http.StatusNotFound, "cluster_not_found", "name", "cluster %q is not known to discovery (add ?force=true to set an override for it anyway)", name)
	}
	if err := s.opts.Store.SetOverride(c.Request().Context(), name, o); err != nil {
		return err
	}
	s.opts.Logger.Info("admin: cluster override set", "cluster", name, "drain", o.Drain)
	return c.JSON(http.StatusOK, o)
}

func (s *Server) deleteOverride(c echo.Context) error {
	if err := s.opts.Store.DeleteOverride(c.Request().Context(), c.Param("name")); err != nil {
		if errors.Is(err, tenant.ErrNotFound) {
			return errf(http.StatusNotFound, "override_not_found", "name", "no override for cluster %q", c.Param("name"))
		}
		return err
	}
	return c.NoContent(http.StatusNoContent)
}

func (s *Server) breakers(c echo.Context) error {
	out := []BreakerState{}
	if s.opts.Breakers != nil {
		if b := s.opts.Breakers.Breakers(); b != nil {
			out = b
		}
	}
	return c.JSON(http.StatusOK, listResp[BreakerState]{Object: "list", Data: out})
}
