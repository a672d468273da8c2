package scrape

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"unsafe"

	"github.com/infergate/infergate/tier1/picker"
)

// Parse reads a Prometheus text exposition and maps it onto picker.Metrics
// for engine ("" detects the engine from the metric names present). Series of
// one metric (data-parallel ranks, per-engine labels) are summed for counts
// and averaged for KV usage.
//
// It streams the page once, line by line, and looks only at the few families
// some engine mapping reads: every other line (vLLM's pages are mostly
// histogram buckets) costs a first-byte check or one map probe on its
// name. Nothing of the exposition is built; buffers come from a pool. It
// gives the answers parseExpfmt (the expfmt-based reference) gives for every
// page expfmt accepts; it is more lenient about malformed HELP/TYPE lines,
// which it does not need.
func Parse(engine string, r io.Reader) (Sample, error) {
	p := parserPool.Get().(*fastParser)
	defer parserPool.Put(p)
	p.reset(r)
	if err := p.run(); err != nil {
		return Sample{}, err
	}
	return p.sample(engine)
}

// parsePage is Parse on a page already in memory (the scraper reads a whole
// response into a reused buffer): no bufio copy, lines are sliced in place.
// page is only read during the call. When prev (the pod's last metrics) is
// set, adapter lists equal to prev's are shared with it rather than built
// again: they rarely change between scrapes, and nothing writes to them.
func parsePage(engine string, page []byte, prev *picker.Metrics) (Sample, error) {
	p := parserPool.Get().(*fastParser)
	defer parserPool.Put(p)
	p.reset(nil)
	p.prev = prev
	defer func() { p.prev = nil }()
	if err := p.runBytes(page); err != nil {
		return Sample{}, err
	}
	return p.sample(engine)
}

// wantedList numbers the wanted families; famIndex maps a name to its slot.
var (
	wantedList = func() []string {
		var out []string
		for n := range wanted {
			out = append(out, n)
		}
		sort.Strings(out)
		return out
	}()
	famIndex = func() map[string]int {
		m := make(map[string]int, len(wantedList))
		for i, n := range wantedList {
			m[n] = i
		}
		return m
	}()
)

// famAcc accumulates one wanted family during a pass.
type famAcc struct {
	present   bool    // at least one sample line
	order     int     // line number of the first sample, for detection
	pos, neg  float64 // sums of the finite positive and negative values
	n         int     // finite values
	nonScalar bool    // TYPE says histogram/summary: no plain values
	// series with labels kept, for the info families (LoRA, cache config)
	series []seriesRef
}

type seriesRef struct {
	v        float64
	ok       bool // v is a finite scalar value
	lab, end int  // p.labels[lab:end]
}

// labelRef points into p.arena at one unescaped label name and value.
type labelRef struct{ name, nameEnd, val, valEnd int }

type fastParser struct {
	br     *bufio.Reader
	long   []byte // a line longer than br's buffer
	fams   []famAcc
	labels []labelRef
	arena  []byte
	line   int
	prev   *picker.Metrics // see parsePage
	names  [][]byte        // loraLoaded's scratch list, reused
}

const fastBufSize = 32 << 10

var parserPool = sync.Pool{New: func() any {
	return &fastParser{br: bufio.NewReaderSize(nil, fastBufSize), fams: make([]famAcc, len(wantedList))}
}}

// infoFamily reports whether the labels of family i are read (LoRA and
// cache-config info series).
var infoFamily = func() []bool {
	out := make([]bool, len(wantedList))
	for _, d := range dialects {
		for _, n := range d.families[picker.MetricLoRA] {
			out[famIndex[n]] = true
		}
		if d.cacheConfig != "" {
			out[famIndex[d.cacheConfig]] = true
		}
		if d.loraLoaded != "" {
			out[famIndex[d.loraLoaded]] = true
		}
	}
	return out
}()

