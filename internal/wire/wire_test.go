package wire

import (
	"slices"
	"strings"
	"testing"
)

// TestKeys: the key names are a contract between versions; these are
// today's, letter for letter.
func TestKeys(t *testing.T) {
	for _, tc := range []struct {
		what string
		got  []string
		want []string
	}{
		{"LockKeys", LockKeys("remutex:", "job"), []string{"remutex:{job}", "remutex:{job}:fence", "remutex:{job}:waiting"}},
		{"RWKeys", RWKeys("p:", "cfg"), []string{"p:{cfg}:rw", "p:{cfg}:rw:fence", "p:{cfg}:rw:waiting", "p:{cfg}:rw:readers"}},
		{"SemKeys", SemKeys("p:", "gpu"), []string{"p:{gpu}:sem", "p:{gpu}:sem:fence", "p:{gpu}:sem:waiting", "p:{gpu}:sem:size"}},
		{"OnceKeys", OnceKeys("p:", "m"), []string{"p:{m}:once", "p:{m}:once:fence", "p:{m}:once:waiting", "p:{m}:once:done", "p:{m}:once:err"}},
		{"OnceLockKeys", OnceLockKeys("p:", "m"), []string{"p:{m}:once", "p:{m}:once:fence", "p:{m}:once:waiting"}},
		{"ElectKeys", ElectKeys("p:", "ldr"), []string{"p:{ldr}:elect", "p:{ldr}:elect:fence", "p:{ldr}:elect:waiting", "p:{ldr}:elect:leader", "p:{ldr}:elect:log"}},
		{"ElectChannel", []string{ElectChannel("p:{ldr}:elect")}, []string{"p:{ldr}:elect:changed"}},
	} {
		if !slices.Equal(tc.got, tc.want) {
			t.Errorf("%s: got %q, want %q", tc.what, tc.got, tc.want)
		}
		for _, k := range tc.got {
			if Slot(k) != Slot(tc.got[0]) {
				t.Errorf("%s: %q is in slot %d, %q in %d", tc.what, k, Slot(k), tc.got[0], Slot(tc.got[0]))
			}
		}
	}
}

// TestSlot: Redis Cluster's slots of known keys (CLUSTER KEYSLOT).
func TestSlot(t *testing.T) {
	for key, want := range map[string]int{
		"foo": 12182, "bar": 5061, "hello": 866, "": 0,
		"{user1000}.following": 3443, "{user1000}.followers": 3443, "user1000": 3443,
		"{}.x": Slot("{}.x"), "foo{}{bar}": Slot("foo{}{bar}"), "foo{{bar}}zap": Slot("{bar"),
	} {
		if got := Slot(key); got != want {
			t.Errorf("Slot(%q): got %d, want %d", key, got, want)
		}
	}
	for key, want := range map[string]string{"a{b}c": "b", "{}x": "", "x{": "", "a{b{c}d}": "b{c", "none": ""} {
		if got := HashTag(key); got != want {
			t.Errorf("HashTag(%q): got %q, want %q", key, got, want)
		}
	}
}

// TestEntry: an entry's text, as the scripts keep it, and what a message
// naming it tells its waiter.
func TestEntry(t *testing.T) {
	e := Entry{ClaimMs: "750", Flag: "1", Wait: 7, At: 1234, Arrival: 1700000000000, Owner: "cid:g5:3"}
	if got, want := e.String(), "750:1:7-1234.1700000000000:cid:g5:3"; got != want {
		t.Errorf("String: got %q, want %q", got, want)
	}
	e.Permits, e.WithPermits, e.Flag = 3, true, "S"
	if got, want := e.String(), "750:S:7-1234.1700000000000.3:cid:g5:3"; got != want {
		t.Errorf("String with permits: got %q, want %q", got, want)
	}
	key, at, ok := ParseEntry(e.String())
	if !ok || key != WaitKey(7, "cid:g5:3") || at != 1234 {
		t.Errorf("ParseEntry: got %q %d %v, want %q 1234 true", key, at, ok, WaitKey(7, "cid:g5:3"))
	}
	for _, bad := range []string{"", "750:1:7", "750:1:7.1234:o", "750:1:7-x.1:o", "750:1:7-:o"} {
		if _, _, ok := ParseEntry(bad); ok {
			t.Errorf("ParseEntry(%q): ok, want not an entry", bad)
		}
	}
}

