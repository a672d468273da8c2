package tlsfiles

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
)

// HTTP1 is the ALPN list of the tiers' HTTP listeners: HTTP/1.1 only, as
// in plain text (their timeouts and connection handling are built for
// it).
var HTTP1 = []string{"http/1.1"}

// Listener is one listener's server block, for NewListeners.
type Listener struct {
	Key        string // the block's YAML path, named in errors ("tls", "admin.tls")
	Name       string // Options.Name: the listener in logs and metrics
	Block      Server
	NextProtos []string // Options.NextProtos
}

// NewListeners loads every enabled block of ls with NewServer and opts
// (each with its own Name and NextProtos), so that a bad file stops a
// process before it listens. The result is parallel to ls, nil where a
// block is off (plain text). An error names the block's key and the file.
func NewListeners(ctx context.Context, ls []Listener, opts Options) ([]*ServerConfig, error) {
	out := make([]*ServerConfig, len(ls))
	for i, l := range ls {
		if !l.Block.Enabled() {
			continue
		}
		o := opts
		o.Name, o.NextProtos = l.Name, l.NextProtos
		sc, err := NewServer(ctx, l.Block, o)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", l.Key, err)
		}
		out[i] = sc
	}
	return out, nil
}

// ValidateListeners checks each block of ls with Server.Validate, named by
// its Key, without reading files: a process's configuration check lists
// the same blocks NewListeners later loads. It returns every failing
// block's error, in the order of ls; Name and NextProtos are not used.
func ValidateListeners(ls []Listener) []error {
	var errs []error
	for _, l := range ls {
		if err := l.Block.Validate(l.Key); err != nil {
			errs = append(errs, err)
		}
	}
	return errs
}

// Wrap serves ln over TLS with s, or returns ln as is when s is nil (the
// listener's block is off) or ln is.
func (s *ServerConfig) Wrap(ln net.Listener) net.Listener {
	if ln == nil || s == nil {
		return ln
	}
	return tls.NewListener(ln, s.Config())
}

// ConfigOrNil is s.Config(), or nil when s is nil (plain text).
func (s *ServerConfig) ConfigOrNil() *tls.Config {
	if s == nil {
		return nil
	}
	return s.Config()
}
