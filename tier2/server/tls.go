package server

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/infergate/infergate/shared/tlsfiles"
)

// tlsState are Tier 2's TLS configurations, loaded (and checked) by New so
// that a bad file stops the process before it listens. A nil listener
// configuration serves plain text; a nil tier1 dials https clusters with
// the system roots and no client certificate.
type tlsState struct {
	api, admin, metrics *tlsfiles.ServerConfig
	tier1               *tlsfiles.ClientConfig
}

// loadTLS loads the tls, admin.tls, metrics.tls and tier1.tls blocks. The
// files are re-read every interval (0: tlsfiles' default) until ctx ends;
// reloads are counted on reg. An error names the key and the file.
func loadTLS(ctx context.Context, cfg Config, reg prometheus.Registerer, log *slog.Logger, interval time.Duration) (tlsState, error) {
	m, err := tlsfiles.NewMetrics(reg)
	if err != nil {
		return tlsState{}, fmt.Errorf("tls metrics: %w", err)
	}
	opts := tlsfiles.Options{Logger: log, Metrics: m, Interval: interval}
	scs, err := tlsfiles.NewListeners(ctx, []tlsfiles.Listener{
		{Key: "tls", Name: "tier2-api", Block: cfg.TLS, NextProtos: tlsfiles.HTTP1},
		{Key: "admin.tls", Name: "tier2-admin", Block: cfg.Admin.TLS, NextProtos: tlsfiles.HTTP1},
		{Key: "metrics.tls", Name: "tier2-metrics", Block: cfg.Metrics.TLS, NextProtos: tlsfiles.HTTP1},
	}, opts)
	if err != nil {
		return tlsState{}, err
	}
	ts := tlsState{api: scs[0], admin: scs[1], metrics: scs[2]}
	if cfg.Tier1.TLS.Enabled() {
		opts.Name = "tier2-tier1"
		if ts.tier1, err = tlsfiles.NewClient(ctx, cfg.Tier1.TLS, opts); err != nil {
			return ts, fmt.Errorf("tier1.tls: %w", err)
		}
	}
	return ts, nil
}

// dialFunc is http.Transport's DialContext and DialTLSContext.
type dialFunc = func(ctx context.Context, network, addr string) (net.Conn, error)

// tier1Dialer is how https clusters are dialled with tier1.tls: dial, then
// a handshake with the files current at that moment (so a rotated CA
// bundle or client certificate applies to the next connection), both
// within timeout. nil without tier1.tls: the transport's own TLS, with the
// system roots, as before.
func (ts tlsState) tier1Dialer(dial dialFunc, timeout time.Duration) dialFunc {
	if ts.tier1 == nil {
		return nil
	}
	dialTLS := ts.tier1.DialTLSContext(dial)
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		ctx, cancel := context.WithTimeout(ctx, timeout)
		defer cancel()
		return dialTLS(ctx, network, addr)
	}
}

// tier1HandshakeTimeout bounds connecting to a Tier 1 over TLS, handshake
// included: what gateway.NewTransport allows for the two (2s + 5s).
const tier1HandshakeTimeout = 7 * time.Second
