package load

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
)

// Bodies builds the chat requests the generator sends: BodyBytes each
// (32 KB ≈ 8k tokens at the router's 4 bytes per token), every one with a
// distinct prompt. Requests share one of a few system prompts (a quarter
// of the body: the shared prefixes a prefix-aware scheduler looks for);
// the user turn starts with a per-request nonce, so nothing after the
// system prompt repeats.
type Bodies struct {
	templates [][]byte // [variant][stream]: even index non-streaming, odd streaming
	nonceAt   []int    // offset of the nonce digits in each template
	streamPct int
}

const (
	// BodyBytes is the size of every request body.
	BodyBytes   = 32 << 10
	nonceDigits = 12
	sharedSys   = 8 // distinct system prompts
	userTexts   = 4 // user-turn texts per system prompt (before the nonce makes them distinct)
)

var words = strings.Fields(`the a of to and in is for on that with as by at from this be are was it or an
which model request token cache prefix router latency throughput batch queue pod cluster region
schedule score filter pick stream event answer question summary table column query index data
report value error retry budget limit quota tenant cost price capacity memory compute kernel`)

// NewBodies builds the templates; streamPct (0..100) of requests stream.
func NewBodies(seed uint64, streamPct int) *Bodies {
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	text := func(n int) string {
		var b strings.Builder
		for b.Len() < n {
			b.WriteString(words[rng.IntN(len(words))])
			b.WriteByte(' ')
		}
		return b.String()[:n]
	}
	b := &Bodies{streamPct: min(max(streamPct, 0), 100)}
	marker := "[req " + strings.Repeat("0", nonceDigits) + "] "
	for s := 0; s < sharedSys; s++ {
		sys := fmt.Sprintf("System prompt %d. You are a careful assistant. ", s) + text(BodyBytes/4)
		for u := 0; u < userTexts; u++ {
			user := text(BodyBytes) // trimmed below to hit BodyBytes exactly
			for _, stream := range []bool{false, true} {
				build := func(user string) []byte {
					msgs, _ := json.Marshal([]map[string]string{
						{"role": "system", "content": sys},
						{"role": "user", "content": marker + user},
					})
					return fmt.Appendf(nil, `{"model":%q,"stream":%t,"max_tokens":16,"messages":%s}`, Model, stream, msgs)
				}
				body := build("")
				body = build(user[:max(BodyBytes-len(body), 0)])
				b.templates = append(b.templates, body)
				b.nonceAt = append(b.nonceAt, bytes.Index(body, []byte(marker))+len("[req "))
			}
		}
	}
	return b
}

// Body returns request i's body (a fresh copy; the caller owns it) and
// whether it streams. The mix is deterministic in i.
func (b *Bodies) Body(i uint64) ([]byte, bool) {
	stream := int(i%100) < b.streamPct
	v := int((i*2654435761)>>7) % (len(b.templates) / 2)
	idx := 2 * v
	if stream {
		idx++
	}
	t := b.templates[idx]
	out := make([]byte, len(t))
	copy(out, t)
	n := strconv.AppendUint(nil, i, 10)
	at := b.nonceAt[idx] + nonceDigits - len(n)
	copy(out[at:], n)
	return out, stream
}
