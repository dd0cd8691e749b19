// Package regions holds the arithmetic and the Redis side of limits
// shared across regions (scope: global): each region decides on its own
// Redis, from its own count plus the last known counts of the other
// regions, and a syncer copies its count to every peer region's Redis in
// the background. No request waits for another region. A Store decides
// (Decide), settles a usage whatever the count holds (Settle: a debt the
// next decisions see, docs/usage.md), takes back a charge (Refund) and
// resets a client (Reset) in its region's Redis; its syncer (Run, Sync)
// pushes to the peers and Peers reports how each link fares. Package
// middleware's RegionStore is its public face; docs/regions.md states the
// bound and the behaviour under partitions for users.
//
// # The count of a window
//
// A global limit's windows are aligned to the Unix epoch (Start): regions
// cannot agree on a per-client anchor without a round trip. The clock of
// the region's Redis (TIME) picks the window, so that the app servers of
// a region agree whatever their own clocks. A script touches only the
// keys it is given in KEYS, yet the window is picked inside it: the store
// declares the hashes of the windows around its estimate of that clock
// (Declared: its own clock plus the offset to the Redis clock learned
// from the scripts' earlier replies), and a script that does not find the
// hashes it needs among them (Covers: the estimate was off by more than a
// window, as on an app server's first call when its clock is skewed)
// touches nothing and answers the instant it read, from which the store
// declares the windows again and runs it once more. The count of
// one window is a G-counter: one field per region in a Redis hash, each
// region writes only its own field, and a merge keeps the largest value
// per field (Merge, merge.lua), so that repeated and reordered syncs are
// harmless. A region decides (Decide, decide.lua) from the sum of the
// fields of its own copy; for a sliding window, the previous window's
// sum is weighted by the part of it still inside the sliding window.
//
// # Bound
//
// A region's own count is exact in its own Redis; the others' counts lag
// by at most the sync interval T plus the one-way delay d. In one window
// the regions together admit over the limit at most what was admitted
// across regions in that lag, R × (T + d) for a total admit rate R, and
// never more than (N − 1) × L, since each region alone stops at L
// (Bound).
//
// # Partitions
//
// A region whose pushes to a peer have failed for longer than the hold
// time counts that peer, in every window, as at least its share L / N
// (Share): during a long partition each region keeps to about its share,
// and the regions together stay within about L. Within the hold time the
// peer's last known count is used. A peer whose last push failed is
// pushed to at every tick: when the link heals, the next tick carries each
// region's counts of the windows still open, so the copies converge
// within a tick plus the new connection's handshake plus d.
package regions

import (
	"math"
	"slices"
	"time"
)

// Start is the start (Unix ms) of the epoch-aligned window of length w ms
// that contains now.
func Start(now, w int64) int64 {
	s := now - now%w
	if now < 0 && now%w != 0 {
		s -= w
	}
	return s
}

// Declared returns the starts of the windows whose hashes a script that
// decides or resets a counter passes in KEYS when the instant it decides
// at is estimated at est (Unix ms), for windows of w ms: the windows of
// est − w, est and est + w, and, if prev (the script needs the window
// before the current one: a sliding window's decision, a reset), the one
// before them, in ascending order. If the instant is within a window of
// est, the script finds there every hash it needs (Covers).
func Declared(est, w int64, prev bool) []int64 {
	s := Start(est, w)
	if prev {
		return []int64{s - 2*w, s - w, s, s + w}
	}
	return []int64{s - w, s, s + w}
}

// Covers reports whether declared holds the start of every window that a
// script deciding or resetting at now (Unix ms) touches: the current
// window, and, if prev, the one before it. If not, the script touches
// nothing and answers the instant it read (the clock of the region's
// Redis), from which the store declares the windows again (Declared) and
// runs it once more.
func Covers(declared []int64, now, w int64, prev bool) bool {
	s := Start(now, w)
	return slices.Contains(declared, s) && (!prev || slices.Contains(declared, s-w))
}

// Merge merges the counts of b into a, keeping the largest value per
// region: a G-counter's merge, commutative, associative and idempotent.
func Merge(a, b map[string]int64) {
	for r, n := range b {
		if n > a[r] {
			a[r] = n
		}
	}
}

// Window is what a region knows of one counter: the fields of its copy
// of the current and previous windows.
type Window struct {
	Curr, Prev map[string]int64
}

// Total is the count a region decides from at now (Unix ms) for a window
// of w ms starting at start: the sum over regions of the current window,
// plus, if sliding, the previous window's sum weighted by the part of it
// still inside the sliding window (rounded down). A window's ResetField is
// taken off its sum (not below 0). Each peer in stale counts as at least
// share in each window.
func Total(c Window, start, now, w int64, sliding bool, stale []string, share int64) int64 {
	sum := func(m map[string]int64) int64 {
		var s int64
		for r, n := range m {
			if r != ResetField {
				s += n
			}
		}
		s = max(0, s-m[ResetField])
		for _, p := range stale {
			if m[p] < share {
				s += share - m[p]
			}
		}
		return s
	}
	t := sum(c.Curr)
	if sliding {
		t += sum(c.Prev) * (w - (now - start)) / w
	}
	return t
}

// Fits reports whether a request of cost fits a limit of limit units
// when the regions' count is total.
func Fits(total, cost, limit int64) bool { return total+cost <= limit }

// Share is what a region counts an unreachable peer as, per window: the
// limit divided evenly among the n regions, rounded up.
func Share(limit int64, n int) int64 {
	if n <= 0 {
		return limit
	}
	return (limit + int64(n) - 1) / int64(n)
}

// Bound is the most the regions together admit over a global limit of
// limit units in one window, for a total admit rate rate (requests per
// second across regions), sync interval t, one-way delay d and n regions:
// min(rate × (t + d), (n − 1) × limit), rounded up. rate × (t + d) stands
// for what the regions admit in any interval of t + d: for a burst, use
// the burst's rate over that interval.
func Bound(rate float64, t, d time.Duration, n int, limit int64) int64 {
	lag := int64(math.Ceil(rate * (t + d).Seconds()))
	return min(lag, int64(n-1)*limit)
}
