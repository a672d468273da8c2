package gateway_test

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/infergate/infergate/shared/openai"
	"github.com/infergate/infergate/tier2/gateway"
)

// BenchmarkTransportSend32K sends 32 KiB chat bodies to a loopback
// server over one keep-alive connection of the transport Tier 2 uses
// towards Tier 1, as the exchange sends them: "edited" is a stream's body
// with include_usage set in place (openai.Splice.Edit) behind a
// *bytes.Reader, "splice" the same edit read through openai.Splice.Reader
// (what the exchange sent before: net/http flushes the headers apart from
// a body it does not know to be in memory, and copies it through a buffer
// of its own). B/op counts the loopback server too.
//
//	go test -run '^$' -bench TransportSend32K -benchmem ./tier2/gateway
func BenchmarkTransportSend32K(b *testing.B) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		_, _ = io.WriteString(w, "{}")
	}))
	defer srv.Close()
	text := bytes.Repeat([]byte("a"), 32<<10-64)
	orig := append(append([]byte(`{"model":"m","stream":true,"messages":[{"role":"user","content":"`), text...), `"}]}`...)
	body := make([]byte, len(orig), len(orig)+openai.MaxSpliceGrowth)
	for _, mode := range []string{"edited", "splice"} {
		b.Run(mode, func(b *testing.B) {
			tr := gateway.NewTransport()
			defer tr.CloseIdleConnections()
			send := func() {
				copy(body, orig)
				body = body[:len(orig)]
				r, err := openai.ParseRequest(body)
				if err != nil {
					b.Fatal(err)
				}
				sp, _, err := r.IncludeUsage(body)
				if err != nil {
					b.Fatal(err)
				}
				var rd io.Reader
				n := sp.Len(body)
				if mode == "edited" {
					rd = bytes.NewReader(sp.Edit(body))
				} else {
					rd = sp.Reader(body)
				}
				req, err := http.NewRequest(http.MethodPost, srv.URL, rd)
				if err != nil {
					b.Fatal(err)
				}
				req.ContentLength = int64(n)
				resp, err := tr.RoundTrip(req)
				if err != nil {
					b.Fatal(err)
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				_ = resp.Body.Close()
			}
			send()
			b.SetBytes(int64(len(orig)))
			b.ReportAllocs()
			for b.Loop() {
				send()
			}
		})
	}
}
