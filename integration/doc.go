// Package integration holds infergate's end-to-end tests: the real
// `infergate` binary run as separate processes (`sim --fleet`, one `tier1`
// per cluster, `tier2`, and `dev`), with a real Redis and a real Consul
// agent, driven by the official OpenAI Go client. The simulator stands in for
// GPUs. The TestFault* tests and TestSoak are the fault matrix of
// docs/reliability.md: each kills or stops one part under an open-loop load
// and reports FIGURES. `go test -short` skips the suite.
package integration
