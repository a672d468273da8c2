package getjson

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

func TestGet(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/doc":
			if r.Header.Get("Authorization") != "Bearer s3cret" {
				http.Error(w, "no token", http.StatusUnauthorized)
				return
			}
			w.Write([]byte(`{"name":"pod-a","n":3}`))
		case "/big":
			w.Write([]byte(`{"name":"` + strings.Repeat("x", 4096) + `"}`))
		default:
			http.Error(w, strings.Repeat("gone ", 100), http.StatusServiceUnavailable)
		}
	}))
	defer srv.Close()
	type doc struct {
		Name string `json:"name"`
		N    int    `json:"n"`
	}
	ctx := context.Background()
	var d doc
	if err := Get(ctx, srv.Client(), Request{URL: srv.URL + "/doc", Token: "s3cret"}, &d); err != nil || d != (doc{"pod-a", 3}) {
		t.Fatalf("Get = %+v, %v", d, err)
	}
	var se *StatusError
	if err := Get(ctx, srv.Client(), Request{URL: srv.URL + "/doc"}, &d); !errors.As(err, &se) || se.Code != http.StatusUnauthorized {
		t.Fatalf("without the token: %v, want HTTP 401", err)
	}
	if err := Get(ctx, srv.Client(), Request{URL: srv.URL + "/down"}, &d); !errors.As(err, &se) || se.Code != http.StatusServiceUnavailable || err.Error() != "HTTP 503" {
		t.Fatalf("503: %v", err)
	}
	if err := Get(ctx, srv.Client(), Request{URL: srv.URL + "/big", Limit: 1024}, &d); err == nil || !strings.HasPrefix(err.Error(), "decode: ") {
		t.Fatalf("a document over Limit: %v, want a decode error", err)
	}
	if err := Get(ctx, srv.Client(), Request{URL: srv.URL + "/big"}, &d); err != nil || len(d.Name) != 4096 {
		t.Fatalf("under the default limit: %v", err)
	}
}
