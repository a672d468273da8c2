package server

import (
	"context"
	"fmt"
	"log/slog"
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
	m, err := tlsfiles.NewMetrics(reg)
	if err != nil {
		return listenerTLS{}, fmt.Errorf("tls metrics: %w", err)
	}
	scs, err := tlsfiles.NewListeners(ctx, []tlsfiles.Listener{
		{Key: "tls", Name: "tier1-api", Block: cfg.TLS, NextProtos: tlsfiles.HTTP1},
		{Key: "metrics_tls", Name: "tier1-metrics", Block: cfg.MetricsTLS, NextProtos: tlsfiles.HTTP1},
		{Key: "ext_proc_tls", Name: "tier1-ext-proc", Block: cfg.ExtProcTLS, NextProtos: []string{"h2"}}, // gRPC
	}, tlsfiles.Options{Logger: log, Metrics: m, Interval: interval})
	if err != nil {
		return listenerTLS{}, err
	}
	return listenerTLS{api: scs[0], metrics: scs[1], extProc: scs[2]}, nil
}
