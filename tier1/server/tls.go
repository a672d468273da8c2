package server

import (
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"
	"net"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/infergate/infergate/shared/tlsfiles"
)

// listenerTLS are the TLS configurations of Tier 1's listeners, loaded
// (and checked) by New so that a bad file stops the process before it
// listens; nil where a listener serves plain text.
type listenerTLS struct {
	api, metrics, extProc *tlsfiles.ServerConfig
}

// loadListenerTLS loads the tls, metrics_tls and ext_proc_tls blocks. The
// files are re-read every interval (0: tlsfiles' default) until ctx ends;
// reloads are counted on reg. An error names the key and the file.
func loadListenerTLS(ctx context.Context, cfg *Config, reg prometheus.Registerer, log *slog.Logger, interval time.Duration) (listenerTLS, error) {
	var lt listenerTLS
	m, err := tlsfiles.NewMetrics(reg)
	if err != nil {
		return lt, fmt.Errorf("tls metrics: %w", err)
	}
	for _, b := range []struct {
		key, name string
		block     tlsfiles.Server
		dst       **tlsfiles.ServerConfig
		// protos: HTTP/1.1 only on the HTTP listeners, as in plain text
		// (their timeouts and connection handling are built for it);
		// gRPC needs h2.
		protos []string
	}{
		{"tls", "tier1-api", cfg.TLS, &lt.api, []string{"http/1.1"}},
		{"metrics_tls", "tier1-metrics", cfg.MetricsTLS, &lt.metrics, []string{"http/1.1"}},
		{"ext_proc_tls", "tier1-ext-proc", cfg.ExtProcTLS, &lt.extProc, []string{"h2"}},
	} {
		if !b.block.Enabled() {
			continue
		}
		sc, err := tlsfiles.NewServer(ctx, b.block, tlsfiles.Options{Name: b.name, Logger: log, Metrics: m,
			Interval: interval, NextProtos: b.protos})
		if err != nil {
			return lt, fmt.Errorf("%s: %w", b.key, err)
		}
		*b.dst = sc
	}
	return lt, nil
}

// wrap serves ln over TLS with sc, or returns it as is when sc is nil.
func wrap(ln net.Listener, sc *tlsfiles.ServerConfig) net.Listener {
	if ln == nil || sc == nil {
		return ln
	}
	return tls.NewListener(ln, sc.Config())
}

// configOf is sc's configuration, nil when sc is.
func configOf(sc *tlsfiles.ServerConfig) *tls.Config {
	if sc == nil {
		return nil
	}
	return sc.Config()
}
