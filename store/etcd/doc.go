// Package etcd is the etcd store of package store: each record an etcd key below a
// prefix, read in one transaction and written by compare-and-set on the key's mod
// revision, timed on the members' clocks made monotonic per record (New). Importing it
// registers the scheme etcd with store.Open; a program that does not import it links no
// etcd client.
package etcd
