package learn

import "time"

// Windows infers the window of an upstream's quota from the resets it
// reports, for fields that do not say (X-RateLimit-Limit, OpenAI's
// x-ratelimit-limit-*): the longest reset seen, or the largest jump of
// the instant of the reset from one answer to the next (fixed windows
// move it by a window at each of their starts), whichever is longer, both
// at most the window. Its zero value is ready to use; it is not safe for
// concurrent use.
type Windows struct {
	longest time.Duration
	jump    time.Duration
	seen    time.Time // when the last reset was seen
	last    time.Time // the instant of the last reset
}

// Observe records a reset of d reported at now.
func (w *Windows) Observe(now time.Time, d time.Duration) {
	if d <= 0 {
		return
	}
	w.longest = max(w.longest, d)
	at := now.Add(d)
	if !w.seen.IsZero() {
		// A jump counts when the answers are closer than it: after a
		// pause of the traffic the instant moves by the pause.
		if j := at.Sub(w.last); j > 0 && 2*now.Sub(w.seen) < j {
			w.jump = max(w.jump, j)
		}
	}
	w.seen, w.last = now, at
}

// Window returns the window inferred, 0 when no reset was seen: rounded
// up to whole seconds. Both signals are at most the window, and a window
// taken shorter than it is scales a quota up (Bound): rounding up keeps
// the inference on the side of the upstream's limit.
func (w *Windows) Window() time.Duration {
	est := max(w.longest, w.jump)
	if est <= 0 {
		return 0
	}
	return (est + time.Second - 1) / time.Second * time.Second
}