// breakdownSlot is breakdownOf by family slot: the label whose non-empty
// value keeps a series out of the family's sums.
var breakdownSlot = func() []string {
	out := make([]string, len(wantedList))
	for n, l := range breakdownOf {
		out[famIndex[n]] = l
	}
	return out
}()

func (p *fastParser) reset(r io.Reader) {
	p.br.Reset(r)
	for i := range p.fams {
		p.fams[i] = famAcc{series: p.fams[i].series[:0]}
	}
	p.labels, p.arena, p.long, p.line = p.labels[:0], p.arena[:0], p.long[:0], 0
	// Do not let one huge page pin memory in the pool.
	if cap(p.arena) > 1<<20 {
		p.arena = nil
	}
	if cap(p.long) > 1<<20 {
		p.long = nil
	}
}

func (p *fastParser) run() error {
	for {
		line, err := p.br.ReadSlice('\n')
		if errors.Is(err, bufio.ErrBufferFull) {
			p.long = append(p.long[:0], line...)
			for errors.Is(err, bufio.ErrBufferFull) {
				line, err = p.br.ReadSlice('\n')
				p.long = append(p.long, line...)
			}
			line = p.long
		}
		if len(line) > 0 {
			p.line++
			if line[len(line)-1] == '\n' {
				line = line[:len(line)-1]
			}
			if perr := p.parseLine(line); perr != nil {
				return fmt.Errorf("parse metrics: line %d: %w", p.line, perr)
			}
		}
		if err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return fmt.Errorf("read metrics: %w", err)
		}
	}
}

// runBytes is run over a page in memory; it numbers lines the same way.
func (p *fastParser) runBytes(b []byte) error {
	for len(b) > 0 {
		line := b
		if i := bytes.IndexByte(b, '\n'); i >= 0 {
			line, b = b[:i], b[i+1:]
		} else {
			b = nil
		}
		p.line++
		if len(line) >= 8 && skippable(line) {
			continue
		}
		if err := p.parseLine(line); err != nil {
			return fmt.Errorf("parse metrics: line %d: %w", p.line, err)
		}
	}
	return nil
}

// skippable is parseLine's answer for most lines, decided inline on the
// line's first 8 bytes (len(line) >= 8): a sample line whose first word
// starts no wanted name, a "# HELP " line, or a "# TYPE " line whose name
// starts with a byte no wanted name starts with.
func skippable(line []byte) bool {
	w := binary.LittleEndian.Uint64(line)
	if h := &hotWords[wordSlot(w)]; h.overflow || w == h.w[0] || w == h.w[1] {
		return false
	}
	switch c := line[0]; {
	case c == '#':
		p7 := w & (1<<56 - 1)
		return p7 == helpPrefix || p7 == typePrefix && !isBlank(line[7])
	case isBlank(c):
		return false
	}
	return true
}

var (
	helpPrefix = binary.LittleEndian.Uint64([]byte("# HELP \x00"))
	typePrefix = binary.LittleEndian.Uint64([]byte("# TYPE \x00"))
)

// hotWords holds, by wordSlot, the first words of lines parseLine must
// see: every wanted name's, and "# TYPE " followed by each wanted name's
// first byte. A slot with more than two is marked overflow.
var hotWords = func() (t [64]struct {
	w        [2]uint64
	n        int
	overflow bool
}) {
	add := func(w uint64) {
		h := &t[wordSlot(w)]
		switch {
		case h.n == 2 && w != h.w[0] && w != h.w[1]:
			h.overflow = true
		case h.n == 1 && w == h.w[0], h.n == 2:
		default:
			h.w[h.n] = w
			h.n++
		}
	}
	for _, n := range wantedList {
		add(binary.LittleEndian.Uint64([]byte(n)))
		add(binary.LittleEndian.Uint64([]byte("# TYPE " + n[:1])))
	}
	return t
}()

func isBlank(c byte) bool { return c == ' ' || c == '\t' }

func skipBlank(b []byte, i int) int {
	for i < len(b) && isBlank(b[i]) {
		i++
	}
	return i
}