// TestParseMessage: each kind of message, and what is not one.
func TestParseMessage(t *testing.T) {
	entry := Entry{ClaimMs: "750", Flag: "0", Wait: 2, At: 99, Arrival: 5, Owner: "o:1"}.String()
	for _, tc := range []struct {
		payload string
		want    Message
		ok      bool
	}{
		{"g 42 " + entry, Message{Kind: "g", Fence: 42, Wait: "2:o:1", At: 99}, true},
		{"g 0 " + entry, Message{Kind: "g", Wait: "2:o:1", At: 99}, true},
		{"w " + entry, Message{Kind: "w", Wait: "2:o:1", At: 99}, true},
		{"o d\n" + entry + " " + entry, Message{Kind: "o", Outcome: "d", Entries: entry + " " + entry}, true},
		{"o eboom\n", Message{Kind: "o", Outcome: "eboom"}, true},
		{"o \n" + entry, Message{}, false},
		{"o d", Message{}, false},
		{"g 42", Message{}, false},
		{"g " + entry, Message{}, false},
		{"w nonsense", Message{}, false},
		{"", Message{}, false},
	} {
		got, ok := ParseMessage(tc.payload)
		if ok != tc.ok || ok && got != tc.want {
			t.Errorf("ParseMessage(%q): got %+v %v, want %+v %v", tc.payload, got, ok, tc.want, tc.ok)
		}
		if ok && got.Grant() != (tc.want.Kind == "g") {
			t.Errorf("ParseMessage(%q).Grant(): got %v", tc.payload, got.Grant())
		}
	}
}

// FuzzEntry: an entry whose parts the scripts can keep comes back from a
// message as its wait and send time; no input makes the parsers panic.
func FuzzEntry(f *testing.F) {
	f.Add("750", "1", uint64(1), int64(2), int64(3), 4, true, "cid:g1:1")
	f.Add("", "", uint64(0), int64(-1), int64(0), 0, false, "")
	f.Fuzz(func(t *testing.T, claim, flag string, wait uint64, at, arrival int64, permits int, withPermits bool, owner string) {
		e := Entry{ClaimMs: claim, Flag: flag, Wait: wait, At: at, Arrival: arrival, Permits: permits, WithPermits: withPermits, Owner: owner}
		s := e.String()
		key, gotAt, ok := ParseEntry(s)
		_, _ = ParseMessage("g 1 " + s)
		_, _ = ParseMessage(s)
		if strings.Contains(claim, ":") || strings.Contains(flag, ":") {
			return // (the scripts' own parts hold no colon)
		}
		if !ok || key != WaitKey(wait, owner) || gotAt != at {
			t.Fatalf("ParseEntry(%q): got %q %d %v, want %q %d true", s, key, gotAt, ok, WaitKey(wait, owner), at)
		}
		m, ok := ParseMessage("g 9 " + s)
		if !ok || m.Wait != key || m.At != at || m.Fence != 9 || !m.Grant() {
			t.Fatalf("ParseMessage(g 9 %q): got %+v %v", s, m, ok)
		}
	})
}

// TestParseAcquire: the acquire scripts' one-number reply.
func TestParseAcquire(t *testing.T) {
	for _, tc := range []struct {
		v         interface{}
		code, val int64
	}{
		{int64(0), Granted, 0}, {int64(17), Granted, 17}, {"5", Granted, 5},
		{int64(-(4*250 + 0) - 1), Busy, 250}, {int64(-(4*250 + 1) - 1), Queued, 250},
		{int64(-(4*0 + 2) - 1), Gone, 0}, {int64(-(4*9 + 3) - 1), Lost, 9},
	} {
		code, val, err := ParseAcquire(tc.v)
		if err != nil || code != tc.code || val != tc.val {
			t.Errorf("ParseAcquire(%v): got %d %d %v, want %d %d", tc.v, code, val, err, tc.code, tc.val)
		}
	}
	for _, bad := range []interface{}{nil, "x", []interface{}{int64(1)}, 1.5} {
		if _, _, err := ParseAcquire(bad); err == nil {
			t.Errorf("ParseAcquire(%v): no error", bad)
		}
	}
}

