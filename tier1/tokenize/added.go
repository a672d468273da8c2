package tokenize

import (
	"sort"
	"strings"
	"unicode"
	"unicode/utf8"
)

// addedToken is an entry of tokenizer.json's added_tokens: text that
// becomes one token wherever it appears, before any other processing.
type addedToken struct {
	id         uint32
	content    string
	singleWord bool // only where not inside a word
	lstrip     bool // absorbs the whitespace before it
	rstrip     bool // absorbs the whitespace after it
}

// addedMatcher finds added tokens leftmost-longest, as the Aho-Corasick
// automaton of the Hugging Face library (MatchKind::LeftmostLongest) does.
// The token sets are small (hundreds), so candidates are indexed by first
// byte and tried longest first.
type addedMatcher struct {
	first       [256][]*addedToken // by first byte, longest first
	starts      string             // every first byte, for strings.IndexAny
	startsASCII bool               // IndexAny works on starts
}

func newAddedMatcher(tokens []*addedToken) *addedMatcher {
	if len(tokens) == 0 {
		return nil
	}
	m := &addedMatcher{}
	var starts []byte
	for _, t := range tokens {
		c := t.content[0]
		if len(m.first[c]) == 0 {
			starts = append(starts, c)
		}
		m.first[c] = append(m.first[c], t)
	}
	for c := range m.first {
		sort.SliceStable(m.first[c], func(i, j int) bool {
			return len(m.first[c][i].content) > len(m.first[c][j].content)
		})
	}
	// IndexAny wants characters; bytes >= 0x80 are not whole characters, so
	// those make find scan byte by byte instead.
	m.starts = string(starts)
	m.startsASCII = ascii(m.starts)
	return m
}

// segment is a part of the text: either an added token (id valid) or text
// still to be encoded.
type segment struct {
	text  string
	id    uint32
	token bool
}

// split cuts s at the added tokens, appending the segments to dst.
func (m *addedMatcher) split(dst []segment, s string) []segment {
	if m == nil || s == "" {
		return append(dst, segment{text: s})
	}
	startOffset := 0
	for pos := 0; pos < len(s); {
		i, tok := m.find(s, pos)
		if tok == nil {
			break
		}
		start, stop := i, i+len(tok.content)
		pos = stop
		if tok.singleWord {
			before := start == 0 || !endsWithWord(s[:start])
			after := stop == len(s) || !startsWithWord(s[stop:])
			if !before || !after {
				continue // plain text; the search goes on after it
			}
		}
		if tok.lstrip {
			start = max(len(strings.TrimRightFunc(s[:start], unicode.IsSpace)), startOffset)
		}
		if tok.rstrip {
			stop = len(s) - len(strings.TrimLeftFunc(s[stop:], unicode.IsSpace))
			pos = stop
		}
		if startOffset < start {
			dst = append(dst, segment{text: s[startOffset:start]})
		}
		dst = append(dst, segment{text: s[start:stop], id: tok.id, token: true})
		startOffset = stop
	}
	if startOffset < len(s) {
		dst = append(dst, segment{text: s[startOffset:]})
	}
	return dst
}

// find returns the leftmost position at or after pos where an added token
// starts, and the longest token there.
func (m *addedMatcher) find(s string, pos int) (int, *addedToken) {
	for pos < len(s) {
		i := pos
		if m.startsASCII {
			k := strings.IndexAny(s[pos:], m.starts)
			if k < 0 {
				return -1, nil
			}
			i = pos + k
		}
		for _, t := range m.first[s[i]] {
			if strings.HasPrefix(s[i:], t.content) {
				return i, t
			}
		}
		pos = i + 1
	}
	return -1, nil
}

func ascii(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] >= utf8.RuneSelf {
			return false
		}
	}
	return true
}

func isWordRune(r rune) bool { return r == '_' || unicode.IsLetter(r) || unicode.IsNumber(r) }

func endsWithWord(s string) bool {
	r, _ := utf8.DecodeLastRuneInString(s)
	return s != "" && isWordRune(r)
}

func startsWithWord(s string) bool {
	r, _ := utf8.DecodeRuneInString(s)
	return s != "" && isWordRune(r)
}
