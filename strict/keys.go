package strict

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"

	goredis "github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/backend"
)

var _ backend.KeyCounter = (*Backend)(nil)

// scanCount is how many keys one SCAN step asks Redis to look at.
const scanCount = 1000

// CountKeys counts the keys of this backend's prefix and format version in Redis
// (backend.KeyCounter: the daemon's sluice_keys), with SCAN over every master of a
// Cluster or shard of a Ring: one round trip per thousand keys of the whole database, so
// it is for a gauge refreshed now and then, not for each decision. A count taken while
// keys come and go is approximate, as SCAN is.
func (b *Backend) CountKeys(ctx context.Context) (int64, error) {
	match := globEscape(b.prefix+"v"+strconv.Itoa(FormatVersion)+":") + "*"
	var (
		mu    sync.Mutex // the ForEach calls run on every node at once
		total int64
	)
	node := func(ctx context.Context, c *goredis.Client) error {
		n, err := scanKeys(ctx, c.Pipeline, match)
		mu.Lock()
		total += n
		mu.Unlock()
		return err
	}
	var err error
	switch c := b.client.(type) {
	case *goredis.ClusterClient:
		err = c.ForEachMaster(ctx, node)
	case *goredis.Ring:
		err = c.ForEachShard(ctx, node)
	default:
		total, err = scanKeys(ctx, b.client.Pipeline, match)
	}
	if err != nil {
		return 0, fmt.Errorf("%w: redis: counting keys: %w", backend.ErrUnavailable, err)
	}
	return total, nil
}

// scanKeys counts the keys matching match on one node, one SCAN step per round trip.
func scanKeys(ctx context.Context, pipeline func() goredis.Pipeliner, match string) (int64, error) {
	var n int64
	var cursor uint64
	for {
		p := pipeline()
		cmd := p.Scan(ctx, cursor, match, scanCount)
		if _, err := p.Exec(ctx); err != nil {
			return n, err
		}
		keys, next := cmd.Val()
		n += int64(len(keys))
		if next == 0 {
			return n, nil
		}
		cursor = next
	}
}

// globEscape escapes the characters SCAN's MATCH reads as a pattern.
func globEscape(s string) string {
	return strings.NewReplacer(`\`, `\\`, `*`, `\*`, `?`, `\?`, `[`, `\[`, `]`, `\]`).Replace(s)
}
