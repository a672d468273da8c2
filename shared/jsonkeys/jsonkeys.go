// Package jsonkeys reads the members of a JSON object by their exact names.
//
// encoding/json matches object keys to struct fields case-insensitively
// (Unicode simple folding: "Model", "MODEL" and "ſtream" all match) and
// lets the last spelling win. The Python and Rust servers infergate routes
// to match keys exactly, so a router that decodes with encoding/json can
// read a different model or max_tokens than the engine that serves the
// request. This package validates a JSON object in one pass and hands out
// the raw value of each member under its exact, unescaped name; a Set
// additionally refuses a body that spells one of the names it guards twice,
// or in another case, so every reader agrees on what the request says.
package jsonkeys

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"strings"
	"unicode/utf8"
)

// MaxDepth is the deepest nesting of arrays and objects accepted. Python's
// json gives up around its recursion limit of 1000.
const MaxDepth = 512

// Error codes, usable as OpenAI error codes.
const (
	CodeInvalidJSON  = "invalid_json"  // malformed JSON, not an object, trailing data, invalid UTF-8
	CodeDuplicateKey = "duplicate_key" // a guarded name spelled twice or in another case
)

// Error is why a body was refused.
type Error struct {
	Code   string // CodeInvalidJSON or CodeDuplicateKey
	Key    string // the guarded name concerned (CodeDuplicateKey only)
	Offset int    // byte offset in the input where the problem was found
	msg    string
}

func (e *Error) Error() string { return e.msg }

func syntaxErr(off int, format string, args ...any) *Error {
	return &Error{Code: CodeInvalidJSON, Offset: off,
		msg: fmt.Sprintf("request body is not valid JSON: "+format+" at byte %d", append(args, off)...)}
}

// Members validates data as exactly one JSON object (whitespace around it
// allowed, nothing else) and calls fn for each of its top-level members in
// order with the member's unescaped name and its raw value. name is only
// valid during the call; value aliases data. Strings must be valid UTF-8
// without raw control characters, as Python's json.loads requires. An
// error from fn stops the scan and is returned as is.
func Members(data []byte, fn func(name, value []byte) error) error {
	return members(data, func(name, value []byte, _ int) error { return fn(name, value) })
}

// members is Members, also handing fn the offset of the member's name
// (its opening quote).
func members(data []byte, fn func(name, value []byte, start int) error) error {
	s := scanner{data: data}
	s.ws()
	if s.i >= len(data) {
		return syntaxErr(s.i, "empty body; expected a JSON object")
	}
	if data[s.i] != '{' {
		return syntaxErr(s.i, "expected a JSON object, found %s", s.describe())
	}
	s.i++
	s.depth = 1
	s.ws()
	if s.i < len(data) && data[s.i] == '}' {
		s.i++
		return s.end()
	}
	var scratch []byte
	for {
		s.ws()
		if s.i >= len(data) || data[s.i] != '"' {
			return syntaxErr(s.i, "expected a member name, found %s", s.describe())
		}
		kstart := s.i
		escaped, err := s.str()
		if err != nil {
			return err
		}
		name := data[kstart+1 : s.i-1]
		if escaped {
			var k string
			if err := json.Unmarshal(data[kstart:s.i], &k); err != nil {
				return syntaxErr(kstart, "bad member name: %v", err)
			}
			scratch = append(scratch[:0], k...)
			name = scratch
		}
		s.ws()
		if s.i >= len(data) || data[s.i] != ':' {
			return syntaxErr(s.i, "expected ':' after member name, found %s", s.describe())
		}
		s.i++
		s.ws()
		vstart := s.i
		if err := s.value(); err != nil {
			return err
		}
		if err := fn(name, data[vstart:s.i], kstart); err != nil {
			return err
		}
		s.ws()
		if s.i >= len(data) {
			return syntaxErr(s.i, "unexpected end of object")
		}
		switch data[s.i] {
		case ',':
			s.i++
		case '}':
			s.i++
			return s.end()
		default:
			return syntaxErr(s.i, "expected ',' or '}' after member value, found %s", s.describe())
		}
	}
}

