package strict

// The board of classes: which classes (package priority) asked for a key recently, across
// the processes that share its line in Redis (backend.ClassBoard, docs/priorities.md).

import (
	"context"
	"errors"
	"fmt"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/backend"
	"github.com/sluicehq/sluice/internal/rkey"
	"github.com/sluicehq/sluice/priority"
)

var _ backend.ClassBoard = (*Backend)(nil)

// classKey is the Redis key of class c's post for key: PREFIX + "critical:" or
// "standard:" and the key as a hash tag (the slot of the key's state). It is outside the
// state's names (PREFIX + "v1:"), so that CountKeys counts the states alone. It holds the
// time the post lasts, in milliseconds, and expires after it.
func (b *Backend) classKey(key string, c priority.Class) string {
	return rkey.Name(b.prefix+c.String()+":", key)
}

// PostClass records on the board that a caller of class c (priority.Critical or
// priority.Standard) asked for key now, for recent (backend.ClassBoard): one SET with an
// expiry, no arithmetic in Redis.
func (b *Backend) PostClass(ctx context.Context, key string, c priority.Class, recent time.Duration) error {
	if c != priority.Critical && c != priority.Standard {
		return nil
	}
	if b.isClosed() {
		return backend.ErrClosed
	}
	if b.down.Load() {
		return fmt.Errorf("%w: redis is down", backend.ErrUnavailable)
	}
	ms := max(recent.Milliseconds(), 1)
	ctx, cancel := context.WithTimeout(ctx, b.timeout)
	defer cancel()
	p := b.client.Pipeline()
	p.Set(ctx, b.classKey(key, c), ms, time.Duration(ms)*time.Millisecond)
	if _, err := p.Exec(ctx); err != nil {
		return fmt.Errorf("%w: redis: posting a class: %w", backend.ErrUnavailable, err)
	}
	return nil
}

// ClassesPosted returns how long ago priority.Critical and priority.Standard were last
// posted for key, each negative if not within the time its post lasts
// (backend.ClassBoard): the time a post lasts less what is left of it (PTTL), read in one
// round trip.
func (b *Backend) ClassesPosted(ctx context.Context, key string) (critical, standard time.Duration, err error) {
	if b.isClosed() {
		return -1, -1, backend.ErrClosed
	}
	if b.down.Load() {
		return -1, -1, fmt.Errorf("%w: redis is down", backend.ErrUnavailable)
	}
	ctx, cancel := context.WithTimeout(ctx, b.timeout)
	defer cancel()
	p := b.client.Pipeline()
	var gets [2]*goredis.StringCmd
	var ttls [2]*goredis.DurationCmd
	for i, c := range []priority.Class{priority.Critical, priority.Standard} {
		gets[i] = p.Get(ctx, b.classKey(key, c))
		ttls[i] = p.PTTL(ctx, b.classKey(key, c))
	}
	if _, err := p.Exec(ctx); err != nil && !errors.Is(err, goredis.Nil) {
		return -1, -1, fmt.Errorf("%w: redis: reading the classes: %w", backend.ErrUnavailable, err)
	}
	var ago [2]time.Duration
	for i := range ago {
		ago[i] = -1
		lasts, gerr := gets[i].Int64()
		left := ttls[i].Val()
		if gerr == nil && ttls[i].Err() == nil && left > 0 {
			ago[i] = max(time.Duration(lasts)*time.Millisecond-left, 0)
		}
	}
	return ago[0], ago[1], nil
}
