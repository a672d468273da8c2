package gateway

import (
	"bytes"
	"encoding/json"
	"testing"

	"github.com/infergate/infergate/shared/sse"
)

// FuzzEvent: rewriting usage never panics; an event is passed through
// unchanged, dropped, or rewritten to one data event of valid JSON without
// a usage key, and only when the gateway injected include_usage and the
// event carried usage.
func FuzzEvent(f *testing.F) {
	for _, s := range []string{
		"data: {\"choices\":[],\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":3,\"total_tokens\":8}}\n\n",
		"data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}],\"usage\" : {\"total_tokens\":2}}\n\n",
		"data: {\"choices\":[],\ndata: \"usage\":{\"total_tokens\":1}}\n\n",
		"data: [DONE]\n\n",
		"data: {\"usage\":null}\n\n",
	} {
		f.Add([]byte(s), true)
		f.Add([]byte(s), false)
	}
	f.Fuzz(func(t *testing.T, ev []byte, injected bool) {
		in := bytes.Clone(ev)
		x := &exchange{injected: injected}
		out := x.Event(ev)
		if bytes.Equal(out, in) {
			return
		}
		if !injected || x.usage == nil {
			t.Fatalf("event changed without injected usage: %q -> %q", in, out)
		}
		if out == nil {
			return // the usage-only chunk
		}
		var m map[string]json.RawMessage
		if err := json.Unmarshal(sse.Data(out), &m); err != nil {
			t.Fatalf("rewritten event is not JSON: %q", out)
		}
		if _, ok := m["usage"]; ok {
			t.Fatalf("rewritten event still has usage: %q", out)
		}
	})
}
