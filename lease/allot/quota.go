package allot

import "fmt"

// A windowed quota's allocation (Limit.Window > 0): members draw tokens of the current
// window's count in chunks, and give back what they do not use.

// chunkParts bounds a chunk: one draw takes at most 1/chunkParts of the window's count
// (and at least one token), so that a member that crashes holding its tokens costs the
// pool at most about that much of the window.
const chunkParts = 200

// roll moves a windowed quota's record to the window that holds now: the count is whole
// again, and every token of the window before is void.
func (s *State) roll(now int64) {
	if s.Limit.Window == 0 || now < s.WindowEnd {
		return
	}
	s.WindowEnd = s.Limit.WindowEnd(now)
	s.Granted = 0
	for i := range s.Members {
		s.Members[i].Chunk = 0
	}
}

// unused takes back the tokens entry i gave up (Request.Unused) and those whose answer it
// never read (beyond Request.Got), if they are of the current window and it holds them:
// they may be handed out again. A request older than one applied before is stale: it
// takes nothing back, and is given nothing.
func (s *State) unused(i int, req Request) (stale bool) {
	e := &s.Members[i]
	if s.Limit.Window == 0 {
		return false
	}
	if req.Nonce <= e.Nonce && req.Op != OpJoin {
		return true
	}
	e.Nonce = req.Nonce
	if req.UnusedOf != s.WindowEnd {
		return false
	}
	g := min(max(req.Unused, 0), e.Chunk)
	e.Chunk -= g
	if lost := e.Chunk - max(req.Got, 0); lost > 0 && req.Op != OpJoin {
		e.Chunk -= lost // handed out under answers the member never read
		g += lost
	}
	s.Granted -= g
	return false
}

// quota answers a join or renewal of a windowed quota's entry i: it takes back what the
// member gave up, keeps it alive a TTL, and hands it the tokens it asks for (Request.Want)
// as far as the window has them: at most 1/chunkParts of the count, and at most half of
// what is left split among the live members (at least one token while any is left), so
// that the last of the count goes out in ever smaller chunks to whoever still asks.
func (s *State) quota(i int, now int64, cfg Config, req Request, rep *Reply) {
	e := &s.Members[i]
	if req.Op == OpJoin {
		e.Chunk, e.Nonce = 0, req.Nonce // an earlier registration's tokens stay handed out
	}
	stale := s.unused(i, req)
	e.Lease.Expires = now + int64(cfg.TTL)
	e.Lease.Until = e.Lease.Expires + int64(cfg.Grace)
	var live int64
	for j := range s.Members {
		if s.Members[j].live(now) {
			live++
		}
	}
	count := s.Limit.Burst()
	left := count - s.Granted
	var give int64
	if now >= s.Penalty && now >= s.Fence && left > 0 && req.Want > 0 && !stale {
		give = min(req.Want, max(1, count/chunkParts), max(1, left/(2*max(live, 1))), left)
	}
	s.Granted += give
	e.Chunk += give
	rep.Epoch = e.Epoch
	rep.Quota = give
	rep.WindowEnd = s.WindowEnd
	rep.WindowLeft = s.WindowEnd - now
	rep.Remaining = count - s.Granted
	rep.Live, rep.Size = live, live
	rep.Penalty = max(0, s.Penalty-now)
}

// SpendWindow counts a windowed quota's current window as wholly handed out: the record
// was lost, or went back in time (an old copy restored, a failover that lost writes),
// while a member still held tokens drawn from it in this window (Request.Seen), so the
// tokens handed out are unknown. The next window is whole. Apply calls it when such a
// member renews; a store calls it for a record it finds older than a member has seen.
func (s *State) SpendWindow(now int64) {
	if s.Limit.Window == 0 {
		return
	}
	s.roll(now)
	s.Granted = s.Limit.Burst()
}

// checkQuota verifies a windowed quota's invariant: no more handed out than the count,
// and the members' chunks within what was handed out.
func (s *State) checkQuota() error {
	if s.Limit.Window == 0 {
		return nil
	}
	var sum int64
	for i := range s.Members {
		if s.Members[i].Chunk < 0 {
			return fmt.Errorf("sluice lease: member %q holds %d tokens", s.Members[i].ID, s.Members[i].Chunk)
		}
		sum += s.Members[i].Chunk
	}
	if s.Granted > s.Limit.Burst() || s.Granted < sum {
		return fmt.Errorf("sluice lease: %d tokens handed out of a count of %d, members hold %d", s.Granted, s.Limit.Burst(), sum)
	}
	return nil
}