func (p *fastParser) parseLine(line []byte) error {
	i := skipBlank(line, 0)
	if i == len(line) {
		return nil
	}
	if line[i] == '#' {
		p.parseComment(line[i+1:])
		return nil
	}
	// A wanted family's sample line starts with its name followed by '{'
	// or a blank.
	if fi, n := wantedPrefix(line[i:], true); fi >= 0 {
		return p.parseSample(fi, line, i+n)
	}
	return nil
}

// wantedPrefix returns the slot and length of the wanted family whose name
// starts b followed by a blank, a '{' (when brace is set) or the end of a
// TYPE line, or -1. Every wanted name is at least 8 bytes long: the first 8
// bytes of b, as one word, pick the few names that start with them (most
// lines of a vLLM page, "vllm:req...", "vllm:tim...", match none), and only
// those are compared.
func wantedPrefix(b []byte, brace bool) (int, int) {
	if len(b) < 8 {
		return -1, 0
	}
	w := binary.LittleEndian.Uint64(b)
	for _, c := range byWord[wordSlot(w)] {
		if c.word != w {
			continue
		}
		n := len(c.name)
		switch {
		case len(b) < n:
			continue
		case len(b) == n:
			if brace { // a sample line needs a value after the name
				continue
			}
		case b[n] == '{':
			if !brace {
				continue
			}
		case !isBlank(b[n]):
			continue
		}
		if string(b[8:n]) == c.name[8:] {
			return c.idx, n
		}
	}
	return -1, 0
}

type wantedName struct {
	name string
	idx  int
	word uint64 // the name's first 8 bytes, little-endian
}

// wordSlot hashes a name's first 8 bytes to a slot of byWord.
func wordSlot(w uint64) int { return int((w * 0x9e3779b97f4a7c15) >> 58) }

// byWord lists the wanted families by the slot of their first 8 bytes.
var byWord = func() (t [64][]wantedName) {
	for i, n := range wantedList {
		if len(n) < 8 {
			panic("scrape: wanted metric name shorter than 8 bytes: " + n)
		}
		w := binary.LittleEndian.Uint64([]byte(n))
		t[wordSlot(w)] = append(t[wordSlot(w)], wantedName{n, i, w})
	}
	return t
}()

// parseComment notes the TYPE of wanted families; HELP and other comments
// carry nothing the router reads.
func (p *fastParser) parseComment(b []byte) {
	if len(b) < 2 || !isBlank(b[0]) {
		return // "#TYPE" is a plain comment to expfmt
	}
	if b[1] == 'H' {
		return // "# HELP", a third of a vLLM page
	}
	b = b[skipBlank(b, 0):]
	if len(b) < 5 || b[0] != 'T' || string(b[:4]) != "TYPE" || !isBlank(b[4]) {
		return
	}
	b = b[skipBlank(b, 4):]
	fi, n := wantedPrefix(b, false)
	if fi < 0 {
		return
	}
	typ, _ := token(b[skipBlank(b, n):])
	switch {
	case len(typ) == 0: // expfmt leaves the family untyped
	case bytes.EqualFold(typ, []byte("counter")), bytes.EqualFold(typ, []byte("gauge")), bytes.EqualFold(typ, []byte("untyped")):
	default:
		p.fams[fi].nonScalar = true
	}
}

// token splits b at its first blank.
func token(b []byte) (tok, rest []byte) {
	i := 0
	for i < len(b) && !isBlank(b[i]) {
		i++
	}
	return b[:i], b[i:]
}

var (
	errSyntax  = errors.New("syntax error")
	errEscape  = errors.New("invalid escape sequence")
	errNoValue = errors.New("missing value")
)

