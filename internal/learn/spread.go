package learn

import (
	"slices"
	"time"
)

// spreadSamples is how many durations a Spread keeps.
const spreadSamples = 128

// Spread estimates how far apart in time requests admitted together reach
// an upstream, from the durations between recent requests' admissions
// and their answers: the 90th percentile of the last 128 less the least.
// The arrival lies between the admission and the answer, so that the
// spread of the arrivals is at most that of the answers. The top tenth is
// left out: a late answer of its own moves one unit (the margin's extra
// unit), and a process that stalls holds the few requests it admitted
// just before; taking the longest instead kept, on a machine loaded ten
// times over, a fifth of the budget unused against stalls that cost a
// unit or two. Its zero value is ready to use; it is not safe for
// concurrent use.
type Spread struct {
	d    [spreadSamples]time.Duration
	n, i int
}

// Add records the duration between a request's admission and its answer.
func (s *Spread) Add(d time.Duration) {
	s.d[s.i] = max(d, 0)
	s.i = (s.i + 1) % spreadSamples
	s.n = min(s.n+1, spreadSamples)
}

// Value returns the spread: 0 with fewer than 8 samples.
func (s *Spread) Value() time.Duration {
	if s.n < 8 {
		return 0
	}
	var buf [spreadSamples]time.Duration
	d := buf[:s.n]
	copy(d, s.d[:s.n])
	slices.Sort(d)
	return d[(s.n*9-1)/10] - d[0]
}
