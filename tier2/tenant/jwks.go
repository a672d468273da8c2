package tenant

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/MicahParks/jwkset"
	"github.com/MicahParks/keyfunc/v3"
	"golang.org/x/time/rate"

	"github.com/infergate/infergate/shared/getjson"
	"github.com/infergate/infergate/shared/tlsfiles"
)

// Defaults for the remote key set (JWTOptions zero values).
const (
	DefaultJWKSRefreshInterval    = 15 * time.Minute
	DefaultJWKSMinRefreshInterval = time.Minute
	DefaultJWKSFetchTimeout       = 10 * time.Second
	// MaxJWKSBytes bounds a JWKS or discovery document: a key set is a
	// few KiB, and an identity provider answering with more is broken or
	// hostile.
	MaxJWKSBytes = 1 << 20
)

// errKeysNotLoaded is why a JWT is refused while the remote key set has
// never been fetched.
var errKeysNotLoaded = errors.New("signing keys from the JWKS endpoint not loaded yet")

// remoteKeys is the JSON Web Key Set at JWKSURL, or at the jwks_uri the
// issuer's OpenID Connect discovery document names. keyfunc and jwkset do
// the caching, the periodic refresh and the rate-limited refresh on an
// unknown kid; remoteKeys adds discovery and retries the first load in the
// background until it succeeds, so Tier 2 starts while the identity
// provider is unreachable and refuses JWTs (not API keys) until keys arrive.
type remoteKeys struct {
	o      *JWTOptions
	log    *slog.Logger
	client *http.Client

	kf      atomic.Pointer[keyfuncBox] // nil until the first load succeeds
	lastErr atomic.Pointer[errBox]     // why the last load failed; nil once loaded

	life   context.Context // ends at close: refresh loops, TLS file watcher
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

type keyfuncBox struct {
	kf   keyfunc.Keyfunc
	url  string
	stop context.CancelFunc // ends the set's refresh loop
}

type errBox struct{ err error }

// newRemoteKeys builds the HTTP client (TLS from o.TLS, so a private CA
// works) and tries the first load now, bounded by o.FetchTimeout. A failed
// load is logged and retried in the background; only configuration errors
// (an unreadable CA file) are returned.
func newRemoteKeys(ctx context.Context, o *JWTOptions, log *slog.Logger) (*remoteKeys, error) {
	life, cancel := context.WithCancel(context.Background())
	r := &remoteKeys{o: o, log: log, life: life, cancel: cancel}
	tc, err := tlsfiles.NewClient(life, o.TLS, tlsfiles.Options{Name: "tier2-jwks", Logger: log})
	if err != nil {
		cancel()
		return nil, fmt.Errorf("jwt.tls: %w", err)
	}
	r.client = &http.Client{
		Timeout: o.FetchTimeout,
		Transport: limitedTransport{&http.Transport{
			Proxy:               http.ProxyFromEnvironment,
			DialContext:         (&net.Dialer{Timeout: o.FetchTimeout, KeepAlive: 30 * time.Second}).DialContext,
			TLSClientConfig:     tc.Config(),
			TLSHandshakeTimeout: o.FetchTimeout,
			ForceAttemptHTTP2:   true,
			MaxIdleConns:        2,
			IdleConnTimeout:     90 * time.Second,
		}},
		// A redirect must stay on HTTPS: a key set fetched over plain
		// HTTP could be anyone's.
		CheckRedirect: func(req *http.Request, via []*http.Request) error {
			if req.URL.Scheme != "https" {
				return fmt.Errorf("redirect to %s refused: not https", req.URL.Redacted())
			}
			if len(via) >= 3 {
				return errors.New("stopped after 3 redirects")
			}
			return nil
		},
	}
	if err := r.load(ctx); err != nil {
		r.failed(err)
		log.Error("jwt: signing keys not loaded; JWTs are refused until they are (API keys still work); retrying in the background",
			"source", r.source(), "err", err)
		r.wg.Add(1)
		go r.retry()
	}
	return r, nil
}

func (r *remoteKeys) source() string {
	if r.o.OIDCDiscovery {
		return discoveryURL(r.o.Issuer)
	}
	return r.o.JWKSURL
}

func (r *remoteKeys) failed(err error) { r.lastErr.Store(&errBox{err}) }

// retry loads until it succeeds or close, backing off from 1s to the
// smaller of a minute and the refresh interval.
func (r *remoteKeys) retry() {
	defer r.wg.Done()
	wait := time.Second
	maxWait := min(time.Minute, r.o.RefreshInterval)
	for {
		t := time.NewTimer(wait)
		select {
		case <-r.life.Done():
			t.Stop()
			return
		case <-t.C:
		}
		err := r.load(r.life)
		if err == nil {
			return
		}
		if r.life.Err() != nil {
			return
		}
		r.failed(err)
		r.log.Warn("jwt: signing keys still not loaded", "source", r.source(), "err", err, "retry_in", min(2*wait, maxWait))
		wait = min(2*wait, maxWait)
	}
}

// load discovers the JWKS URL if needed, fetches the set once and, on
// success, publishes a keyfunc whose storage refreshes itself every
// RefreshInterval and on an unknown kid (at most once per
// MinRefreshInterval).
func (r *remoteKeys) load(ctx context.Context) error {
	u := r.o.JWKSURL
	if r.o.OIDCDiscovery {
		var err error
		if u, err = r.discover(ctx); err != nil {
			return err
		}
	}
	// The storage's refresh loop lives until close, or until this attempt
	// fails (jwkset starts it before the first fetch).
	actx, acancel := context.WithCancel(r.life)
	st, err := jwkset.NewStorageFromHTTP(u, jwkset.HTTPClientStorageOptions{
		Client:          r.client,
		Ctx:             actx,
		HTTPTimeout:     r.o.FetchTimeout,
		RefreshInterval: r.o.RefreshInterval,
		RefreshErrorHandler: func(_ context.Context, err error) {
			// The previous keys stay in use.
			r.log.Warn("jwt: JWKS refresh failed; keeping the keys fetched before", "url", u, "err", err)
		},
	})
	if err != nil {
		acancel()
		return fmt.Errorf("fetch JWKS %s: %w", u, err)
	}
	client, err := jwkset.NewHTTPClient(jwkset.HTTPClientOptions{
		HTTPURLs: map[string]jwkset.Storage{u: st},
		// A token whose kid is not in the set refreshes it now (a key
		// rotated in since the last refresh), at most once per
		// MinRefreshInterval however many such tokens arrive. A request
		// waits at most FetchTimeout for that.
		RefreshUnknownKID: rate.NewLimiter(rate.Every(r.o.MinRefreshInterval), 1),
		RateLimitWaitMax:  r.o.FetchTimeout,
	})
	if err != nil {
		acancel()
		return err
	}
	kf, err := keyfunc.New(keyfunc.Options{Ctx: actx, Storage: client,
		// Keys marked for encryption never verify a signature.
		UseWhitelist: []jwkset.USE{jwkset.UseSig, ""}})
	if err != nil {
		acancel()
		return err
	}
	n := 0
	if keys, err := st.KeyReadAll(ctx); err == nil {
		n = len(keys)
	}
	if n == 0 {
		r.log.Warn("jwt: the JWKS has no usable keys; every JWT is refused until it has", "url", u)
	} else {
		r.log.Info("jwt: signing keys loaded", "url", u, "keys", n, "refresh_interval", r.o.RefreshInterval)
	}
	r.kf.Store(&keyfuncBox{kf: kf, url: u, stop: acancel})
	r.lastErr.Store(nil)
	return nil
}

func discoveryURL(issuer string) string {
	return strings.TrimSuffix(issuer, "/") + "/.well-known/openid-configuration"
}

// discover reads the issuer's OpenID Connect discovery document and
// returns its jwks_uri. The document must name exactly the configured
// issuer (OpenID Connect Discovery 1.0, section 4.3): a document served
// for another issuer would let its keys sign for this one.
func (r *remoteKeys) discover(ctx context.Context) (string, error) {
	du := discoveryURL(r.o.Issuer)
	ctx, cancel := context.WithTimeout(ctx, r.o.FetchTimeout)
	defer cancel()
	var doc struct {
		Issuer  string `json:"issuer"`
		JWKSURI string `json:"jwks_uri"`
	}
	// r.client cuts bodies at MaxJWKSBytes (limitedTransport).
	if err := getjson.Get(ctx, r.client, getjson.Request{URL: du, Limit: MaxJWKSBytes}, &doc); err != nil {
		return "", fmt.Errorf("oidc discovery %s: %w", du, err)
	}
	if doc.Issuer != r.o.Issuer {
		return "", fmt.Errorf("oidc discovery %s: the document names issuer %q, not %q (jwt.issuer)", du, doc.Issuer, r.o.Issuer)
	}
	if err := checkHTTPSURL(doc.JWKSURI); err != nil {
		return "", fmt.Errorf("oidc discovery %s: jwks_uri: %w", du, err)
	}
	return doc.JWKSURI, nil
}

// checkHTTPSURL accepts an absolute https URL with a host.
func checkHTTPSURL(s string) error {
	u, err := url.Parse(s)
	if err != nil {
		return err
	}
	if u.Scheme != "https" || u.Host == "" {
		return fmt.Errorf("%q: want an https:// URL", s)
	}
	return nil
}

// keyfunc is the loaded key set, or nil before the first load.
func (r *remoteKeys) keyfunc() keyfunc.Keyfunc {
	if b := r.kf.Load(); b != nil {
		return b.kf
	}
	return nil
}

// notLoaded is the error for a token that needed the remote keys before
// they were loaded.
func (r *remoteKeys) notLoaded() error {
	if b := r.lastErr.Load(); b != nil {
		return fmt.Errorf("%w (last attempt: %v)", errKeysNotLoaded, b.err)
	}
	return errKeysNotLoaded
}

func (r *remoteKeys) close() {
	r.cancel()
	r.wg.Wait()
	if b := r.kf.Load(); b != nil {
		b.stop()
	}
}

// limitedTransport cuts response bodies at MaxJWKSBytes.
type limitedTransport struct{ rt http.RoundTripper }

func (t limitedTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := t.rt.RoundTrip(req)
	if err != nil {
		return nil, err
	}
	resp.Body = &limitedBody{rc: resp.Body, left: MaxJWKSBytes}
	return resp, nil
}

type limitedBody struct {
	rc   io.ReadCloser
	left int64
}

func (b *limitedBody) Read(p []byte) (int, error) {
	if b.left < 0 {
		return 0, errTooLarge
	}
	// Reading one byte past the limit tells a full body from a cut one.
	if int64(len(p)) > b.left+1 {
		p = p[:b.left+1]
	}
	n, err := b.rc.Read(p)
	if b.left -= int64(n); b.left < 0 {
		return 0, errTooLarge
	}
	return n, err
}

var errTooLarge = fmt.Errorf("response over %d bytes", MaxJWKSBytes)

func (b *limitedBody) Close() error { return b.rc.Close() }
