package tokenize

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"golang.org/x/text/unicode/norm"
)

// Tokenizer encodes text into token ids exactly as the Hugging Face
// tokenizers library does with the same tokenizer.json, and renders chat
// requests with the model's chat template. It is safe for concurrent use.
type Tokenizer struct {
	model bpe
	// Added tokens matched on the raw text, and on the normalized text.
	rawAdded, normAdded *addedMatcher
	normalize           func(string) string // nil: none
	pre                 []splitter          // applied in turn to every piece
	// Tokens the post-processor puts around the text when special tokens
	// are added (Llama's <|begin_of_text|>).
	prefix, suffix []uint32
	tokens         []string // id → raw bytes (added tokens: their content)

	chat *chatTemplate // nil: no chat template configured
}

// Parse builds a tokenizer from the contents of a tokenizer.json. Fields
// it cannot reproduce exactly are refused, naming the field.
func Parse(data []byte) (*Tokenizer, error) {
	var f struct {
		AddedTokens []struct {
			ID         *int64 `json:"id"`
			Content    string `json:"content"`
			SingleWord bool   `json:"single_word"`
			LStrip     bool   `json:"lstrip"`
			RStrip     bool   `json:"rstrip"`
			Normalized bool   `json:"normalized"`
		} `json:"added_tokens"`
		Normalizer    json.RawMessage `json:"normalizer"`
		PreTokenizer  json.RawMessage `json:"pre_tokenizer"`
		PostProcessor json.RawMessage `json:"post_processor"`
		Model         struct {
			Type                    string            `json:"type"`
			Vocab                   map[string]uint32 `json:"vocab"`
			Merges                  json.RawMessage   `json:"merges"`
			Dropout                 *float64          `json:"dropout"`
			ContinuingSubwordPrefix *string           `json:"continuing_subword_prefix"`
			EndOfWordSuffix         *string           `json:"end_of_word_suffix"`
			ByteFallback            bool              `json:"byte_fallback"`
			IgnoreMerges            bool              `json:"ignore_merges"`
		} `json:"model"`
	}
	if err := json.Unmarshal(data, &f); err != nil {
		return nil, fmt.Errorf("not a tokenizer.json: %w", err)
	}
	m := f.Model
	switch {
	case m.Type != "BPE":
		return nil, fmt.Errorf("model.type %q: only BPE is supported", m.Type)
	case len(m.Vocab) == 0:
		return nil, errors.New("model.vocab: empty")
	case m.Dropout != nil && *m.Dropout != 0:
		return nil, errors.New("model.dropout: BPE dropout is random; only null or 0 is supported")
	case m.ContinuingSubwordPrefix != nil && *m.ContinuingSubwordPrefix != "":
		return nil, errors.New("model.continuing_subword_prefix: only empty is supported")
	case m.EndOfWordSuffix != nil && *m.EndOfWordSuffix != "":
		return nil, errors.New("model.end_of_word_suffix: only empty is supported")
	case m.ByteFallback:
		return nil, errors.New("model.byte_fallback: only byte-level BPE (byte_fallback false) is supported")
	}

	t := &Tokenizer{}
	var err error
	if t.normalize, err = parseNormalizer(f.Normalizer); err != nil {
		return nil, fmt.Errorf("normalizer: %w", err)
	}
	if t.pre, err = parsePreTokenizer(f.PreTokenizer); err != nil {
		return nil, fmt.Errorf("pre_tokenizer: %w", err)
	}

	// The vocabulary, keyed by the raw bytes each entry stands for.
	inverse := make(map[rune]byte, 256)
	for b, r := range byteLevelRunes {
		inverse[r] = byte(b)
	}
	maxID := uint32(0)
	for _, id := range m.Vocab {
		maxID = max(maxID, id)
	}
	for _, a := range f.AddedTokens {
		if a.ID == nil || *a.ID < 0 || *a.ID > 1<<31 {
			return nil, fmt.Errorf("added_tokens: %q has no valid id", a.Content)
		}
		maxID = max(maxID, uint32(*a.ID))
	}
	t.tokens = make([]string, maxID+1)
	t.model.vocab = make(map[string]uint32, len(m.Vocab))
	t.model.ignoreMerges = m.IgnoreMerges
	t.model.cache = newPieceCache()
	for tok, id := range m.Vocab {
		raw, ok := byteLevelDecode(tok, inverse)
		if !ok {
			t.tokens[id] = tok
			continue
		}
		t.model.vocab[raw] = id
		t.tokens[id] = raw
	}
	for b := range 256 {
		id, ok := t.model.vocab[string([]byte{byte(b)})]
		if !ok {
			return nil, fmt.Errorf("model.vocab: no token for byte 0x%02x (%q); not a byte-level vocabulary", b, byteLevelRunes[b])
		}
		t.model.byteIDs[b] = id
	}
	if t.model.merges, err = parseMerges(m.Merges, m.Vocab); err != nil {
		return nil, fmt.Errorf("model.merges: %w", err)
	}

	var raw, normalized []*addedToken
	for _, a := range f.AddedTokens {
		if a.Content == "" {
			return nil, fmt.Errorf("added_tokens: id %d has empty content", *a.ID)
		}
		tok := &addedToken{id: uint32(*a.ID), content: a.Content, singleWord: a.SingleWord, lstrip: a.LStrip, rstrip: a.RStrip}
		t.tokens[tok.id] = a.Content
		if a.Normalized {
			// Matched on normalized text, so in normalized form.
			if t.normalize != nil {
				tok.content = t.normalize(tok.content)
			}
			normalized = append(normalized, tok)
		} else {
			raw = append(raw, tok)
		}
	}
	t.rawAdded, t.normAdded = newAddedMatcher(raw), newAddedMatcher(normalized)

	if t.prefix, t.suffix, err = parsePostProcessor(f.PostProcessor, func(content string) (uint32, bool) {
		for _, a := range f.AddedTokens {
			if a.Content == content {
				return uint32(*a.ID), true
			}
		}
		id, ok := m.Vocab[content]
		return id, ok
	}); err != nil {
		return nil, fmt.Errorf("post_processor: %w", err)
	}
	return t, nil
}

