package openai

import (
	"bufio"
	"bytes"
	"encoding/json"
	"io"
	"strings"
	"testing"
	"testing/iotest"
)

func TestWithIncludeUsage(t *testing.T) {
	for _, tc := range []struct{ name, in, want string }{
		{"no stream_options", `{"model":"m","stream":true}`, `{"model":"m","stream":true,"stream_options":{"include_usage":true}}`},
		{"no stream_options, spaced", "{ \"model\" : \"m\" ,\n \"stream\" : true \n} \n", "{ \"model\" : \"m\" ,\n \"stream\" : true,\"stream_options\":{\"include_usage\":true} \n} \n"},
		{"stream_options null", `{"stream":true,"stream_options":null,"model":"m"}`, `{"stream":true,"stream_options":{"include_usage":true},"model":"m"}`},
		{"stream_options empty", `{"stream":true,"stream_options":{ }}`, `{"stream":true,"stream_options":{"include_usage":true }}`},
		{"other options kept", `{"stream":true,"stream_options":{"continuous_usage_stats":false} ,"n":1}`, `{"stream":true,"stream_options":{"continuous_usage_stats":false,"include_usage":true} ,"n":1}`},
		{"include_usage false", `{"stream":true,"stream_options":{"include_usage":false,"x":1}}`, `{"stream":true,"stream_options":{"include_usage":true,"x":1}}`},
		{"include_usage null", `{"stream":true,"stream_options":{"x":1, "include_usage" : null}}`, `{"stream":true,"stream_options":{"x":1, "include_usage" : true}}`},
		{"include_usage true", `{"stream":true,"stream_options":{"include_usage":true}}`, `{"stream":true,"stream_options":{"include_usage":true}}`},
		{"not streamed", `{"model":"m"}`, `{"model":"m"}`},
		{"text around kept", `{"model":"m","stream":true,"messages":[{"role":"user","content":"日本語 ✓ émoji 🎉 <b>&amp;</b> \u00e9\n"}]}`,
			`{"model":"m","stream":true,"messages":[{"role":"user","content":"日本語 ✓ émoji 🎉 <b>&amp;</b> \u00e9\n"}],"stream_options":{"include_usage":true}}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			body := []byte(tc.in)
			r, err := ParseRequest(body)
			if err != nil {
				t.Fatal(err)
			}
			sp, changed, err := r.IncludeUsage(body)
			if err != nil {
				t.Fatal(err)
			}
			out := body
			if changed {
				out = sp.Apply(body)
				rd, _ := io.ReadAll(sp.Reader(body))
				if !bytes.Equal(rd, out) || sp.Len(body) != len(out) {
					t.Fatalf("Reader %q, Len %d; Apply %q", rd, sp.Len(body), out)
				}
			}
			if string(out) != tc.want || changed != (tc.in != tc.want) {
				t.Fatalf("got  %s (%v)\nwant %s", out, changed, tc.want)
			}
			r2, err := ParseRequest(out)
			if err != nil {
				t.Fatalf("result does not parse: %v", err)
			}
			if r.Stream && (r2.StreamOptions == nil || !r2.StreamOptions.IncludeUsage) {
				t.Fatal("include_usage not set")
			}
			if !bytes.Equal(r2.Messages, r.Messages) {
				t.Fatal("messages changed")
			}
			if string(body) != tc.in {
				t.Fatal("the input was modified")
			}
		})
	}
	// A body other than the one parsed is refused.
	for _, in := range []string{`{"stream":true}`, `{"stream":true,"stream_options":{}}`} {
		r, _ := ParseRequest([]byte(in))
		if _, ok, err := r.IncludeUsage([]byte(in)); ok || err == nil {
			t.Errorf("another body: %v %v", ok, err)
		}
	}
}

// FuzzWithIncludeUsage: for any body ParseRequest accepts, the result
// parses, asks for usage, and equals the input with only the member's
// bytes added or the value's bytes replaced.
func FuzzWithIncludeUsage(f *testing.F) {
	for _, s := range []string{
		`{"model":"m","stream":true}`,
		`{"stream":true,"stream_options":null}`,
		`{"stream":true,"stream_options":{"include_usage":false}}`,
		`{"stream":true,"stream_options":{"a":[1,{}]} }`,
		" {\"stream\" :true\t}\r\n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		r, err := ParseRequest(body)
		if err != nil {
			return
		}
		sp, changed, err := r.IncludeUsage(body)
		if err != nil {
			t.Fatalf("refused its own body %q: %v", body, err)
		}
		if !changed {
			return
		}
		out := sp.Apply(body)
		r2, err := ParseRequest(out)
		if err != nil {
			t.Fatalf("%q → %q: %v", body, out, err)
		}
		if r2.StreamOptions == nil || !r2.StreamOptions.IncludeUsage || r2.Model != r.Model || !bytes.Equal(r2.Messages, r.Messages) {
			t.Fatalf("%q → %q", body, out)
		}
		var a, b map[string]json.RawMessage
		if json.Unmarshal(body, &a) == nil && json.Unmarshal(out, &b) == nil {
			for k, v := range a {
				if k != "stream_options" && !bytes.Equal(v, b[k]) {
					t.Fatalf("%s changed: %s → %s", k, v, b[k])
				}
			}
		}
		// Only bytes were added or false/null replaced: the common prefix
		// and suffix cover everything but the edit.
		p := 0
		for p < len(body) && p < len(out) && body[p] == out[p] {
			p++
		}
		s := 0
		for s < len(body)-p && s < len(out)-p && body[len(body)-1-s] == out[len(out)-1-s] {
			s++
		}
		removed, added := string(body[p:len(body)-s]), string(out[p:len(out)-s])
		if len(removed) > len("false") || strings.Count(added, "include_usage") > 1 {
			t.Fatalf("edit %q → %q", removed, added)
		}
	})
}

// body32K is a streamed chat request of about 32 KiB without
// stream_options, mostly message text, some of it non-ASCII or <>&.
func body32K() []byte {
	var b strings.Builder
	b.WriteString(`{"model":"llama","stream":true,"max_tokens":256,"messages":[`)
	para := strings.Repeat(`The quick brown fox jumps over the <lazy> dog & \"twice\" — déjà vu.\n `, 16)
	for i := 0; b.Len() < 32<<10; i++ {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(`{"role":"user","content":"` + para + `"}`)
	}
	b.WriteString(`],"temperature":0.7}`)
	return []byte(b.String())
}

// reencodeIncludeUsage is how Tier 2 used to set include_usage: decode
// the body into a map and encode it again. Kept here as the baseline of
// BenchmarkIncludeUsage32K.
func reencodeIncludeUsage(body []byte) ([]byte, error) {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(body, &m); err != nil {
		return nil, err
	}
	so := map[string]json.RawMessage{}
	if raw, ok := m["stream_options"]; ok && !bytes.Equal(bytes.TrimSpace(raw), []byte("null")) {
		if err := json.Unmarshal(raw, &so); err != nil {
			return nil, err
		}
	}
	so["include_usage"] = json.RawMessage("true")
	raw, err := json.Marshal(so)
	if err != nil {
		return nil, err
	}
	m["stream_options"] = raw
	return json.Marshal(m)
}

// BenchmarkIncludeUsage32K: setting include_usage on a 32 KiB body.
// splice is IncludeUsage alone (the gateway parses the body anyway) and
// the reader the transport sends;
// scan+splice adds ParseRequest; reencode is the old map decode and
// encode, which also changed the prompt's bytes (<>& escaped, whitespace
// dropped, keys reordered).
//
//	go test -run '^$' -bench IncludeUsage ./shared/openai
func BenchmarkIncludeUsage32K(b *testing.B) {
	body := body32K()
	b.Run("splice", func(b *testing.B) {
		r, err := ParseRequest(body)
		if err != nil {
			b.Fatal(err)
		}
		b.SetBytes(int64(len(body)))
		b.ReportAllocs()
		for b.Loop() {
			sp, ok, err := r.IncludeUsage(body)
			if !ok || err != nil {
				b.Fatal("not set")
			}
			if sp.Reader(body) == nil {
				b.Fatal("no reader")
			}
		}
	})
	b.Run("scan+splice", func(b *testing.B) {
		b.SetBytes(int64(len(body)))
		b.ReportAllocs()
		for b.Loop() {
			r, err := ParseRequest(body)
			if err != nil {
				b.Fatal(err)
			}
			sp, ok, err := r.IncludeUsage(body)
			if !ok || err != nil {
				b.Fatal("not set")
			}
			if sp.Reader(body) == nil {
				b.Fatal("no reader")
			}
		}
	})
	b.Run("reencode", func(b *testing.B) {
		b.SetBytes(int64(len(body)))
		b.ReportAllocs()
		for b.Loop() {
			if _, err := reencodeIncludeUsage(body); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// The old re-encode changed the prompt's bytes; the splice does not.
func TestIncludeUsageKeepsPrompt(t *testing.T) {
	body := body32K()
	r, _ := ParseRequest(body)
	sp, _, _ := r.IncludeUsage(body)
	r2, _ := ParseRequest(sp.Apply(body))
	if !bytes.Equal(r2.Messages, r.Messages) {
		t.Fatal("splice changed the messages")
	}
	old, _ := reencodeIncludeUsage(body)
	r3, _ := ParseRequest(old)
	if bytes.Equal(r3.Messages, r.Messages) {
		t.Fatal("the baseline re-encode is expected to change the messages' bytes")
	}
}

// TestSpliceReader reads an edit every way net/http may: Read with small
// and large buffers (testing/iotest checks the io.Reader contract), and
// WriteTo, also after part of it was read, and through the LimitReader
// plus trailing copy net/http uses for a request body.
func TestSpliceReader(t *testing.T) {
	body := []byte(`{"model":"m","stream":true,"messages":[{"role":"user","content":"hi <&>"}]}`)
	for _, sp := range []Splice{
		{Off: len(body) - 1, Insert: streamOptionsNext},
		{Off: 0, N: 1, Insert: []byte("{ ")},
		{Off: len(body), Insert: []byte(" ")},
		{Off: 10, N: 5},
	} {
		want := sp.Apply(body)
		if err := iotest.TestReader(sp.Reader(body), want); err != nil {
			t.Errorf("%+v: %v", sp, err)
		}
		for _, head := range []int{0, 1, 7, len(want)} {
			r := sp.Reader(body)
			got := make([]byte, head)
			if _, err := io.ReadFull(r, got); err != nil {
				t.Fatal(err)
			}
			var rest bytes.Buffer
			n, err := r.(io.WriterTo).WriteTo(&rest)
			if err != nil || int(n) != rest.Len() || !bytes.Equal(append(got, rest.Bytes()...), want) {
				t.Errorf("%+v, WriteTo after %d bytes: %q (%d, %v), want %q", sp, head, append(got, rest.Bytes()...), n, err, want)
			}
		}
		r := sp.Reader(body)
		var out bytes.Buffer
		n, err := io.Copy(&out, io.LimitReader(r, int64(sp.Len(body))))
		if extra, err2 := io.Copy(io.Discard, r); err != nil || err2 != nil || extra != 0 || n != int64(len(want)) || !bytes.Equal(out.Bytes(), want) {
			t.Errorf("%+v: copied %q (%d, %v), then %d more (%v)", sp, out.Bytes(), n, err, extra, err2)
		}
	}
}

// BenchmarkSpliceSend copies an edited 32 KB body as net/http sends a
// request body: through an io.LimitReader of its length, then once more
// to check that nothing is left (where io.MultiReader allocated 32 KB).
func BenchmarkSpliceSend(b *testing.B) {
	body := body32K()
	r, err := ParseRequest(body)
	if err != nil {
		b.Fatal(err)
	}
	sp, _, err := r.IncludeUsage(body)
	if err != nil {
		b.Fatal(err)
	}
	dst := bufio.NewWriterSize(io.Discard, 4096)
	b.SetBytes(int64(sp.Len(body)))
	b.ReportAllocs()
	for b.Loop() {
		rd := sp.Reader(body)
		if _, err := io.Copy(dst, io.LimitReader(rd, int64(sp.Len(body)))); err != nil {
			b.Fatal(err)
		}
		if _, err := io.Copy(io.Discard, rd); err != nil {
			b.Fatal(err)
		}
	}
}

// TestSpliceEdit checks Edit against Apply for every kind of edit
// IncludeUsage makes, in place (spare capacity) and not.
func TestSpliceEdit(t *testing.T) {
	bodies := []string{
		`{"model":"m","stream":true}`,
		`{"model":"m","stream":true,"stream_options":null}`,
		`{"model":"m","stream":true,"stream_options":{}}`,
		`{"model":"m","stream":true,"stream_options":{"include_usage":false}, "n":1}`,
		`{"model":"m","stream":true,"stream_options":{"x":1}} `,
		`{"stream":true}`,
	}
	for _, b := range bodies {
		body := []byte(b)
		r, err := ParseRequest(body)
		if err != nil {
			t.Fatal(err)
		}
		sp, changed, err := r.IncludeUsage(body)
		if err != nil || !changed {
			t.Fatalf("%s: changed %v, %v", b, changed, err)
		}
		want := sp.Apply([]byte(b))
		if sp.Len([]byte(b))-len(b) > MaxSpliceGrowth {
			t.Errorf("%s: grows by %d, over MaxSpliceGrowth %d", b, sp.Len([]byte(b))-len(b), MaxSpliceGrowth)
		}
		roomy := make([]byte, len(b), len(b)+MaxSpliceGrowth)
		copy(roomy, b)
		got := sp.Edit(roomy)
		if !bytes.Equal(got, want) || &got[0] != &roomy[0] {
			t.Errorf("%s: in place %q (same array %v), want %q", b, got, &got[0] == &roomy[0], want)
		}
		// Without spare capacity a body that grows is copied, untouched.
		tight := []byte(b)[:len(b):len(b)]
		got = sp.Edit(tight)
		grows := len(want) > len(b)
		if !bytes.Equal(got, want) || (grows && string(tight) != b) {
			t.Errorf("%s: no room %q, body now %q; want %q (body untouched: %v)", b, got, tight, want, grows)
		}
	}
}