// Elements validates data as exactly one JSON array (whitespace around it
// allowed, nothing else) by the rules Members applies and calls fn for
// each of its elements in order with the element's raw value, which
// aliases data. An error from fn stops the scan and is returned as is.
func Elements(data []byte, fn func(value []byte) error) error {
	s := scanner{data: data}
	s.ws()
	if s.i >= len(data) || data[s.i] != '[' {
		return syntaxErr(s.i, "expected a JSON array, found %s", s.describe())
	}
	s.i++
	s.depth = 1
	s.ws()
	if s.i < len(data) && data[s.i] == ']' {
		s.i++
		return s.end()
	}
	for {
		s.ws()
		start := s.i
		if err := s.value(); err != nil {
			return err
		}
		if err := fn(data[start:s.i]); err != nil {
			return err
		}
		s.ws()
		if s.i >= len(data) {
			return syntaxErr(s.i, "unexpected end of array")
		}
		switch data[s.i] {
		case ',':
			s.i++
		case ']':
			s.i++
			return s.end()
		default:
			return syntaxErr(s.i, "expected ',' or ']' after array element, found %s", s.describe())
		}
	}
}

// Valid reports whether data is one well-formed JSON value by the rules
// Members applies (any value, not just an object).
func Valid(data []byte) bool {
	s := scanner{data: data}
	s.ws()
	return s.value() == nil && s.end() == nil
}

// Set is a fixed list of member names a reader takes from an object. Its
// zero value guards nothing.
type Set struct {
	names          []string
	minLen, maxLen int
}

// NewSet returns a Set of at most 64 distinct names.
func NewSet(names ...string) *Set {
	if len(names) > 64 {
		panic("jsonkeys: more than 64 names")
	}
	s := &Set{names: names, minLen: 1 << 30}
	for i, n := range names {
		for _, m := range names[:i] {
			if strings.EqualFold(n, m) {
				panic("jsonkeys: names " + m + " and " + n + " differ only in case")
			}
		}
		s.minLen, s.maxLen = min(s.minLen, len(n)), max(s.maxLen, len(n))
	}
	return s
}

// Names returns the guarded names, in the order NewSet got them.
func (s *Set) Names() []string { return s.names }

// Scan validates data as Members does and stores in vals[i] the raw value
// of the member named exactly names[i], or nil when there is none (vals
// may be shorter than the names, or nil, to only check). It refuses with
// CodeDuplicateKey an object in which a guarded name appears twice, or a
// key that equals one under Unicode case folding (what encoding/json
// matches) without being spelled exactly like it: such a body means one
// thing to a case-insensitive reader and another to an exact one.
func (s *Set) Scan(data []byte, vals [][]byte) error {
	for i := range vals {
		vals[i] = nil
	}
	var seen uint64
	return Members(data, func(name, value []byte) error {
		i := s.index(name)
		if i < 0 {
			return nil
		}
		want := s.names[i]
		if string(name) != want {
			return &Error{Code: CodeDuplicateKey, Key: want,
				msg: fmt.Sprintf("the key %q is a different spelling of %q; keys are case-sensitive, spell it exactly %q", name, want, want)}
		}
		if seen&(1<<i) != 0 {
			return &Error{Code: CodeDuplicateKey, Key: want,
				msg: fmt.Sprintf("the key %q appears more than once in the request body", want)}
		}
		seen |= 1 << i
		if i < len(vals) {
			vals[i] = value
		}
		return nil
	})
}

// index returns the guarded name that name equals under case folding, or
// -1. Folding can turn a multi-byte rune into an ASCII letter (U+212A
// KELVIN SIGN is k, U+017F LONG S is s), so the length filter allows up
// to three bytes per byte of the guarded name.
func (s *Set) index(name []byte) int {
	if len(name) < s.minLen || len(name) > 3*s.maxLen {
		return -1
	}
	for i, n := range s.names {
		if string(name) == n {
			return i
		}
	}
	k := string(name) // no allocation: only compared
	for i, n := range s.names {
		if len(k) >= len(n) && len(k) <= 3*len(n) && strings.EqualFold(k, n) {
			return i
		}
	}
	return -1
}

type scanner struct {
	data  []byte
	i     int
	depth int
}

func (s *scanner) ws() {
	for s.i < len(s.data) {
		switch s.data[s.i] {
		case ' ', '\t', '\n', '\r':
			s.i++
		default:
			return
		}
	}
}