func (p *fastParser) parseSample(fi int, line []byte, i int) error {
	f := &p.fams[fi]
	info := infoFamily[fi]
	brk := breakdownSlot[fi]
	lab, arena := len(p.labels), len(p.arena)
	i = skipBlank(line, i)
	if i < len(line) && line[i] == '{' {
		var err error
		if i, err = p.parseLabels(line, i+1, info || brk != ""); err != nil {
			return err
		}
	}
	breakdown := false
	if brk != "" {
		v, _ := p.label(seriesRef{lab: lab, end: len(p.labels)}, brk)
		breakdown = len(v) > 0
		if !info {
			p.labels, p.arena = p.labels[:lab], p.arena[:arena]
		}
	}
	i = skipBlank(line, i)
	start := i
	for i < len(line) && !isBlank(line[i]) {
		i++
	}
	tok := line[start:i]
	if len(tok) == 0 {
		return errNoValue
	}
	v, err := parseValue(tok)
	if err != nil {
		return err
	}
	i = skipBlank(line, i)
	if i < len(line) {
		start = i
		for i < len(line) && !isBlank(line[i]) {
			i++
		}
		if _, err := strconv.ParseInt(bytesString(line[start:i]), 10, 64); err != nil {
			return fmt.Errorf("bad timestamp: %w", err)
		}
		if i = skipBlank(line, i); i < len(line) {
			return errSyntax
		}
	}
	if !f.present {
		f.present, f.order = true, p.line
	}
	if breakdown {
		// A per-priority series beside its total: the line is valid, it
		// is just not counted.
		p.labels, p.arena = p.labels[:lab], p.arena[:arena]
		return nil
	}
	ok := !f.nonScalar && !math.IsNaN(v) && !math.IsInf(v, 0)
	if ok {
		if v > 0 {
			f.pos += v
		} else {
			f.neg += v
		}
		f.n++
	}
	if info {
		f.series = append(f.series, seriesRef{v: v, ok: ok, lab: lab, end: len(p.labels)})
	} else {
		p.labels = p.labels[:lab]
	}
	return nil
}

// parseValue parses a sample value as expfmt does: Go float syntax, but no
// hexadecimal floats or digit separators.
func parseValue(tok []byte) (float64, error) {
	if bytes.ContainsAny(tok, "pP_") {
		return 0, errSyntax
	}
	v, err := strconv.ParseFloat(bytesString(tok), 64)
	if err != nil {
		return 0, fmt.Errorf("bad value: %w", err)
	}
	return v, nil
}

// bytesString views b as a string without copying. Only for calls that do
// not keep the string: strconv copies it into any error it returns.
func bytesString(b []byte) string {
	return unsafe.String(unsafe.SliceData(b), len(b))
}

// parseLabels reads a label set after its '{' and returns the index after
// the '}'. When keep is set the unescaped pairs go to p.labels/p.arena.
func (p *fastParser) parseLabels(line []byte, i int, keep bool) (int, error) {
	for {
		i = skipBlank(line, i)
		if i >= len(line) {
			return 0, errSyntax
		}
		if line[i] == '}' {
			return i + 1, nil
		}
		var ref labelRef
		if line[i] == '"' {
			ref.name = len(p.arena)
			var err error
			if i, err = p.quoted(line, i+1); err != nil {
				return 0, err
			}
			ref.nameEnd = len(p.arena)
		} else {
			start := i
			for i < len(line) && isLabelNameByte(line[i], i == start) {
				i++
			}
			if i == start {
				return 0, errSyntax
			}
			ref.name = len(p.arena)
			p.arena = append(p.arena, line[start:i]...)
			ref.nameEnd = len(p.arena)
		}
		i = skipBlank(line, i)
		if i >= len(line) || line[i] != '=' {
			return 0, errSyntax
		}
		i = skipBlank(line, i+1)
		if i >= len(line) || line[i] != '"' {
			return 0, errSyntax
		}
		ref.val = len(p.arena)
		var err error
		if i, err = p.quoted(line, i+1); err != nil {
			return 0, err
		}
		ref.valEnd = len(p.arena)
		if keep {
			p.labels = append(p.labels, ref)
		} else {
			p.arena = p.arena[:ref.name]
		}
		i = skipBlank(line, i)
		if i >= len(line) {
			return 0, errSyntax
		}
		switch line[i] {
		case ',':
			i++
		case '}':
			return i + 1, nil
		default:
			return 0, errSyntax
		}
	}
}

