package gateway

import (
	"net"
	"net/http"
	"time"
)

// NewTransport returns the transport used towards Tier 1: connections are
// kept alive and dialled with a short timeout so a dead cluster fails over
// fast; bodies are passed through uncompressed.
func NewTransport() *http.Transport {
	return &http.Transport{
		Proxy:                 nil,
		DialContext:           (&net.Dialer{Timeout: 2 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConns:          1024,
		MaxIdleConnsPerHost:   256,
		IdleConnTimeout:       90 * time.Second,
		TLSHandshakeTimeout:   5 * time.Second,
		ExpectContinueTimeout: time.Second,
		DisableCompression:    true,
	}
}
