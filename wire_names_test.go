package remutex

import "github.com/remutex/remutex/internal/wire"

// The tests' short names for the codecs of internal/wire, which the
// library calls by their own names.
var (
	rwKeys   = wire.RWKeys
	semKeys  = wire.SemKeys
	onceKeys = wire.OnceKeys
	keySlot  = wire.Slot

	ownerOrigin = wire.OwnerOrigin
	hostPart    = wire.HostPart
	clientID    = wire.ClientID
)

const (
	releasedInfix = wire.ReleasedInfix
	maxHostLen    = wire.MaxHostLen
)