// TestParseScriptError: the error replies the scripts raise, and replies
// that are not theirs.
func TestParseScriptError(t *testing.T) {
	for _, tc := range []struct {
		msg  string
		want ScriptError
		ok   bool
	}{
		{"WRONGTYPE remutex string p:{a}", ScriptError{Code: "WRONGTYPE", Key: "p:{a}", Type: "string"}, true},
		{"WRONGTYPE remutex string p:{a b}", ScriptError{Code: "WRONGTYPE", Key: "p:{a b}", Type: "string"}, true},
		{"NOEXPIRY remutex 7 p:{a b} owner x", ScriptError{Code: "NOEXPIRY", Key: "p:{a b}", Owner: "owner x"}, true},
		{"NOEXPIRY remutex 99 p:{a}", ScriptError{Code: "NOEXPIRY"}, false},
		{"NOEXPIRY remutex x p:{a} o", ScriptError{Code: "NOEXPIRY"}, false},
		{"SIZE remutex 3 p:{s}:sem:size", ScriptError{Code: "SIZE", Key: "p:{s}:sem:size", Stored: 3}, true},
		{"SIZE remutex three p:{s}", ScriptError{Code: "SIZE"}, false},
		{"WRONGTYPE Operation against a key holding the wrong kind of value", ScriptError{}, false},
		{"ERR unknown command", ScriptError{}, false},
	} {
		got, ok := ParseScriptError(tc.msg)
		if got != tc.want || ok != tc.ok {
			t.Errorf("ParseScriptError(%q): got %+v %v, want %+v %v", tc.msg, got, ok, tc.want, tc.ok)
		}
	}
	for msg, want := range map[string]bool{"LOADING Redis is loading": true, "READONLY You can't write": true,
		"MOVED 3999 127.0.0.1:6381": true, "BUSY Redis is busy": true, "BUSYKEY x": false, "NOPERM": false, "ERR x": false} {
		if got := TransientReply(msg); got != want {
			t.Errorf("TransientReply(%q): got %v, want %v", msg, got, want)
		}
	}
	for msg, want := range map[string]bool{"NOAUTH Authentication required.": true,
		"ERR Protocol error: unauthenticated multibulk length": true, "NOPERM": false} {
		if got := AuthReply(msg); got != want {
			t.Errorf("AuthReply(%q): got %v, want %v", msg, got, want)
		}
	}
}

// TestOwner: owner tokens as the scripts and Inspect read them.
func TestOwner(t *testing.T) {
	id := ClientID("AAAAAAAAAAAAAAAAAAAAAA", HostPart("web 1"), 42)
	if id != "AAAAAAAAAAAAAAAAAAAAAA.web_1.42" {
		t.Errorf("ClientID: got %q", id)
	}
	for _, tc := range []struct {
		gid  int64
		seq  uint64
		want string
	}{{7, 3, id + ":7.3"}, {-1, 9, id + ":n9"}, {0, 1, id + ":0.1"}} {
		if got := string(AppendOwner(nil, id, tc.gid, tc.seq)); got != tc.want {
			t.Errorf("AppendOwner(%d, %d): got %q, want %q", tc.gid, tc.seq, got, tc.want)
		}
		if host, pid := OwnerOrigin(tc.want); host != "web_1" || pid != 42 {
			t.Errorf("OwnerOrigin(%q): got %q %d, want web_1 42", tc.want, host, pid)
		}
	}
	for _, owner := range []string{"", "x", "a.b", "a.b.c:1", "legacy-owner"} {
		if host, pid := OwnerOrigin(owner); host != "" || pid != 0 {
			t.Errorf("OwnerOrigin(%q): got %q %d, want none", owner, host, pid)
		}
	}
	if got := HostPart(strings.Repeat("h", 100)); len(got) != MaxHostLen {
		t.Errorf("HostPart of 100 bytes: got %d bytes, want %d", len(got), MaxHostLen)
	}
}

