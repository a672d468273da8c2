package tokenize

import (
	"encoding/json"
	"errors"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/dlclark/regexp2/v2"
)

// tinyVocab builds a byte-level tokenizer.json: ids 0-255 are the bytes,
// then one id per merge result in order. Options change fields.
type tinyVocab struct {
	merges       [][2]string // in byte-level characters ("Ġ" for a space)
	arrayForm    bool
	ignoreMerges bool
	extraVocab   []string
	added        []map[string]any
	normalizer   any
	preTokenizer any
	post         any
	edit         func(map[string]any)
}

func (v tinyVocab) json(t testing.TB) []byte {
	t.Helper()
	vocab := map[string]int{}
	for b := range 256 {
		vocab[string(byteLevelRunes[b])] = b
	}
	add := func(s string) {
		if _, ok := vocab[s]; !ok {
			vocab[s] = len(vocab)
		}
	}
	var merges []any
	for _, m := range v.merges {
		add(m[0] + m[1])
		if v.arrayForm {
			merges = append(merges, []string{m[0], m[1]})
		} else {
			merges = append(merges, m[0]+" "+m[1])
		}
	}
	for _, s := range v.extraVocab {
		add(s)
	}
	pre := v.preTokenizer
	if pre == nil {
		pre = map[string]any{"type": "Sequence", "pretokenizers": []any{
			map[string]any{"type": "Split", "pattern": map[string]any{"Regex": llama3Pattern}, "behavior": "Isolated", "invert": false},
			map[string]any{"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": false},
		}}
	}
	f := map[string]any{
		"version":        "1.0",
		"added_tokens":   v.added,
		"normalizer":     v.normalizer,
		"pre_tokenizer":  pre,
		"post_processor": v.post,
		"model": map[string]any{
			"type": "BPE", "dropout": nil, "unk_token": nil, "continuing_subword_prefix": nil,
			"end_of_word_suffix": nil, "fuse_unk": false, "byte_fallback": false,
			"ignore_merges": v.ignoreMerges, "vocab": vocab, "merges": merges,
		},
	}
	if v.edit != nil {
		v.edit(f)
	}
	data, err := json.Marshal(f)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

func (v tinyVocab) parse(t *testing.T) *Tokenizer {
	t.Helper()
	tok, err := Parse(v.json(t))
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// ids names the expected tokens by their text.
func ids(t *testing.T, tok *Tokenizer, texts ...string) []uint32 {
	t.Helper()
	var out []uint32
	for _, s := range texts {
		id, ok := tok.model.vocab[s]
		if !ok {
			for _, a := range []*addedMatcher{tok.rawAdded, tok.normAdded} {
				if a == nil {
					continue
				}
				for _, c := range a.first {
					for _, at := range c {
						if at.content == s {
							id, ok = at.id, true
						}
					}
				}
			}
		}
		if !ok {
			t.Fatalf("%q is not a token", s)
		}
		out = append(out, id)
	}
	return out
}

var helloMerges = [][2]string{{"h", "e"}, {"l", "l"}, {"he", "ll"}, {"hell", "o"}, {"Ġ", "w"}, {"Ġw", "o"}}

func TestEncodeMerges(t *testing.T) {
	for _, array := range []bool{false, true} {
		tok := tinyVocab{merges: helloMerges, arrayForm: array}.parse(t)
		for _, tc := range []struct {
			text string
			want []string
		}{
			{"hello", []string{"hello"}},
			{"hello wo", []string{"hello", " wo"}},
			{"hell", []string{"hell"}},
			{"helo", []string{"he", "l", "o"}},
			{"", nil},
			{"h\u00e9", []string{"h", "\xc3", "\xa9"}}, // bytes of é
		} {
			got := tok.Encode(tc.text, false)
			if want := ids(t, tok, tc.want...); !slices.Equal(got, want) {
				t.Errorf("array form %v: Encode(%q) = %v, want %v %q", array, tc.text, got, want, tc.want)
			}
		}
	}
}

func TestMergeOrder(t *testing.T) {
	// Lowest rank first; among equal ranks the leftmost pair.
	tok := tinyVocab{merges: [][2]string{{"a", "a"}, {"b", "c"}, {"ab", "c"}, {"a", "b"}}}.parse(t)
	for text, want := range map[string][]string{
		"aaa":  {"aa", "a"},
		"aaaa": {"aa", "aa"},
		"abc":  {"a", "bc"}, // b+c (rank 1) before a+b (rank 3)
	} {
		if got := tok.Encode(text, false); !slices.Equal(got, ids(t, tok, want...)) {
			t.Errorf("Encode(%q) = %v, want %q", text, got, want)
		}
	}
}

func TestIgnoreMerges(t *testing.T) {
	// "hlo" is in the vocabulary but no merge makes it.
	for _, ignore := range []bool{false, true} {
		tok := tinyVocab{merges: helloMerges, ignoreMerges: ignore, extraVocab: []string{"hlo"}}.parse(t)
		want := []string{"h", "l", "o"}
		if ignore {
			want = []string{"hlo"}
		}
		if got := tok.Encode("hlo", false); !slices.Equal(got, ids(t, tok, want...)) {
			t.Errorf("ignore_merges %v: %v, want %q", ignore, got, want)
		}
	}
}

// TestHeapMatchesScan: the two merge loops agree on random words.
func TestHeapMatchesScan(t *testing.T) {
	merges := [][2]string{{"a", "b"}, {"b", "a"}, {"a", "a"}, {"ab", "a"}, {"b", "b"}, {"ab", "ab"}, {"ba", "b"}, {"aa", "b"}, {"abab", "a"}, {"c", "a"}, {"ca", "b"}}
	tok := tinyVocab{merges: merges}.parse(t)
	tok.model.cache = nil
	r := rand.New(rand.NewPCG(1, 2))
	for range 3000 {
		n := 2 + r.IntN(heapThreshold-1)
		b := make([]byte, n)
		for i := range b {
			b[i] = "abc"[r.IntN(3)]
		}
		s := string(b)
		scan := tok.model.encode(nil, s)
		heap := tok.model.encodeHeap(nil, s)
		if !slices.Equal(scan, heap) {
			t.Fatalf("%q: scan %v, heap %v", s, scan, heap)
		}
	}
}

// TestScannerMatchesRegexp: the hand-written pre-tokenizer splits as
// regexp2 does with the same patterns, on random text from a pool chosen
// to hit every alternative's edges.
func TestScannerMatchesRegexp(t *testing.T) {
	pool := []string{"a", "Z", "é", "ß", "日", "ا", "\u0301", "1", "٣", "½", "Ⅻ", "²", " ", "  ", "\t", "\n", "\r", "\r\n",
		"\u00a0", "\u3000", "\u2028", "\u0085", "\ufeff", "\x1c", "\v", "'", "'s", "'S", "'t", "'re", "'RE", "'ve", "'m", "'ll",
		"'Ll", "'d", "'x", "'ſ", ".", "!", "😀", "\u200d", "-", "_", "\x00", "\xff"}
	r := rand.New(rand.NewPCG(3, 4))
	for _, pattern := range []string{llama3Pattern, qwen2Pattern} {
		scanner, err := newRegexSplit(pattern, true)
		if err != nil {
			t.Fatal(err)
		}
		if _, ok := scanner.(patternScanner); !ok {
			t.Fatalf("pattern %q did not get the scanner", pattern)
		}
		re := regexSplit{re: regexp2.MustCompile(pattern, regexp2.None), isolated: true}
		for range 20000 {
			var b strings.Builder
			for range 1 + r.IntN(12) {
				b.WriteString(pool[r.IntN(len(pool))])
			}
			s := b.String()
			var got, want []string
			scanner.split(s, func(p string) { got = append(got, p) })
			re.split(s, func(p string) { want = append(want, p) })
			if !slices.Equal(got, want) {
				t.Fatalf("%q:\nscanner %q\nregexp2 %q", s, got, want)
			}
		}
	}
}

// TestCharClasses: the scanner's \p{L}, \p{N} and \s are regexp2's, for
// every character of the first two planes.
func TestCharClasses(t *testing.T) {
	if testing.Short() {
		t.Skip("131,072 characters")
	}
	letter, number, space := regexp2.MustCompile(`^\p{L}$`, regexp2.None), regexp2.MustCompile(`^\p{N}$`, regexp2.None), regexp2.MustCompile(`^\s$`, regexp2.None)
	for r := rune(0); r < 0x20000; r++ {
		if r >= 0xd800 && r <= 0xdfff {
			continue
		}
		s := string(r)
		want := uint8(classOther)
		if ok, _ := letter.MatchString(s); ok {
			want = classLetter
		} else if ok, _ := number.MatchString(s); ok {
			want = classNumber
		} else if ok, _ := space.MatchString(s); ok {
			want = classSpace
		}
		if got := classOf(r); got != want {
			t.Fatalf("U+%04X: scanner class %d, regexp2 %d", r, got, want)
		}
	}
}

func TestAddedTokens(t *testing.T) {
	tok := tinyVocab{merges: helloMerges, added: []map[string]any{
		{"id": 1000, "content": "<a>", "special": true},
		{"id": 1001, "content": "<a><b>", "special": true},
		{"id": 1002, "content": "[L]", "lstrip": true},
		{"id": 1003, "content": "[R]", "rstrip": true},
		{"id": 1004, "content": "wo", "single_word": true},
		{"id": 1005, "content": "é", "normalized": true},
	}, normalizer: map[string]any{"type": "NFC"}}.parse(t)
	for _, tc := range []struct {
		text string
		want []string
	}{
		{"<a><b>", []string{"<a><b>"}}, // longest at the leftmost position
		{"x<a><c>", []string{"x", "<a>", "<", "c", ">"}},
		{"hello  [L]x", []string{"hello", "[L]", "x"}}, // lstrip takes the spaces before
		{"x[R]  hello", []string{"x", "[R]", "hello"}}, // rstrip those after
		{"wo two wo", []string{"wo", " two ", "wo"}},   // single_word: not inside "two"
		{"e\u0301", []string{"é"}},                     // normalized: matched after NFC
	} {
		var want []uint32
		for _, w := range tc.want {
			if w == "wo" || w == "é" {
				want = append(want, ids(t, tok, w)...)
				continue
			}
			want = append(want, tok.Encode(w, false)...)
		}
		if got := tok.Encode(tc.text, false); !slices.Equal(got, want) {
			t.Errorf("Encode(%q) = %v, want %v (%q)", tc.text, got, want, tc.want)
		}
	}
}

func TestPostProcessor(t *testing.T) {
	post := map[string]any{"type": "Sequence", "processors": []any{
		map[string]any{"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": false, "use_regex": true},
		map[string]any{"type": "TemplateProcessing",
			"single":         []any{map[string]any{"SpecialToken": map[string]any{"id": "<s>", "type_id": 0}}, map[string]any{"Sequence": map[string]any{"id": "A", "type_id": 0}}},
			"special_tokens": map[string]any{"<s>": map[string]any{"id": "<s>", "ids": []int{1000}, "tokens": []string{"<s>"}}}},
	}}
	tok := tinyVocab{merges: helloMerges, post: post, added: []map[string]any{{"id": 1000, "content": "<s>", "special": true}}}.parse(t)
	if got := tok.Encode("hello", true); !slices.Equal(got, ids(t, tok, "<s>", "hello")) {
		t.Errorf("with special tokens: %v", got)
	}
	if got := tok.Encode("hello", false); !slices.Equal(got, ids(t, tok, "hello")) {
		t.Errorf("without: %v", got)
	}
	if got := tok.Encode("<s>hello", false); !slices.Equal(got, ids(t, tok, "<s>", "hello")) {
		t.Errorf("a special token in the text: %v", got)
	}
	s, err := tok.Decode(tok.Encode("<s>hello wo", true))
	if err != nil || s != "<s><s>hello wo" {
		t.Errorf("Decode = %q, %v", s, err)
	}
	if _, err := tok.Decode([]uint32{99999}); err == nil {
		t.Error("Decode of an unknown id: no error")
	}
}

// TestGPT2ByteLevel: a ByteLevel pre-tokenizer with use_regex splits on
// GPT-2's pattern (spaces go with the following word).
func TestGPT2ByteLevel(t *testing.T) {
	tok := tinyVocab{merges: helloMerges, preTokenizer: map[string]any{"type": "ByteLevel", "add_prefix_space": false, "use_regex": true}}.parse(t)
	if got := tok.Encode("hello wo", false); !slices.Equal(got, ids(t, tok, "hello", " wo")) {
		t.Errorf("got %v", got)
	}
}

func TestParseRefuses(t *testing.T) {
	model := func(k string, v any) func(map[string]any) {
		return func(f map[string]any) { f["model"].(map[string]any)[k] = v }
	}
	top := func(k string, v any) func(map[string]any) { return func(f map[string]any) { f[k] = v } }
	for _, tc := range []struct {
		edit func(map[string]any)
		want string
	}{
		{model("type", "WordPiece"), "model.type"},
		{model("byte_fallback", true), "model.byte_fallback"},
		{model("dropout", 0.1), "model.dropout"},
		{model("continuing_subword_prefix", "##"), "model.continuing_subword_prefix"},
		{model("merges", []string{"h zz"}), "model.merges"},
		{model("merges", 7), "model.merges"},
		{model("vocab", map[string]int{"a": 0}), "model.vocab"},
		{top("normalizer", map[string]any{"type": "Lowercase"}), "normalizer"},
		{top("pre_tokenizer", nil), "pre_tokenizer"},
		{top("pre_tokenizer", map[string]any{"type": "Metaspace"}), "pre_tokenizer"},
		{top("pre_tokenizer", map[string]any{"type": "Sequence", "pretokenizers": []any{
			map[string]any{"type": "Split", "pattern": map[string]any{"Regex": "x"}, "behavior": "MergedWithNext"},
			map[string]any{"type": "ByteLevel"}}}), "pretokenizers[0]: behavior"},
		{top("pre_tokenizer", map[string]any{"type": "ByteLevel", "add_prefix_space": true}), "add_prefix_space"},
		{top("post_processor", map[string]any{"type": "RobertaProcessing"}), "post_processor"},
		{top("added_tokens", []any{map[string]any{"content": "x"}}), "added_tokens"},
	} {
		_, err := Parse(tinyVocab{merges: helloMerges, edit: tc.edit}.json(t))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("want an error naming %q, got %v", tc.want, err)
		}
	}
	if _, err := Parse([]byte("{")); err == nil {
		t.Error("truncated JSON: no error")
	}
}

func writeFile(t *testing.T, dir, name, content string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

const tinyTemplate = `{{ bos_token }}{% for m in messages %}[{{ m.role }}]{{ m.content }}{% if m.name is defined %}({{ m.name }}){% endif %}{% endfor %}{% if add_generation_prompt %}[assistant]{% endif %}{% if extra %}+{{ extra }}{% endif %}`

func TestLoad(t *testing.T) {
	dir := t.TempDir()
	tj := writeFile(t, dir, "tokenizer.json", string(tinyVocab{merges: helloMerges}.json(t)))
	cfg := writeFile(t, dir, "tokenizer_config.json", `{"bos_token": {"content": "<s>", "special": true}, "eos_token": "</s>", "chat_template": [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "{{ bos_token }}D"}]}`)
	tmpl := writeFile(t, dir, "chat_template.jinja", tinyTemplate)
	bad := writeFile(t, dir, "bad.json", `{"model": {"type": "Unigram"}}`)
	badTmpl := writeFile(t, dir, "bad.jinja", `{% if %}`)
	badCfg := writeFile(t, dir, "bad_config.json", `{"chat_template": 5}`)

	tok, err := Load(Config{File: tj, ConfigFile: cfg})
	if err != nil {
		t.Fatal(err)
	}
	if s, err := tok.RenderChat(&ChatRequest{Messages: []Message{TextMessage("user", "hi")}}); err != nil || s != "<s>D" {
		t.Errorf("config_file's default template: %q, %v", s, err)
	}
	tok, err = Load(Config{File: tj, ConfigFile: cfg, ChatTemplateFile: tmpl})
	if err != nil {
		t.Fatal(err)
	}
	if s, _ := tok.RenderChat(&ChatRequest{Messages: []Message{TextMessage("user", "hi")}}); s != "<s>[user]hi[assistant]" {
		t.Errorf("chat_template_file wins: %q", s)
	}
	if tok, err := Load(Config{File: tj}); err != nil || tok.HasChatTemplate() {
		t.Errorf("no template: %v, %v", tok, err)
	}

	for _, tc := range []struct {
		c    Config
		want []string
	}{
		{Config{}, []string{"tokenizer.file", "required"}},
		{Config{File: filepath.Join(dir, "missing.json")}, []string{"tokenizer.file", "missing.json"}},
		{Config{File: bad}, []string{"tokenizer.file", bad, "model.type"}},
		{Config{File: tj, ConfigFile: bad + "x"}, []string{"tokenizer.config_file", "bad.jsonx"}},
		{Config{File: tj, ConfigFile: badCfg}, []string{"tokenizer.config_file", badCfg, "chat_template"}},
		{Config{File: tj, ChatTemplateFile: badTmpl}, []string{"tokenizer.chat_template_file", badTmpl}},
	} {
		_, err := Load(tc.c)
		for _, w := range tc.want {
			if err == nil || !strings.Contains(err.Error(), w) {
				t.Errorf("Load(%+v): want an error containing %q, got %v", tc.c, w, err)
			}
		}
	}
}

func TestRegistry(t *testing.T) {
	dir := t.TempDir()
	tj := writeFile(t, dir, "tokenizer.json", string(tinyVocab{merges: helloMerges}.json(t)))
	r, err := LoadRegistry(map[string]Config{"a": {File: tj}, "b": {File: tj}, "c": {}})
	if err != nil {
		t.Fatal(err)
	}
	a, err := r.Lookup("a")
	if err != nil {
		t.Fatal(err)
	}
	if b, _ := r.Lookup("b"); b != a {
		t.Error("two models with the same files loaded the tokenizer twice")
	}
	for _, model := range []string{"c", "unknown"} {
		if _, err := r.Lookup(model); !errors.Is(err, ErrNotConfigured) || !strings.Contains(err.Error(), model) {
			t.Errorf("Lookup(%q) = %v, want ErrNotConfigured naming the model", model, err)
		}
	}
	var none *Registry
	if _, err := none.Lookup("a"); !errors.Is(err, ErrNotConfigured) {
		t.Errorf("nil registry: %v", err)
	}
	if _, err := LoadRegistry(map[string]Config{"m1": {File: filepath.Join(dir, "nope.json")}}); err == nil || !strings.Contains(err.Error(), `model "m1"`) {
		t.Errorf("bad file: want an error naming the model, got %v", err)
	}
}

func TestRenderChat(t *testing.T) {
	tok := tinyVocab{merges: helloMerges}.parse(t)
	if _, err := tok.RenderChat(&ChatRequest{Messages: []Message{TextMessage("user", "x")}}); !errors.Is(err, ErrNoChatTemplate) {
		t.Errorf("no template: %v", err)
	}
	if err := tok.SetChatTemplate(tinyTemplate, map[string]string{"bos_token": "<s>"}); err != nil {
		t.Fatal(err)
	}
	no := false
	parts := json.RawMessage(`[{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]`)
	for _, tc := range []struct {
		name string
		body string
		want string
		err  error
	}{
		{"default adds the generation prompt", `{"messages": [{"role": "user", "content": "hi"}]}`, "<s>[user]hi[assistant]", nil},
		{"add_generation_prompt false", `{"messages": [{"role": "user", "content": "hi"}], "add_generation_prompt": false}`, "<s>[user]hi", nil},
		{"text parts joined by newlines", `{"messages": [{"role": "user", "content": ` + string(parts) + `}]}`, "<s>[user]a\nb[assistant]", nil},
		{"null content, name", `{"messages": [{"role": "assistant", "content": null, "name": "bot"}], "add_generation_prompt": false}`, "<s>[assistant](bot)", nil},
		{"kwargs", `{"messages": [{"role": "user", "content": "x"}], "chat_template_kwargs": {"extra": "E"}}`, "<s>[user]x[assistant]+E", nil},
		{"continue_final_message", `{"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "The answer is "}], "add_generation_prompt": false, "continue_final_message": true}`, "<s>[user]q[assistant]The answer is ", nil},
		{"image part", `{"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}`, "", ErrUnsupported},
		{"tools", `{"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]}`, "", ErrUnsupported},
		{"tool_calls", `{"messages": [{"role": "assistant", "tool_calls": [{"id": "1"}]}]}`, "", ErrUnsupported},
		{"per-request template", `{"messages": [{"role": "user", "content": "x"}], "chat_template": "{{ 1 }}"}`, "", ErrUnsupported},
	} {
		var req ChatRequest
		if err := json.Unmarshal([]byte(tc.body), &req); err != nil {
			t.Fatal(err)
		}
		got, err := tok.RenderChat(&req)
		if tc.err != nil {
			if !errors.Is(err, tc.err) {
				t.Errorf("%s: err = %v, want %v", tc.name, err, tc.err)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("%s: %q, %v; want %q", tc.name, got, err, tc.want)
		}
	}
	for name, req := range map[string]*ChatRequest{
		"both prompt flags": {Messages: []Message{TextMessage("user", "x")}, ContinueFinalMessage: true},
		"no messages":       {AddGenerationPrompt: &no},
		"content a number":  {Messages: []Message{{Role: "user", Content: json.RawMessage(`7`)}}},
	} {
		if _, err := tok.RenderChat(req); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
	// EncodeChat is the rendered prompt, encoded without special tokens.
	req := &ChatRequest{Messages: []Message{TextMessage("user", "hello")}, AddGenerationPrompt: &no}
	got, err := tok.EncodeChat(req)
	if want := tok.Encode("<s>[user]hello", false); err != nil || !slices.Equal(got, want) {
		t.Errorf("EncodeChat = %v, %v; want %v", got, err, want)
	}
}

// TestPartsContentTemplate: a template that loops over message content gets
// the content as a list of text parts (vLLM's "openai" content format).
func TestPartsContentTemplate(t *testing.T) {
	tok := tinyVocab{merges: helloMerges}.parse(t)
	src := `{% for m in messages %}{% for p in m.content %}<{{ p.type }}:{{ p.text }}>{% endfor %}{% endfor %}`
	if err := tok.SetChatTemplate(src, nil); err != nil {
		t.Fatal(err)
	}
	got, err := tok.RenderChat(&ChatRequest{Messages: []Message{TextMessage("user", "hi")}})
	if err != nil || got != "<text:hi>" {
		t.Errorf("got %q, %v", got, err)
	}
}

// TestConcurrentEncode: one Tokenizer from many goroutines (run with -race)
// gives each the same ids as alone; the piece cache is shared.
func TestConcurrentEncode(t *testing.T) {
	tok := tinyVocab{merges: helloMerges}.parse(t)
	texts := []string{"hello wo hello", "helo hell", "wo wo wo hello", strings.Repeat("hel", 60)}
	want := make([][]uint32, len(texts))
	for i, s := range texts {
		want[i] = tok.Encode(s, false)
	}
	done := make(chan error)
	for g := range 8 {
		go func() {
			for i := range 200 {
				k := (g + i) % len(texts)
				if got := tok.Encode(texts[k], false); !slices.Equal(got, want[k]) {
					done <- errors.New(texts[k])
					return
				}
			}
			done <- nil
		}()
	}
	for range 8 {
		if err := <-done; err != nil {
			t.Errorf("concurrent Encode(%q) differed", err)
		}
	}
}

func FuzzEncode(f *testing.F) {
	for _, s := range []string{"hello wo", "I'm  \n\n x", "日本 12345", "\xff\xfe"} {
		f.Add(s)
	}
	tok, err := Parse(tinyVocab{merges: helloMerges}.json(f))
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, s string) {
		// Byte-level BPE loses nothing, even of invalid UTF-8.
		back, err := tok.Decode(tok.Encode(s, false))
		if err != nil || back != s {
			t.Fatalf("Decode(Encode(%q)) = %q, %v", s, back, err)
		}
	})
}
