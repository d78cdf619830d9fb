package strict

// A batch's encoding: its calls grouped into script calls (every key together for one
// Redis, one key per call otherwise), each script call's arguments (see sluice.lua), and
// each reply split among its calls.

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"

	goredis "github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/rkey"
)

// grouping says which calls may share one script call. One script call may only touch
// keys that live on one server.
type grouping int

const (
	groupAll     grouping = iota // one Redis (or a Sentinel's master): every key together
	groupEachKey                 // any other client: one key per script call
)

// groupingOf returns how calls through client may be grouped. On one Redis every key goes
// in one script call. Any other client (Redis Cluster, Ring) gets one key per script
// call, each deciding all the batch's calls on its key, in one pipeline. docs/strict.md,
// "Throughput: batches" ("How calls are grouped"), says why a Cluster gets one call per
// key rather than per hash slot.
func groupingOf(client Client) grouping {
	if _, ok := client.(*goredis.Client); ok {
		return groupAll
	}
	return groupEachKey
}

// groupKey identifies the calls that may share one script call.
type groupKey struct {
	key     string // groupEachKey: the key
	virtual bool
	vnow    int64
}

func groupKeyOf(how grouping, c *call) groupKey {
	gk := groupKey{virtual: c.virtual, vnow: c.vnow}
	if how == groupEachKey {
		gk.key = c.key
	}
	return gk
}

// group is one script call of a batch: its keys in order of first arrival, and its calls
// ordered by key, each key's calls in arrival order (the order of the script's records and
// of its reply).
type group struct {
	gk    groupKey
	keys  []string  // the keys (not their Redis names)
	refs  []nameRef // with refs: the keys' Redis names, in the builder's buffer
	calls []*call
	other bool // a call other than 'a', or a virtual now: the reply carries now
	cmd   *goredis.Cmd
	args  []any // cmd's arguments, kept from one batch to the next (cleared after each)
}

// batchBuilder turns a batch of calls into script calls, and their replies into answers.
// It keeps its buffers from one batch to the next; it is not safe for concurrent use.
type batchBuilder struct {
	groups []group
	gidx   map[groupKey]int // the groups, once there are many
	kidx   map[string]int   // a group's keys, once there are many
	counts []int
	sorted []*call
	again  []int
	cmds   []goredis.Cmder // the commands being sent
	names  []byte          // with refs: the Redis names of the batch's keys (see nameRef)
}

// nameRef is a key's Redis name written in a batch builder's buffer (batchBuilder.names):
// go-redis writes it as an encoding.BinaryMarshaler, and an interface holding a pointer
// to it needs no allocation, where the name made as a string was the one allocation per
// decision of a batched Allow. It reads the buffer when the command is written: the
// buffer only grows while the batch is built, and is reset for the next one.
type nameRef struct {
	buf      *[]byte
	off, end int
}

func (r *nameRef) MarshalBinary() ([]byte, error) { return (*r.buf)[r.off:r.end], nil }

// manyIndex is how many groups or keys are searched one by one before a map is used.
const manyIndex = 8

// exec sends batch as one pipeline of EVALSHA, one per group, and again with EVAL the
// groups that met NOSCRIPT (the script cache is empty after a Redis restart or SCRIPT
// FLUSH; EVAL loads it). A NOSCRIPT reply means the script did not run, so sending it
// again is safe. Every call of the batch is answered.
func (bb *batchBuilder) exec(p *pipeliner, batch []*call) {
	batch, oldest := p.unexpired(batch)
	if len(batch) == 0 {
		return
	}
	ctx := p.deadline(oldest)
	bb.group(p.grouping, batch)
	bb.cmds = bb.cmds[:0]
	for i := range bb.groups {
		g := &bb.groups[i]
		g.cmd = bb.command(ctx, p, g, argEvalsha, p.sha)
		bb.cmds = append(bb.cmds, g.cmd)
	}
	wait := bb.withAcks(ctx, p)
	execErr := p.send(ctx, bb.cmds)
	ackErr := p.acked(wait)
	bb.again = bb.again[:0]
	for i := range bb.groups {
		g := &bb.groups[i]
		err := replyErr(g.cmd, execErr)
		if err != nil && goredis.HasErrorPrefix(err, "NOSCRIPT") {
			bb.again = append(bb.again, i)
			continue
		}
		g.answer(cmp.Or(err, ackErr))
	}
	if len(bb.again) > 0 {
		bb.cmds = bb.cmds[:0]
		for _, i := range bb.again {
			g := &bb.groups[i]
			g.cmd = bb.command(ctx, p, g, argEval, p.src)
			bb.cmds = append(bb.cmds, g.cmd)
		}
		wait := bb.withAcks(ctx, p)
		execErr := p.send(ctx, bb.cmds)
		ackErr := p.acked(wait)
		for _, i := range bb.again {
			bb.groups[i].answer(cmp.Or(replyErr(bb.groups[i].cmd, execErr), ackErr))
		}
	}
	for i := range bb.groups {
		g := &bb.groups[i]
		clear(g.keys)
		clear(g.refs)
		clear(g.calls)
		clear(g.args)
		g.keys, g.refs, g.calls, g.cmd, g.args = g.keys[:0], g.refs[:0], g.calls[:0], nil, g.args[:0]
	}
	clear(bb.cmds)
	bb.groups = bb.groups[:0]
	bb.names = bb.names[:0]
}

