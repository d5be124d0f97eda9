// Package lockcheck is the history recorder and the checkers that the fault
// suites (tests/partition, tests/robustness) share: what a run's holders did,
// on one clock, and whether that is what a lock with leases and fencing may
// do.
//
// A lock under leases is not a linearizable object (a hold ends by itself
// when its lease runs out), so a history is checked as intervals on one
// clock rather than against a sequential model: a hold counts from the
// return of the call that took it until the first of its Lost closing (as a
// watcher saw it) and the start of its release. The checks (History.Check):
//
//   - Overlap: at no time do more holds believe they hold a lock than it
//     admits: two exclusive holds, an exclusive hold beside any other, more
//     permits of a semaphore than its size. A hold's Lost counts LostSlack
//     early (the watcher that timestamps it runs late on a busy machine);
//     overlaps no longer than Grace are near misses, not violations.
//     Holds live across a Redis restart count only until the restart.
//   - Fences: no two holds share a fence, and a hold has a larger fence
//     than every hold that returned before its own call began (or, with
//     FencesByReturn, before it returned: holds of an exclusive lock never
//     overlap, so the later one was taken later). Read holds carry a
//     writer's fence and are left out.
//   - Minimum hold: after a WithMinHold hold was released (not lost, the
//     release not failed), no hold of another Client starts before its
//     minimum hold has passed.
//   - Probes: a hold that disagreed with what Redis held while its Lost
//     stayed open (Probe); excused across a restart.
//   - Late calls (Limits.Late): no lock or release call returned more than
//     Late past its deadline.
//   - The fenced register: a write of a hold refused while its Lost had not
//     closed, a write that failed (Hold.Writes), and what the register's
//     own log shows (CheckRegister): overlapping writes, a shared fence, a
//     fence that went back, or, for a semaphore, more writers at once than
//     its permits.
//
// An election's terms are holds (the term their fence, the values they
// published in Values), so the checks above find two leaders at once, terms
// that went back and leaders' writes out of order. Its own checks:
//
//   - Observers (CheckObserved): what each observer received (Observed) in
//     order: never a term below one received before, a term again only
//     with a changed value, every value with the term that published it,
//     and no term skipped that was elected while it listened.
//   - Leading (CheckLeading): some term counts at some time within a limit
//     of every heal of a fault.
//
// Violations recorded while a run goes (Violate) are reported with them. A
// report lists the events around each violation in time order (Around,
// Timeline), so that it can be read without running again.
package lockcheck
