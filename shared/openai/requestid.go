package openai

import (
	"crypto/rand"
	"encoding/hex"
)

// HeaderRequestID carries a request's ID between client, Tier 2, Tier 1
// and the engine, and back to the client on the response.
const HeaderRequestID = "X-Request-Id"

// MaxRequestIDLen bounds a client-supplied request ID.
const MaxRequestIDLen = 128

// RequestID returns the ID to use for a request whose client sent id: id
// itself when it is 1 to MaxRequestIDLen visible ASCII characters (no
// spaces or control bytes, so it cannot forge a log line or a header),
// else a fresh random ID.
func RequestID(id string) string {
	if ValidRequestID(id) {
		return id
	}
	return NewRequestID()
}

// ValidRequestID reports whether id may be used as given; see RequestID.
func ValidRequestID(id string) bool {
	if id == "" || len(id) > MaxRequestIDLen {
		return false
	}
	for i := 0; i < len(id); i++ {
		if id[i] < 0x21 || id[i] > 0x7e {
			return false
		}
	}
	return true
}

// NewRequestID returns a random 24-hex-digit ID.
func NewRequestID() string {
	var b [12]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand)
	return hex.EncodeToString(b[:])
}