// withAcks appends to bb.cmds the WAIT for the replicas' acknowledgements, if the
// backend asks for them (WithReplicaAcks), and returns it.
func (bb *batchBuilder) withAcks(ctx context.Context, p *pipeliner) *goredis.IntCmd {
	if p.acks == 0 {
		return nil
	}
	w := goredis.NewIntCmd(ctx, "wait", p.acks, p.ackMs)
	bb.cmds = append(bb.cmds, w)
	return w
}

// acked returns nil if wait (nil: none asked for) counted enough replicas, and otherwise
// an error that is a failure to reach Redis (backend.ErrUnavailable), never a reply
// error: the writes may be lost to a failover, so their grants must not be used.
func (p *pipeliner) acked(wait *goredis.IntCmd) error {
	if wait == nil {
		return nil
	}
	n, err := wait.Result()
	switch {
	case err != nil:
		return fmt.Errorf("sluice redis: WAIT for %d replicas: %v", p.acks, err) // %v: not a Redis reply error
	case n < p.acks:
		return fmt.Errorf("sluice redis: %d of %d replicas acknowledged the writes within %d ms", n, p.acks, p.ackMs)
	}
	return nil
}

// group splits batch into bb.groups, each with its keys and its calls ordered by key.
func (bb *batchBuilder) group(how grouping, batch []*call) {
	last := -1
	for _, c := range batch {
		gk := groupKeyOf(how, c)
		if last < 0 || bb.groups[last].gk != gk {
			last = bb.groupIndex(gk)
		}
		bb.groups[last].calls = append(bb.groups[last].calls, c)
	}
	clear(bb.gidx)
	// Within each group: the keys in order of first arrival, and the calls ordered by key
	// (a stable counting sort, so that each key's calls stay in arrival order).
	for i := range bb.groups {
		g := &bb.groups[i]
		g.other = false
		for _, c := range g.calls {
			c.ki = bb.keyIndex(g, c.key)
			g.other = g.other || c.op != 'a' || c.virtual
		}
		clear(bb.kidx)
		if len(g.keys) == 1 {
			continue
		}
		bb.counts = slices.Grow(bb.counts[:0], len(g.keys)+1)[:len(g.keys)+1]
		clear(bb.counts)
		for _, c := range g.calls {
			bb.counts[c.ki+1]++
		}
		for k := 1; k < len(bb.counts); k++ {
			bb.counts[k] += bb.counts[k-1]
		}
		bb.sorted = slices.Grow(bb.sorted[:0], len(g.calls))[:len(g.calls)]
		for _, c := range g.calls {
			bb.sorted[bb.counts[c.ki]] = c
			bb.counts[c.ki]++
		}
		copy(g.calls, bb.sorted)
		clear(bb.sorted)
	}
}

// groupIndex returns the index of the group gk, adding it if new.
func (bb *batchBuilder) groupIndex(gk groupKey) int {
	n := len(bb.groups)
	if n <= manyIndex {
		for i := range bb.groups {
			if bb.groups[i].gk == gk {
				return i
			}
		}
	} else {
		if len(bb.gidx) == 0 {
			if bb.gidx == nil {
				bb.gidx = make(map[groupKey]int)
			}
			for i := range bb.groups {
				bb.gidx[bb.groups[i].gk] = i
			}
		}
		if i, ok := bb.gidx[gk]; ok {
			return i
		}
		bb.gidx[gk] = n
	}
	if n < cap(bb.groups) {
		bb.groups = bb.groups[:n+1]
	} else {
		bb.groups = append(bb.groups, group{})
	}
	bb.groups[n].gk = gk
	return n
}

// keyIndex returns the index of name among g's keys, adding it if new.
func (bb *batchBuilder) keyIndex(g *group, key string) int {
	n := len(g.keys)
	if n > 0 && g.keys[n-1] == key {
		return n - 1
	}
	if n <= manyIndex {
		for i, k := range g.keys {
			if k == key {
				return i
			}
		}
	} else {
		if len(bb.kidx) == 0 {
			if bb.kidx == nil {
				bb.kidx = make(map[string]int)
			}
			for i, k := range g.keys {
				bb.kidx[k] = i
			}
		}
		if i, ok := bb.kidx[key]; ok {
			return i
		}
		bb.kidx[key] = n
	}
	g.keys = append(g.keys, key)
	return n
}

