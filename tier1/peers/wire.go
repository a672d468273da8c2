package peers

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"io"

	"github.com/infergate/infergate/tier1/picker"
)

// The wire protocol, one TCP connection per (sender, receiver) pair,
// carrying data one way:
//
//	receiver → sender: magic "IGPEERS1", 32-byte random nonce
//	sender → receiver: frame{hello: replica ID, HMAC-SHA256(token, nonce‖ID)}
//	receiver → sender: one status byte (statusOK, statusBadAuth, statusSelf)
//	sender → receiver: frame{batch}, frame{batch}, ...
//
// A frame is a 4-byte big-endian length and that many payload bytes; the
// payload's first byte is its type. Integers are unsigned varints, a
// string is a varint length and its bytes, a block hash 8 little-endian
// bytes. A batch holds load entries (pod, version, in-flight, prefill,
// prompt tokens, uncached tokens), dispatch records (pod, block hashes)
// and prefill-speed samples (pod, tokens, microseconds). The token itself never crosses the wire.
const (
	magic      = "IGPEERS1"
	nonceLen   = 32
	frameHello = 1
	frameBatch = 2

	statusOK      = 0
	statusBadAuth = 1
	statusSelf    = 2

	maxString = 1024 // pod names, replica IDs
	maxHashes = 4096 // block hashes in one record
)

// DefaultMaxFrameBytes bounds one frame.
const DefaultMaxFrameBytes = 1 << 20

var errFrame = errors.New("peers: malformed frame")

func mac(token string, nonce []byte, id string) []byte {
	m := hmac.New(sha256.New, []byte(token))
	m.Write(nonce)
	m.Write([]byte(id))
	return m.Sum(nil)
}

// record is one dispatch: pod was sent a request with these blocks.
type record struct {
	pod    string
	hashes []uint64
}

// sample is one prefill-speed sample: tokens prefilled in micros µs.
type sample struct {
	pod            string
	tokens, micros int
}

// batch is what one frame carries.
type batch struct {
	loads   map[string]picker.ReplicaLoad
	records []record
	samples []sample
}

func (b *batch) empty() bool { return len(b.loads) == 0 && len(b.records) == 0 && len(b.samples) == 0 }

func appendString(dst []byte, s string) []byte {
	dst = binary.AppendUvarint(dst, uint64(len(s)))
	return append(dst, s...)
}

func appendCount(dst []byte, n int) []byte { return binary.AppendUvarint(dst, uint64(max(n, 0))) }

// encodeBatch appends b as a whole frame (length included) to dst.
func encodeBatch(dst []byte, b *batch) []byte {
	start := len(dst)
	dst = append(dst, 0, 0, 0, 0, frameBatch)
	dst = binary.AppendUvarint(dst, uint64(len(b.loads)))
	for pod, l := range b.loads {
		dst = appendString(dst, pod)
		dst = binary.AppendUvarint(dst, l.Version)
		dst = appendCount(dst, l.InFlight)
		dst = appendCount(dst, l.Prefill)
		dst = appendCount(dst, l.PromptTokens)
		dst = appendCount(dst, l.Uncached)
	}
	dst = binary.AppendUvarint(dst, uint64(len(b.records)))
	for _, r := range b.records {
		dst = appendString(dst, r.pod)
		dst = binary.AppendUvarint(dst, uint64(len(r.hashes)))
		for _, h := range r.hashes {
			dst = binary.LittleEndian.AppendUint64(dst, h)
		}
	}
	dst = binary.AppendUvarint(dst, uint64(len(b.samples)))
	for _, s := range b.samples {
		dst = appendString(dst, s.pod)
		dst = appendCount(dst, s.tokens)
		dst = appendCount(dst, s.micros)
	}
	binary.BigEndian.PutUint32(dst[start:], uint32(len(dst)-start-4))
	return dst
}

func encodeHello(id string, sum []byte) []byte {
	p := []byte{0, 0, 0, 0, frameHello}
	p = appendString(p, id)
	p = append(p, sum...)
	binary.BigEndian.PutUint32(p, uint32(len(p)-4))
	return p
}

// readFrame reads one frame's payload into buf (grown as needed).
func readFrame(r io.Reader, buf []byte, maxBytes int) ([]byte, error) {
	var hdr [4]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return buf, err
	}
	n := int(binary.BigEndian.Uint32(hdr[:]))
	if n < 1 || n > maxBytes {
		return buf, fmt.Errorf("peers: frame of %d bytes (limit %d)", n, maxBytes)
	}
	if cap(buf) < n {
		buf = make([]byte, n)
	}
	buf = buf[:n]
	_, err := io.ReadFull(r, buf)
	return buf, err
}

// decoder reads fields of a payload; the first error sticks.
type decoder struct {
	p   []byte
	err error
}

func (d *decoder) uvarint() uint64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Uvarint(d.p)
	if n <= 0 {
		d.err = errFrame
		return 0
	}
	d.p = d.p[n:]
	return v
}

func (d *decoder) count(limit uint64) int {
	v := d.uvarint()
	if v > limit {
		d.err = errFrame
		return 0
	}
	return int(v)
}

func (d *decoder) bytes(n int) []byte {
	if d.err != nil {
		return nil
	}
	if n > len(d.p) {
		d.err = errFrame
		return nil
	}
	b := d.p[:n]
	d.p = d.p[n:]
	return b
}

func (d *decoder) string() string {
	n := d.count(maxString)
	return string(d.bytes(n))
}

func decodeHello(p []byte) (id string, sum []byte, err error) {
	if len(p) == 0 || p[0] != frameHello {
		return "", nil, errFrame
	}
	d := decoder{p: p[1:]}
	id = d.string()
	sum = d.bytes(sha256.Size)
	if d.err == nil && len(d.p) != 0 {
		d.err = errFrame
	}
	return id, sum, d.err
}

// decodeBatch calls load and rec for each entry of a batch payload; the
// hashes slice passed to rec is reused after it returns.
func decodeBatch(p []byte, scratch []uint64, load func(pod string, l picker.ReplicaLoad), rec func(pod string, hashes []uint64), smp func(sample)) ([]uint64, error) {
	if len(p) == 0 || p[0] != frameBatch {
		return scratch, errFrame
	}
	d := decoder{p: p[1:]}
	// Each entry takes at least 2 bytes, so counts beyond the payload's
	// length are malformed (and never allocate).
	limit := uint64(len(p))
	for range d.count(limit) {
		pod := d.string()
		l := picker.ReplicaLoad{Version: d.uvarint()}
		l.InFlight = d.count(1 << 31)
		l.Prefill = d.count(1 << 31)
		l.PromptTokens = d.count(1 << 40)
		l.Uncached = d.count(1 << 40)
		if d.err != nil {
			return scratch, d.err
		}
		load(pod, l)
	}
	for range d.count(limit) {
		pod := d.string()
		n := d.count(maxHashes)
		b := d.bytes(8 * n)
		if d.err != nil {
			return scratch, d.err
		}
		scratch = scratch[:0]
		for i := range n {
			scratch = append(scratch, binary.LittleEndian.Uint64(b[8*i:]))
		}
		rec(pod, scratch)
	}
	for range d.count(limit) {
		s := sample{pod: d.string(), tokens: d.count(1 << 40), micros: d.count(1 << 40)}
		if d.err != nil {
			return scratch, d.err
		}
		smp(s)
	}
	if d.err == nil && len(d.p) != 0 {
		d.err = errFrame
	}
	return scratch, d.err
}
