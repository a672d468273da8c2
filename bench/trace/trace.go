// Package trace loads public LLM request traces into benchmark request
// streams: Mooncake's JSONL (with prefix-sharing hash ids) and Azure's LLM
// inference CSV (lengths only).
package trace

import (
	"bufio"
	"encoding/csv"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/infergate/infergate/bench/workload"
)

// MooncakeBlockTokens is the token span of one Mooncake hash id.
const MooncakeBlockTokens = 512

// MaxTokens bounds a request's prompt or output length in a trace; longer
// (or negative) lengths are errors. It keeps a bad row from allocating
// gigabytes of block hashes or overflowing token sums.
const MaxTokens = 10_000_000

// maxArrival bounds a timestamp (as an offset) so scaling and rebasing
// never overflow time.Duration: about 29 years.
const maxArrival = time.Duration(1) << 59

// Options shape a loaded trace.
type Options struct {
	// RateScale multiplies the arrival rate (timestamps are divided by it);
	// 0 means 1.
	RateScale float64
	// Start drops arrivals before it (after scaling) and makes it time 0:
	// a window of the trace, so tuning can use windows that are never
	// published. 0 starts at the first request.
	Start time.Duration
	// Duration keeps only arrivals before Start+Duration (after scaling);
	// 0 keeps all.
	Duration time.Duration
	// MaxTotalTokens clamps prompt plus output (keeping the prompt's
	// leading blocks) so every request fits the fleet's smallest context:
	// output is cut to a quarter of it at most, the prompt to the rest.
	// 0 means no clamp.
	MaxTotalTokens int
	// MaxOutputTokens clamps outputs; 0 means no clamp.
	MaxOutputTokens int
}

// Load reads a trace file, choosing the format from its extension: .jsonl
// (Mooncake) or .csv (Azure).
func Load(path string, opts Options) (workload.Stream, error) {
	f, err := os.Open(path)
	if err != nil {
		return workload.Stream{}, fmt.Errorf("open trace: %w", err)
	}
	defer func() { _ = f.Close() }() // read only
	switch strings.ToLower(filepath.Ext(path)) {
	case ".jsonl", ".json":
		return ReadMooncake(f, opts)
	case ".csv":
		return ReadAzure(f, opts)
	default:
		return workload.Stream{}, fmt.Errorf("trace %s: unknown format (want .jsonl Mooncake or .csv Azure)", path)
	}
}

type mooncakeRecord struct {
	Timestamp    *float64 `json:"timestamp"`
	InputLength  *int     `json:"input_length"`
	OutputLength *int     `json:"output_length"`
	HashIDs      []uint64 `json:"hash_ids"`
}

// ReadMooncake parses Mooncake JSONL: timestamp (ms), input_length,
// output_length, hash_ids. Each hash id stands for 512 tokens, which become
// 32 chained 16-token block hashes, so requests sharing leading hash ids
// share cached prompt blocks exactly as far as the ids agree.
func ReadMooncake(r io.Reader, opts Options) (workload.Stream, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 1<<16), 1<<24)
	var reqs []workload.Request
	line := 0
	for sc.Scan() {
		line++
		b := strings.TrimSpace(sc.Text())
		if b == "" {
			continue
		}
		var rec mooncakeRecord
		if err := json.Unmarshal([]byte(b), &rec); err != nil {
			return workload.Stream{}, fmt.Errorf("mooncake line %d: %w", line, err)
		}
		if rec.Timestamp == nil || rec.InputLength == nil || rec.OutputLength == nil {
			return workload.Stream{}, fmt.Errorf("mooncake line %d: missing timestamp, input_length or output_length", line)
		}
		in := *rec.InputLength
		if err := checkTokens(in, *rec.OutputLength); err != nil {
			return workload.Stream{}, fmt.Errorf("mooncake line %d: %w", line, err)
		}
		ts := *rec.Timestamp
		if !(ts >= 0 && ts*float64(time.Millisecond) < float64(maxArrival)) {
			return workload.Stream{}, fmt.Errorf("mooncake line %d: timestamp %v ms out of range", line, ts)
		}
		const sub = MooncakeBlockTokens / workload.BlockSize
		content := make([]uint64, 0, len(rec.HashIDs)*sub)
		for _, id := range rec.HashIDs {
			for j := range sub {
				content = append(content, id*sub+uint64(j))
			}
		}
		reqs = append(reqs, workload.Request{
			Arrival:      time.Duration(ts * float64(time.Millisecond)),
			PromptTokens: in,
			OutputTokens: *rec.OutputLength,
			BlockHashes:  workload.Chain(content),
			Session:      -1,
		})
	}
	if err := sc.Err(); err != nil {
		return workload.Stream{}, fmt.Errorf("mooncake: %w", err)
	}
	return finish(reqs, opts)
}

