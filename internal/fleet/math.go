package fleet

import "github.com/sluicehq/sluice/internal/window"

// View is one counter as an app server sees it.
type View struct {
	// C is what decisions are made from: the fleet's counter as last
	// synced, plus what this process counted since.
	C window.State
	// U is what this process counted and has not pushed yet: U.Curr in
	// the window that starts at U.Start (C's current window), U.Prev in
	// the one before it. For a token bucket, U.Curr is in tokens (cost
	// units) and U.Start and U.Prev are unused.
	U window.State
}

// Delta is what a process pushes for one counter: Curr counted in the
// window that starts at Start (Unix ms) and Prev in the window before it;
// for a token bucket, Curr tokens, whatever the window.
type Delta struct {
	Start, Prev, Curr int64
}

// Zero reports whether the delta counts nothing.
func (d Delta) Zero() bool { return d.Prev == 0 && d.Curr == 0 }

// Roll moves v to now (Unix ms) under l and returns the instant to decide
// at, as window.Limit.Roll does for C. U follows C's windows: what was
// counted in the current window moves to Prev when C rolls one window, and
// what belongs to windows that no decision depends on any more (two
// windows back, or a fixed window that ended) is forgotten.
func (v *View) Roll(l *window.Limit, now int64) int64 {
	prev := v.C
	c, at := l.Roll(v.C, now)
	v.C = c
	switch l.Algorithm {
	case window.SlidingWindow:
		switch w := l.Window.Milliseconds(); {
		case c.Start == prev.Start:
		case c.Start == prev.Start+w && (c.Prev != 0 || c.Curr != 0):
			v.U = window.State{Start: c.Start, Prev: v.U.Curr}
		default:
			v.U = window.State{Start: c.Start}
		}
	case window.FixedWindow:
		if c.Start != prev.Start {
			v.U = window.State{Start: c.Start}
		}
	}
	return at
}

// Take decides a request of cost c at now from the local view, as
// window.TakeOne decides from a stored counter, and counts it in C and U
// if it fits. It returns the instant decided at and whether c fits;
// window.Describe(v.C, at, *l, c, ok) describes the decision.
func (v *View) Take(l *window.Limit, now, c int64) (at int64, ok bool) {
	at = v.Roll(l, now)
	if ok = window.Fits(v.C, at, *l, c); ok && c > 0 {
		window.Add(&v.C, at, *l, c)
		v.U.Curr += c
	}
	return at, ok
}

// Unsynced is how many units this process counted and has not pushed.
func (v *View) Unsynced() int64 { return v.U.Prev + v.U.Curr }

// Detach returns U as a delta to push and clears it.
func (v *View) Detach() Delta {
	d := Delta{Start: v.U.Start, Prev: v.U.Prev, Curr: v.U.Curr}
	v.U = window.State{Start: v.U.Start}
	return d
}

// Restore puts back a delta that could not be pushed, in C's windows as
// they are now (Roll first): what no longer matters is dropped, and what
// belongs to an earlier window is counted in the current one when the
// mapping is unclear, which errs on the side of counting more.
func (v *View) Restore(l *window.Limit, d Delta) {
	switch l.Algorithm {
	case window.TokenBucket:
		v.U.Curr += d.Curr
		return
	case window.FixedWindow:
		if d.Start == v.U.Start {
			v.U.Curr += d.Curr
		}
		return
	}
	w := l.Window.Milliseconds()
	place := func(last, n int64) {
		switch {
		case n == 0:
		case last >= v.U.Start:
			v.U.Curr += n
		case last >= v.U.Start-w:
			v.U.Prev += n
		}
	}
	place(d.Start+w-1, d.Curr)
	place(d.Start-1, d.Prev)
}

// Synced makes r, the fleet's counter as Redis returned it after a push
// or a lease (stored, not rolled), the new base of v: C becomes r rolled
// to now with what is still unsynced merged in (Apply), plus inflight, the
// units pushed by other calls whose answer has not come yet, counted in
// the current window.
func (v *View) Synced(l *window.Limit, r window.State, now, inflight int64) {
	u := Delta{Start: v.U.Start, Prev: v.U.Prev, Curr: v.U.Curr}
	c, at := Apply(l, r, u, now)
	if inflight > 0 {
		window.Add(&c, at, *l, inflight)
	}
	v.C = c
	// U now follows C's windows, which may be anchored elsewhere.
	v.U = window.State{Start: c.Start}
	if l.Algorithm == window.TokenBucket {
		v.U.Curr = u.Curr
		return
	}
	v.Restore(l, u)
}

