package wire

import "strings"

// The keys of every kind of lock called name under prefix P begin with
// P{name}, so that they share one cluster slot. Each kind's keys start with
// its hash (or sorted set) of holders, its fence counter and its queue, in
// that order: the scripts take them in KEYS in that order.

// LockKeys are a DistMutex's keys: P{name}, P{name}:fence, P{name}:waiting.
func LockKeys(prefix, name string) []string { return keysFrom(prefix + "{" + name + "}") }

// RWKeys are a DistRWMutex's keys, apart from the mutex's: P{name}:rw and its
// fence, queue and readers.
func RWKeys(prefix, name string) []string {
	base := prefix + "{" + name + "}:rw"
	return append(keysFrom(base), base+":readers")
}

// SemKeys are a DistSemaphore's keys: P{name}:sem (its holders) and its
// fence, queue and size.
func SemKeys(prefix, name string) []string {
	base := prefix + "{" + name + "}:sem"
	return append(keysFrom(base), base+":size")
}

// OnceKeys are a DistOnce's keys: its lock P{name}:once (and that lock's
// fence counter and queue), its done record P{name}:once:done and its error
// record P{name}:once:err. They are its own, so that a mutex of the same
// name never meets its hold.
func OnceKeys(prefix, name string) []string {
	base := prefix + "{" + name + "}:once"
	return append(keysFrom(base), base+":done", base+":err")
}

// OnceLockKeys are the keys of a once's lock alone (see OnceKeys).
func OnceLockKeys(prefix, name string) []string { return OnceKeys(prefix, name)[:3] }

func keysFrom(base string) []string {
	return []string{base, base + ":fence", base + ":waiting"}
}

// ReleasedInfix joins a lock's home key (the key its holds live in) and a
// Client id into the channel on which that Client hears of the lock:
// <home>:released:<client id>.
const ReleasedInfix = ":released:"

// HashTag returns the part of key Redis Cluster hashes: the text between the
// first '{' and the next '}', or "" when that is empty or missing.
func HashTag(key string) string {
	_, rest, ok := strings.Cut(key, "{")
	if !ok {
		return ""
	}
	tag, _, ok := strings.Cut(rest, "}")
	if !ok {
		return ""
	}
	return tag
}

// Slot is Redis Cluster's slot of key: CRC16 (XMODEM) of its hash tag, or
// of the whole key without one, mod 16384.
func Slot(key string) int {
	if tag := HashTag(key); tag != "" {
		key = tag
	}
	var crc uint16
	for i := 0; i < len(key); i++ {
		crc ^= uint16(key[i]) << 8
		for b := 0; b < 8; b++ {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return int(crc) % 16384
}

// ElectKeys are a DistElection's keys: its leader's hold P{name}:elect (and
// that lock's fence counter, whose tokens are the terms, and its queue of
// candidates), the record of the published leader P{name}:elect:leader and
// the log of records P{name}:elect:log (a stream). The channel on which every
// change is published is ElectChannel of the first.
func ElectKeys(prefix, name string) []string {
	base := prefix + "{" + name + "}:elect"
	return append(keysFrom(base), base+":leader", base+":log")
}

// ElectLockKeys are the keys of an election's lock alone (see ElectKeys).
func ElectLockKeys(prefix, name string) []string { return ElectKeys(prefix, name)[:3] }

// ElectChannel is the channel on which a DistElection's changes are
// published, for the election whose hold is at hash (ElectKeys' first):
// <hash>:changed.
func ElectChannel(hash string) string { return hash + ":changed" }
