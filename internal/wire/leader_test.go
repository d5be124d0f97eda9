package wire

import "testing"

// TestLeaderRecord: a DistElection's record and message, as elect.lua
// writes them, decode to their parts; foreign data does not.
func TestLeaderRecord(t *testing.T) {
	s := "1700000000000001-2 1700000000123 abc.host-1.42:n7 value with spaces"
	rec, ok := ParseLeaderRecord(s)
	want := LeaderRecord{ID: LeaderID{1700000000000001, 2}, Since: 1700000000123, Owner: "abc.host-1.42:n7", Value: "value with spaces"}
	if !ok || rec != want {
		t.Fatalf("ParseLeaderRecord: got %+v %v, want %+v", rec, ok, want)
	}
	if rec.String() != s {
		t.Errorf("String: got %q, want %q", rec.String(), s)
	}
	prev, got, ok := ParseLeaderMessage("1700000000000001-1 " + s)
	if !ok || got != want || prev != (LeaderID{1700000000000001, 1}) {
		t.Errorf("ParseLeaderMessage: got %v %+v %v", prev, got, ok)
	}
	if _, m, ok := ParseLeaderMessage("0-0 5-1 1 o "); !ok || m.Value != "" {
		t.Errorf("empty value: got %+v %v", m, ok)
	}
	for _, bad := range []string{"", "x", "1-1 2 o", "0-1 2 o v", "1-0 2 o v", "1 2 o v", "-1-1 2 o v", "1-1 x o v", "1-1 2  v"} {
		if _, ok := ParseLeaderRecord(bad); ok {
			t.Errorf("ParseLeaderRecord(%q): ok", bad)
		}
	}
	if !(LeaderID{1, 9}).Less(LeaderID{2, 1}) || !(LeaderID{2, 1}).Less(LeaderID{2, 2}) || (LeaderID{2, 2}).Less(LeaderID{2, 2}) {
		t.Error("LeaderID.Less does not order by term, then n")
	}
}

// FuzzLeaderRecord: no record or message makes a decoder panic, and what
// decodes re-encodes to itself.
func FuzzLeaderRecord(f *testing.F) {
	f.Add("0-0 3-1 17 o.h.1:n1 v")
	f.Fuzz(func(t *testing.T, s string) {
		_, _ = ParseLeaderID(s)
		_, _, _ = ParseLeaderMessage(s)
		if rec, ok := ParseLeaderRecord(s); ok {
			if back, ok := ParseLeaderRecord(rec.String()); !ok || back != rec {
				t.Fatalf("record %q: re-encoded as %q (%+v %v)", s, rec.String(), back, ok)
			}
		}
	})
}
