// Package redistest is the test harness of the remutex tree, shared by the
// root package's tests, the remutex command's tests and the benchmarks
// module:
//
//   - redis-server processes on free loopback ports ([Start], [Launch],
//     [Shared]), which can be restarted, paused (SIGSTOP) and killed, and the
//     deployments built from them ([StartCluster], [StartReplicaPair],
//     [StartServers], and [StartSentinel]: a primary, two replicas and three
//     sentinels), with the faults of a failover (a master killed or paused,
//     its promotion awaited: [Sentinel.AwaitSwitch],
//     [Cluster.AwaitPromotion]);
//   - a TCP [Proxy] that holds, drops, delays or cuts traffic, and a
//     [FaultProxy] that reads it as Redis requests and delivers the ones it
//     is told to late, twice or never, or cuts one direction;
//   - child processes that are the test binary re-executed in a role
//     ([StartChild], [ChildRole], [Emit]);
//   - a fenced [Register], on a redis-server, that logs the writes of a
//     lock's holders (from any process) and finds overlaps and stale fences;
//   - a test network of Linux network namespaces ([NewNet]: root and
//     iproute2) with a redis-server and child processes in namespaces of
//     their own, and cuts of one node, both ways or one direction, healed
//     at will; a server on a unix socket only ([StartUnix]) that no cut
//     reaches.
//
// redis-server runs as
//
//	redis-server --port P --bind 127.0.0.1 --save "" --appendonly no --dir <tmp>
//
// and dies with the process that started it (Linux: a parent-death signal),
// so that a killed test run leaves no server behind. Where redis-server (or
// redis-cli, for clusters) is not on PATH the tests that need it skip with
// the reason, unless REMUTEX_REQUIRE_REDIS=1, when they fail instead.
//
// It knows nothing of remutex itself: what needs the package's internals
// stays in the tests of that package.
package redistest
