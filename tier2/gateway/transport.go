package gateway

import (
	"net"
	"net/http"
	"time"
)

// writeBufferBytes is the write buffer of a connection to Tier 1 (see
// NewTransport).
const writeBufferBytes = 64 << 10

// NewTransport returns the transport used towards Tier 1: connections are
// kept alive and dialled with a short timeout so a dead cluster fails over
// fast; bodies are passed through uncompressed.
//
// The write buffer holds a whole request of up to 64 KB: with net/http's
// default 4 KB, a body longer than what is left of the buffer after the
// headers goes to net.TCPConn.ReadFrom, whose generic copy allocates a
// buffer of up to 32 KB for every request (a third of Tier 2's
// allocations with 32 KB chat bodies; BenchmarkTransportSend32K), and is
// written in two system calls instead of one. The buffer is per
// connection: 64 KB times the connections open to Tier 1.
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
		WriteBufferSize:       writeBufferBytes,
	}
}
