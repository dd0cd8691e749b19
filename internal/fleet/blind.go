package fleet

import "github.com/sluicehq/sluice/internal/window"

// Blind accounts for what a write-back server admits for one counter from
// a view it has not synced for two intervals (a stale view, or none: a
// counter it has never seen), without reading the fleet's count first.
// Such a view misses what the other servers pushed since, so what it may
// admit comes out of the server's own share of OverBound, the
// max_unsynced units the others may not have seen: per period (below),
// the units admitted blind (D) plus the most units the server held
// unsynced at once (M) stay within a budget.
//
// # Why the bound holds
//
// Take one window of the counter and the last admission in it that a
// server k made from a fresh view, at t'. What k's view missed of the
// others at t' is, for each other server i, its unsynced units U_i(t')
// and what was pushed since k's last sync (one interval's admissions, at
// most two intervals old): the fleet has admitted at most
// limit + Σ_{i≠k} U_i(t') + one interval's admissions by t'. Every later
// admission in the window is blind, so the window's total is at most
// that plus Σ_i blind_i, the units each server admits blind after t'.
// For each server, U_i(t') + blind_i ≤ max_unsynced, since
// U_i(t') ≤ M + D(t') (see Note) and blind_i ≤ D(end) − D(t'):
//
//   - a fixed window is one period, with a budget of max_unsynced: when i
//     admits blind after t', the admission required D + M ≤ max_unsynced;
//   - a sliding window's periods are window-long and aligned to the Unix
//     epoch, so that any window of the counter (anchored anywhere)
//     overlaps at most two of them, p and p + 1, each with a budget of
//     max_unsynced / 2, and U_i(t') + blind_i ≤ M_p + D_p + M_p+1 + D_p+1.
//
// k's own blind units after t' are at most its budget, max_unsynced.
// Summed, the window admits at most limit + servers × max_unsynced + one
// interval's admissions: write-back's bound (OverBound), unchanged.
//
// A token bucket refills continuously and has no period: it is never
// admitted blind.
//
// A Blind is packed into 64 bits, to fit in a counter's entry: the period
// modulo 2^16 (a period 2^16 periods later taken for the same keeps its
// figures, which only lowers what is left of the budget), D and M in 24
// bits each. The budget is at most 2^22, so D never saturates; M
// saturates at 2^24 − 1, above any budget.
type Blind uint64

const (
	blindBits = 24
	blindMax  = 1<<blindBits - 1
	// maxBlindBudget bounds BlindBudget, so that D fits its bits.
	maxBlindBudget = 1 << 22
)

// D is what was admitted blind in the period.
func (b Blind) D() int64 { return int64(b >> 16 & blindMax) }

// M is the most units held unsynced at once in the period (see Note).
func (b Blind) M() int64 { return int64(b >> (16 + blindBits)) }

func packBlind(period uint64, d, m int64) Blind {
	return Blind(period&0xffff | uint64(d)<<16 | uint64(min(m, blindMax))<<(16+blindBits))
}

// blindPeriod returns the period that instant now belongs to for limit l
// (whose current window starts at start), modulo 2^16: the window itself
// for a fixed window, a window-long slice of time aligned to the Unix
// epoch for a sliding window.
func blindPeriod(l *window.Limit, now, start int64) uint64 {
	if l.Algorithm == window.FixedWindow {
		return uint64(start) & 0xffff
	}
	return uint64(now/l.Window.Milliseconds()) & 0xffff
}

// BlindPeriodStart is the instant (Unix ms) the period of now starts, for
// limit l whose current window starts at start: start itself for a fixed
// window.
func BlindPeriodStart(l *window.Limit, now, start int64) int64 {
	if l.Algorithm == window.FixedWindow {
		return start
	}
	return now - now%l.Window.Milliseconds()
}

// BlindBudget is what D + M may reach in one period for a counter of
// limit l whose servers may each count maxUnsynced units unseen: all of
// it for a fixed window, half for a sliding window (whose windows
// overlap two periods), none for a token bucket; at most 2^22.
func BlindBudget(l *window.Limit, maxUnsynced int64) int64 {
	switch l.Algorithm {
	case window.FixedWindow:
		return min(maxUnsynced, maxBlindBudget)
	case window.SlidingWindow:
		return min(maxUnsynced/2, maxBlindBudget)
	}
	return 0
}

// rolled returns b in the period of now (with the counter's current
// window starting at start): a new period starts with nothing admitted
// blind and with what is unsynced now as the most held so far.
func (b Blind) rolled(l *window.Limit, now, start, unsynced int64) Blind {
	if p := blindPeriod(l, now, start); p != uint64(b)&0xffff {
		return packBlind(p, 0, unsynced)
	}
	return b
}

// Admit reports whether a request of cost c may be admitted blind at now,
// with unsynced units unsynced before it (which start M if the period is
// new), and if so counts it in D. The caller has checked that its view
// has room for it.
func (b *Blind) Admit(l *window.Limit, now, start, c, unsynced, maxUnsynced int64) bool {
	r := b.rolled(l, now, start, unsynced)
	*b = r
	if c <= 0 || r.D()+c+r.M() > BlindBudget(l, maxUnsynced) {
		return false
	}
	*b = packBlind(uint64(r), r.D()+c, r.M())
	return true
}

// Note records that unsynced units are unsynced at now: every admission
// that is not blind calls it (and so does what puts back units a push
// failed to deliver), so that M is at least what was held unsynced at any
// instant of the period less what was admitted blind since the last
// Note, which D holds.
func (b *Blind) Note(l *window.Limit, now, start, unsynced int64) {
	r := b.rolled(l, now, start, unsynced)
	*b = packBlind(uint64(r), r.D(), max(r.M(), unsynced))
}
