// Package robustness is Sluice's robustness suite, run the way etcd's robustness tests run: a
// randomized schedule, reproducible by its seed, drives several member processes (each
// many goroutines making random requests: costs, several limits, reservations,
// settlements, penalties) against a real redis-server while it injects faults: network
// toxics between each member and Redis (toxiproxy, in process: latency and jitter,
// bandwidth, time-outs, reset connections, black holes, a proxy down), SIGKILL and
// SIGSTOP/SIGCONT of members and of Redis, Redis restarted empty, an old DUMP of the
// keys RESTOREd (a failover that lost writes), and members whose clocks are off by
// seconds. Every operation is recorded with its call and return times and its outcome;
// after the run, checkers judge the whole history:
//
//   - strict mode: a porcupine model of GCRA on Redis' clock. The grants the members used
//     must be linearizable against the limit, where each loss of Redis' state (a restart
//     empty, a RESTORE of old state) may forget what was granted before it: one burst per
//     key per loss, the documented failover bound.
//   - lease mode: the shares in use, from the members' own lease records, never sum past
//     the limit's rate at any moment.
//   - both: the referee's rule (package referee) applied to the times the permits were
//     used, with the limiter's margin as the jitter tolerance; nothing lost (every call
//     returned within its time-out, no goroutine left behind in a member, no member died
//     that the schedule did not kill).
//
// The runner is a test (TestRobustness) so that the member processes are re-executions
// of the test binary; `make robustness` runs ROBUST_RUNS schedules and prints one line per
// run and a summary line. docs/robustness.md is the user's guide.
package robustness
