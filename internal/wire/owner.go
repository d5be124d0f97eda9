package wire

import (
	"strconv"
	"strings"
)

// A Client's id is <random>.<host>.<pid>: the random part (128 bits in
// unpadded base64url, 22 characters: every owner token, queue entry and
// channel name carries it, and Redis keeps a string of up to 44 bytes in one
// allocation), then the host and pid of its process, so that an operator
// can tell where a hold lives. The scripts take the text before an owner
// token's first ':' for the Client's id, so it has no ':', nor braces (a
// cluster hash tag) or white space.

// MaxHostLen bounds the host part of a Client id.
const MaxHostLen = 64

// ClientID is the id of a Client with the given random part, host (see
// HostPart) and pid.
func ClientID(random, host string, pid int) string {
	return random + "." + host + "." + strconv.Itoa(pid)
}

// HostPart makes h fit in a Client id: every byte outside [A-Za-z0-9._-]
// becomes '_', and at most MaxHostLen bytes are kept; "" is "unknown".
func HostPart(h string) string {
	if h == "" {
		return "unknown"
	}
	b := []byte(h[:min(len(h), MaxHostLen)])
	for i, ch := range b {
		ok := ch >= 'a' && ch <= 'z' || ch >= 'A' && ch <= 'Z' || ch >= '0' && ch <= '9' ||
			ch == '.' || ch == '-' || ch == '_'
		if !ok {
			b[i] = '_'
		}
	}
	return string(b)
}

// AppendOwner appends the owner token of an acquisition to buf:
// <client id>:<goroutine id>.<seq> for a goroutine's hold, or
// <client id>:n<seq> for a NonReentrant value's (goroutine < 0), with seq a
// number the Client never gives again. Every acquisition has a token of its
// own, so a call of an earlier one, however late or often it reaches Redis,
// finds nothing of a later one to change.
func AppendOwner(buf []byte, clientID string, goroutine int64, seq uint64) []byte {
	buf = append(append(buf, clientID...), ':')
	if goroutine < 0 {
		buf = append(buf, 'n')
	} else {
		buf = append(strconv.AppendInt(buf, goroutine, 10), '.')
	}
	return strconv.AppendUint(buf, seq, 10)
}

// OwnerOrigin returns the host and pid in the Client id that begins an
// owner token (or a Client id); "", 0 if it has none.
func OwnerOrigin(owner string) (host string, pid int) {
	id, _, _ := strings.Cut(owner, ":")
	first, last := strings.IndexByte(id, '.'), strings.LastIndexByte(id, '.')
	if first < 0 || last <= first {
		return "", 0
	}
	pid, err := strconv.Atoi(id[last+1:])
	if err != nil {
		return "", 0
	}
	return id[first+1 : last], pid
}
