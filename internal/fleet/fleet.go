// Package fleet holds the pure arithmetic of the coordination modes in
// which app servers decide in memory and keep the fleet's count in Redis in
// the background: lease (each server spends a slice of the budget reserved
// in Redis) and write-back (each server counts locally and pushes its
// deltas). Everything here takes its instant explicitly; the Lua twin in
// internal/redisstore (fleet.lua) applies the same arithmetic on the Redis
// side and is cross-checked against it on one table of instants
// (ApplyCases, GrantCases). Package fleetstore runs these modes;
// docs/fleet.md describes them for users.
//
// # The local view
//
// A counter in process is a View: C, the count decisions are made from
// (the fleet's count as last synced, plus what this process counted since
// and has not seen come back), and U, what this process counted and has
// not pushed yet, in the windows of C. Both are window.State values of the
// counter's algorithm, so window.Fits and window.Describe decide and
// describe from C exactly as exact mode decides from the counter in Redis.
//
// A delta (Delta) is what a process pushes: counts keyed by the window
// they were counted in (Start, with Prev the window before it), so that a
// push that arrives late lands in the window its hits belong to, or in a
// later one, never an earlier one: a late push can only make the fleet's
// count larger than exact, never smaller. Apply merges a delta into a
// counter; the script does the same in Redis.
//
// # Slices and blind decisions
//
// Grant is the lease script's arithmetic: it gives back what an earlier
// slice left and reserves the next, at most LeaseSize of the remaining
// budget. SliceLife says how long a slice lives: one sync interval when it
// was granted near the limit, LongLife intervals far from it. Blind
// accounts for what a write-back server admits for a counter whose view
// it has not synced for two intervals (a cold key), without reading the
// fleet's count first, within its share of OverBound (BlindBudget).
//
// A Call is one operation of the syncer on one counter of the shared
// store (a push, or a lease), named by its ID as exact mode names the
// counter, and a Reply the store's answer; they are what crosses the
// syncer's seam (fleetstore.Backend).
//
// # Bounds
//
// Lease mode never admits more than exact mode would for the same
// admissions (see Grant); it denies falsely at most FalseDenialBound per
// window. Write-back admits at most OverBound more per window, blind
// decisions included. Both are stated in docs/fleet.md.
package fleet

import "github.com/sluicehq/sluice/internal/window"

// Mode is how a rule's counters are coordinated across app servers.
type Mode uint8

// The modes.
const (
	// Exact decides every request in Redis, in one script call: today's
	// behaviour and the default.
	Exact Mode = iota
	// Lease reserves a slice of the remaining budget in Redis and spends
	// it locally.
	Lease
	// WriteBack counts locally and pushes deltas to Redis in the
	// background.
	WriteBack
)

var modeNames = [...]string{Exact: "exact", Lease: "lease", WriteBack: "write_back"}

// String returns the mode as the rules file spells it.
func (m Mode) String() string {
	if int(m) < len(modeNames) {
		return modeNames[m]
	}
	return "Mode(?)"
}

// ParseMode returns the mode spelled s: "exact", "lease" or "write_back".
func ParseMode(s string) (Mode, bool) {
	for m, n := range modeNames {
		if n == s {
			return Mode(m), true
		}
	}
	return Exact, false
}

// Supports reports whether the algorithm of l can be coordinated in a mode
// other than Exact: sliding windows, fixed windows (calendar periods
// included) and token buckets. Leaky buckets (a queue) and sliding logs
// (one entry per request) stay exact.
func Supports(a window.Algorithm) bool {
	return a == window.SlidingWindow || a == window.FixedWindow || a == window.TokenBucket
}
