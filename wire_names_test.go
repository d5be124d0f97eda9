package remutex

import "github.com/remutex/remutex/internal/wire"

// The tests' short names for the codecs of internal/wire, which the
// library calls by their own names.
var (
	rwKeys   = wire.RWKeys
	semKeys  = wire.SemKeys
	onceKeys = wire.OnceKeys
	keySlot  = wire.Slot
)

const releasedInfix = wire.ReleasedInfix
