package remutex

// How the wait of a DistOnce's Do for the once's lock ends when the run it
// waited for ended: the run's final release told it the outcome, or its
// queue entry was found gone (see once_release.lua, Client.tellOutcome).

import "context"

// told returns the outcome of the DistOnce run the attempt waited for, if
// the run's final release told it (see Client.tellOutcome); else "". Where
// writes must be acknowledged by replicas (WithReplicaAck) it is always "":
// the message leaves before any replica has the record, and a failover
// could then lose it, so the waiter finds the outcome the way it did before
// the message, through the lock, by calls the replicas acknowledge.
func (a *attempt) told() string {
	c := a.m.c
	if c.be.Acked() {
		return ""
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return a.w.told
}

// ended ends a wait for a DistOnce's lock whose run ended: the run's final
// release removed the attempt's entry and told it the outcome, which its
// Do returns (see runEnded) without a call; or ("" outcome) its entry was
// found gone without the message, and Do reads the outcome. Should the
// attempt's latest call have got no answer, that call may still reach Redis
// and queue it again, or take the lock: a leave follows it, as giveUp's
// does.
func (a *attempt) ended(ctx context.Context, outcome string) (bool, error) {
	if a.again {
		a.postLeave(ctx)
	}
	return false, &runEnded{outcome: outcome}
}

// runEnded is how the wait of a Do for the once's lock ends when the run
// it waited for ends: the run's final release removed the waiter's queue
// entry and told its Client the outcome in the same call (see
// once_release.lua), so the waiter returns with it, without a call of its
// own, rather than be handed the lock to read the outcome and pass it on.
type runEnded struct {
	// outcome is "d" done, "e" and the failed run's error record, or ""
	// if the wait found its entry gone without a message: Do then reads
	// the records.
	outcome string
}

func (e *runEnded) Error() string {
	return "remutex: the once's run ended, and its release told the outcome"
}
