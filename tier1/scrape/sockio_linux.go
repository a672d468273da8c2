package scrape

import (
	"io"
	"net"
	"os"
	"syscall"
	"unsafe"
)

// sockIO reads and writes a TCP connection's non-blocking socket with raw
// read(2) and write(2) calls, waiting for readiness through the netpoller
// (syscall.RawConn) as net.Conn does. What it skips is the runtime's
// system-call bookkeeping: on a process that is otherwise idle, every
// ordinary system call wakes the runtime's monitor thread (sysmon), which
// then polls for a while; at 2,000 scrapes/s that was about a tenth of the
// scraper's CPU (docs/performance.md, "Idle scraping"). The calls never
// block, so there is nothing for the bookkeeping to do.
type sockIO struct {
	conn            net.Conn
	rc              syscall.RawConn
	p               []byte // the caller's buffer, during a call
	n               int
	errno           syscall.Errno
	readFn, writeFn func(fd uintptr) bool // built once: no closure per call
}

func newSockIO(conn net.Conn) io.ReadWriter {
	sc, ok := conn.(syscall.Conn)
	if !ok {
		return conn
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return conn
	}
	s := &sockIO{conn: conn, rc: rc}
	s.readFn = func(fd uintptr) bool {
		for {
			r, _, e := syscall.RawSyscall(syscall.SYS_READ, fd, uintptr(unsafe.Pointer(unsafe.SliceData(s.p))), uintptr(len(s.p)))
			switch e {
			case syscall.EINTR:
				continue
			case syscall.EAGAIN:
				return false // wait until readable
			}
			s.n, s.errno = int(r), e
			return true
		}
	}
	s.writeFn = func(fd uintptr) bool {
		for s.n < len(s.p) {
			r, _, e := syscall.RawSyscall(syscall.SYS_WRITE, fd, uintptr(unsafe.Pointer(&s.p[s.n])), uintptr(len(s.p)-s.n))
			switch e {
			case 0:
				s.n += int(r)
			case syscall.EINTR:
			case syscall.EAGAIN:
				return false // wait until writable
			default:
				s.errno = e
				return true
			}
		}
		return true
	}
	return s
}

func (s *sockIO) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	s.p, s.n, s.errno = p, 0, 0
	err := s.rc.Read(s.readFn)
	s.p = nil
	switch {
	case err != nil:
		return 0, err
	case s.errno != 0:
		return 0, os.NewSyscallError("read", s.errno)
	case s.n == 0:
		return 0, io.EOF
	}
	return s.n, nil
}

func (s *sockIO) Write(p []byte) (int, error) {
	s.p, s.n, s.errno = p, 0, 0
	err := s.rc.Write(s.writeFn)
	s.p = nil
	switch {
	case err != nil:
		return s.n, err
	case s.errno != 0:
		return s.n, os.NewSyscallError("write", s.errno)
	}
	return s.n, nil
}
