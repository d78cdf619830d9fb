// Package all links every store that Sluice ships (Redis, etcd, ZooKeeper), so that
// store.Open, strict.Dial and lease.Dial know every URL scheme. Import it for its effect:
//
//	import _ "github.com/sluicehq/sluice/store/all"
//
// A program that needs one store imports that store's package instead, and links no
// other store's client.
package all

import (
	_ "github.com/sluicehq/sluice/store/etcd"  // etcd://
	_ "github.com/sluicehq/sluice/store/redis" // redis://, rediss://, redis-cluster://, redis-sentinel://
	_ "github.com/sluicehq/sluice/store/zk"    // zk://
)
