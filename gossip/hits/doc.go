// Package hits is the gossip mode's pure core: one daemon's view of limits that peer
// daemons share with no store. A Node decides per tag on its own and, at every sync
// interval, reports the permits it granted (its hits) to its peers, which charge them to
// their view of the pool's bucket: the exchange of the DThrottle design, with GCRA.
//
// Between syncs a node spends only its share of each tag's limit: a bucket of its own at
// that share of the rate and burst (its sub-bucket), on top of the pool's bucket as it
// knows it. Shares follow each node's recent demand, reported with the hits, and are
// computed from the last reports conservatively (a node counts its own demand at the least
// of its last three reports and each peer's at the most of the last three it received),
// so that, while every report arrives within a sync interval, the shares in force never
// sum above one: the pool admits at most what one bucket would, plus at most one permit
// per node whose share holds less than a permit of burst. A peer that falls silent keeps
// its share (at least the demand of the node that holds it) for a hold time, so a
// partition does not multiply the limit before then. docs/gossip.md derives the bound.
//
// A pool of more than Config.MeshMax nodes reports over a tree per tag instead of to every
// peer (tree.go): each node sends its subtree's aggregate to its parent, the tag's root
// sends the pool's down, and a node's bytes no longer grow with the pool.
//
// A tag decided at its owner keeps a board of classes there (classes.go): the nodes post
// which classes (package priority) ask for it and read the board, so that a lower class
// at one node keeps headroom for a higher class at another (DecideKept,
// docs/priorities.md).
//
// A Node takes now and messages and returns decisions and messages: it does no I/O,
// starts no goroutine and reads no clock. It is not safe for concurrent use. Package
// gossip runs it over hashicorp/memberlist; package sim over a simulated network.
package hits
