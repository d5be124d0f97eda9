package remutex

import (
	"context"
	"errors"
	"sync"
)

// RunOption configures DistElection.Run.
type RunOption func(*runConfig)

type runConfig struct {
	newLeader func(Leader)
	stopped   func(term int64, err error)
}

// OnNewLeader has Run call f with each leader the election has (this
// candidate too), in order, as Observe reports them: on a goroutine of its
// own that Run starts and joins before it returns, one call at a time.
// Default: none.
func OnNewLeader(f func(Leader)) RunOption {
	return func(c *runConfig) { c.newLeader = f }
}

// OnStoppedLeading has Run call f when a term in which it ran its function
// ended, after that function returned and the term was resigned: with the
// term's number and why it ended (nil: the function returned nil; the
// function's error; an error matching ErrLockLost if the term was lost).
// It is never called for a term whose function did not start. Default:
// none.
func OnStoppedLeading(f func(term int64, err error)) RunOption {
	return func(c *runConfig) { c.stopped = f }
}

// Run campaigns with value, runs f while e leads, and resigns when f
// returns, as client-go's leaderelection does, and campaigns again unless
// ctx ended. f's context ends when the term ends (lost: its cause matches
// ErrLockLost, before another candidate can be elected) or when ctx ends;
// Run waits for f to return before it resigns. f reads the term's number,
// the fencing token to hand to storage, with e.Term().
//
// Run returns ctx's error (wrapped) once ctx ended; f's error, after
// resigning, if f returned one while its term was still valid and ctx not
// done; or the error that ended a Campaign (ErrClosed, a permanent Redis
// error). A term that was lost, or f returning nil, leads to the next
// Campaign. A panic of f resigns the term and goes on. Run panics if f is
// nil.
func (e *DistElection) Run(ctx context.Context, value string, f func(ctx context.Context) error, opts ...RunOption) error {
	e.client()
	if f == nil {
		panic("remutex: DistElection.Run: nil function")
	}
	var cfg runConfig
	for _, o := range opts {
		if o == nil {
			panic("remutex: DistElection.Run: nil option")
		}
		o(&cfg)
	}
	if cfg.newLeader != nil {
		octx, stop := context.WithCancel(ctx)
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			for l := range e.Observe(octx) {
				cfg.newLeader(l)
			}
		}()
		defer wg.Wait()
		defer stop()
	}
	for {
		if err := e.Campaign(ctx, value); err != nil {
			return err
		}
		done, err := e.runTerm(ctx, f, &cfg)
		if done {
			return err
		}
	}
}

// runTerm runs f in the term e leads, resigns it, and tells cfg.stopped.
// It reports whether Run is done, with its error.
func (e *DistElection) runTerm(ctx context.Context, f func(ctx context.Context) error, cfg *runConfig) (done bool, err error) {
	term, tctx := e.Term(), e.Context()
	fctx, cancel := context.WithCancelCause(tctx)
	stop := context.AfterFunc(ctx, func() { cancel(context.Cause(ctx)) })
	var ferr error
	returned := false
	defer func() {
		stop()
		cancel(nil)
		lost := context.Cause(tctx)
		if !errors.Is(lost, ErrLockLost) {
			lost = nil
		}
		rerr := e.Resign(context.WithoutCancel(ctx))
		if lost == nil && errors.Is(rerr, ErrLockLost) {
			lost = rerr
		}
		if cfg.stopped != nil {
			why := ferr
			if lost != nil {
				why = errors.Join(ferr, lost)
			}
			cfg.stopped(term, why)
		}
		switch {
		case !returned:
			// f panicked (the panic goes on) or called runtime.Goexit.
		case ctx.Err() != nil:
			done, err = true, e.wrap("run", ctx.Err())
		case ferr != nil && lost == nil:
			done, err = true, ferr
		}
	}()
	ferr = f(fctx)
	returned = true
	return false, nil
}
