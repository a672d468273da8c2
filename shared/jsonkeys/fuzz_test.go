package jsonkeys

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"unicode/utf8"
)

// FuzzScan checks the invariants the routers rely on: no panic; whatever
// Scan accepts encoding/json accepts too; and for an accepted body the
// case-insensitive encoding/json struct decode, the exact-key map decode
// and the values Scan returns all agree on every guarded field.
func FuzzScan(f *testing.F) {
	for _, s := range []string{
		`{"model":"m","max_tokens":5}`,
		`{"max_tokens":500,"Max_tokens":1,"stream":true}`,
		`{"model":"a","Model":"b"}`,
		`{"\u006dodel":"x","n":2}`,
		`{"ſtream":true}`,
		`{"a":[1,2,{"b":"c\n"}],"model":null}`,
		`[1]`, `{"model":"a"} {}`, "{\"m\xffodel\":1}",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		vals := make([][]byte, 4)
		err := testSet.Scan(data, vals)
		if Valid(data) && !json.Valid(data) {
			t.Fatalf("Valid accepts what encoding/json refuses: %q", data)
		}
		if err != nil {
			return
		}
		if !json.Valid(data) || !utf8.Valid(data) {
			t.Fatalf("accepted invalid JSON %q", data)
		}
		var folded struct {
			Model     json.RawMessage `json:"model"`
			MaxTokens json.RawMessage `json:"max_tokens"`
			Stream    json.RawMessage `json:"stream"`
			N         json.RawMessage `json:"n"`
		}
		if err := json.Unmarshal(data, &folded); err != nil {
			t.Fatalf("encoding/json refused an accepted body %q: %v", data, err)
		}
		var exact map[string]json.RawMessage
		if err := json.Unmarshal(data, &exact); err != nil {
			t.Fatal(err)
		}
		for i, got := range [][]byte{folded.Model, folded.MaxTokens, folded.Stream, folded.N} {
			name := testSet.Names()[i]
			if string(got) == "null" {
				got = nil // RawMessage keeps null; absent is nil
			}
			want := exact[name]
			if string(want) == "null" {
				want = nil
			}
			scanned := vals[i]
			if string(scanned) == "null" {
				scanned = nil
			}
			if !bytes.Equal(got, want) || !bytes.Equal(scanned, want) {
				t.Fatalf("%s: encoding/json %q, exact %q, Scan %q in %q", name, got, want, scanned, data)
			}
			for k := range exact {
				if k != name && strings.EqualFold(k, name) {
					t.Fatalf("accepted case variant %q of %q", k, name)
				}
			}
		}
	})
}