// Apply merges delta d into the stored counter r of limit l at now (Unix
// ms): it rolls r to now and adds each count of d to the window of r that
// contains the last instant of the window d counted it in, or to r's
// current window if that instant is later; counts of windows that ended
// before r's previous one are dropped, since no decision depends on them.
// A counter that is empty at now takes d's windows. A fixed window adds d
// only if d counted in r's window; a token bucket adds d.Curr tokens to
// its level. It returns the merged counter and the instant to decide at.
// fleet.lua applies deltas in Redis with the same arithmetic.
func Apply(l *window.Limit, r window.State, d Delta, now int64) (window.State, int64) {
	r, at := l.Roll(r, now)
	switch l.Algorithm {
	case window.TokenBucket, window.FixedWindow:
		if l.Algorithm == window.TokenBucket || d.Start == r.Start {
			window.Add(&r, at, *l, d.Curr)
		}
		return r, at
	}
	if d.Zero() {
		return r, at
	}
	w := l.Window.Milliseconds()
	if r.Prev == 0 && r.Curr == 0 {
		switch {
		case now < d.Start+w:
			r = window.State{Start: d.Start, Prev: d.Prev, Curr: d.Curr}
		case now < d.Start+2*w && d.Curr != 0:
			r = window.State{Start: d.Start + w, Prev: d.Curr}
		default:
			return r, at
		}
		return r, max(now, r.Start)
	}
	for _, x := range [2][2]int64{{d.Start + w - 1, d.Curr}, {d.Start - 1, d.Prev}} {
		switch last, n := x[0], x[1]; {
		case last >= r.Start:
			r.Curr += n
		case last >= r.Start-w:
			r.Prev += n
		}
	}
	return r, at
}

// Remaining is how many units of cost fit the rolled counter r of limit l
// at at: the largest c with window.Fits(r, at, l, c), 0 if none.
func Remaining(l *window.Limit, r window.State, at int64) int64 {
	return int64(window.Describe(r, at, *l, 1, true).Remaining)
}

// LeaseSize is the slice a lease grants: at most want, and at most a
// share of the remaining budget rem that leaves room for the others,
// rem / (2 × servers) where servers is how many app servers hold leases
// on the counter, this one included; it falls to 1 near the limit (as long
// as rem >= 1) and is 0 when nothing remains.
func LeaseSize(want, rem, servers int64) int64 {
	if want <= 0 || rem <= 0 {
		return 0
	}
	s := rem / (2 * max(servers, 1))
	return min(want, rem, max(s, 1))
}

// Grant is the lease script's arithmetic (fleet.lua): it rolls the stored
// counter r to now, gives back give units of an earlier lease counted in
// the window that starts at from (for a token bucket, whatever the
// window; units of a window that ended are not given back), then reserves
// LeaseSize(want, remaining, servers) units by counting them, as an
// admitted request of that cost would be. It returns the new counter, the
// units granted and the instant decided at. A lease thus never takes more
// than the remaining budget: the fleet admits at most what exact mode
// would.
func Grant(l *window.Limit, r window.State, now, want, give, from, servers int64) (window.State, int64, int64) {
	r, at := l.Roll(r, now)
	if give > 0 {
		switch l.Algorithm {
		case window.TokenBucket:
			r.Curr = max(0, r.Curr-give*(l.Window.Milliseconds()/l.Tick()))
		case window.FixedWindow:
			if from == r.Start {
				r.Curr = max(0, r.Curr-give)
			}
		default:
			switch w := l.Window.Milliseconds(); {
			case from == r.Start:
				r.Curr = max(0, r.Curr-give)
			case from == r.Start-w:
				r.Prev = max(0, r.Prev-give)
			}
		}
	}
	g := LeaseSize(want, Remaining(l, r, at), servers)
	if g > 0 {
		window.Add(&r, at, *l, g)
	}
	return r, g, at
}

// LongLife is how many sync intervals a slice granted far from the limit
// lives (see SliceLife).
const LongLife = 10

// SliceLife is how long a slice lives, in ms, before what it left goes
// back: one sync interval when it was granted near the limit, with less
// than servers × lease of the budget left after it (remaining), and
// LongLife intervals when it was granted farther from the limit, where
// no server can be denied before the fleet has spent what every holder
// may hold; a token bucket's slices live one interval, since its bound
// grows with the time a slice is spent after its tokens were taken. The
// caller ends a slice sooner at the end of the window it was counted in,
// and gives back the rest of a slice whose counter goes idle.
//
// A slice's life does not change what lease mode may deny falsely
// (FalseDenialBound: the units other servers hold, at most lease each),
// only how long a server that keeps its counter busy may hold them.
func SliceLife(l *window.Limit, interval, remaining, servers, lease int64) int64 {
	if l.Algorithm == window.TokenBucket || remaining < max(servers, 1)*lease {
		return interval
	}
	return LongLife * interval
}

// OverBound is write-back's bound on what the fleet admits over the limit
// in one window, on top of what it admits in one sync interval: each of
// servers app servers may have counted up to maxUnsynced units that the
// others have not seen.
func OverBound(servers, maxUnsynced int64) int64 { return servers * maxUnsynced }

// FalseDenialBound is lease mode's bound on the requests denied while
// budget was still unused, per window: the slices the other servers hold,
// at most lease each, until their leases end and they give the rest back.
func FalseDenialBound(servers, lease int64) int64 { return max(servers-1, 0) * lease }
