package wire

import (
	"strconv"
	"strings"
)

// LeaderRecord is a DistElection's record of its published leader, as
// elect.lua stores it (P{name}:elect:leader), logs it (the log's entry ID is
// its ID) and publishes it:
//
//	<term>-<n> <since unix ms> <owner token> <value>
//
// The term is the leader's fence token, n counts the publications of that
// term from 1, and the value comes last, so it may hold anything.
type LeaderRecord struct {
	ID    LeaderID
	Since int64 // unix ms on the server's clock: the term's first publication
	Owner string
	Value string
}

// LeaderID is a record's ID: its term, and which publication of the term it
// is. IDs order as (Term, N); it is also the record's stream entry ID.
type LeaderID struct{ Term, N int64 }

// String is the ID as the stream and the records write it.
func (id LeaderID) String() string {
	return strconv.FormatInt(id.Term, 10) + "-" + strconv.FormatInt(id.N, 10)
}

// Less reports whether id comes before o.
func (id LeaderID) Less(o LeaderID) bool {
	return id.Term < o.Term || id.Term == o.Term && id.N < o.N
}

// ParseLeaderID decodes "<term>-<n>" ("0-0": none yet).
func ParseLeaderID(s string) (LeaderID, bool) {
	t, n, ok := strings.Cut(s, "-")
	if !ok {
		return LeaderID{}, false
	}
	term, err1 := strconv.ParseInt(t, 10, 64)
	seq, err2 := strconv.ParseInt(n, 10, 64)
	if err1 != nil || err2 != nil || term < 0 || seq < 0 {
		return LeaderID{}, false
	}
	return LeaderID{term, seq}, true
}

// String is the record as stored.
func (r LeaderRecord) String() string {
	return r.ID.String() + " " + strconv.FormatInt(r.Since, 10) + " " + r.Owner + " " + r.Value
}

// ParseLeaderRecord decodes a record; ok false for anything that is not one
// (foreign data under the record's key).
func ParseLeaderRecord(s string) (LeaderRecord, bool) {
	parts := strings.SplitN(s, " ", 4)
	if len(parts) != 4 || parts[2] == "" {
		return LeaderRecord{}, false
	}
	id, ok := ParseLeaderID(parts[0])
	since, err := strconv.ParseInt(parts[1], 10, 64)
	if !ok || id.Term < 1 || id.N < 1 || err != nil {
		return LeaderRecord{}, false
	}
	return LeaderRecord{ID: id, Since: since, Owner: parts[2], Value: parts[3]}, true
}

// ParseLeaderMessage decodes a message on an election's changes channel:
// "<previous record's ID> <record>", the previous ID "0-0" for the first.
func ParseLeaderMessage(s string) (prev LeaderID, rec LeaderRecord, ok bool) {
	p, r, found := strings.Cut(s, " ")
	if !found {
		return prev, rec, false
	}
	if prev, ok = ParseLeaderID(p); !ok {
		return prev, rec, false
	}
	rec, ok = ParseLeaderRecord(r)
	return prev, rec, ok
}
