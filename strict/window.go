package strict

// Windowed quotas in the Redis mode: a window counter per limit, decided by window.lua on
// Redis' clock, for keys whose limits are all windowed quotas (gcra.Limit.Window). It is
// a second, separate script: the GCRA script (sluice.lua) and its batching are unchanged,
// and each window decision is one round trip of its own (EVALSHA, EVAL once if Redis has
// not seen the script).

import (
	"context"
	"crypto/sha1"
	_ "embed"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"

	goredis "github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/backend"
	"github.com/sluicehq/sluice/gcra"
)

//go:embed window.lua
var windowSource string

var windowSHA = func() string { h := sha1.Sum([]byte(windowSource)); return hex.EncodeToString(h[:]) }()

// Capabilities reports that the backend decides windowed quotas, on keys whose limits are
// all windows (they cannot sit beside rate limits here), and takes a ramp's changing
// limits: the script reads each call's limits from its arguments, with their ramp
// (gcra.Limit.Rise), and spaces a booking at the ramp's limit where it falls
// (backend.Capable); and
// that every process shares each key's line in Redis (SharedLine).
func (b *Backend) Capabilities() backend.Capabilities {
	return backend.Capabilities{Windows: true, Ramps: true, WindowsAlone: true, SharedLine: true, ByValue: true}
}

// windowed reports whether limits are windows, and an error if only some are, or if a
// window is not a whole number of microseconds (the script's unit).
func windowed(limits []gcra.Limit) (bool, error) {
	w := 0
	for _, l := range limits {
		if l.Window > 0 {
			w++
			if l.Window%1000 != 0 {
				return true, fmt.Errorf("%w: the strict mode's windows on Redis are whole microseconds, not %dns", gcra.ErrInvalidLimits, l.Window)
			}
		}
	}
	if w > 0 && w < len(limits) {
		return true, ErrMixedWindows
	}
	return w > 0, nil
}

// windowKey is the name of key's window state: beside its GCRA state, in the same hash
// slot.
func (b *Backend) windowKey(key string) string { return b.KeyName(key) + ":w" }

// windowState is a window script's reply: allowed, at and now (nanoseconds), and per
// limit the latest window index and its count.
type windowState struct {
	allowed bool
	at, now int64
	i, u    [gcra.MaxLimits]int64
}

// windowRun runs window.lua's op on key under limits (checked: all windows) with fields.
func (b *Backend) windowRun(ctx context.Context, key string, op byte, limits []gcra.Limit, fields ...int64) (windowState, error) {
	if b.isClosed() {
		return windowState{}, backend.ErrClosed
	}
	if b.misuse != nil {
		return windowState{}, b.misuse
	}
	if b.down.Load() { // Redis failed and the prober has not seen it back yet
		return windowState{}, b.unavailable(errors.New("redis: unavailable"))
	}
	args := make([]any, 0, 3+2*len(limits)+len(fields))
	if b.now != nil {
		args = append(args, strconv.FormatInt(b.now()/1000, 10))
	} else {
		args = append(args, "")
	}
	args = append(args, string(op), len(limits))
	for _, l := range limits {
		args = append(args, l.Window/1000, l.Burst())
	}
	for _, f := range fields {
		args = append(args, f)
	}
	ctx, cancel := context.WithTimeout(ctx, b.timeout)
	defer cancel()
	keys := []string{b.windowKey(key)}
	res, err := evalWindow(ctx, b.client, keys, args, true, b.p)
	if err != nil && strings.HasPrefix(err.Error(), "NOSCRIPT") {
		res, err = evalWindow(ctx, b.client, keys, args, false, b.p)
	}
	if err != nil {
		if isRedisError(err) {
			return windowState{}, &ReplyError{Op: "window", Key: key, Err: err}
		}
		return windowState{}, b.unavailable(fmt.Errorf("redis: window quota: %w", err))
	}
	arr, ok := res.([]any)
	if !ok || len(arr) != 3+2*len(limits) {
		return windowState{}, &ReplyError{Op: "window", Key: key, Reply: res}
	}
	var st windowState
	var v [3 + 2*gcra.MaxLimits]int64
	for x := range arr {
		n, ok := arr[x].(int64)
		if !ok {
			return windowState{}, &ReplyError{Op: "window", Key: key, Reply: res}
		}
		v[x] = n
	}
	st.allowed, st.at, st.now = v[0] == 1, v[1]*1000, v[2]*1000
	for j := range limits {
		st.i[j], st.u[j] = v[3+2*j], v[4+2*j]
	}
	return st, nil
}

