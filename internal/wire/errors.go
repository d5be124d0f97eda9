package wire

import (
	"strconv"
	"strings"
)

// ScriptError is an error reply the scripts raise themselves (see
// hash_error.lua and queue.lua's no_expiry), decoded:
//
//	"WRONGTYPE remutex <type> <key>"              a key of another type, or a field that is no hold
//	"NOEXPIRY remutex <bytes of key> <key> <owner>"  a hold without expiry (key and owner may hold spaces)
//	"SIZE remutex <stored size> <key>"            a semaphore's size that differs from the caller's
type ScriptError struct {
	Code   string // "WRONGTYPE", "NOEXPIRY" or "SIZE"
	Key    string
	Type   string // WRONGTYPE: what the key holds
	Owner  string // NOEXPIRY: the holder
	Stored int64  // SIZE: the size stored in Redis
}

// ParseScriptError decodes msg, an error reply's text; ok false if it is not
// one the scripts raise, or does not parse (then Code alone is set, if the
// reply is one of theirs).
func ParseScriptError(msg string) (e ScriptError, ok bool) {
	if rest, found := strings.CutPrefix(msg, "WRONGTYPE remutex "); found {
		typ, key, _ := strings.Cut(rest, " ")
		return ScriptError{Code: "WRONGTYPE", Key: key, Type: typ}, true
	}
	if rest, found := strings.CutPrefix(msg, "NOEXPIRY remutex "); found {
		n, tail, _ := strings.Cut(rest, " ")
		k, err := strconv.Atoi(n)
		if err != nil || k < 0 || k+1 > len(tail) {
			return ScriptError{Code: "NOEXPIRY"}, false
		}
		return ScriptError{Code: "NOEXPIRY", Key: tail[:k], Owner: tail[k+1:]}, true
	}
	if rest, found := strings.CutPrefix(msg, "SIZE remutex "); found {
		stored, key, _ := strings.Cut(rest, " ")
		n, err := strconv.ParseInt(stored, 10, 64)
		if err != nil {
			return ScriptError{Code: "SIZE"}, false
		}
		return ScriptError{Code: "SIZE", Key: key, Stored: n}, true
	}
	return ScriptError{}, false
}

// transientPrefixes are the Redis error replies that pass on their own: a
// server still loading, a failover in progress, a cluster reconfiguring.
var transientPrefixes = []string{
	"LOADING", "READONLY", "MASTERDOWN", "CLUSTERDOWN", "TRYAGAIN",
	"MOVED", "ASK", "BUSY ", "NOREPLICAS",
}

// TransientReply reports whether an error reply (its text) passes on its
// own, so that the call is worth sending again.
func TransientReply(msg string) bool {
	for _, p := range transientPrefixes {
		if strings.HasPrefix(msg, p) {
			return true
		}
	}
	return false
}

// AuthReply reports an error reply that asks for authentication: NOAUTH,
// or, for a command of more than a few arguments from an unauthenticated
// connection, "Protocol error: unauthenticated multibulk length" (after
// which the server closes the connection).
func AuthReply(msg string) bool {
	return strings.HasPrefix(msg, "NOAUTH") || strings.Contains(msg, "unauthenticated")
}
