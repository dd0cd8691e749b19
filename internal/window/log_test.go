package window

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"
)

func slidingLog(n int, w time.Duration) Limit {
	return Limit{Requests: n, Window: w, Algorithm: SlidingLog, MaxLog: max(n, DefaultMaxLog)}
}

// TestSlidingLogTable: 3 per 10 s, with costs. An entry admitted at t
// counts during [t, t+10s).
func TestSlidingLogTable(t *testing.T) {
	t.Parallel()
	l := slidingLog(3, 10*time.Second)
	const t0 = 100_000
	st := func(es ...Entry) State {
		s := State{Log: es}
		for _, e := range es {
			s.Curr += e.N
		}
		return s
	}
	s := time.Second
	runSteps(t, l, []step{
		{"first", t0, 1, true,
			Decision{Allowed: true, Remaining: 2, ResetAfter: 10 * s, NextAfter: 10 * s},
			st(Entry{t0, 1})},
		// Full; the newest leaves in 10 s, the oldest in 8.
		{"cost 2", t0 + 2*sec, 2, true,
			Decision{Allowed: true, Remaining: 0, ResetAfter: 10 * s, NextAfter: 8 * s},
			st(Entry{t0, 1}, Entry{t0 + 2*sec, 2})},
		// One unit needs the entry at t0 to leave, at t0+10s.
		{"denied", t0 + 5*sec, 1, false,
			Decision{Remaining: 0, ResetAfter: 7 * s, RetryAfter: 5 * s, NextAfter: 5 * s},
			st(Entry{t0, 1}, Entry{t0 + 2*sec, 2})},
		// Two units need both entries to leave: the second at t0+12s.
		{"cost 2 denied", t0 + 5*sec, 2, false,
			Decision{Remaining: 0, ResetAfter: 7 * s, RetryAfter: 7 * s, NextAfter: 5 * s},
			st(Entry{t0, 1}, Entry{t0 + 2*sec, 2})},
		{"cost 3 denied", t0 + 5*sec, 3, false,
			Decision{Remaining: 0, ResetAfter: 7 * s, RetryAfter: 7 * s, NextAfter: 5 * s},
			st(Entry{t0, 1}, Entry{t0 + 2*sec, 2})},
		{"cost above the limit", t0 + 5*sec, 4, false,
			Decision{Remaining: 0, ResetAfter: 7 * s, RetryAfter: -1, NextAfter: 5 * s},
			st(Entry{t0, 1}, Entry{t0 + 2*sec, 2})},
		{"a ms before the first leaves", t0 + 10*sec - 1, 1, false,
			Decision{Remaining: 0, ResetAfter: 2*s + ms, RetryAfter: ms, NextAfter: ms},
			st(Entry{t0, 1}, Entry{t0 + 2*sec, 2})},
		// At t0+10s the first has left.
		{"the first left", t0 + 10*sec, 1, true,
			Decision{Allowed: true, Remaining: 0, ResetAfter: 10 * s, NextAfter: 2 * s},
			st(Entry{t0 + 2*sec, 2}, Entry{t0 + 10*sec, 1})},
		{"full again", t0 + 10*sec, 1, false,
			Decision{Remaining: 0, ResetAfter: 10 * s, RetryAfter: 2 * s, NextAfter: 2 * s},
			st(Entry{t0 + 2*sec, 2}, Entry{t0 + 10*sec, 1})},
		{"cost 2 when 2 left", t0 + 12*sec, 2, true,
			Decision{Allowed: true, Remaining: 0, ResetAfter: 10 * s, NextAfter: 8 * s},
			st(Entry{t0 + 10*sec, 1}, Entry{t0 + 12*sec, 2})},
		{"read when full", t0 + 12*sec, 0, true,
			Decision{Allowed: true, Remaining: 0, ResetAfter: 10 * s, NextAfter: 8 * s},
			st(Entry{t0 + 10*sec, 1}, Entry{t0 + 12*sec, 2})},
		{"all left", t0 + 30*sec, 0, true,
			Decision{Allowed: true, Remaining: 3},
			st()},
		// Requests at one instant share an entry.
		{"one", t0 + 30*sec, 1, true,
			Decision{Allowed: true, Remaining: 2, ResetAfter: 10 * s, NextAfter: 10 * s},
			st(Entry{t0 + 30*sec, 1})},
		{"one more at the same instant", t0 + 30*sec, 1, true,
			Decision{Allowed: true, Remaining: 1, ResetAfter: 10 * s, NextAfter: 10 * s},
			st(Entry{t0 + 30*sec, 2})},
	})
}

var logsUnderTest = []Limit{
	slidingLog(3, 10*time.Second), slidingLog(1, 10*time.Millisecond), slidingLog(7, 300*time.Millisecond), slidingLog(100, time.Second),
	slidingLog(DefaultMaxLog, time.Second), slidingLog(5, 2*time.Second), slidingLog(5000, time.Second), slidingLog(3, MaxWindow),
}