// command builds g's script call (see sluice.lua for the arguments): the keys' Redis
// names, the time mode, and for each key the number of its records and its records. An
// operation that repeats the previous record's is sent as '='. With p.refs, the names go
// in as pointers to nameRefs into bb.names, and the fields as pointers (*int64) into g's
// calls, which live until the reply is read. An interface holding a pointer needs no
// allocation, where one holding a string or an int64 does. Without refs each name is made
// as a string. docs/strict.md, "Throughput: batches" ("What a batch costs"), says why refs
// is only for the backend's own client of one Redis (pipeliner.refs).
func (bb *batchBuilder) command(ctx context.Context, p *pipeliner, g *group, name, script any) *goredis.Cmd {
	n := 4 + 2*len(g.keys)
	for _, c := range g.calls {
		n += 1 + c.nf
	}
	args := slices.Grow(g.args[:0], n)
	args = append(args, name, script, len(g.keys))
	if p.refs {
		if len(g.refs) != len(g.keys) { // not yet written (a NOSCRIPT's second command reuses them)
			g.refs = slices.Grow(g.refs[:0], len(g.keys))[:len(g.keys)]
			for i, k := range g.keys {
				off := len(bb.names)
				bb.names = rkey.AppendName(bb.names, p.names, k)
				g.refs[i] = nameRef{buf: &bb.names, off: off, end: len(bb.names)}
			}
		}
		for i := range g.refs {
			args = append(args, &g.refs[i])
		}
	} else {
		for _, k := range g.keys {
			args = append(args, rkey.Name(p.names, k))
		}
	}
	c0 := g.calls[0]
	switch {
	case c0.virtual:
		s, ns := c0.vnow/1e9, c0.vnow%1e9
		if ns < 0 {
			s, ns = s-1, ns+1e9
		}
		args = append(args, fmt.Sprintf("%d %d", s, ns))
	case g.other:
		args = append(args, "+")
	default:
		args = append(args, "")
	}
	var prev *call
	for i := 0; i < len(g.calls); {
		ki := g.calls[i].ki
		j := i
		for j < len(g.calls) && g.calls[j].ki == ki {
			j++
		}
		if j-i == 1 && prev != nil && g.calls[i].sameOp(prev) {
			// A key's one call repeating the previous operation: '=' stands for 1 '='.
			args = append(args, "=")
			prev = g.calls[i]
			i = j
			continue
		}
		args = append(args, j-i)
		for _, c := range g.calls[i:j] {
			if prev != nil && c.sameOp(prev) {
				args = append(args, "=")
			} else {
				args = append(args, opArg(c.op))
				if p.refs {
					for j := range c.f[:c.nf] {
						args = append(args, &c.f[j])
					}
				} else {
					for _, x := range c.f[:c.nf] {
						args = append(args, x)
					}
				}
			}
			prev = c
		}
		i = j
	}
	g.args = args
	cmd := goredis.NewCmd(ctx, args...)
	cmd.SetFirstKeyPos(3)
	return cmd
}

// The script call's constant arguments, boxed once: a string converted to an interface
// where it is appended would be allocated for every record.
var (
	argEvalsha, argEval         any = "evalsha", "eval"
	opAllow, opDecide, opSettle any = "a", "d", "s"
	opPenalize, opRamped        any = "p", "r"
)

// opArg is op's argument in a script call.
func opArg(op byte) any {
	switch op {
	case 'a':
		return opAllow
	case 'd':
		return opDecide
	case 's':
		return opSettle
	case 'r':
		return opRamped
	}
	return opPenalize
}

// answer splits g's reply among its calls and signals each: an error for all, or each
// call's results (a record's error text becomes its error).
func (g *group) answer(err error) {
	if err != nil {
		for _, c := range g.calls {
			c.err = err
			c.done <- struct{}{}
		}
		return
	}
	reply := g.cmd.Val()
	arr, isArr := reply.([]any)
	var now int64
	i, ok := 0, true
	if g.other {
		if ok = isArr && len(arr) >= 2; ok {
			now, ok = pairAt(arr, 0)
			i = 2
		}
	}
	if !g.other && len(g.calls) == 1 {
		// A reply of one element is sent bare.
		c := g.calls[0]
		c.one[0] = reply
		arr = c.one[:]
	} else if !isArr {
		ok = false
	}
	for _, c := range g.calls {
		c.reply, c.now, c.res = reply, now, nil
		if !ok {
			continue
		}
		if i >= len(arr) {
			ok = false
			continue
		}
		if s, isErr := arr[i].(string); isErr {
			c.err = scriptError(s)
			i++
			continue
		}
		n := c.results()
		if i+n > len(arr) {
			ok = false
			continue
		}
		c.res = arr[i : i+n : i+n]
		i += n
	}
	if ok && i != len(arr) {
		ok = false
	}
	for _, c := range g.calls {
		if !ok {
			// A reply of the wrong shape: every call reports it (res nil).
			c.res = nil
		}
		c.done <- struct{}{}
	}
}

// replyErr is a pipelined command's error. A pipeline that could not get a connection
// (go-redis v9) reports the failure only from Exec and leaves its commands without error
// and without reply: such a command gets Exec's error. Every reply of the script is
// non-nil, so a command with neither did not run.
func replyErr(cmd *goredis.Cmd, execErr error) error {
	if err := cmd.Err(); err != nil {
		return err
	}
	if cmd.Val() == nil {
		if execErr == nil {
			execErr = errors.New("sluice redis: no reply")
		}
		return execErr
	}
	return nil
}
