package learn

import (
	"math"
	"time"
)

// Bound returns the most a limit of window span may admit to stay within
// a quota of q units per window w that an upstream announced, less margin
// units: q' − margin (at most 2^62), where q' = q × span / w when w ≤ span (the
// upstream's windows fit in the limit's) and q' = q when w > span (the
// limit's window fits in the upstream's), floored; at least 1. A quota
// without a window (w ≤ 0) is taken to be per span.
func Bound(q int64, w, span time.Duration, margin int64) int64 {
	scaled := float64(q)
	if w > 0 && w < span {
		scaled = scaled * float64(span) / float64(w)
	}
	return max(int64(math.Floor(min(scaled, maxBound)))-max(margin, 0), 1)
}

// maxBound caps Bound, so that the scaling of a huge quota to a long
// window stays an int64.
const maxBound = 1 << 62

// Margin returns how many units below an announced quota of q per window
// w a budget stays: the units the upstream counts in a window that the
// budget counted in another, for requests that reach it spread over
// spread after their admission, q × spread / w (rounded), plus one for the
// last unit that the two counts may see on either side of a window's
// edge; at most a quarter of q (at least 1).
//
// The upstream counts a request when it arrives, the budget when it
// admits it: a smooth flow at q per w shifted by a delay that varies by
// spread puts up to q × spread / w of one window's requests into the next
// one of the upstream's. A sliding-window counter (sluice's default)
// admits at most its limit plus one in any interval of one window.
func Margin(q int64, w, spread time.Duration) int64 {
	if q <= 0 {
		return 0
	}
	m := int64(1)
	if w > 0 && spread > 0 {
		m += int64(math.Round(float64(q) * float64(spread) / float64(w)))
	}
	return min(m, max(q/4, 1))
}
