// Package cas is the strict mode's compare-and-set path, for consensus stores: every
// decision is made by the Go GCRA core (package gcra) on a key's state kept in a register
// of etcd or ZooKeeper, read with the store's time and written back by compare-and-set, so
// that processes in several data centres obey one limit through a quorum, as the strict
// mode on Redis makes them obey it through one Redis.
//
// strict.Dial opens it for an etcd:// or zk:// URL (with package store/etcd or store/zk
// linked). The backend takes any store.Store, the small contract the lease mode's stores
// keep (read records with the store's time, compare-and-set them), so a program that has
// its own client makes the store itself (etcdstore is package store/etcd):
//
//	st := etcdstore.New(client, store.WithPrefix("sluice/strict/"))
//	b := cas.New(st)
//	defer b.Close()
//	l, err := sluice.New(sluice.MustParse("50/s burst=5"), sluice.WithBackend(b))
//
// or zkstore.New(conn, store.WithPrefix("/sluice/strict")) for ZooKeeper (package store/zk).
//
// What it does:
//
//   - A key's state (a penalty's end and one TAT per limit) is one record, named
//     DefaultPrefix + the key as a hash tag.
//   - A call reads the record and the store's time, decides, and writes the record back if
//     it changed, on the version read; when another process wrote it meanwhile, it reads,
//     decides and writes again (up to MaxAttempts, with jittered pauses). Denials and
//     queries write nothing.
//   - The calls of one process combine: while one round of the store is on its way, the
//     calls that come join the next, one read and one write for all of them, so a
//     process's calls never conflict with each other.
//   - Time: on ZooKeeper, its leader's clock (a clock znode written before each read); on
//     etcd, which has none, the members' clocks, never earlier on a key than the time of its
//     last write. docs/consensus.md states each store's guarantee exactly: ZooKeeper is
//     exact on its leader's clock; on etcd the excess is at most one permit per emission
//     interval of clock skew between the members.
//   - Classes (package priority) across processes: a lower class's decisions keep headroom
//     for a higher one (backend.Capabilities.ByValue), and the processes tell each other
//     which classes ask through a board of classes, one record per key beside its state
//     (backend.ClassBoard: Backend.PostClass, Backend.ClassesPosted), read and written in
//     the same rounds. A post rides on the process's next round; a read is a round of its
//     own, at most every 100 ms per key, before a lower class decides. The GCRA decisions
//     do not read it. docs/priorities.md.
//
// Windowed quotas and ramps are not decided here (a limiter refuses them).
package cas
