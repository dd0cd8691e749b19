package learn

import "time"

// spreadSamples is how many durations a Spread keeps.
const spreadSamples = 128

// Spread estimates how far apart in time requests admitted together reach
// an upstream, from the durations between recent requests' admissions
// and their answers: the longest of the last 128 less the shortest. The
// arrival lies between the admission and the answer, so that the spread
// of the arrivals is at most that of the answers. The longest counts, not
// a percentile: on a busy machine a process that stalls holds all the
// requests it admitted meanwhile, which then reach the upstream late
// together. Its zero value is ready to use; it is not safe for
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
	lo, hi := s.d[0], s.d[0]
	for _, d := range s.d[1:s.n] {
		lo, hi = min(lo, d), max(hi, d)
	}
	return hi - lo
}
