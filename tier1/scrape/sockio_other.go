//go:build !linux

package scrape

import (
	"io"
	"net"
)

// newSockIO is the connection itself where raw socket calls are not used.
func newSockIO(conn net.Conn) io.ReadWriter { return conn }
