// Package zk is the ZooKeeper store of package store: each record a znode below a path,
// written by compare-and-set on the znode's version and timed on the ensemble leader's
// clock (New). Importing it registers the scheme zk with store.Open; a program that does
// not import it links no ZooKeeper client.
package zk