// checkLog checks a sliding log's invariants: entries in increasing
// order, each of a positive cost, summing to Curr, within the limit, and
// no more of them than the limit.
func checkLog(t *testing.T, l Limit, s State) {
	t.Helper()
	sum := int64(0)
	for i, e := range s.Log {
		if e.N <= 0 || i > 0 && e.At <= s.Log[i-1].At {
			t.Fatalf("%v: log %+v out of order or with an empty entry", l, s.Log)
		}
		sum += e.N
	}
	if sum != s.Curr || s.Curr > int64(l.Requests) || len(s.Log) > l.Requests || s.Start != 0 || s.Prev != 0 {
		t.Fatalf("%v: state %+v", l, s)
	}
}

// TestSlidingLogExact checks RetryAfter, NextAfter and ResetAfter to the
// millisecond on random clients, the log's invariants, and that the
// summary a Redis script returns (Summarize, then Charge for an admitted
// request) describes the same decision as the log itself.
func TestSlidingLogExact(t *testing.T) {
	t.Parallel()
	checkRandomWalks(t, logsUnderTest, []int64{0, 137, 1_700_000_000_731}, 300)
	for i, l := range logsUnderTest {
		t.Run(fmt.Sprintf("summary %v", l), func(t *testing.T) {
			t.Parallel()
			rng := rand.New(rand.NewPCG(uint64(i), 7))
			end := randomWalk(l, rng, 1_700_000_000_000, l.Window.Milliseconds(), 500, func(s State, now int64) {
				checkLog(t, l, s)
				r, at := l.Roll(cloneState(s), now)
				for _, c := range costsFor(l) {
					fits := Fits(r, at, l, c)
					sum := Summarize(l, r, at, c)
					after := cloneState(r)
					if fits {
						sum.Charge(at, c)
						Add(&after, at, l, c)
					}
					if got, want := DescribeLog(l, sum, at, c, fits), Describe(after, at, l, c, fits); got != want {
						t.Fatalf("%v %+v at %d cost %d: from the summary %+v, from the log %+v", l, r, at, c, got, want)
					}
				}
			})
			checkLog(t, l, end)
		})
	}
}

// TestSlidingLogBounds hammers sliding logs with several clients and start
// phases: no interval of one window admits more than the limit, and a
// greedy client gets exactly the limit in every window from its first
// request.
func TestSlidingLogBounds(t *testing.T) {
	t.Parallel()
	for _, l := range []Limit{
		slidingLog(3, 100*time.Millisecond), slidingLog(10, time.Second), slidingLog(1, 10*time.Millisecond),
		slidingLog(7, 300*time.Millisecond), slidingLog(100, time.Second), slidingLog(2000, time.Second),
	} {
		for _, start := range []int64{0, 1, 137, 999_999_999_999, 1_700_000_000_731} {
			t.Run(fmt.Sprintf("%v from %d", l, start), func(t *testing.T) {
				t.Parallel()
				w, n := l.Window.Milliseconds(), int64(l.Requests)
				const windows = 5
				for name, ad := range clients(l, start, start+windows*w, false) {
					if most := mostIn(ad, w); most > n || name == "greedy" && most != n {
						t.Errorf("%s: %d admitted in an interval of one window, limit %d", name, most, n)
					}
					if name != "greedy" {
						continue
					}
					for k := int64(0); k < windows; k++ {
						if got := countIn(ad, start+k*w, start+(k+1)*w); got != n {
							t.Errorf("greedy: window %d from the first request admitted %d, want %d", k, got, n)
						}
					}
				}
			})
		}
	}
}

// TestSlidingLogPlanChange: a log filled under a larger limit denies every
// request, reads included, until enough of it has left for the smaller
// one, and says exactly when.
func TestSlidingLogPlanChange(t *testing.T) {
	t.Parallel()
	big, small := slidingLog(10, 10*time.Second), slidingLog(3, 10*time.Second)
	const t0 = 500_000
	var s State
	for i := range int64(10) {
		s, _, _ = take(big, s, t0+i*sec, 1)
	}
	// 10 entries, one per second, at t0 .. t0+9s; decided at t0+9.999s.
	// A read fits once 7 have left (the 7th, at t0+6s, leaves at t0+16s),
	// one unit once 8 have (t0+17s); the newest leaves at t0+19s.
	_, d, ok := take(small, s, t0+10*sec-1, 0)
	want := Decision{Remaining: 0, ResetAfter: 9001 * ms, RetryAfter: 6001 * ms, NextAfter: 7001 * ms, Debt: 7}
	if ok || d != want {
		t.Errorf("read under the smaller limit: %v %+v, want denied %+v", ok, d, want)
	}
	checkExact(t, small, s, t0+10*sec-1, costsFor(small))
}