func parseMerges(data json.RawMessage, vocab map[string]uint32) (map[uint64]uint64, error) {
	var pairs [][2]string
	var lines []string
	if err := json.Unmarshal(data, &lines); err == nil {
		// The older form: "a b".
		pairs = make([][2]string, len(lines))
		for i, l := range lines {
			a, b, ok := strings.Cut(l, " ")
			if !ok {
				return nil, fmt.Errorf("entry %d %q: want two tokens separated by a space", i, l)
			}
			pairs[i] = [2]string{a, b}
		}
	} else if err := json.Unmarshal(data, &pairs); err != nil {
		return nil, errors.New(`want a list of "a b" strings or of ["a", "b"] pairs`)
	}
	merges := make(map[uint64]uint64, len(pairs))
	for rank, p := range pairs {
		a, okA := vocab[p[0]]
		b, okB := vocab[p[1]]
		id, okC := vocab[p[0]+p[1]]
		if !okA || !okB || !okC {
			return nil, fmt.Errorf("entry %d %q: token not in model.vocab", rank, p)
		}
		// A repeated pair takes the later rank, as the library's map does.
		merges[pairKey(a, b)] = uint64(rank)<<32 | uint64(id)
	}
	return merges, nil
}

type typed struct {
	Type string `json:"type"`
}

func isNull(data json.RawMessage) bool {
	return len(bytes.TrimSpace(data)) == 0 || string(bytes.TrimSpace(data)) == "null"
}

func parseNormalizer(data json.RawMessage) (func(string) string, error) {
	if isNull(data) {
		return nil, nil
	}
	var n struct {
		typed
		Normalizers []json.RawMessage `json:"normalizers"`
	}
	if err := json.Unmarshal(data, &n); err != nil {
		return nil, err
	}
	switch n.Type {
	case "NFC":
		return norm.NFC.String, nil
	case "NFD":
		return norm.NFD.String, nil
	case "NFKC":
		return norm.NFKC.String, nil
	case "NFKD":
		return norm.NFKD.String, nil
	case "Sequence":
		var fs []func(string) string
		for i, sub := range n.Normalizers {
			f, err := parseNormalizer(sub)
			if err != nil {
				return nil, fmt.Errorf("normalizers[%d]: %w", i, err)
			}
			if f != nil {
				fs = append(fs, f)
			}
		}
		switch len(fs) {
		case 0:
			return nil, nil
		case 1:
			return fs[0], nil
		}
		return func(s string) string {
			for _, f := range fs {
				s = f(s)
			}
			return s
		}, nil
	}
	return nil, fmt.Errorf("type %q is not supported (NFC, NFD, NFKC, NFKD, Sequence are)", n.Type)
}

