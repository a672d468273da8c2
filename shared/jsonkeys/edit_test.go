package jsonkeys

import (
	"encoding/json"
	"testing"
)

func TestOffset(t *testing.T) {
	data := []byte(`{"model":"m","n":2}`)
	var vals [4][]byte
	if err := testSet.Scan(data, vals[:]); err != nil {
		t.Fatal(err)
	}
	if got := Offset(data, vals[0]); got != 9 || string(data[got:got+len(vals[0])]) != `"m"` {
		t.Errorf("model at %d", got)
	}
	if got := Offset(data, vals[3]); got != 17 {
		t.Errorf("n at %d", got)
	}
	other := []byte(`"m"`)
	if Offset(data, other) != -1 || Offset(data, nil) != -1 || Offset(data, data[3:3]) != -1 {
		t.Error("a slice of other bytes, or an empty one, has an offset")
	}
}

func TestRemove(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{`{"a":1,"usage":{"x":2},"b":3}`, `{"a":1,"b":3}`},
		{`{"a":1,"usage":{"x":2}}`, `{"a":1}`},
		{`{"usage":{"x":2},"b":3}`, `{"b":3}`},
		{`{"usage":null}`, `{}`},
		{"{ \"a\" : [1] ,\n \"usage\" : {} \n}", "{ \"a\" : [1] \n}"},
		{` { "usage" : 1 , "b" : "\"usage\"" } `, ` { "b" : "\"usage\"" } `},
		{`{"a\"usage":1,"usage":2}`, `{"a\"usage":1}`},
		{`{"u\u0073age":2,"b":1}`, `{"b":1}`},                          // the name unescaped
		{`{"o":{"usage":1},"Usage":2}`, `{"o":{"usage":1},"Usage":2}`}, // nested or another case: kept
	} {
		out, found := Remove([]byte(tc.in), "usage")
		if string(out) != tc.want || found != (tc.in != tc.want) {
			t.Errorf("Remove(%s) = %s %v, want %s", tc.in, out, found, tc.want)
		}
		if !json.Valid(out) {
			t.Errorf("Remove(%s) = %s: not JSON", tc.in, out)
		}
	}
	if out, found := Remove([]byte(`{"usage":1`), "usage"); found || string(out) != `{"usage":1` {
		t.Error("an invalid object was changed")
	}
}

func FuzzRemove(f *testing.F) {
	f.Add([]byte(`{"a":1,"usage":{"x":2},"b":3}`))
	f.Add([]byte(` {"usage":null} `))
	f.Fuzz(func(t *testing.T, data []byte) {
		out, found := Remove(data, "usage")
		if !found {
			return
		}
		// The result is an object without the member and with every other
		// member as it was.
		var before, after map[string]json.RawMessage
		if json.Unmarshal(data, &before) != nil {
			return // encoding/json is stricter on some inputs (duplicates are fine)
		}
		if err := json.Unmarshal(out, &after); err != nil {
			t.Fatalf("Remove(%q) = %q: %v", data, out, err)
		}
		if _, ok := after["usage"]; ok && countName(data, "usage") == 1 {
			t.Fatalf("Remove(%q) = %q keeps usage", data, out)
		}
	})
}

func countName(data []byte, name string) int {
	n := 0
	_ = Members(data, func(k, _ []byte) error {
		if string(k) == name {
			n++
		}
		return nil
	})
	return n
}