// ReadAzure parses the Azure LLM inference trace CSV
// (TIMESTAMP,ContextTokens,GeneratedTokens). Timestamps become offsets from
// the first row. The trace carries no prompt contents, so requests get
// unique block hashes: no prefix can be shared.
func ReadAzure(r io.Reader, opts Options) (workload.Stream, error) {
	cr := csv.NewReader(r)
	cr.FieldsPerRecord = -1
	head, err := cr.Read()
	if err != nil {
		return workload.Stream{}, fmt.Errorf("azure: header: %w", err)
	}
	col := map[string]int{}
	for i, h := range head {
		col[strings.TrimSpace(strings.TrimPrefix(h, "\ufeff"))] = i
	}
	ti, ok1 := col["TIMESTAMP"]
	ci, ok2 := col["ContextTokens"]
	gi, ok3 := col["GeneratedTokens"]
	if !ok1 || !ok2 || !ok3 {
		return workload.Stream{}, fmt.Errorf("azure: header %q lacks TIMESTAMP,ContextTokens,GeneratedTokens", head)
	}
	var reqs []workload.Request
	var t0 time.Time
	for row := 2; ; row++ {
		rec, err := cr.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return workload.Stream{}, fmt.Errorf("azure row %d: %w", row, err)
		}
		if len(rec) <= max(ti, ci, gi) {
			return workload.Stream{}, fmt.Errorf("azure row %d: %d fields", row, len(rec))
		}
		ts, err := parseAzureTime(rec[ti])
		if err != nil {
			return workload.Stream{}, fmt.Errorf("azure row %d: %w", row, err)
		}
		in, err1 := strconv.Atoi(strings.TrimSpace(rec[ci]))
		out, err2 := strconv.Atoi(strings.TrimSpace(rec[gi]))
		if err := errors.Join(err1, err2); err != nil {
			return workload.Stream{}, fmt.Errorf("azure row %d: %w", row, err)
		}
		if err := checkTokens(in, out); err != nil {
			return workload.Stream{}, fmt.Errorf("azure row %d: %w", row, err)
		}
		if len(reqs) == 0 {
			t0 = ts
		}
		// Rows need not be in order, but every offset from the first must
		// fit; Sub saturates rather than overflowing.
		off := ts.Sub(t0)
		if off <= -maxArrival || off >= maxArrival {
			return workload.Stream{}, fmt.Errorf("azure row %d: timestamp %v too far from the first row's", row, ts)
		}
		reqs = append(reqs, workload.Request{
			Arrival:      off,
			PromptTokens: in,
			OutputTokens: out,
			Session:      -1,
		})
	}
	for i := range reqs {
		// Unique contents: key the blocks by row so nothing is shared.
		n := reqs[i].PromptTokens / workload.BlockSize
		content := make([]uint64, n)
		for j := range content {
			content[j] = workload.Mix(uint64(i)+1, uint64(j))
		}
		reqs[i].BlockHashes = workload.Chain(content)
	}
	return finish(reqs, opts)
}

func parseAzureTime(s string) (time.Time, error) {
	s = strings.TrimSpace(s)
	// The 2023 trace has 7 fractional digits, which Go parses with .999999999.
	for _, layout := range []string{"2006-01-02 15:04:05.999999999", "2006-01-02 15:04:05", time.RFC3339Nano} {
		if t, err := time.Parse(layout, s); err == nil {
			return t, nil
		}
	}
	if f, err := strconv.ParseFloat(s, 64); err == nil { // seconds
		// NaN, Inf and values past 2262 do not fit Unix nanoseconds.
		if math.IsNaN(f) || math.Abs(f) >= math.MaxInt64/float64(time.Second) {
			return time.Time{}, fmt.Errorf("timestamp %q out of range", s)
		}
		return time.Unix(0, int64(f*float64(time.Second))), nil
	}
	return time.Time{}, fmt.Errorf("bad timestamp %q", s)
}

func checkTokens(in, out int) error {
	if in < 0 || out < 0 || in > MaxTokens || out > MaxTokens {
		return fmt.Errorf("token lengths %d, %d outside [0, %d]", in, out, MaxTokens)
	}
	return nil
}

// finish sorts, rebases, scales, clamps and numbers the requests.
func finish(reqs []workload.Request, opts Options) (workload.Stream, error) {
	if len(reqs) == 0 {
		return workload.Stream{}, errors.New("trace has no requests")
	}
	sort.SliceStable(reqs, func(i, j int) bool { return reqs[i].Arrival < reqs[j].Arrival })
	t0 := reqs[0].Arrival
	scale := opts.RateScale
	if !(scale > 0) || math.IsInf(scale, 1) { // also NaN
		scale = 1
	}
	out := reqs[:0]
	for _, r := range reqs {
		r.Arrival = time.Duration(float64(r.Arrival-t0)/scale) - opts.Start
		if r.Arrival < 0 {
			continue
		}
		if opts.Duration > 0 && r.Arrival >= opts.Duration {
			break
		}
		if r.PromptTokens < 1 {
			r.PromptTokens = 1
		}
		if r.OutputTokens < 1 {
			r.OutputTokens = 1
		}
		if opts.MaxOutputTokens > 0 && r.OutputTokens > opts.MaxOutputTokens {
			r.OutputTokens = opts.MaxOutputTokens
		}
		if m := opts.MaxTotalTokens; m > 0 && r.PromptTokens+r.OutputTokens > m {
			r.OutputTokens = max(1, min(r.OutputTokens, m/4))
			r.PromptTokens = max(1, min(r.PromptTokens, m-r.OutputTokens)) // m < 2 cannot fit both
		}
		// Only full blocks of the (possibly clamped) prompt are hashed.
		if nb := r.PromptTokens / workload.BlockSize; len(r.BlockHashes) > nb {
			r.BlockHashes = r.BlockHashes[:nb]
		}
		r.ID = uint64(len(out))
		out = append(out, r)
	}
	if len(out) == 0 {
		return workload.Stream{}, fmt.Errorf("trace has no requests after %v", opts.Start)
	}
	dur := opts.Duration
	if last := out[len(out)-1].Arrival; dur == 0 || dur > last+time.Second {
		dur = last + time.Second
	}
	return workload.Stream{Requests: out, Duration: dur}, nil
}