// parsePreTokenizer returns the splitters to apply in turn; it insists on a
// ByteLevel pre-tokenizer last, since the model is byte-level.
func parsePreTokenizer(data json.RawMessage) ([]splitter, error) {
	if isNull(data) {
		return nil, errors.New("null: a byte-level BPE needs a ByteLevel pre-tokenizer")
	}
	var p struct {
		typed
		PreTokenizers []json.RawMessage `json:"pretokenizers"`
	}
	if err := json.Unmarshal(data, &p); err != nil {
		return nil, err
	}
	steps := []json.RawMessage{data}
	if p.Type == "Sequence" {
		steps = p.PreTokenizers
	}
	var out []splitter
	for i, step := range steps {
		var s struct {
			typed
			Pattern struct {
				Regex  *string `json:"Regex"`
				String *string `json:"String"`
			} `json:"pattern"`
			Behavior       string `json:"behavior"`
			Invert         bool   `json:"invert"`
			AddPrefixSpace bool   `json:"add_prefix_space"`
			UseRegex       *bool  `json:"use_regex"`
		}
		where := func(err error) error {
			if p.Type == "Sequence" {
				return fmt.Errorf("pretokenizers[%d]: %w", i, err)
			}
			return err
		}
		if err := json.Unmarshal(step, &s); err != nil {
			return nil, where(err)
		}
		last := i == len(steps)-1
		switch s.Type {
		case "Split":
			if last {
				return nil, where(errors.New("a Split last: a byte-level BPE needs a ByteLevel pre-tokenizer last"))
			}
			if s.Invert {
				return nil, where(errors.New("invert: only false is supported"))
			}
			var pattern string
			switch {
			case s.Pattern.Regex != nil:
				pattern = *s.Pattern.Regex
			case s.Pattern.String != nil:
				pattern = regexpQuote(*s.Pattern.String)
			default:
				return nil, where(errors.New("pattern: want Regex or String"))
			}
			if s.Behavior != "Isolated" && s.Behavior != "Removed" {
				return nil, where(fmt.Errorf("behavior %q: only Isolated and Removed are supported", s.Behavior))
			}
			sp, err := newRegexSplit(pattern, s.Behavior == "Isolated")
			if err != nil {
				return nil, where(err)
			}
			out = append(out, sp)
		case "ByteLevel":
			if !last {
				return nil, where(errors.New("a ByteLevel before the end: only a ByteLevel pre-tokenizer last is supported"))
			}
			if s.AddPrefixSpace {
				return nil, where(errors.New("add_prefix_space: only false is supported"))
			}
			if s.UseRegex == nil || *s.UseRegex {
				sp, err := newRegexSplit(gpt2Pattern, true)
				if err != nil {
					return nil, where(err)
				}
				out = append(out, sp)
			}
		default:
			return nil, where(fmt.Errorf("type %q is not supported (Sequence, Split, ByteLevel are)", s.Type))
		}
	}
	if len(steps) == 0 {
		return nil, errors.New("empty Sequence: a byte-level BPE needs a ByteLevel pre-tokenizer")
	}
	return out, nil
}

// regexpQuote escapes a literal for regexp2 (.NET syntax).
func regexpQuote(s string) string {
	var b strings.Builder
	for _, r := range s {
		if strings.ContainsRune(`\*+?|{}[]()^$.# `, r) {
			b.WriteByte('\\')
		}
		b.WriteRune(r)
	}
	return b.String()
}

