package load

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// This file reads another process's CPU time and memory from /proc
// (Linux), so Tier 1's cost is measured in its own process, apart from the
// load generator's and the fake pods'.

// userHZ is the unit of utime/stime in /proc/PID/stat: USER_HZ, 100 on
// every Linux architecture Go supports.
const userHZ = 100

// ProcCPU is the user+system CPU time process pid has used.
func ProcCPU(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, fmt.Errorf("cpu of %d: %w", pid, err)
	}
	// The command name (field 2) is in parentheses and may hold spaces:
	// count fields after the last ')'.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, fmt.Errorf("cpu of %d: malformed stat", pid)
	}
	f := strings.Fields(string(b[i+1:]))
	// After ')': state(3) ppid(4) ... utime(14) stime(15): indexes 11, 12.
	if len(f) < 13 {
		return 0, fmt.Errorf("cpu of %d: short stat", pid)
	}
	ut, err1 := strconv.ParseInt(f[11], 10, 64)
	st, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("cpu of %d: malformed utime/stime", pid)
	}
	return time.Duration(ut+st) * time.Second / userHZ, nil
}

// ProcMem is a process's resident set: now (VmRSS) and peak (VmHWM).
type ProcMem struct {
	RSS, Peak int64 // bytes
}

// ReadProcMem reads process pid's resident set sizes.
func ReadProcMem(pid int) (ProcMem, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return ProcMem{}, fmt.Errorf("memory of %d: %w", pid, err)
	}
	defer func() { _ = f.Close() }() // read only
	var m ProcMem
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		var dst *int64
		switch k {
		case "VmRSS":
			dst = &m.RSS
		case "VmHWM":
			dst = &m.Peak
		default:
			continue
		}
		fs := strings.Fields(v) // "12345 kB"
		if len(fs) == 0 {
			continue
		}
		n, err := strconv.ParseInt(fs[0], 10, 64)
		if err == nil {
			*dst = n << 10
		}
	}
	return m, sc.Err()
}

// LoadAvg is the 1-minute load average of the machine, or -1 if unknown.
func LoadAvg() float64 {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return -1
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return -1
	}
	v, err := strconv.ParseFloat(f[0], 64)
	if err != nil {
		return -1
	}
	return v
}
