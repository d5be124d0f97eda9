package wire

import (
	"strconv"
	"strings"
)

// Message is a message on a Client's channel of a lock
// (<home>:released:<client id>), as the release scripts publish it:
//
//	"w <entry>"           a quorum's: the lock is free, entry may take it
//	"g <fence> <entry>"   a single server's: the lock was handed to entry
//	"o <outcome>\n<entry> <entry> ..."
//	                      a DistOnce's run ended with outcome ("d" done, or
//	                      "e" and its error record), and the entries, which
//	                      waited for it, left the queue
//
// A kind other than these is read as a wake-up of the entry it names.
type Message struct {
	Kind  string // "w", "g", "o", or another
	Fence int64  // "g": the grant's fencing token (0 without fencing)
	Wait  string // not "o": the wait key of the entry (see WaitKey)
	At    int64  // not "o": the send time the entry names
	// "o": the outcome, and the entries that left, separated by spaces
	// (each read with ParseEntry).
	Outcome, Entries string
}

// Grant reports whether m hands the lock to the entry it names.
func (m Message) Grant() bool { return m.Kind == "g" }

// ParseMessage decodes payload; ok false if it is not a message.
func ParseMessage(payload string) (m Message, ok bool) {
	kind, rest, _ := strings.Cut(payload, " ")
	m.Kind = kind
	switch kind {
	case "o":
		m.Outcome, m.Entries, ok = strings.Cut(rest, "\n")
		return m, ok && m.Outcome != ""
	case "g":
		f, entry, ok := strings.Cut(rest, " ")
		if !ok {
			return Message{}, false
		}
		m.Fence, _ = strconv.ParseInt(f, 10, 64) // (a token that does not parse is 0: no fencing)
		rest = entry
	}
	m.Wait, m.At, ok = ParseEntry(rest)
	return m, ok
}