// parsePostProcessor returns the ids a TemplateProcessing puts before and
// after a single sequence when special tokens are added. ByteLevel only
// adjusts offsets, so it adds nothing.
func parsePostProcessor(data json.RawMessage, lookup func(string) (uint32, bool)) (prefix, suffix []uint32, err error) {
	if isNull(data) {
		return nil, nil, nil
	}
	var p struct {
		typed
		Processors []json.RawMessage `json:"processors"`
		Single     []struct {
			SpecialToken *struct {
				ID string `json:"id"`
			} `json:"SpecialToken"`
			Sequence *struct {
				ID string `json:"id"`
			} `json:"Sequence"`
		} `json:"single"`
		SpecialTokens map[string]struct {
			IDs []uint32 `json:"ids"`
		} `json:"special_tokens"`
	}
	if err := json.Unmarshal(data, &p); err != nil {
		return nil, nil, err
	}
	switch p.Type {
	case "ByteLevel":
		return nil, nil, nil
	case "Sequence":
		for i, sub := range p.Processors {
			pre, suf, err := parsePostProcessor(sub, lookup)
			if err != nil {
				return nil, nil, fmt.Errorf("processors[%d]: %w", i, err)
			}
			if len(pre)+len(suf) > 0 && len(prefix)+len(suffix) > 0 {
				return nil, nil, errors.New("more than one processor adds tokens")
			}
			prefix, suffix = append(prefix, pre...), append(suffix, suf...)
		}
		return prefix, suffix, nil
	case "TemplateProcessing":
		seen := false
		for i, item := range p.Single {
			switch {
			case item.Sequence != nil:
				if seen {
					return nil, nil, fmt.Errorf("single[%d]: the sequence twice", i)
				}
				seen = true
			case item.SpecialToken != nil:
				st, ok := p.SpecialTokens[item.SpecialToken.ID]
				ids := st.IDs
				if !ok {
					id, found := lookup(item.SpecialToken.ID)
					if !found {
						return nil, nil, fmt.Errorf("single[%d]: special token %q is in neither special_tokens nor the vocabulary", i, item.SpecialToken.ID)
					}
					ids = []uint32{id}
				}
				if seen {
					suffix = append(suffix, ids...)
				} else {
					prefix = append(prefix, ids...)
				}
			default:
				return nil, nil, fmt.Errorf("single[%d]: want SpecialToken or Sequence", i)
			}
		}
		return prefix, suffix, nil
	}
	return nil, nil, fmt.Errorf("type %q is not supported (ByteLevel, TemplateProcessing, Sequence are)", p.Type)
}

// Encode returns the token ids of text. With addSpecialTokens the
// post-processor's tokens are added (Llama's <|begin_of_text|>), as for
// vLLM's /v1/completions; a rendered chat prompt is encoded without them,
// since the template writes them itself. Added and special tokens written
// in the text (such as <|im_start|>) are matched as tokens.
func (t *Tokenizer) Encode(text string, addSpecialTokens bool) []uint32 {
	return t.AppendEncode(nil, text, addSpecialTokens)
}

// AppendEncode is Encode appending to dst.
func (t *Tokenizer) AppendEncode(dst []uint32, text string, addSpecialTokens bool) []uint32 {
	if addSpecialTokens {
		dst = append(dst, t.prefix...)
	}
	// Each piece goes through the remaining splitters, then the model.
	var stage func(k int, piece string)
	stage = func(k int, piece string) {
		if k == len(t.pre) {
			dst = t.model.encode(dst, piece)
			return
		}
		t.pre[k].split(piece, func(p string) { stage(k+1, p) })
	}
	var segBuf, subBuf [16]segment
	for _, seg := range t.rawAdded.split(segBuf[:0], text) {
		if seg.token {
			dst = append(dst, seg.id)
			continue
		}
		s := seg.text
		if t.normalize != nil {
			s = t.normalize(s)
		}
		for _, sub := range t.normAdded.split(subBuf[:0], s) {
			if sub.token {
				dst = append(dst, sub.id)
			} else if sub.text != "" {
				stage(0, sub.text)
			}
		}
	}
	if addSpecialTokens {
		dst = append(dst, t.suffix...)
	}
	return dst
}

// Decode returns the text of ids (added tokens included); an id outside
// the vocabulary is an error.
func (t *Tokenizer) Decode(ids []uint32) (string, error) {
	var b strings.Builder
	for _, id := range ids {
		if int(id) >= len(t.tokens) || t.tokens[id] == "" {
			return "", fmt.Errorf("token id %d is not in the vocabulary", id)
		}
		b.WriteString(t.tokens[id])
	}
	return b.String(), nil
}

// VocabSize is the number of token ids (the highest id plus one).
func (t *Tokenizer) VocabSize() int { return len(t.tokens) }
