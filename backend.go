package remutex

import (
	"context"

	"github.com/remutex/remutex/internal/transport"
	"github.com/remutex/remutex/internal/wire"
)

// Reply codes of the acquire and release scripts (see internal/wire).
const (
	replyLost    = wire.Lost
	replyBusy    = wire.Busy
	replyGranted = wire.Granted
	replyQueued  = wire.Queued
	replyGone    = wire.Gone

	releaseNotHeld = wire.NotHeld
	releaseDone    = wire.Done
	releaseHandoff = wire.Handoff
)

// The transport's types under the engine's names (see internal/transport).
type (
	backend    = transport.Backend
	reply      = transport.Reply
	acquireReq = transport.AcquireReq
	queuePlace = transport.QueuePlace
	fenceMode  = transport.FenceMode
	renewItem  = transport.RenewItem
)

// The fence modes (see transport.FenceMode).
const (
	fenceOff   = transport.FenceOff
	fenceOn    = transport.FenceOn
	fenceFresh = transport.FenceFresh
)

// parseReply decodes the reply of an acquire script (see
// wire.ParseAcquire).
func parseReply(v interface{}) (reply, error) { return transport.ParseReply(v) }

// rollback releases a hold nobody will use (a lost hold's field that may be
// left on the server, a leftover in the way of a new acquisition), best
// effort and briefly, within ctx: its lease ends it otherwise. keep is the
// final release's lease argument: how long the key stays taken by nobody
// (WithMinHold, see releaseArg), "0" none.
func rollback(ctx context.Context, b backend, s *lockSpec, owner, keep interface{}) error {
	ctx, cancel := context.WithTimeout(ctx, rollbackTimeout)
	defer cancel()
	_, err := b.Release(ctx, &s.Spec, owner, 0, keep)
	return err
}

// postRelease posts the release of what a call may have granted owner that
// nobody will use (see transport.PostRelease); keep is as for rollback.
func postRelease(ctx context.Context, b backend, s *lockSpec, owner, keep interface{}) {
	transport.PostRelease(ctx, b, &s.Spec, owner, keep)
}
