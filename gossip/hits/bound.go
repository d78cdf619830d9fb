package hits

import "time"

// BoundParams describe a pool for Bound.
type BoundParams struct {
	Nodes int     // daemons sharing the limit
	Burst int64   // the limit's burst
	Rate  float64 // the limit's rate, permits per second
	// Sides and Split describe a partition: the pool cut into Sides groups that cannot hear
	// each other, for Split beyond the time a lost peer's share is held (Hold + LostAfter).
	Sides int
	Split time.Duration
}

// Bound is the most permits the pool admits, over any window, beyond one bucket's
// Burst + Rate × window, with the Shares policy, while every report reaches every peer
// within a sync interval (docs/gossip.md derives it): one permit per node whose share
// holds less than a permit of burst, plus, for a partition, a bucket and the rate over
// the split for each side beyond the first.
func Bound(p BoundParams) float64 {
	e := float64(p.Nodes)
	if p.Sides > 1 {
		e += float64(p.Sides-1) * (float64(p.Burst) + p.Rate*max(0, p.Split.Seconds()))
	}
	return e
}
