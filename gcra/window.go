package gcra

// Fixed windows. A limit with Window > 0 is a quota of Burst permits per window, the
// windows being [k*Window, (k+1)*Window) of Unix time (a daily quota resets at 00:00 UTC,
// an hourly one on the hour), as an API that counts requests per calendar window does. Its
// T is floor(Window/Burst), so that Tau = Burst*T <= Window. A caller whose now is not
// Unix time (a clock's Nanotime counts from the clock's origin) sets Origin to the Unix
// time of its now = 0, so that the windows still fall on Unix multiples.
//
// The key's state is still one int64 per limit, read differently: a window that ends at E
// in which u permits are counted is the state E + u*T. A state at or before the end of the
// current window means nothing is counted in it (a count from an earlier window ends at
// most Tau after that window's end, which is at most the current window's end). So a key
// with permits counted in the current window has a state beyond now, as a GCRA key that
// is not idle does, and Idle needs no change. Permits reserved ahead (Decide with a
// maxDelay) go to the first window with room, usable from its start.

// floorMod is a mod m in [0, m), for m > 0.
func floorMod(a, m int64) int64 {
	r := a % m
	if r < 0 {
		r += m
	}
	return r
}

// WindowEnd is the end of the window of l (Window > 0) that holds t.
func (l Limit) WindowEnd(t int64) int64 { return t - floorMod(t+l.Origin, l.Window) + l.Window }

// windowOf returns the end E of the latest window the state tat counts permits in, asked at
// now (the end of now's window when it counts none there or later), and whether it counts
// any.
func windowOf(tat int64, l Limit, now int64) (int64, bool) {
	end := l.WindowEnd(now)
	if tat <= end {
		return end, false
	}
	// tat lies in (E, E+Tau] for one window end E = end + k*Window, and Tau <= Window.
	return end + (tat-end-1)/l.Window*l.Window, true
}

// windowSlot returns when n permits (n <= Burst) may be used for a key whose state is tat,
// asked at now (at >= now), and the state after taking them there.
func windowSlot(tat int64, l Limit, now, n int64) (at, after int64) {
	e, counted := windowOf(tat, l, now)
	if !counted {
		return now, e + n*l.T
	}
	if tat+n*l.T <= e+l.Tau {
		return max(now, e-l.Window), tat + n*l.T
	}
	return e, e + l.Window + n*l.T // the next window, from its start
}

// windowStatus is what a window limit has left at now for a key whose state is tat: the
// permits still free in now's window, and how long until it is fresh again (the end of
// the latest window it counts permits in).
func windowStatus(tat int64, l Limit, now int64) (remaining, reset int64) {
	e, counted := windowOf(tat, l, now)
	if !counted {
		return l.Tau / l.T, 0
	}
	if e != l.WindowEnd(now) {
		return 0, e - now // reservations in a later window: now's window is full
	}
	return max(0, (e+l.Tau-tat)/l.T), e - now
}

// status is remaining and reset for either kind of limit.
func status(tat int64, l Limit, now int64) (remaining, reset int64) {
	if l.Window > 0 {
		return windowStatus(tat, l, now)
	}
	t := max(tat, now)
	return max(0, (now+l.Tau-t)/l.T), t - now
}

// take is the state after n permits used at `at` (at is no earlier than the limit's own
// Wait for them).
func take(tat int64, l Limit, at, n int64) int64 {
	if l.Window > 0 {
		_, after := windowSlot(tat, l, at, n)
		return after
	}
	return max(tat, at) + n*l.T
}
