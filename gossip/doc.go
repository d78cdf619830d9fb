// Package gossip is the gossip mode: daemons (or processes) that share limits with no
// store. Each decides on its own, at once, and every sync interval tells its peers the
// permits it granted per tag. Between syncs it spends only its share of each limit, so
// the pool over-admits by at most a small documented bound (docs/gossip.md).
//
// Membership is hashicorp/memberlist (SWIM: join, leave, failure detection): peers are
// found from a seed list of addresses (a DNS name with several addresses joins them all),
// traffic binds loopback by default, and a shared key encrypts and authenticates it.
// Reports travel as memberlist user messages: UDP datagrams when small, its TCP stream
// when large. The decisions themselves are made by the pure core of gossip/hits.
package gossip
