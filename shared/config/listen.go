package config

import (
	"errors"
	"net"
)

// Listener is one listen address of a configuration and its key.
type Listener struct {
	Path string // the key, e.g. metrics.listen
	Addr string // host:port; empty or unparsable entries are skipped
}

// ListenClashes reports listeners that would bind the same port: the same
// host, or a wildcard host (":9090", "0.0.0.0:9090") that takes the port on
// every address. Port 0 (any free port) never clashes. Each problem is at
// the later key.
func ListenClashes(ls []Listener) error {
	type bound struct {
		Listener
		host, port string
	}
	var seen []bound
	var errs []error
	for _, l := range ls {
		host, port, err := net.SplitHostPort(l.Addr)
		if err != nil || port == "" || port == "0" {
			continue
		}
		host = normalHost(host)
		for _, b := range seen {
			if b.port == port && (b.host == host || b.host == "" || host == "") {
				errs = append(errs, Errorf(l.Path, "%q clashes with %s (%q): two listeners cannot share a port", l.Addr, b.Path, b.Addr))
				break
			}
		}
		seen = append(seen, bound{l, host, port})
	}
	return errors.Join(errs...)
}

func normalHost(h string) string {
	switch h {
	case "", "0.0.0.0", "::", "[::]":
		return ""
	case "localhost":
		return "127.0.0.1"
	}
	return h
}
