package robustness

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"time"

	"github.com/sluicehq/sluice/backend"
	"github.com/sluicehq/sluice/gcra"
	"github.com/sluicehq/sluice/gossip/hits"
	"github.com/sluicehq/sluice/server"
)

// memberName is a gossip member's name in its pool (gossip.Config.Name): its process
// number, so that a member started again in a slot is a new member.
func memberName(proc int) string { return fmt.Sprint("m", proc) }

// daemonRules are the daemons' --limit flags for the workload's groups: a pattern rule
// per group (its keys' first letter and "*": "a*", "b*"), each tag under it a bucket of
// its own.
func daemonRules(groups []Group) []string {
	var rs []string
	for _, g := range groups {
		rs = append(rs, g.Keys[0][:1]+"*="+g.Limits)
	}
	return rs
}

// keyRecorder is a back end that records the key of each decision asked of it and
// grants nothing: daemonKeys's witness of the keys a daemon's rules give tags.
type keyRecorder struct{ key string }

func (k *keyRecorder) Decide(_ context.Context, key string, _ backend.Request) (backend.Grant, error) {
	k.key = key
	return backend.Grant{}, nil
}
func (*keyRecorder) Adjust(context.Context, string, []gcra.Limit, gcra.Ticket, int64) error {
	return nil
}
func (*keyRecorder) Penalize(context.Context, string, []gcra.Limit, time.Duration) error {
	return nil
}
func (*keyRecorder) Close() error { return nil }

// daemonKeys maps each tag of the workload's groups to the key a daemon with the suite's
// rules decides it under (its gossip back end's key, whose owner decides it): found by
// asking an in-process server with the same rules over a back end that records the key,
// not by spelling the server's keys here.
func daemonKeys(groups []Group) (map[string]string, error) {
	cfg := server.DefaultConfig()
	cfg.Margin = server.Duration(Margin)
	for _, f := range daemonRules(groups) {
		r, err := server.ParseRuleFlag(f, false)
		if err != nil {
			return nil, err
		}
		cfg.Rules = append(cfg.Rules, r)
	}
	rec := &keyRecorder{}
	s, err := server.New(cfg, server.WithBackend(rec), server.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))))
	if err != nil {
		return nil, err
	}
	defer s.Shutdown(context.Background())
	keys := map[string]string{}
	for _, g := range groups {
		for _, tag := range g.Keys {
			rec.key = ""
			if _, err := s.Decide(context.Background(), tag, 1, 0); err != nil || rec.key == "" {
				return nil, fmt.Errorf("robust: the daemons' key of tag %s: none decided (%v)", tag, err)
			}
			keys[tag] = rec.key
		}
	}
	return keys, nil
}

// owner finds the slot whose process owns key now: of the member processes running (the
// gossip mode: each named memberName), or of the daemons up (daemon-gossip: each named
// its advertised address, its proxy's), the one hits.OwnerOf picks, which is the
// rendezvous every member computes over the pool it holds (a peer lost less than the hold
// ago is still in it; the fault targets the live owner, which the key moves to once the
// pool lets the lost one go). It returns the slot, the owner's name and the names it
// chose among; ok is false when no process is up.
func (r *runner) owner(key string) (slot int, name string, names []string, ok bool) {
	bySlot := map[string]int{}
	r.mu.Lock()
	switch r.s.Mode {
	case ModeGossip:
		for s, m := range r.current {
			if m != nil && !m.killed {
				n := memberName(m.proc)
				names, bySlot[n] = append(names, n), s
			}
		}
	case ModeDaemonGossip:
		for s, d := range r.daemons {
			if d.up() {
				n := r.dnet.Addrs()[s]
				names, bySlot[n] = append(names, n), s
			}
		}
	}
	r.mu.Unlock()
	if r.s.Mode == ModeDaemonGossip {
		keys, err := daemonKeys(r.s.groups())
		if err != nil {
			r.note("%v", err)
			return 0, "", names, false
		}
		key = keys[key]
	}
	if len(names) == 0 {
		return 0, "", names, false
	}
	slices.Sort(names)
	name = hits.OwnerOf(key, names)
	return bySlot[name], name, names, true
}
