package tokenize

import (
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/dlclark/regexp2/v2"
)

// splitter cuts a string into pieces, passing each to emit in order.
// Pieces are substrings of s: nothing is copied.
type splitter interface {
	split(s string, emit func(piece string))
}

// Pre-tokenizer patterns with a hand-written scanner (see scanPattern).
const (
	// llama3Pattern is Llama-3's Split regex (also in DeepSeek-V3 and others).
	llama3Pattern = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
	// qwen2Pattern is Qwen2/Qwen2.5/Qwen3's: digits one at a time.
	qwen2Pattern = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
	// gpt2Pattern is what a ByteLevel pre-tokenizer with use_regex splits on.
	gpt2Pattern = `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`
)

// regexSplit is a Split pre-tokenizer: matches of the pattern are pieces
// and, when isolated, so is the text between them; otherwise the matches
// are removed.
type regexSplit struct {
	re       *regexp2.Regexp
	isolated bool
}

func newRegexSplit(pattern string, isolated bool) (splitter, error) {
	if isolated {
		switch pattern {
		case llama3Pattern:
			return patternScanner{maxDigits: 3}, nil
		case qwen2Pattern:
			return patternScanner{maxDigits: 1}, nil
		}
	}
	// The patterns are written for Oniguruma (the Rust library's engine);
	// regexp2 has the lookahead and \p classes they need, where Go's regexp
	// has no lookahead.
	re, err := regexp2.Compile(pattern, regexp2.None)
	if err != nil {
		return nil, fmt.Errorf("pattern %q: %w", pattern, err)
	}
	return regexSplit{re: re, isolated: isolated}, nil
}

func (r regexSplit) split(s string, emit func(string)) {
	// The only error regexp2 returns is a match timeout, and none is set.
	idx, _ := r.re.FindAllStringIndex(s, -1)
	last := 0
	for _, m := range idx {
		if m[0] == m[1] {
			continue // an empty match splits nothing
		}
		if m[0] > last {
			emit(s[last:m[0]])
		}
		if r.isolated {
			emit(s[m[0]:m[1]])
		}
		last = m[1]
	}
	if last < len(s) {
		emit(s[last:])
	}
}

// patternScanner splits exactly as llama3Pattern (maxDigits 3) or
// qwen2Pattern (maxDigits 1) with behaviour Isolated do, without a regex
// engine. It exists because regexp2, a backtracking engine, made those
// patterns most of the encoding time: BenchmarkPreTokenize in this package
// compares the two. TestScannerMatchesRegexp checks them against each other.
//
// Every character is matched by one alternative, so the matches tile the
// text; at each position the alternatives are tried in the pattern's order:
//
//  1. (?i:'s|'t|'re|'ve|'m|'ll|'d)  contractions in any case (ſ is an s)
//  2. [^\r\n\p{L}\p{N}]?\p{L}+      letters, with one optional leading
//     character that is not CR, LF, a letter or a number
//  3. \p{N}{1,maxDigits}
//  4. " ?[^\s\p{L}\p{N}]+[\r\n]*"   other characters, optional leading space,
//     trailing CR/LF
//  5. \s*[\r\n]+                    whitespace up to the last CR/LF of the run
//  6. \s+(?!\S)                     a whitespace run but its last character,
//     or all of it at the end of the text
//  7. \s+                           a single whitespace character
type patternScanner struct{ maxDigits int }

// Character classes as the patterns see them: \p{L}, \p{N}, \s.
const (
	classOther = iota
	classLetter
	classNumber
	classSpace
)

var asciiClass = func() (t [utf8.RuneSelf]uint8) {
	for r := range rune(utf8.RuneSelf) {
		t[r] = classOf(r)
	}
	return t
}()

func classOf(r rune) uint8 {
	switch {
	case unicode.IsLetter(r):
		return classLetter
	case unicode.IsNumber(r):
		return classNumber
	case unicode.IsSpace(r):
		return classSpace
	}
	return classOther
}

// at decodes the rune at i with its class; at the end it returns width 0.
func at(s string, i int) (r rune, width int, class uint8) {
	if i >= len(s) {
		return -1, 0, classOther
	}
	if c := s[i]; c < utf8.RuneSelf {
		return rune(c), 1, asciiClass[c]
	}
	r, width = utf8.DecodeRuneInString(s[i:])
	return r, width, classOf(r)
}

func lower(c byte) byte { return c | 0x20 }

func (p patternScanner) split(s string, emit func(string)) {
	for i := 0; i < len(s); {
		n := p.match(s, i)
		emit(s[i : i+n])
		i += n
	}
}

// match returns the length in bytes of the match at i (always > 0).
func (p patternScanner) match(s string, i int) int {
	r, w, cl := at(s, i)
	// 1. Contractions.
	if r == '\'' && i+1 < len(s) {
		switch lower(s[i+1]) {
		case 's', 't', 'm', 'd':
			return 2
		case 'r', 'v':
			if i+2 < len(s) && lower(s[i+2]) == 'e' {
				return 3
			}
		case 'l':
			if i+2 < len(s) && lower(s[i+2]) == 'l' {
				return 3
			}
		}
		// U+017F LATIN SMALL LETTER LONG S (C5 BF) case-folds to s, for
		// Oniguruma and regexp2 alike (not for Tokenizers.js).
		if strings.HasPrefix(s[i+1:], "\u017f") {
			return 3
		}
	}
	// 2. Letters, with an optional leading non-letter, non-number, non-CR/LF.
	if cl == classLetter {
		return w + p.letters(s, i+w)
	}
	if cl != classNumber && r != '\r' && r != '\n' {
		if _, _, next := at(s, i+w); next == classLetter {
			return w + p.letters(s, i+w)
		}
	}
	// 3. Numbers.
	if cl == classNumber {
		n := w
		for k := 1; k < p.maxDigits; k++ {
			_, w2, c2 := at(s, i+n)
			if c2 != classNumber {
				break
			}
			n += w2
		}
		return n
	}
	// 4. Other characters, with an optional leading space.
	start := i
	if r == ' ' {
		if _, _, next := at(s, i+1); next == classOther && i+1 < len(s) {
			start = i + 1
		}
	}
	if _, _, c := at(s, start); c == classOther && start < len(s) {
		j := start
		for j < len(s) {
			_, w2, c2 := at(s, j)
			if c2 != classOther {
				break
			}
			j += w2
		}
		for j < len(s) && (s[j] == '\r' || s[j] == '\n') {
			j++
		}
		return j - i
	}
	// Whitespace from here on (every other class has matched above).
	end, lastNL, count := i, -1, 0
	for end < len(s) {
		r2, w2, c2 := at(s, end)
		if c2 != classSpace {
			break
		}
		if r2 == '\r' || r2 == '\n' {
			lastNL = end
		}
		end += w2
		count++
	}
	// 5. Whitespace up to and including the run's last CR/LF.
	if lastNL >= 0 {
		return lastNL + 1 - i
	}
	// 6. The run less its last character, unless the run ends the text.
	if end == len(s) {
		return end - i
	}
	if count >= 2 {
		_, lastW := utf8.DecodeLastRuneInString(s[:end])
		return end - lastW - i
	}
	// 7. A single whitespace character.
	return end - i
}

// letters returns the byte length of the run of letters at i.
func (patternScanner) letters(s string, i int) int {
	j := i
	for j < len(s) {
		_, w, c := at(s, j)
		if c != classLetter {
			break
		}
		j += w
	}
	return j - i
}
