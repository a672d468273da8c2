package kvevents

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/go-zeromq/zmq4/transport"
)

// go-zeromq reads a whole ZMTP frame into memory before the application
// sees it, allocating the size the peer announces (conn.go: make([]byte,
// size), up to 2^63), and collects frames while the peer sets MORE. It has
// no ZMQ_MAXMSGSIZE. So every socket here runs over transportName: plain
// TCP whose reads are checked against ZMTP framing as they pass (RFC 23,
// ZMTP 3: a 64-byte greeting, then frames of flags, a 1- or 8-byte size
// and a body). A peer announcing a message over the limit is cut off
// before go-zeromq allocates anything for it. The transport also bounds
// the handshake, and in bind mode the number of connections.

// transportName is registered once per process with go-zeromq's transport
// registry (a process-wide table: the limits themselves travel in each
// socket's context, so subscribers with different limits share it).
const transportName = "infergate-kvtcp"

var registerOnce sync.Once

func registerTransport() {
	registerOnce.Do(func() {
		if err := zmq4.RegisterTransport(transportName, limitedTransport{}); err != nil {
			panic(err) // only on a duplicate name, which registerOnce rules out
		}
	})
}

// limits bound what one peer connection may send.
type limits struct {
	maxMessage uint64        // all frames of one message
	maxFrames  int           // frames in one message
	handshake  time.Duration // greeting and handshake must finish within this
	maxConns   int           // connections accepted at once (listeners)
	onReject   func(error)   // a connection cut off or refused (metrics)
}

// maxCommand caps a ZMTP command's body (READY carries a little metadata).
const maxCommand = 64 << 10

type limitsKey struct{}

func withLimits(ctx context.Context, l *limits) context.Context {
	return context.WithValue(ctx, limitsKey{}, l)
}

func limitsFrom(ctx context.Context) *limits {
	if l, ok := ctx.Value(limitsKey{}).(*limits); ok {
		return l
	}
	return &limits{maxMessage: DefaultMaxMessageBytes, maxFrames: 8, handshake: 10 * time.Second, maxConns: DefaultMaxConnections}
}

// endpoint turns tcp://host:port into this transport's endpoint.
func endpoint(ep string) (string, error) {
	addr, err := tcpAddr(ep)
	if err != nil {
		return "", err
	}
	return transportName + "://" + addr, nil
}

// ErrLimit is wrapped by the errors of connections cut off for exceeding
// a limit (a message too large, too many frames, a slow handshake).
var ErrLimit = errors.New("kvevents: peer exceeded a limit")

type limitedTransport struct{}

func (limitedTransport) Dial(ctx context.Context, d transport.Dialer, addr string) (net.Conn, error) {
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	return newLimitConn(c, limitsFrom(ctx), nil), nil
}

func (limitedTransport) Listen(ctx context.Context, addr string) (net.Listener, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	l := limitsFrom(ctx)
	ll := &limitListener{Listener: ln, lim: l, sem: make(chan struct{}, max(l.maxConns, 1)),
		conns: make(chan net.Conn), done: make(chan struct{})}
	go ll.acceptLoop()
	return ll, nil
}

func (limitedTransport) Addr(ep string) (string, error) {
	host, port, err := net.SplitHostPort(ep)
	if err != nil {
		return "", err
	}
	if host == "*" {
		host = "0.0.0.0"
	}
	if port == "*" {
		port = "0"
	}
	return net.JoinHostPort(host, port), nil
}

// limitListener accepts at most maxConns connections at once, and hands
// go-zeromq (whose accept loop handshakes one connection at a time) only
// connections whose peer has already sent a ZMTP signature: a port scan or
// an idle connection never stalls the pods behind it.
type limitListener struct {
	net.Listener
	lim       *limits
	sem       chan struct{}
	conns     chan net.Conn
	done      chan struct{}
	closeOnce sync.Once
}

func (l *limitListener) acceptLoop() {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			return
		}
		select {
		case l.sem <- struct{}{}:
		default:
			_ = c.Close()
			if l.lim.onReject != nil {
				l.lim.onReject(fmt.Errorf("%w: %d connections open, refusing %s", ErrLimit, l.lim.maxConns, c.RemoteAddr()))
			}
			continue
		}
		go l.vet(c)
	}
}

// vet reads the peer's 10-byte ZMTP signature within the handshake
// deadline, then queues the connection for Accept.
func (l *limitListener) vet(c net.Conn) {
	release := func() { <-l.sem }
	lc := newLimitConn(c, l.lim, release)
	var sig [10]byte
	n, err := readFull(lc, sig[:])
	if err == nil && (sig[0] != 0xFF || sig[9] != 0x7F) {
		err = fmt.Errorf("%w: %s did not send a ZMTP signature", ErrLimit, c.RemoteAddr())
	}
	if err != nil {
		_ = lc.Close()
		if l.lim.onReject != nil {
			l.lim.onReject(err)
		}
		return
	}
	lc.unread = append(lc.unread[:0], sig[:n]...)
	select {
	case l.conns <- lc:
	case <-l.done:
		_ = lc.Close()
	}
}