func isLabelNameByte(c byte, first bool) bool {
	return c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || !first && c >= '0' && c <= '9'
}

// quoted appends the unescaped quoted string starting at i (after its
// opening quote) to p.arena and returns the index after the closing quote.
func (p *fastParser) quoted(line []byte, i int) (int, error) {
	for i < len(line) {
		c := line[i]
		switch c {
		case '"':
			return i + 1, nil
		case '\\':
			if i+1 >= len(line) {
				return 0, errSyntax
			}
			switch line[i+1] {
			case '\\', '"':
				p.arena = append(p.arena, line[i+1])
			case 'n':
				p.arena = append(p.arena, '\n')
			default:
				return 0, errEscape
			}
			i += 2
		default:
			p.arena = append(p.arena, c)
			i++
		}
	}
	return 0, errSyntax
}

// sample maps the accumulated families onto a Sample for engine.
func (p *fastParser) sample(engine string) (Sample, error) {
	if engine == "" {
		engine = p.detect()
		if engine == "" {
			return Sample{}, ErrUnknownEngine
		}
	}
	d := dialectOf(engine)
	if d == nil {
		return Sample{}, fmt.Errorf("unknown engine %q", engine)
	}
	s := Sample{Engine: engine}
	for _, name := range d.families[picker.MetricWaiting] {
		if v, ok := p.sum(name); ok {
			s.Metrics.Waiting = count(v)
			s.Have |= InputWaiting
			break
		}
	}
	for _, name := range d.families[picker.MetricRunning] {
		if v, ok := p.sum(name); ok {
			if d.runningIncludesWaiting {
				v -= float64(s.Metrics.Waiting)
			}
			s.Metrics.Running = count(v)
			s.Have |= InputRunning
			break
		}
	}
	for _, name := range d.families[picker.MetricKVUsage] {
		if v, ok := p.sum(name); ok {
			s.Metrics.KVUsage = clamp01(v / float64(p.fams[famIndex[name]].n))
			s.Metrics.HasKV = true
			s.Have |= InputKV
			break
		}
	}
	for _, name := range d.families[picker.MetricLoRA] {
		if p.lora(&p.fams[famIndex[name]], &s.Metrics) {
			s.Have |= InputLoRA
			break
		}
	}
	if d.loraLoaded != "" && p.loraLoaded(&p.fams[famIndex[d.loraLoaded]], &s.Metrics) {
		s.Have |= InputLoRA
	}
	if d.cacheConfig != "" {
		p.cacheConfig(&p.fams[famIndex[d.cacheConfig]], d, &s.Metrics)
	}
	if s.Metrics.BlockSize == 0 && d.blockSizeFamily != "" {
		s.Metrics.BlockSize = p.meanCount(d.blockSizeFamily)
	}
	if s.Metrics.NumBlocks == 0 && d.numBlocksFamily != "" {
		s.Metrics.NumBlocks = p.meanCount(d.numBlocksFamily)
	}
	return s, nil
}

// meanCount is a gauge family's mean over its series as a positive
// count (one series per rank, each reporting the same configuration), or
// 0 when absent.
func (p *fastParser) meanCount(name string) int {
	v, ok := p.sum(name)
	if !ok {
		return 0
	}
	return count(math.Round(v / float64(p.fams[famIndex[name]].n)))
}

