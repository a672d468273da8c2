//go:build unix

package gateway

import (
	"syscall"
	"time"
)

// processCPU is the CPU time (user + system) this process has used. The
// benchmark reports it per request: unlike wall time it does not move with
// other load on a shared machine.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
