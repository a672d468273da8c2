package gateway_test

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/infergate/infergate/tier2/gateway"
)

// BenchmarkTransportSend32K sends 32 KiB request bodies to a loopback
// server over one keep-alive connection of the transport Tier 2 uses
// towards Tier 1, the way the exchange sends them (a reader over the body
// already in memory, its length known). B/op is what sending costs the
// client beside the request itself.
//
//	go test -run '^$' -bench TransportSend32K -benchmem ./tier2/gateway
func BenchmarkTransportSend32K(b *testing.B) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		_, _ = io.WriteString(w, "{}")
	}))
	defer srv.Close()
	tr := gateway.NewTransport()
	defer tr.CloseIdleConnections()
	body := bytes.Repeat([]byte("a"), 32<<10)
	send := func() {
		req, err := http.NewRequest(http.MethodPost, srv.URL, bytes.NewReader(body))
		if err != nil {
			b.Fatal(err)
		}
		resp, err := tr.RoundTrip(req)
		if err != nil {
			b.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
	}
	send()
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		send()
	}
}