// loraLoaded adds the adapters a vllm:lora_adapter_loaded-style family
// shows resident on the GPU (level="gpu", value > 0) to out.ActiveAdapters,
// keeping its order and sorting the additions. It reports whether the
// family was on the page: a page with the family and no adapter loaded
// still tells that none is. A result equal to the previous scrape's list
// is that list: the steady state allocates nothing.
func (p *fastParser) loraLoaded(f *famAcc, out *picker.Metrics) bool {
	if !f.present {
		return false
	}
	out.HasLoRA = true
	add := p.names[:0]
	defer func() {
		clear(add) // the names point into this page's arena
		p.names = add[:0]
	}()
	for _, s := range f.series {
		if !s.ok || s.v <= 0 {
			continue
		}
		if lvl, _ := p.label(s, "level"); string(lvl) != "gpu" {
			continue
		}
		name, _ := p.label(s, "adapter_name")
		if len(name) == 0 || containsName(out.ActiveAdapters, name) || slices.ContainsFunc(add, func(n []byte) bool { return bytes.Equal(n, name) }) {
			continue
		}
		add = append(add, name)
	}
	if len(add) == 0 {
		return true
	}
	slices.SortFunc(add, bytes.Compare)
	if p.prev != nil && p.prev.HasLoRA && isConcat(p.prev.ActiveAdapters, out.ActiveAdapters, add) {
		out.ActiveAdapters = p.prev.ActiveAdapters
		return true
	}
	list := make([]string, len(out.ActiveAdapters), len(out.ActiveAdapters)+len(add))
	copy(list, out.ActiveAdapters)
	for _, n := range add {
		list = append(list, string(n))
	}
	out.ActiveAdapters = list
	return true
}

// containsName reports whether list holds name, without converting name.
func containsName(list []string, name []byte) bool {
	for _, s := range list {
		if s == string(name) {
			return true
		}
	}
	return false
}

// isConcat reports whether list is head followed by tail.
func isConcat(list, head []string, tail [][]byte) bool {
	if len(list) != len(head)+len(tail) || !slices.Equal(list[:len(head)], head) {
		return false
	}
	for i, n := range tail {
		if list[len(head)+i] != string(n) {
			return false
		}
	}
	return true
}

// detect names the engine whose metrics appear, or "". A page mixing
// engines' metrics resolves to the first one in it.
func (p *fastParser) detect() string {
	for _, d := range dialects {
		if d.marker != "" && p.fams[famIndex[d.marker]].present {
			return d.engine
		}
	}
	first, engine := 0, ""
	for i, f := range p.fams {
		if !f.present || (first != 0 && f.order >= first) {
			continue
		}
		if e := engineByPrefix(wantedList[i]); e != "" {
			first, engine = f.order, e
		}
	}
	return engine
}

// engineByPrefix names the first dialect whose prefix starts name, or "".
func engineByPrefix(name string) string {
	for _, d := range dialects {
		if strings.HasPrefix(name, d.prefix) {
			return d.engine
		}
	}
	return ""
}

// sum is the reference sum over family name: finite values added, an
// overflow to both infinities is 0, a negative total is 0.
func (p *fastParser) sum(name string) (float64, bool) {
	i, ok := famIndex[name]
	if !ok {
		return 0, false
	}
	f := &p.fams[i]
	if f.n == 0 {
		return 0, false
	}
	total := f.pos + f.neg
	switch {
	case math.IsInf(f.pos, 1) && math.IsInf(f.neg, -1):
		total = 0
	case total < 0:
		total = 0
	}
	return total, true
}

func (p *fastParser) str(from, to int) string { return string(p.arena[from:to]) }

// label returns the value of the first label called name in series s.
func (p *fastParser) label(s seriesRef, name string) ([]byte, bool) {
	for _, l := range p.labels[s.lab:s.end] {
		if string(p.arena[l.name:l.nameEnd]) == name {
			return p.arena[l.val:l.valEnd], true
		}
	}
	return nil, false
}

// listLen counts the non-blank items of a comma-separated list.
func listLen(b []byte) int {
	n := 0
	for len(b) > 0 {
		item := b
		if j := bytes.IndexByte(b, ','); j >= 0 {
			item, b = b[:j], b[j+1:]
		} else {
			b = nil
		}
		if len(bytes.TrimSpace(item)) > 0 {
			n++
		}
	}
	return n
}