// end checks that only whitespace follows the top-level value.
func (s *scanner) end() error {
	s.ws()
	if s.i != len(s.data) {
		return syntaxErr(s.i, "unexpected data after the top-level value (%s)", s.describe())
	}
	return nil
}

func (s *scanner) describe() string {
	if s.i >= len(s.data) {
		return "end of input"
	}
	c := s.data[s.i]
	if c >= 0x20 && c < 0x7f {
		return fmt.Sprintf("%q", rune(c))
	}
	return fmt.Sprintf("byte 0x%02x", c)
}

func (s *scanner) value() error {
	if s.i >= len(s.data) {
		return syntaxErr(s.i, "unexpected end of input; expected a value")
	}
	switch c := s.data[s.i]; c {
	case '{':
		return s.object()
	case '[':
		return s.array()
	case '"':
		_, err := s.str()
		return err
	case 't':
		return s.literal("true")
	case 'f':
		return s.literal("false")
	case 'n':
		return s.literal("null")
	default:
		if c == '-' || (c >= '0' && c <= '9') {
			return s.number()
		}
		return syntaxErr(s.i, "expected a value, found %s", s.describe())
	}
}

func (s *scanner) literal(lit string) error {
	if len(s.data)-s.i < len(lit) || string(s.data[s.i:s.i+len(lit)]) != lit {
		return syntaxErr(s.i, "invalid literal; expected %s", lit)
	}
	s.i += len(lit)
	return nil
}

func (s *scanner) enter() error {
	s.depth++
	if s.depth > MaxDepth {
		return syntaxErr(s.i, "nesting deeper than %d", MaxDepth)
	}
	s.i++
	return nil
}

func (s *scanner) object() error {
	if err := s.enter(); err != nil {
		return err
	}
	s.ws()
	if s.i < len(s.data) && s.data[s.i] == '}' {
		s.i++
		s.depth--
		return nil
	}
	for {
		s.ws()
		if s.i >= len(s.data) || s.data[s.i] != '"' {
			return syntaxErr(s.i, "expected a member name, found %s", s.describe())
		}
		if _, err := s.str(); err != nil {
			return err
		}
		s.ws()
		if s.i >= len(s.data) || s.data[s.i] != ':' {
			return syntaxErr(s.i, "expected ':' after member name, found %s", s.describe())
		}
		s.i++
		s.ws()
		if err := s.value(); err != nil {
			return err
		}
		s.ws()
		if s.i >= len(s.data) {
			return syntaxErr(s.i, "unexpected end of object")
		}
		switch s.data[s.i] {
		case ',':
			s.i++
		case '}':
			s.i++
			s.depth--
			return nil
		default:
			return syntaxErr(s.i, "expected ',' or '}' after member value, found %s", s.describe())
		}
	}
}

func (s *scanner) array() error {
	if err := s.enter(); err != nil {
		return err
	}
	s.ws()
	if s.i < len(s.data) && s.data[s.i] == ']' {
		s.i++
		s.depth--
		return nil
	}
	for {
		s.ws()
		if err := s.value(); err != nil {
			return err
		}
		s.ws()
		if s.i >= len(s.data) {
			return syntaxErr(s.i, "unexpected end of array")
		}
		switch s.data[s.i] {
		case ',':
			s.i++
		case ']':
			s.i++
			s.depth--
			return nil
		default:
			return syntaxErr(s.i, "expected ',' or ']' after array element, found %s", s.describe())
		}
	}
}

func isDigit(c byte) bool { return c >= '0' && c <= '9' }

// number accepts the JSON grammar -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)?
// (no NaN or Infinity, which Python would take but JSON does not allow).
func (s *scanner) number() error {
	d, start := s.data, s.i
	if d[s.i] == '-' {
		s.i++
	}
	switch {
	case s.i < len(d) && d[s.i] == '0':
		s.i++
	case s.i < len(d) && isDigit(d[s.i]):
		for s.i < len(d) && isDigit(d[s.i]) {
			s.i++
		}
	default:
		return syntaxErr(start, "invalid number")
	}
	if s.i < len(d) && d[s.i] == '.' {
		s.i++
		if s.i >= len(d) || !isDigit(d[s.i]) {
			return syntaxErr(start, "invalid number")
		}
		for s.i < len(d) && isDigit(d[s.i]) {
			s.i++
		}
	}
	if s.i < len(d) && (d[s.i] == 'e' || d[s.i] == 'E') {
		s.i++
		if s.i < len(d) && (d[s.i] == '+' || d[s.i] == '-') {
			s.i++
		}
		if s.i >= len(d) || !isDigit(d[s.i]) {
			return syntaxErr(start, "invalid number")
		}
		for s.i < len(d) && isDigit(d[s.i]) {
			s.i++
		}
	}
	return nil
}

