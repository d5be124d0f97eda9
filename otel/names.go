package remutexotel

import (
	"sync"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// Attribute keys.
const (
	attrName    = attribute.Key("remutex.lock.name")
	attrMode    = attribute.Key("remutex.lock.mode")
	attrHandoff = attribute.Key("remutex.lock.handoff")
	attrOutcome = attribute.Key("remutex.lock.outcome")
	attrEnd     = attribute.Key("remutex.lock.end")
	attrReason  = attribute.Key("remutex.lock.lost.reason")
	attrFence   = attribute.Key("remutex.lock.fence")
)

// names turns lock names into their attributes, made once per recorded
// name so that the frequent events need no allocation.
type names struct {
	mapName func(string) string
	max     int
	byName  sync.Map // recorded name -> *lockAttrs
	mu      sync.Mutex
	n       int // entries of byName; guarded by mu
	other   *lockAttrs
}

func newNames(mapName func(string) string, max int) *names {
	return &names{mapName: mapName, max: max, other: newLockAttrs(OtherLockName)}
}

// get returns the attributes of the lock called name.
func (ns *names) get(name string) *lockAttrs {
	if ns.mapName != nil {
		name = ns.mapName(name)
	}
	if a, ok := ns.byName.Load(name); ok {
		return a.(*lockAttrs)
	}
	ns.mu.Lock()
	defer ns.mu.Unlock()
	if a, ok := ns.byName.Load(name); ok {
		return a.(*lockAttrs)
	}
	if ns.n >= ns.max {
		return ns.other
	}
	a := newLockAttrs(name)
	ns.byName.Store(name, a)
	ns.n++
	return a
}

// lockAttrs are the attributes of one recorded name, by mode.
type lockAttrs struct {
	write, read modeAttrs
}

func newLockAttrs(name string) *lockAttrs {
	return &lockAttrs{write: newModeAttrs(name, modeWrite), read: newModeAttrs(name, modeRead)}
}

func (a *lockAttrs) mode(read bool) *modeAttrs {
	if read {
		return &a.read
	}
	return &a.write
}

// modeAttrs are the measurement options of one name and mode, as the
// slices the instruments take, so that recording allocates nothing.
type modeAttrs struct {
	kv            []attribute.KeyValue // name and mode
	base          opts
	acquired      [2]opts // by handoffOf
	waitAcquired  opts
	released      opts
	releaseFailed opts
	lost          opts
}

// opts are the options of one attribute set, for both kinds of instrument.
type opts struct {
	add []metric.AddOption
	rec []metric.RecordOption
}

func newModeAttrs(name, mode string) modeAttrs {
	a := modeAttrs{kv: []attribute.KeyValue{attrName.String(name), attrMode.String(mode)}}
	a.base = a.with()
	a.acquired[0] = a.with(attrHandoff.String(handoffFree))
	a.acquired[1] = a.with(attrHandoff.String(handoffGrant))
	a.waitAcquired = a.with(attrOutcome.String(outcomeAcquired))
	a.released = a.with(attrEnd.String(endReleased))
	a.releaseFailed = a.with(attrEnd.String(endReleaseFailed))
	a.lost = a.with(attrEnd.String(endLost))
	return a
}

// with returns the options of the name and mode and more.
func (a *modeAttrs) with(more ...attribute.KeyValue) opts {
	kv := make([]attribute.KeyValue, 0, len(a.kv)+len(more))
	kv = append(append(kv, a.kv...), more...)
	o := metric.WithAttributeSet(attribute.NewSet(kv...))
	return opts{add: []metric.AddOption{o}, rec: []metric.RecordOption{o}}
}
