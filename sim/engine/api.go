// Package engine is the simulator's model of one GPU serving pod: continuous
// batching, chunked prefill, a paged KV cache with prefix caching, LoRA
// slots and preemption. It has no clock of its own: a driver advances it,
// either in real time behind HTTP (Realtime) or in virtual time from an event
// queue (Loop), so the same code serves `infergate-lab sim` and `infergate-lab bench`.
//
// API CONTRACT (shared by sim/server, bench and tests; keep exported names
// and signatures stable, add freely):
//
//	New(cfg Config) (*Engine, error)
//	(*Engine).Submit(now time.Duration, r *Request) error
//	(*Engine).Cancel(now time.Duration, id uint64)
//	(*Engine).NextEventTime() (time.Duration, bool)
//	(*Engine).Advance(now time.Duration)
//	(*Engine).Stats() Stats
//	(*Engine).LoadAdapter(now time.Duration, name string) error
//	(*Engine).UnloadAdapter(name string) error
//	(*Engine).Adapters() []string
//	NewRealtime(e *Engine, timeScale float64) *Realtime
//	(*Realtime).Run(ctx context.Context)
//	(*Realtime).Submit(r *Request) error
//	(*Realtime).Cancel(id uint64)
//	(*Realtime).Do(fn func(e *Engine, now time.Duration))
//	NewLoop() *Loop; (*Loop).Add(e *Engine); (*Loop).At(t time.Duration, fn func(now time.Duration)); (*Loop).Run(until time.Duration); (*Loop).Now() time.Duration
package engine

// BlockSize is the KV-cache block size in tokens, as vLLM's default.
const BlockSize = 16