// TestParseQueued: Inspect's reading of an entry, which keeps what it can.
func TestParseQueued(t *testing.T) {
	e := Entry{ClaimMs: "750", Flag: "S", Wait: 3, At: 12, Arrival: 1700000000000, Permits: 5, WithPermits: true, Owner: "c.h.1:n4"}
	if got, ok := ParseQueued(e.String()); !ok || got != e {
		t.Errorf("ParseQueued(%q): got %+v %v, want %+v", e.String(), got, ok, e)
	}
	if got, ok := ParseQueued("750:r:x.y:o"); !ok || got.Flag != "r" || got.Owner != "o" || got.Arrival != 0 {
		t.Errorf("ParseQueued of bad numbers: got %+v %v", got, ok)
	}
	if _, ok := ParseQueued("750:s:3.1700000000000.5"); ok {
		t.Error("ParseQueued of three parts: ok")
	}
}

// TestOnceRecord: a DistOnce's records and the outcome its run's release
// stores.
func TestOnceRecord(t *testing.T) {
	done := &OnceRecord{V: 1, By: "c.h.1:n2", Start: 1700000000000, Ms: 12}
	if got, want := done.Outcome(60000), `d{"v":1,"by":"c.h.1:n2","start":1700000000000,"ms":12}`; got != want {
		t.Errorf("Outcome: got %q, want %q", got, want)
	}
	failed := *done
	failed.Err = "boom"
	out := failed.Outcome(60000)
	if want := `e60000:{"v":1,"by":"c.h.1:n2","start":1700000000000,"ms":12,"err":"boom"}`; out != want {
		t.Errorf("Outcome of a failed run: got %q, want %q", out, want)
	}
	rec, ok := ParseOnceRecord(out[len("e60000:"):])
	if !ok || *rec != failed {
		t.Errorf("ParseOnceRecord: got %+v %v, want %+v", rec, ok, failed)
	}
	for _, bad := range []string{"", "precious", `{"v":2,"by":"x"}`, `{"v":1}`, `[1]`} {
		if _, ok := ParseOnceRecord(bad); ok {
			t.Errorf("ParseOnceRecord(%q): ok", bad)
		}
	}
}

// FuzzDecoders: no reply, message or record, however garbled, makes a
// decoder panic, and what decodes re-encodes to what was read.
func FuzzDecoders(f *testing.F) {
	for _, s := range []string{"g 1 750:1:7-1.2:o", "o d\n750:0:1-2.3:o", "WRONGTYPE remutex string k",
		"NOEXPIRY remutex 1 k o", "SIZE remutex 3 k", `{"v":1,"by":"o"}`, "750:S:3-4.5.6:o", "-7"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		_, _ = ParseMessage(s)
		_, _ = ParseScriptError(s)
		_ = TransientReply(s)
		_, _, _ = ParseAcquire(s)
		_, _ = OwnerOrigin(s)
		if rec, ok := ParseOnceRecord(s); ok {
			if back, ok := ParseOnceRecord(rec.Outcome(1)[1:]); rec.Err == "" && (!ok || *back != *rec) {
				t.Fatalf("once record %q: re-encoded as %+v %v", s, back, ok)
			}
		}
		if q, ok := ParseQueued(s); ok && !strings.Contains(q.ClaimMs+q.Flag, ":") {
			if _, _, ok := ParseEntry(s); ok {
				if key, at, _ := ParseEntry(q.String()); key != WaitKey(q.Wait, q.Owner) || at != q.At {
					t.Fatalf("entry %q: re-encoded as %q", s, q.String())
				}
			}
		}
	})
}