func readFull(c *limitConn, p []byte) (int, error) {
	n := 0
	for n < len(p) {
		m, err := c.Read(p[n:])
		n += m
		if err != nil {
			return n, err
		}
	}
	return n, nil
}

func (l *limitListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

func (l *limitListener) Close() error {
	var err error
	l.closeOnce.Do(func() {
		close(l.done)
		err = l.Listener.Close()
	})
	return err
}

// limitConn checks what the peer sends against ZMTP framing and the
// limits, and bounds the handshake with deadlines.
type limitConn struct {
	net.Conn
	lim     *limits
	release func()
	once    sync.Once
	unread  []byte // bytes read while vetting, delivered first

	mu        sync.Mutex
	greetLeft int
	state     uint8
	flag      byte
	sizeBuf   [8]byte
	sizeNeed  int
	sizeHave  int
	bodyLeft  uint64
	msgBytes  uint64
	msgFrames int
	shaken    bool
	err       error
}

const (
	stFlag uint8 = iota
	stSize
	stBody
)

const zmtpGreeting = 64

func newLimitConn(c net.Conn, l *limits, release func()) *limitConn {
	lc := &limitConn{Conn: c, lim: l, release: release, greetLeft: zmtpGreeting}
	if l.handshake > 0 {
		_ = c.SetDeadline(time.Now().Add(l.handshake))
	}
	return lc
}

func (c *limitConn) Read(p []byte) (int, error) {
	if len(c.unread) > 0 {
		n := copy(p, c.unread)
		c.unread = c.unread[n:]
		return n, nil
	}
	n, err := c.Conn.Read(p)
	if n > 0 {
		c.mu.Lock()
		serr := c.scan(p[:n])
		c.mu.Unlock()
		if serr != nil {
			_ = c.Close()
			if c.lim.onReject != nil {
				c.lim.onReject(serr)
			}
			return 0, serr
		}
	}
	return n, err
}

func (c *limitConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() {
		if c.release != nil {
			c.release()
		}
	})
	return err
}

// scan advances the framing state over p, failing on a limit.
func (c *limitConn) scan(p []byte) error {
	if c.err != nil {
		return c.err
	}
	for len(p) > 0 {
		if c.greetLeft > 0 {
			n := min(len(p), c.greetLeft)
			c.greetLeft -= n
			p = p[n:]
			continue
		}
		switch c.state {
		case stFlag:
			c.flag = p[0]
			p = p[1:]
			if c.flag&^0x07 != 0 {
				return c.fail("reserved ZMTP flag bits %#x", c.flag)
			}
			c.sizeNeed, c.sizeHave = 1, 0
			if c.flag&0x02 != 0 {
				c.sizeNeed = 8
			}
			c.state = stSize
		case stSize:
			n := copy(c.sizeBuf[c.sizeHave:c.sizeNeed], p)
			c.sizeHave += n
			p = p[n:]
			if c.sizeHave < c.sizeNeed {
				continue
			}
			var size uint64
			for _, b := range c.sizeBuf[:c.sizeNeed] {
				size = size<<8 | uint64(b)
			}
			if c.flag&0x04 != 0 { // a command
				if size > maxCommand {
					return c.fail("a %d-byte command (limit %d)", size, maxCommand)
				}
			} else {
				if size > c.lim.maxMessage || c.msgBytes+size > c.lim.maxMessage {
					return c.fail("a message over %d bytes", c.lim.maxMessage)
				}
				c.msgBytes += size
				if c.msgFrames++; c.msgFrames > c.lim.maxFrames {
					return c.fail("a message of more than %d frames", c.lim.maxFrames)
				}
			}
			c.bodyLeft = size
			c.state = stBody
			if size == 0 {
				c.endFrame()
			}
		case stBody:
			n := uint64(len(p))
			if n > c.bodyLeft {
				n = c.bodyLeft
			}
			c.bodyLeft -= n
			p = p[n:]
			if c.bodyLeft == 0 {
				c.endFrame()
			}
		}
	}
	return nil
}

func (c *limitConn) endFrame() {
	c.state = stFlag
	if c.flag&0x04 != 0 {
		if !c.shaken {
			// The peer's first command (READY, or the security mechanism's
			// first) ends the part of the exchange a stalled peer could
			// hold open: from here on publishers may be idle for hours.
			c.shaken = true
			_ = c.Conn.SetDeadline(time.Time{})
		}
		return
	}
	if c.flag&0x01 == 0 { // the message's last frame
		c.msgBytes, c.msgFrames = 0, 0
	}
}

func (c *limitConn) fail(format string, args ...any) error {
	c.err = fmt.Errorf("%w: %s sent %s", ErrLimit, c.Conn.RemoteAddr(), fmt.Sprintf(format, args...))
	return c.err
}
