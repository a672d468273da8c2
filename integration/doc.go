// Package integration holds infergate's end-to-end tests: the real
// binaries run as separate processes (`infergate-lab sim --fleet`, one
// `infergate tier1` per cluster, `infergate tier2`, and `infergate-lab
// dev`), with a real Redis and a real Consul
// agent, driven by the official OpenAI Go client. The simulator stands in for
// GPUs. The TestFault* tests and TestSoak are the fault matrix of
// docs/reliability.md: each kills or stops one part under an open-loop load
// and reports FIGURES. `go test -short` skips the suite.
package integration
