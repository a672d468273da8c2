package jsonkeys

import (
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"testing"
)

var testSet = NewSet("model", "max_tokens", "stream", "n")

func TestScan(t *testing.T) {
	tests := []struct {
		name, body string
		code       string // "" means accepted
		key        string
		model      string // raw value of "model" when accepted
	}{
		{"plain", `{"model":"m","max_tokens":5,"other":[1,{"a":null}]}`, "", "", `"m"`},
		{"whitespace", " \t\n{ \"model\" : \"m\" } \r\n", "", "", `"m"`},
		{"absent", `{"x":1}`, "", "", ``},
		{"empty object", `{}`, "", "", ``},
		{"escaped key is the name", `{"\u006dodel":"m"}`, "", "", `"m"`},
		{"unguarded duplicates pass", `{"x":1,"x":2,"X":3,"model":"m"}`, "", "", `"m"`},
		{"nested keys not guarded", `{"model":"m","o":{"model":1,"Model":2}}`, "", "", `"m"`},
		{"duplicate", `{"model":"a","model":"b"}`, CodeDuplicateKey, "model", ""},
		{"case variant after", `{"max_tokens":500,"Max_tokens":1}`, CodeDuplicateKey, "max_tokens", ""},
		{"case variant alone", `{"MODEL":"m"}`, CodeDuplicateKey, "model", ""},
		{"escaped duplicate", `{"model":"a","\u006dodel":"b"}`, CodeDuplicateKey, "model", ""},
		{"escaped variant", `{"\u004dodel":"b"}`, CodeDuplicateKey, "model", ""},
		{"long s folds to s", `{"ſtream":true}`, CodeDuplicateKey, "stream", ""},
		{"kelvin folds to k", `{"max_to\u212aens":1}`, CodeDuplicateKey, "max_tokens", ""},
		{"kelvin raw", "{\"max_to\u212aens\":1}", CodeDuplicateKey, "max_tokens", ""},
		{"single letter", `{"N":2}`, CodeDuplicateKey, "n", ""},
		{"empty", ``, CodeInvalidJSON, "", ""},
		{"array", `[{"model":"m"}]`, CodeInvalidJSON, "", ""},
		{"string", `"model"`, CodeInvalidJSON, "", ""},
		{"null", `null`, CodeInvalidJSON, "", ""},
		{"trailing object", `{"model":"a"}{"model":"b"}`, CodeInvalidJSON, "", ""},
		{"trailing garbage", `{"model":"a"} x`, CodeInvalidJSON, "", ""},
		{"unterminated", `{"model":"a"`, CodeInvalidJSON, "", ""},
		{"trailing comma", `{"model":"a",}`, CodeInvalidJSON, "", ""},
		{"bad utf8 key", "{\"mod\xffel\":1}", CodeInvalidJSON, "", ""},
		{"bad utf8 value", "{\"model\":\"m\xc3\"}", CodeInvalidJSON, "", ""},
		{"utf16 surrogate as utf8", "{\"a\":\"\xed\xa0\x80\"}", CodeInvalidJSON, "", ""},
		{"control char", "{\"model\":\"a\nb\"}", CodeInvalidJSON, "", ""},
		{"bad escape", `{"model":"\x"}`, CodeInvalidJSON, "", ""},
		{"bad number", `{"n":01}`, CodeInvalidJSON, "", ""},
		{"NaN", `{"n":NaN}`, CodeInvalidJSON, "", ""},
		{"single quotes", `{'model':'m'}`, CodeInvalidJSON, "", ""},
		{"deep", `{"a":` + strings.Repeat("[", MaxDepth) + strings.Repeat("]", MaxDepth) + `}`, CodeInvalidJSON, "", ""},
		{"deep ok", `{"a":` + strings.Repeat("[", MaxDepth-1) + strings.Repeat("]", MaxDepth-1) + `}`, "", "", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			vals := make([][]byte, 4)
			err := testSet.Scan([]byte(tt.body), vals)
			if tt.code == "" {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				if string(vals[0]) != tt.model {
					t.Fatalf("model = %q, want %q", vals[0], tt.model)
				}
				return
			}
			var e *Error
			if !errors.As(err, &e) {
				t.Fatalf("err = %v, want code %s", err, tt.code)
			}
			if e.Code != tt.code || e.Key != tt.key {
				t.Fatalf("code %q key %q (%v), want %q %q", e.Code, e.Key, e, tt.code, tt.key)
			}
			if e.Error() == "" {
				t.Fatal("empty message")
			}
		})
	}
}

// TestValidAgreesWithEncodingJSON: on well-formed UTF-8 the scanner and
// encoding/json accept the same documents.
func TestValidAgreesWithEncodingJSON(t *testing.T) {
	for _, s := range []string{`1`, `-0.5e+3`, `"a\u00e9\"b"`, `[1,2,{"a":[]}]`, `true`, ` null `,
		`01`, `1.`, `.5`, `-`, `1e`, `[1,]`, `{"a"}`, `{"a":1,}`, `"\u12"`, `tru`, `[`, `{}x`} {
		if got, want := Valid([]byte(s)), json.Valid([]byte(s)); got != want {
			t.Errorf("Valid(%q) = %v, encoding/json says %v", s, got, want)
		}
	}
}

func TestMembersStops(t *testing.T) {
	stop := errors.New("stop")
	var names []string
	err := Members([]byte(`{"a":1,"b":2,"c":3}`), func(name, _ []byte) error {
		names = append(names, string(name))
		if string(name) == "b" {
			return stop
		}
		return nil
	})
	if err != stop || strings.Join(names, ",") != "a,b" {
		t.Fatalf("err %v, names %v", err, names)
	}
}

func TestNewSetRejectsFoldedDuplicates(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Fatal("no panic")
		}
	}()
	NewSet("model", "Model")
}

// TestElements: each element's raw value, in order; what is not exactly
// one array, or not valid JSON by Members' rules, is refused; fn's error
// stops the scan.
func TestElements(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want []string
		ok   bool
	}{
		{`[]`, nil, true},
		{` [ 1 , "a\"b" ,{"x":[null]}, [true] ] `, []string{`1`, `"a\"b"`, `{"x":[null]}`, `[true]`}, true},
		{`[1,]`, []string{`1`}, false},
		{`[1] [2]`, []string{`1`}, false},
		{`{"a":1}`, nil, false},
		{`["\xff"]`, nil, false},
		{`[1`, []string{`1`}, false},
		{``, nil, false},
	} {
		var got []string
		err := Elements([]byte(tc.in), func(v []byte) error { got = append(got, string(v)); return nil })
		if (err == nil) != tc.ok || !slices.Equal(got, tc.want) {
			t.Errorf("%q: %q, %v; want %q, ok %v", tc.in, got, err, tc.want, tc.ok)
		}
	}
	stop := errors.New("stop")
	n := 0
	if err := Elements([]byte(`[1,2,3]`), func([]byte) error { n++; return stop }); err != stop || n != 1 {
		t.Errorf("fn's error: %v after %d elements", err, n)
	}
}
