//go:build linux

package main

import (
	"bytes"
	"flag"
	"fmt"
	"log"
	"net"
	"runtime"
	"strings"
	"syscall"
	"time"
	"unsafe"

	"github.com/infergate/infergate/tier1/scrape"
)

// floorCmd measures what fetching the page costs with nothing of Go's
// runtime in the way: one OS thread, blocking sockets, raw read(2),
// write(2) and nanosleep(2), one fetch per wake-up at the scraper's rate.
// It is not a scraper (no timeouts, no framing checks beyond finding the
// end of the body); it is the floor any client that reads the whole page
// at that rate pays on this machine, for comparing with `scrape`.
func floorCmd(args []string) {
	fs := flag.NewFlagSet("floor", flag.ExitOnError)
	addrsPath := fs.String("addrs", "addrs.txt", "file with one pod host:port per line")
	interval := fs.Duration("interval", 50*time.Millisecond, "per-pod fetch interval")
	warmup := fs.Duration("warmup", 2*time.Second, "time before the measured window")
	window := fs.Duration("for", 10*time.Second, "measured window")
	parse := fs.Bool("parse", false, "also parse each page with scrape.Parse")
	batch := fs.Int("batch", 1, "fetches per wake-up: each wake-up reads the responses to the requests written at the previous one, then writes the next batch (so no read waits)")
	_ = fs.Parse(args)
	var fds []int
	var reqs [][]byte
	for _, a := range readAddrs(*addrsPath) {
		ta, err := net.ResolveTCPAddr("tcp", a)
		if err != nil {
			log.Fatal(err)
		}
		fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM, 0)
		if err != nil {
			log.Fatal(err)
		}
		var sa syscall.SockaddrInet4
		copy(sa.Addr[:], ta.IP.To4())
		sa.Port = ta.Port
		if err := syscall.Connect(fd, &sa); err != nil {
			log.Fatal(err)
		}
		_ = syscall.SetsockoptInt(fd, syscall.IPPROTO_TCP, syscall.TCP_NODELAY, 1)
		fds = append(fds, fd)
		reqs = append(reqs, []byte("GET /metrics HTTP/1.1\r\nHost: "+a+"\r\nUser-Agent: infergate-scraper\r\n"+
			"Accept: text/plain;version=0.0.4\r\nAccept-Encoding: identity\r\n\r\n"))
	}
	runtime.LockOSThread()
	buf := make([]byte, 256<<10)
	step := *interval / time.Duration(len(fds))
	send := func(i int) {
		req := reqs[i]
		if _, _, e := syscall.RawSyscall(syscall.SYS_WRITE, uintptr(fds[i]), uintptr(unsafe.Pointer(&req[0])), uintptr(len(req))); e != 0 {
			log.Fatal(e)
		}
	}
	recv := func(i int) {
		n := 0
		for {
			r, _, e := syscall.RawSyscall(syscall.SYS_READ, uintptr(fds[i]), uintptr(unsafe.Pointer(&buf[n])), uintptr(len(buf)-n))
			if e != 0 || r == 0 {
				log.Fatalf("read: %v (%d)", e, r)
			}
			n += int(r)
			if done(buf[:n]) {
				break
			}
		}
		if *parse {
			body := buf[bytes.Index(buf[:n], []byte("\r\n\r\n"))+4 : n]
			if _, err := scrape.Parse("vllm", bytes.NewReader(body)); err != nil {
				log.Fatal(err)
			}
		}
	}
	sleepUntil := func(t time.Time) {
		if d := time.Until(t); d > 0 {
			ts := syscall.NsecToTimespec(int64(d))
			syscall.RawSyscall(syscall.SYS_NANOSLEEP, uintptr(unsafe.Pointer(&ts)), 0, 0)
		}
	}
	// Each wake-up reads the responses to the previous wake-up's requests
	// (sent one step earlier, so they have arrived) and sends the next
	// batch: one wake-up per batch, no read that waits.
	pending := -1
	run := func(d time.Duration) int {
		start := time.Now()
		n := 0
		for next := start; time.Since(start) < d; next = next.Add(step * time.Duration(*batch)) {
			sleepUntil(next)
			if pending >= 0 {
				for k := range *batch {
					recv((pending + k) % len(fds))
				}
				n += *batch
			}
			pending = (max(pending, 0) + *batch) % len(fds)
			for k := range *batch {
				send((pending + k) % len(fds))
			}
		}
		return n
	}
	run(*warmup)
	c0, t0 := cpuSeconds(), time.Now()
	n := run(*window)
	c1, t1 := cpuSeconds(), time.Now()
	wall := t1.Sub(t0).Seconds()
	fmt.Printf("floor pods=%d interval=%s batch=%d window=%.1fs cpu=%.2fs cores=%.3f fetches=%d (%.0f/s) parse=%v cpu/fetch=%.0fµs\n",
		len(fds), *interval, *batch, wall, c1-c0, (c1-c0)/wall, n, float64(n)/wall, *parse, (c1-c0)/float64(n)*1e6)
}

// done reports whether b holds a whole response: a chunked body's last
// chunk, or a Content-Length body.
func done(b []byte) bool {
	h := bytes.Index(b, []byte("\r\n\r\n"))
	if h < 0 {
		return false
	}
	head := strings.ToLower(string(b[:h]))
	if i := strings.Index(head, "content-length:"); i >= 0 {
		var cl int
		fmt.Sscanf(strings.TrimSpace(head[i+15:]), "%d", &cl)
		return len(b)-h-4 >= cl
	}
	return bytes.HasSuffix(b, []byte("\r\n0\r\n\r\n"))
}
