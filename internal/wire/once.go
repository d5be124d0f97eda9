package wire

import (
	"encoding/json"
	"strconv"
)

// OnceRecord is a DistOnce's record in Redis, JSON of version 1: the done
// record (P{name}:once:done), or, with Err, the error record of a failed
// run (P{name}:once:err).
type OnceRecord struct {
	V     int    `json:"v"`
	By    string `json:"by"`    // the owner token of the run's hold
	Start int64  `json:"start"` // unix ms, when f started
	Ms    int64  `json:"ms"`    // how long f ran
	Err   string `json:"err,omitempty"`
}

// ParseOnceRecord decodes a record; ok false for anything that is not one
// (foreign data under the record's key).
func ParseOnceRecord(s string) (*OnceRecord, bool) {
	var rec OnceRecord
	if err := json.Unmarshal([]byte(s), &rec); err != nil || rec.V != 1 || rec.By == "" {
		return nil, false
	}
	return &rec, true
}

// Outcome is once_release.lua's outcome argument for rec, which the run's
// final release stores and tells the waiters: "d<record>" for a done run,
// "e<keep ms>:<record>" for a failed one, whose record is kept keepMs.
func (rec *OnceRecord) Outcome(keepMs int64) string {
	b, _ := json.Marshal(rec) // (cannot fail: strings and integers)
	if rec.Err == "" {
		return "d" + string(b)
	}
	return "e" + strconv.FormatInt(keepMs, 10) + ":" + string(b)
}
