package engine_test

import (
	"fmt"
	"time"

	"github.com/infergate/infergate/sim/engine"
	"github.com/infergate/infergate/sim/profile"
)

// Two pods in virtual time: arrivals are Loop events; the engines' steps
// are scheduled by the loop itself.
func ExampleLoop() {
	m, _ := profile.Model("llama-3.1-8b")
	l := engine.NewLoop()
	var pods []*engine.Engine
	for _, gpu := range []string{"h100", "a10g"} {
		g, _ := profile.GPU(gpu)
		e, err := engine.New(engine.Config{Model: m, GPU: g})
		if err != nil {
			panic(err)
		}
		l.Add(e)
		pods = append(pods, e)
	}
	for i, e := range pods {
		arrival := time.Duration(i) * time.Second
		r := &engine.Request{ID: uint64(i), PromptTokens: 2000, MaxTokens: 100,
			OnDone: func(at time.Duration, res engine.Result) {
				fmt.Printf("pod %d: TTFT %v, %d tokens\n", i, res.FirstTokenAt-arrival, res.CompletionTokens)
			}}
		l.At(arrival, func(now time.Duration) {
			if err := e.Submit(now, r); err != nil {
				fmt.Println(err)
			}
		})
	}
	l.Run(time.Minute)
}