// evalWindow sends the window script (by its hash, or whole) in a pipeline of one, with
// the WAIT for replicas pl asks for (WithReplicaAcks).
func evalWindow(ctx context.Context, c Client, keys []string, args []any, bySHA bool, pl *pipeliner) (any, error) {
	p := c.Pipeline()
	var cmd *goredis.Cmd
	if bySHA {
		cmd = p.EvalSha(ctx, windowSHA, keys, args...)
	} else {
		cmd = p.Eval(ctx, windowSource, keys, args...)
	}
	var wait *goredis.IntCmd
	if pl.acks > 0 {
		wait = goredis.NewIntCmd(ctx, "wait", pl.acks, pl.ackMs)
		_ = p.Process(ctx, wait)
	}
	_, execErr := p.Exec(ctx)
	if err := replyErr(cmd, execErr); err != nil { // the script's own error, or the connection's
		return nil, err
	}
	return cmd.Val(), pl.acked(wait)
}

// isRedisError reports whether err is an error reply from Redis (the script's), not a
// failure to reach it.
func isRedisError(err error) bool {
	var re goredis.Error
	return errors.As(err, &re) && !strings.HasPrefix(err.Error(), "LOADING") && !strings.HasPrefix(err.Error(), "CLUSTERDOWN")
}

// windowResult derives the decision's Remaining and ResetAfter from the state after it,
// as gcra's windowStatus does.
func windowResult(st windowState, limits []gcra.Limit) gcra.Result {
	r := gcra.Result{Allowed: st.allowed, Remaining: 1<<63 - 1}
	if st.allowed {
		r.Delay = st.at - st.now
	} else {
		r.RetryAfter = st.at - st.now
	}
	for j, l := range limits {
		cur := st.now / l.Window // Unix time: never negative
		rem := l.Burst()
		var reset int64
		if st.u[j] > 0 && st.i[j] >= cur {
			rem = 0
			if st.i[j] == cur {
				rem = max(0, l.Burst()-st.u[j])
			}
			reset = (st.i[j]+1)*l.Window - st.now
		}
		r.Remaining = min(r.Remaining, rem)
		r.ResetAfter = max(r.ResetAfter, reset)
	}
	return r
}

// windowDecide is Decide for a key whose limits are all windows.
func (b *Backend) windowDecide(ctx context.Context, key string, req backend.Request) (backend.Grant, error) {
	md := int64(max(req.MaxDelay, 0)) / 1000
	st, err := b.windowRun(ctx, key, 'd', req.Limits, req.N, md)
	if err != nil {
		return backend.Grant{}, err
	}
	g := backend.Grant{Result: windowResult(st, req.Limits)}
	if st.allowed && req.N > 0 {
		g.Ticket = gcra.Ticket{N: req.N, At: st.at}
		for j := range req.Limits {
			g.Ticket.TatAfter[j] = st.i[j] // the window each limit counted the grant in
		}
	}
	return g, nil
}

// windowAdjust is Adjust for a key whose limits are all windows: a charge is counted in the
// latest window; a refund is given back to the window the grant was counted in while it is
// the latest and has not ended (a counter may give back any of its permits, in any order).
func (b *Backend) windowAdjust(ctx context.Context, key string, limits []gcra.Limit, t gcra.Ticket, newN int64) error {
	if newN == t.N {
		return nil
	}
	fields := []int64{newN - t.N}
	for j := range limits {
		fields = append(fields, t.TatAfter[j])
	}
	_, err := b.windowRun(ctx, key, 's', limits, fields...)
	return err
}

// windowPenalize is Penalize for a key whose limits are all windows: the limit gcra's
// Penalize would drain is counted full in the window that holds the penalty's end (d
// after Redis' now, rounded up to a microsecond).
func (b *Backend) windowPenalize(ctx context.Context, key string, limits []gcra.Limit, d int64) error {
	_, err := b.windowRun(ctx, key, 'p', limits, (d+999)/1000, int64(gcra.PenaltyLimit(limits)+1))
	return err
}