// lora applies parseLoRA's rule (newest value wins; on a tie, fewest
// running, then fewest waiting, then the smallest sorted label text).
func (p *fastParser) lora(f *famAcc, out *picker.Metrics) bool {
	best := -1
	bestV := math.Inf(-1)
	var bestRun, bestWait int
	for j, s := range f.series {
		if !s.ok || s.v < bestV {
			continue
		}
		run, _ := p.label(s, "running_lora_adapters")
		wait, _ := p.label(s, "waiting_lora_adapters")
		nr, nw := listLen(run), listLen(wait)
		if best >= 0 && s.v == bestV {
			less := nr < bestRun
			switch {
			case nr != bestRun:
			case nw != bestWait:
				less = nw < bestWait
			default:
				less = p.labelText(s) < p.labelText(f.series[best])
			}
			if !less {
				continue
			}
		}
		best, bestV, bestRun, bestWait = j, s.v, nr, nw
	}
	if best < 0 {
		return false
	}
	s := f.series[best]
	run, _ := p.label(s, "running_lora_adapters")
	wait, _ := p.label(s, "waiting_lora_adapters")
	out.ActiveAdapters = p.adapterList(run, func(m *picker.Metrics) []string { return m.ActiveAdapters }, true)
	out.WaitingAdapters = p.adapterList(wait, func(m *picker.Metrics) []string { return m.WaitingAdapters }, false)
	if v, ok := p.label(s, "max_lora"); ok {
		if n, err := strconv.Atoi(strings.TrimSpace(string(v))); err == nil && n > 0 {
			out.MaxLoras = n
		}
	}
	out.HasLoRA = true
	return true
}

// adapterList is splitList(string(b)), or the previous scrape's list when
// it is the same. With prefix, a list that begins the previous one is that
// list's beginning: the running adapters lora_requests_info names come
// first in ActiveAdapters, the idle GPU-resident ones (loraLoaded) after.
func (p *fastParser) adapterList(b []byte, field func(*picker.Metrics) []string, prefix bool) []string {
	if p.prev != nil && p.prev.HasLoRA {
		prev := field(p.prev)
		if n, ok := listPrefix(b, prev); ok && (n == len(prev) || prefix && n > 0) {
			return prev[:n:n]
		}
	}
	return splitList(string(b))
}

// listPrefix reports whether splitList(string(b)) begins list, and its
// length.
func listPrefix(b []byte, list []string) (int, bool) {
	i := 0
	for len(b) > 0 {
		item := b
		if j := bytes.IndexByte(b, ','); j >= 0 {
			item, b = b[:j], b[j+1:]
		} else {
			b = nil
		}
		if item = bytes.TrimSpace(item); len(item) == 0 {
			continue
		}
		if i >= len(list) || string(item) != list[i] {
			return 0, false
		}
		i++
	}
	return i, true
}

// labelText matches labelText in parse.go: pairs sorted, NUL-separated.
func (p *fastParser) labelText(s seriesRef) string {
	pairs := make([]string, 0, s.end-s.lab)
	for _, l := range p.labels[s.lab:s.end] {
		pairs = append(pairs, p.str(l.name, l.nameEnd)+"\x00"+p.str(l.val, l.valEnd))
	}
	sort.Strings(pairs)
	return strings.Join(pairs, "\x00")
}

func (p *fastParser) cacheConfig(f *famAcc, m *dialect, out *picker.Metrics) {
	if len(f.series) == 0 {
		return
	}
	s := f.series[0]
	if v, ok := p.label(s, m.blockSizeLabel); ok {
		if n, err := strconv.Atoi(bytesString(v)); err == nil && n > 0 {
			out.BlockSize = n
		}
	}
	if v, ok := p.label(s, m.numBlocksLabel); ok {
		if n, err := strconv.Atoi(bytesString(v)); err == nil && n > 0 {
			out.NumBlocks = n
		}
	}
}