// SWAR constants: a word has a byte below 0x20, a '"' or a '\\', or a byte
// with the high bit set exactly when the matching expression is non-zero.
const (
	ones  = 0x0101010101010101
	highs = 0x8080808080808080
)

func hasZero(x uint64) uint64 { return (x - ones) & ^x & highs }

// str scans the string starting at s.data[s.i] == '"' and leaves s.i after
// its closing quote. It reports whether the string holds escapes. Plain
// ASCII runs are skipped eight bytes at a time: message text is most of a
// request body.
func (s *scanner) str() (escaped bool, err error) {
	d := s.data
	start := s.i
	i := s.i + 1
	for {
		for i+8 <= len(d) {
			x := binary.LittleEndian.Uint64(d[i:])
			if hasZero(x^('"'*ones))|hasZero(x^('\\'*ones))|((x-0x20*ones)&^x&highs)|(x&highs) != 0 {
				break
			}
			i += 8
		}
		if i >= len(d) {
			return false, syntaxErr(start, "unterminated string")
		}
		c := d[i]
		switch {
		case c == '"':
			s.i = i + 1
			return escaped, nil
		case c == '\\':
			escaped = true
			if i+1 >= len(d) {
				return false, syntaxErr(start, "unterminated string")
			}
			switch d[i+1] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				i += 2
			case 'u':
				if i+6 > len(d) || !isHex(d[i+2]) || !isHex(d[i+3]) || !isHex(d[i+4]) || !isHex(d[i+5]) {
					return false, syntaxErr(i, "invalid \\u escape in string")
				}
				i += 6
			default:
				return false, syntaxErr(i, "invalid escape in string")
			}
		case c < 0x20:
			return false, syntaxErr(i, "control character in string")
		case c < utf8.RuneSelf:
			i++
		default:
			r, n := utf8.DecodeRune(d[i:])
			if r == utf8.RuneError && n == 1 {
				return false, syntaxErr(i, "invalid UTF-8 in string")
			}
			i += n
		}
	}
}

func isHex(c byte) bool {
	return isDigit(c) || (c|0x20 >= 'a' && c|0x20 <= 'f')
}

// Offset returns where sub starts in data when sub is a non-empty slice of
// data's own bytes (as the values Members and Scan hand out are), else -1.
// It lets a caller edit a body at the exact bytes the scan found, without
// scanning again.
func Offset(data, sub []byte) int {
	off := cap(data) - cap(sub)
	if len(sub) == 0 || off < 0 || off+len(sub) > len(data) || &data[off] != &sub[0] {
		return -1
	}
	return off
}

// Remove returns obj, one JSON object, without its top-level member named
// exactly name (and the comma that separated it from its neighbour), every
// other byte unchanged; found is false, and obj is returned as is, when
// there is no such member or obj is not a valid object. The result is a
// new slice.
func Remove(obj []byte, name string) (out []byte, found bool) {
	cut0, cut1 := -1, -1
	prevEnd := -1  // end of the previous member's value
	first := false // the removed member was the first: cut to the next name
	err := members(obj, func(n, value []byte, start int) error {
		end := Offset(obj, value) + len(value)
		switch {
		case first:
			cut1, first = start, false
		case cut0 < 0 && string(n) == name && prevEnd >= 0:
			cut0, cut1 = prevEnd, end // ", <member>"
		case cut0 < 0 && string(n) == name:
			cut0, cut1, first = start, end, true
		}
		prevEnd = end
		return nil
	})
	if err != nil || cut0 < 0 {
		return obj, false
	}
	out = make([]byte, 0, len(obj)-(cut1-cut0))
	return append(append(out, obj[:cut0]...), obj[cut1:]...), true
}
