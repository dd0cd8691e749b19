package window

import (
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"testing"
	"time"
	_ "time/tzdata" // calendar periods are tested in named zones on machines without a zone database
)

func mustLoad(t testing.TB, name string) *time.Location {
	t.Helper()
	loc, err := time.LoadLocation(name)
	if err != nil {
		t.Fatal(err)
	}
	return loc
}

func TestValidateAlgorithms(t *testing.T) {
	t.Parallel()
	paris := mustLoad(t, "Europe/Paris")
	tests := []struct {
		l    Limit
		want string
	}{
		// Token bucket.
		{Limit{Requests: 10, Window: time.Second, Algorithm: TokenBucket}, ""},
		{Limit{Requests: 10, Window: time.Second, Algorithm: TokenBucket, Burst: 1}, ""},
		{Limit{Requests: 10, Window: time.Second, Algorithm: TokenBucket, Burst: 20}, ""},
		{Limit{Requests: 1, Window: MaxWindow, Algorithm: TokenBucket, Burst: MaxRequests}, ""},
		{Limit{Requests: 10, Window: time.Second, Algorithm: TokenBucket, Burst: -1},
			"limit 10/1s token_bucket burst -1: burst -1 must be between 1 and 2^50 (1125899906842624), or 0 for requests"},
		{Limit{Requests: 10, Window: time.Second, Algorithm: TokenBucket, Burst: MaxRequests + 1},
			"limit 10/1s token_bucket burst 1125899906842625: burst 1125899906842625 must be between 1 and 2^50 (1125899906842624), or 0 for requests"},
		{Limit{Requests: 10, Window: 0, Algorithm: TokenBucket}, "limit 10/0s token_bucket: window must be > 0"},
		{Limit{Requests: 0, Window: time.Second, Algorithm: TokenBucket, Burst: 5}, "limit 0/1s token_bucket burst 5: requests must be > 0"},
		// Burst on the other algorithms.
		{Limit{Requests: 10, Window: time.Second, Burst: 5}, "limit 10/1s burst 5: burst applies only to the token_bucket and leaky_bucket algorithms, not to sliding_window"},
		{Limit{Requests: 10, Window: time.Second, Algorithm: FixedWindow, Burst: 5},
			"limit 10/1s fixed_window burst 5: burst applies only to the token_bucket and leaky_bucket algorithms, not to fixed_window"},
		{Limit{Requests: 10, Window: time.Second, Algorithm: SlidingLog, Burst: 10},
			"limit 10/1s sliding_log burst 10: burst applies only to the token_bucket and leaky_bucket algorithms, not to sliding_log"},
		// Fixed window and calendar periods.
		{Limit{Requests: 3, Window: time.Minute, Algorithm: FixedWindow}, ""},
		{Limit{Requests: 3, Algorithm: FixedWindow, Period: CalendarDay}, ""},
		{Limit{Requests: 3, Window: 24 * time.Hour, Algorithm: FixedWindow, Period: CalendarDay}, ""},
		{Limit{Requests: 3, Window: 7 * day, Algorithm: FixedWindow, Period: CalendarWeek, Location: paris}, ""},
		{Limit{Requests: 3, Window: 30 * day, Algorithm: FixedWindow, Period: CalendarMonth}, ""},
		{Limit{Requests: 3, Period: CalendarDay}, "limit 3/calendar_day UTC: sliding_window cannot count a calendar period (calendar_day): calendar periods need fixed_window"},
		{Limit{Requests: 3, Window: time.Second, Algorithm: TokenBucket, Period: CalendarWeek},
			"limit 3/calendar_week UTC token_bucket: token_bucket cannot count a calendar period (calendar_week): calendar periods need fixed_window"},
		{Limit{Requests: 3, Algorithm: SlidingLog, Period: CalendarMonth, Location: paris},
			"limit 3/calendar_month Europe/Paris sliding_log: sliding_log cannot count a calendar period (calendar_month): calendar periods need fixed_window"},
		{Limit{Requests: 3, Algorithm: FixedWindow, Period: 7}, "limit 3/Period(7) UTC fixed_window: unknown period 7"},
		{Limit{Requests: 3, Window: time.Hour, Algorithm: FixedWindow, Period: CalendarDay},
			"limit 3/calendar_day UTC fixed_window: a calendar period has no window (or its nominal 24h0m0s)"},
		{Limit{Requests: 3, Window: 24 * time.Hour, Algorithm: FixedWindow, Period: CalendarWeek},
			"limit 3/calendar_week UTC fixed_window: a calendar period has no window (or its nominal 168h0m0s)"},
		{Limit{Requests: 3, Window: 31 * day, Algorithm: FixedWindow, Period: CalendarMonth, Location: paris},
			"limit 3/calendar_month Europe/Paris fixed_window: a calendar period has no window (or its nominal 720h0m0s)"},
		{Limit{Requests: 0, Algorithm: FixedWindow, Period: CalendarDay}, "limit 0/calendar_day UTC fixed_window: requests must be > 0"},
		// A time zone without a period.
		{Limit{Requests: 3, Window: time.Minute, Algorithm: FixedWindow, Location: paris},
			"limit 3/1m0s fixed_window: a time zone applies only to a calendar period (calendar_day, calendar_week or calendar_month), not to a window of 1m"},
		{Limit{Requests: 3, Window: time.Minute, Location: time.UTC}, "limit 3/1m0s: a time zone applies only to a calendar period (calendar_day, calendar_week or calendar_month), not to a window of 1m"},
		// Sliding log and MaxLog.
		{Limit{Requests: DefaultMaxLog, Window: time.Second, Algorithm: SlidingLog}, ""},
		{Limit{Requests: DefaultMaxLog + 1, Window: time.Second, Algorithm: SlidingLog},
			"limit 1001/1s sliding_log: a sliding log keeps one entry per request, and 1001 requests is above its maximum of 1000; raise max_log (up to 100000) to accept the memory it costs, or use another algorithm"},
		{Limit{Requests: DefaultMaxLog + 1, Window: time.Second, Algorithm: SlidingLog, MaxLog: DefaultMaxLog + 1}, ""},
		{Limit{Requests: MaxLogRequests, Window: time.Second, Algorithm: SlidingLog, MaxLog: MaxLogRequests}, ""},
		// MaxLog only raises the bound: below DefaultMaxLog it changes nothing.
		{Limit{Requests: 800, Window: time.Second, Algorithm: SlidingLog, MaxLog: 500}, ""},
		{Limit{Requests: 5000, Window: time.Second, Algorithm: SlidingLog, MaxLog: 4000},
			"limit 5000/1s sliding_log: a sliding log keeps one entry per request, and 5000 requests is above its maximum of 4000; raise max_log (up to 100000) to accept the memory it costs, or use another algorithm"},
		{Limit{Requests: MaxLogRequests + 1, Window: time.Second, Algorithm: SlidingLog, MaxLog: MaxLogRequests},
			"limit 100001/1s sliding_log: a sliding log keeps one entry per request, and 100001 requests is above its maximum of 100000; raise max_log (up to 100000) to accept the memory it costs, or use another algorithm"},
		{Limit{Requests: 10, Window: time.Second, Algorithm: SlidingLog, MaxLog: MaxLogRequests + 1},
			"limit 10/1s sliding_log: max_log 100001 must be between 1 and 100000, or 0 for 1000"},
		{Limit{Requests: 10, Window: time.Second, Algorithm: SlidingLog, MaxLog: -1},
			"limit 10/1s sliding_log: max_log -1 must be between 1 and 100000, or 0 for 1000"},
		{Limit{Requests: 10, Window: time.Second, MaxLog: 2000}, "limit 10/1s: max_log applies only to the sliding_log algorithm, not to sliding_window"},
		{Limit{Requests: 10, Window: time.Second, Algorithm: TokenBucket, MaxLog: 2000},
			"limit 10/1s token_bucket: max_log applies only to the sliding_log algorithm, not to token_bucket"},
		// Unknown algorithm, before anything else.
		{Limit{Requests: 10, Window: time.Second, Algorithm: algorithms}, "limit 10/1s Algorithm(5): unknown algorithm 5"},
		{Limit{Requests: 0, Window: 0, Algorithm: 200}, "limit 0/0s Algorithm(200): unknown algorithm 200"},
	}
	for _, tt := range tests {
		err := tt.l.Validate()
		got := ""
		if err != nil {
			got = err.Error()
		}
		if got != tt.want {
			t.Errorf("%v.Validate() = %q, want %q", tt.l, got, tt.want)
		}
	}
}

func TestParseAlgorithm(t *testing.T) {
	t.Parallel()
	for _, a := range []Algorithm{SlidingWindow, FixedWindow, SlidingLog, TokenBucket} {
		got, err := ParseAlgorithm(a.String())
		if err != nil || got != a {
			t.Errorf("ParseAlgorithm(%q) = %v, %v; want %v", a.String(), got, err, a)
		}
	}
	names := map[Algorithm]string{SlidingWindow: "sliding_window", FixedWindow: "fixed_window", SlidingLog: "sliding_log", TokenBucket: "token_bucket", LeakyBucket: "leaky_bucket", algorithms: "Algorithm(5)", 255: "Algorithm(255)"}
	for a, want := range names {
		if got := a.String(); got != want {
			t.Errorf("Algorithm(%d).String() = %q, want %q", uint8(a), got, want)
		}
	}
	for _, s := range []string{"", "Token_Bucket", "token-bucket", "Algorithm(5)", " sliding_log"} {
		got, err := ParseAlgorithm(s)
		want := fmt.Sprintf("unknown algorithm %q (want sliding_window, fixed_window, sliding_log, token_bucket or leaky_bucket)", s)
		if err == nil || err.Error() != want || got != SlidingWindow {
			t.Errorf("ParseAlgorithm(%q) = %v, %v; want 0, %q", s, got, err, want)
		}
	}
}

func TestParsePeriod(t *testing.T) {
	t.Parallel()
	for _, p := range []Period{CalendarDay, CalendarWeek, CalendarMonth} {
		got, ok := ParsePeriod(p.String())
		if !ok || got != p {
			t.Errorf("ParsePeriod(%q) = %v, %v; want %v, true", p.String(), got, ok, p)
		}
	}
	names := map[Period]string{NoPeriod: "", CalendarDay: "calendar_day", CalendarWeek: "calendar_week", CalendarMonth: "calendar_month", periods: "Period(4)"}
	for p, want := range names {
		if got := p.String(); got != want {
			t.Errorf("Period(%d).String() = %q, want %q", uint8(p), got, want)
		}
	}
	// The empty name is NoPeriod's, but it names no period.
	for _, s := range []string{"", "calendar_year", "Calendar_Day", "day", "Period(4)"} {
		if got, ok := ParsePeriod(s); ok || got != NoPeriod {
			t.Errorf("ParsePeriod(%q) = %v, %v; want NoPeriod, false", s, got, ok)
		}
	}
}

func TestLimitStringAlgorithms(t *testing.T) {
	t.Parallel()
	paris, ny := mustLoad(t, "Europe/Paris"), mustLoad(t, "America/New_York")
	tests := []struct {
		l    Limit
		want string
	}{
		{Limit{Requests: 100, Window: time.Minute}, "100/1m0s"},
		{Limit{Requests: 3, Window: time.Minute, Algorithm: FixedWindow}, "3/1m0s fixed_window"},
		{Limit{Requests: 5, Window: 10 * time.Second, Algorithm: SlidingLog, MaxLog: 2000}, "5/10s sliding_log"},
		{Limit{Requests: 10, Window: time.Second, Algorithm: TokenBucket}, "10/1s token_bucket"},
		{Limit{Requests: 10, Window: time.Second, Algorithm: TokenBucket, Burst: 20}, "10/1s token_bucket burst 20"},
		{Limit{Requests: 1000, Algorithm: FixedWindow, Period: CalendarDay, Location: paris}, "1000/calendar_day Europe/Paris fixed_window"},
		{Limit{Requests: 1000, Window: 24 * time.Hour, Algorithm: FixedWindow, Period: CalendarDay, Location: paris}, "1000/calendar_day Europe/Paris fixed_window"},
		{Limit{Requests: 7, Algorithm: FixedWindow, Period: CalendarWeek}, "7/calendar_week UTC fixed_window"},
		{Limit{Requests: 7, Algorithm: FixedWindow, Period: CalendarMonth, Location: ny}, "7/calendar_month America/New_York fixed_window"},
	}
	for _, tt := range tests {
		if got := tt.l.String(); got != tt.want {
			t.Errorf("String() = %q, want %q", got, tt.want)
		}
	}
}

func TestCapacityAndSpan(t *testing.T) {
	t.Parallel()
	tests := []struct {
		l        Limit
		capacity int
		span     time.Duration
	}{
		{Limit{Requests: 100, Window: time.Minute}, 100, time.Minute},
		{Limit{Requests: 3, Window: time.Minute, Algorithm: FixedWindow}, 3, time.Minute},
		{Limit{Requests: 3, Window: 10 * time.Second, Algorithm: SlidingLog}, 3, 10 * time.Second},
		{Limit{Requests: 3, Algorithm: FixedWindow, Period: CalendarDay}, 3, 24 * time.Hour},
		{Limit{Requests: 3, Window: 24 * time.Hour, Algorithm: FixedWindow, Period: CalendarDay}, 3, 24 * time.Hour},
		{Limit{Requests: 3, Algorithm: FixedWindow, Period: CalendarWeek}, 3, 7 * day},
		{Limit{Requests: 3, Algorithm: FixedWindow, Period: CalendarMonth}, 3, 30 * day},
		// Token bucket: the time its capacity takes to refill from empty.
		{Limit{Requests: 10, Window: time.Second, Algorithm: TokenBucket}, 10, time.Second},
		{Limit{Requests: 10, Window: time.Second, Algorithm: TokenBucket, Burst: 10}, 10, time.Second},
		{Limit{Requests: 10, Window: time.Second, Algorithm: TokenBucket, Burst: 20}, 20, 2 * time.Second},
		{Limit{Requests: 4, Window: time.Second, Algorithm: TokenBucket, Burst: 1}, 1, 250 * time.Millisecond},
		// 1000/3 = 333.3 ms, rounded up.
		{Limit{Requests: 3, Window: time.Second, Algorithm: TokenBucket, Burst: 1}, 1, 334 * time.Millisecond},
		// 10 * 1000 / 7 = 1428.6 ms, rounded up.
		{Limit{Requests: 7, Window: time.Second, Algorithm: TokenBucket, Burst: 10}, 10, 1429 * time.Millisecond},
		// burst * window above 2^64 ms, the span well within MaxWindow.
		{Limit{Requests: 1 << 49, Window: 16384 * time.Millisecond, Algorithm: TokenBucket, Burst: MaxRequests}, MaxRequests, 32768 * time.Millisecond},
		// MaxWindow * requests above 2^64: 3660 days in ms is 2^12 * an odd
		// number, so times 2^50 it wraps to 2^62, below burst * window.
		{Limit{Requests: MaxRequests, Window: 8192 * time.Millisecond, Algorithm: TokenBucket, Burst: MaxRequests - 1}, MaxRequests - 1, 8192 * time.Millisecond},
		{Limit{Requests: 1e12, Window: time.Hour, Algorithm: TokenBucket, Burst: 2e12}, 2e12, 2 * time.Hour},
		{Limit{Requests: 1e12, Window: MaxWindow, Algorithm: TokenBucket, Burst: 1e12 + 1}, 1e12 + 1, MaxWindow},
		// Capped at MaxWindow.
		{Limit{Requests: 1, Window: MaxWindow, Algorithm: TokenBucket, Burst: 2}, 2, MaxWindow},
		{Limit{Requests: 1, Window: MaxWindow, Algorithm: TokenBucket, Burst: MaxRequests}, MaxRequests, MaxWindow},
		{Limit{Requests: 1, Window: 24 * time.Hour, Algorithm: TokenBucket, Burst: 3660}, 3660, MaxWindow},
		{Limit{Requests: 1, Window: 24 * time.Hour, Algorithm: TokenBucket, Burst: 3661}, 3661, MaxWindow},
		{Limit{Requests: 1, Window: 24 * time.Hour, Algorithm: TokenBucket, Burst: 3659}, 3659, 3659 * 24 * time.Hour},
	}
	for _, tt := range tests {
		if err := tt.l.Validate(); err != nil {
			t.Fatal(err)
		}
		if got := tt.l.Capacity(); got != tt.capacity {
			t.Errorf("%v.Capacity() = %d, want %d", tt.l, got, tt.capacity)
		}
		if got := tt.l.Span(); got != tt.span {
			t.Errorf("%v.Span() = %v, want %v", tt.l, got, tt.span)
		}
	}
}

func TestSeries(t *testing.T) {
	t.Parallel()
	paris, ny := mustLoad(t, "Europe/Paris"), mustLoad(t, "America/New_York")
	// The sliding window's series is its window in ms, as before the other
	// algorithms existed.
	for _, w := range []time.Duration{time.Millisecond, time.Second, time.Minute, MaxWindow} {
		if got := (Limit{Requests: 5, Window: w}).Series(); got != uint64(w.Milliseconds()) {
			t.Errorf("sliding window %v: Series() = %d, want %d", w, got, w.Milliseconds())
		}
	}
	distinct := []Limit{
		{Requests: 10, Window: time.Minute},
		{Requests: 10, Window: time.Second},
		{Requests: 10, Window: time.Minute, Algorithm: FixedWindow},
		{Requests: 10, Window: time.Second, Algorithm: FixedWindow},
		{Requests: 10, Window: 24 * time.Hour, Algorithm: FixedWindow},
		{Requests: 10, Window: time.Minute, Algorithm: SlidingLog},
		{Requests: 10, Window: time.Minute, Algorithm: TokenBucket},
		{Requests: 10, Window: MaxWindow, Algorithm: TokenBucket},
		{Requests: 10, Algorithm: FixedWindow, Period: CalendarDay},
		{Requests: 10, Algorithm: FixedWindow, Period: CalendarDay, Location: paris},
		{Requests: 10, Algorithm: FixedWindow, Period: CalendarDay, Location: ny},
		{Requests: 10, Algorithm: FixedWindow, Period: CalendarWeek},
		{Requests: 10, Algorithm: FixedWindow, Period: CalendarWeek, Location: paris},
		{Requests: 10, Algorithm: FixedWindow, Period: CalendarMonth},
		{Requests: 10, Algorithm: FixedWindow, Period: CalendarMonth, Location: ny},
	}
	seen := map[uint64]Limit{}
	for _, l := range distinct {
		if err := l.Validate(); err != nil {
			t.Fatal(err)
		}
		s := l.Series()
		if o, ok := seen[s]; ok {
			t.Errorf("%v and %v share series %#x", l, o, s)
		}
		seen[s] = l
	}
	// What plans change (requests, burst) and equivalent spellings keep
	// the counter.
	same := [][2]Limit{
		{{Requests: 10, Window: time.Minute, Algorithm: FixedWindow}, {Requests: 99, Window: time.Minute, Algorithm: FixedWindow}},
		{{Requests: 10, Window: time.Second, Algorithm: TokenBucket}, {Requests: 1e12, Window: time.Second, Algorithm: TokenBucket, Burst: 5}},
		{{Requests: 10, Window: time.Second, Algorithm: SlidingLog}, {Requests: 5000, Window: time.Second, Algorithm: SlidingLog, MaxLog: 5000}},
		{{Requests: 10, Algorithm: FixedWindow, Period: CalendarDay, Location: paris}, {Requests: 20, Window: 24 * time.Hour, Algorithm: FixedWindow, Period: CalendarDay, Location: paris}},
		{{Requests: 10, Algorithm: FixedWindow, Period: CalendarMonth}, {Requests: 10, Algorithm: FixedWindow, Period: CalendarMonth, Location: time.UTC}},
	}
	for _, p := range same {
		if a, b := p[0].Series(), p[1].Series(); a != b {
			t.Errorf("%v and %v: series %#x and %#x, want one", p[0], p[1], a, b)
		}
	}
}

// step is one request of a hand-worked sequence: Take at At with Cost,
// on the state the steps before left.
type step struct {
	name      string
	at        int64
	cost      int64
	wantOK    bool
	want      Decision
	wantState State
}

func runSteps(t *testing.T, l Limit, steps []step) {
	t.Helper()
	var s State
	for _, st := range steps {
		ns, d, ok := take(l, s, st.at, st.cost)
		if ok != st.wantOK || d != st.want || !sameState(ns, st.wantState) {
			t.Errorf("%s: Take = %v %+v %+v\n\twant %v %+v %+v", st.name, ok, d, ns, st.wantOK, st.want, st.wantState)
		}
		s = ns
	}
}

const ms = time.Millisecond

// cloneState returns s with a log of its own: Take may append to a
// state's log in place.
func cloneState(s State) State {
	s.Log = slices.Clone(s.Log)
	return s
}

// sameState compares states, an empty log being the same as none.
func sameState(a, b State) bool {
	if len(a.Log) == 0 {
		a.Log = nil
	}
	if len(b.Log) == 0 {
		b.Log = nil
	}
	return reflect.DeepEqual(a, b)
}

// take runs Take for one charge on a copy of s.
func take(l Limit, s State, now, cost int64) (State, Decision, bool) {
	states, out := []State{cloneState(s)}, make([]Decision, 1)
	ok := Take(states, now, []Charge{{Key: "k", Limit: l, Cost: int(cost)}}, out)
	return states[0], out[0], ok
}

// fitsAt reports whether cost c fits s at t, with no request in between.
func fitsAt(l Limit, s State, t, c int64) bool {
	r, at := l.Roll(cloneState(s), t)
	return Fits(r, at, l, c)
}

// remainingAt is the Remaining of s at t, with no request in between.
func remainingAt(l Limit, s State, t int64) int {
	r, at := l.Roll(cloneState(s), t)
	return Describe(r, at, l, 0, Fits(r, at, l, 0)).Remaining
}

// checkExact checks every promise a Decision makes, for l at now on state
// s (not rolled), for a request of each cost: the state Take leaves, and
// RetryAfter, NextAfter, ResetAfter, Remaining and ExpiryOf to the
// millisecond, assuming the clock does not go backwards (now is at or
// after every instant s was charged at). A delay capped at maxDelay is
// only checked to be too early, not exact.
func checkExact(t *testing.T, l Limit, s State, now int64, costs []int64) {
	t.Helper()
	capacity := int64(l.Capacity())
	r, at := l.Roll(cloneState(s), now)
	if at != now {
		t.Fatalf("%v %+v: decided at %d, not at now %d", l, s, at, now)
	}
	if r2, at2 := l.Roll(cloneState(r), at); !sameState(r2, r) || at2 != at {
		t.Fatalf("%v: rolling %+v again at %d gives %+v at %d", l, r, at, r2, at2)
	}
	rem := Describe(r, at, l, 0, Fits(r, at, l, 0)).Remaining
	if rem < 0 || int64(rem) > capacity {
		t.Fatalf("%v %+v: remaining %d", l, r, rem)
	}
	if rem > 0 && !Fits(r, at, l, int64(rem)) || Fits(r, at, l, int64(rem)+1) {
		t.Fatalf("%v %+v: remaining %d is not the largest cost that fits", l, r, rem)
	}
	for _, c := range costs {
		fits := Fits(r, at, l, c)
		ns, d, ok := take(l, s, now, c)
		where := fmt.Sprintf("%v state %+v at %d cost %d: %+v", l, s, now, c, d)
		if ok != fits || d.Allowed != ok {
			t.Fatalf("%s: Take %v, Fits %v", where, ok, fits)
		}
		want := cloneState(r)
		if ok {
			Add(&want, at, l, c)
		}
		if !sameState(ns, want) {
			t.Fatalf("%s: state %+v, want %+v", where, ns, want)
		}
		if wantD := Describe(want, at, l, c, ok); d != wantD {
			t.Fatalf("%s: Take and Describe disagree: %+v", where, wantD)
		}
		if c > capacity {
			if ok || d.RetryAfter != -1 {
				t.Fatalf("%s: cost above the capacity", where)
			}
		}
		if !ok {
			if c <= capacity {
				wait := d.RetryAfter.Milliseconds()
				if wait <= 0 || d.RetryAfter%time.Millisecond != 0 {
					t.Fatalf("%s: denied with RetryAfter %v", where, d.RetryAfter)
				}
				if wait != maxDelay && !fitsAt(l, ns, at+wait, c) {
					t.Fatalf("%s: does not fit at RetryAfter", where)
				}
				if fitsAt(l, ns, at+wait-1, c) {
					t.Fatalf("%s: fits a ms before RetryAfter", where)
				}
			}
			next := d.NextAfter.Milliseconds()
			switch {
			case Fits(r, at, l, 1):
				if d.NextAfter != 0 {
					t.Fatalf("%s: one unit fits now, NextAfter %v", where, d.NextAfter)
				}
			case next <= 0:
				t.Fatalf("%s: one unit does not fit, NextAfter %v", where, d.NextAfter)
			case next == maxDelay:
				if fitsAt(l, ns, at+next-1, 1) {
					t.Fatalf("%s: one unit fits before NextAfter, capped", where)
				}
			case !fitsAt(l, ns, at+next, 1):
				t.Fatalf("%s: one unit does not fit at NextAfter", where)
			case fitsAt(l, ns, at+next-1, 1):
				t.Fatalf("%s: one unit fits a ms before NextAfter", where)
			}
		} else {
			if d.RetryAfter != 0 {
				t.Fatalf("%s: allowed with a RetryAfter", where)
			}
			next := d.NextAfter.Milliseconds()
			switch {
			case int64(d.Remaining) >= capacity:
				if d.NextAfter != 0 {
					t.Fatalf("%s: whole, NextAfter %v", where, d.NextAfter)
				}
			case next <= 0:
				t.Fatalf("%s: not whole, NextAfter %v", where, d.NextAfter)
			case next == maxDelay:
				if remainingAt(l, ns, at+next-1) > d.Remaining {
					t.Fatalf("%s: remaining grows before NextAfter, capped", where)
				}
			case remainingAt(l, ns, at+next) <= d.Remaining:
				t.Fatalf("%s: remaining does not grow at NextAfter", where)
			case remainingAt(l, ns, at+next-1) > d.Remaining:
				t.Fatalf("%s: remaining grows before NextAfter", where)
			}
		}
		reset := d.ResetAfter.Milliseconds()
		if reset < 0 || d.ResetAfter%time.Millisecond != 0 {
			t.Fatalf("%s: ResetAfter %v", where, d.ResetAfter)
		}
		if got := remainingAt(l, ns, at+reset); int64(got) != capacity && reset != maxDelay {
			t.Fatalf("%s: remaining %d at ResetAfter, want %d", where, got, capacity)
		}
		if reset > 0 && int64(remainingAt(l, ns, at+reset-1)) >= capacity {
			t.Fatalf("%s: whole a ms before ResetAfter", where)
		}
		wantExpiry := d.ResetAfter
		if reset == 0 {
			wantExpiry = -1
		}
		// A sliding window's counter expires at the end of the window
		// after its own (Expiry), a tick after it is whole again; it
		// is checked by TestExpiry.
		if got := ExpiryOf(l, ns, at); got != wantExpiry && l.Algorithm != SlidingWindow {
			t.Fatalf("%s: ExpiryOf %v, want %v", where, got, wantExpiry)
		}
	}
}

// costsFor are the costs checkExact tries on l.
func costsFor(l Limit) []int64 {
	n := int64(l.Capacity())
	cs := []int64{0, 1, 2, 3, n / 3, n / 2, n - 1, n, n + 1, 2 * n}
	slices.Sort(cs)
	return slices.Compact(cs)
}

// randomWalk drives a client with random costs and pauses through steps
// requests on l from start, and calls visit before each with the state and
// the instant of the request. Pauses mix bursts (0 ms), short gaps, and
// gaps around one and two windows (w ms).
func randomWalk(l Limit, rng *rand.Rand, start, w int64, steps int, visit func(s State, now int64)) State {
	var s State
	now := start
	costs := costsFor(l)
	for range steps {
		switch k := rng.IntN(10); {
		case k < 3:
		case k < 6:
			now += rng.Int64N(max(w/10, 2))
		case k < 8:
			now += rng.Int64N(w + 1)
		default:
			now += []int64{w - 1, w, w + 1, 2*w - 1, 2 * w}[rng.IntN(5)]
		}
		if visit != nil {
			visit(s, now)
		}
		c := costs[rng.IntN(len(costs))]
		if rng.IntN(3) == 0 {
			c = 1 // mostly small requests, so that the state fills slowly
		}
		s, _, _ = take(l, s, now, c)
	}
	return s
}

// checkRandomWalks runs checkExact at every step of random clients of each
// limit, from several starting instants.
func checkRandomWalks(t *testing.T, limits []Limit, starts []int64, steps int) {
	for i, l := range limits {
		if err := l.Validate(); err != nil {
			t.Fatal(err)
		}
		w := l.Span().Milliseconds()
		for _, start := range starts {
			t.Run(fmt.Sprintf("%v from %d", l, start), func(t *testing.T) {
				t.Parallel()
				rng := rand.New(rand.NewPCG(uint64(i), uint64(start)))
				randomWalk(l, rng, start, w, steps, func(s State, now int64) {
					checkExact(t, l, s, now, costsFor(l))
				})
			})
		}
	}
}

// admission is Cost units admitted at At.
type admission struct{ At, N int64 }

// greedy simulates a client that, at every millisecond from start to end,
// spends everything the limit admits: in requests of cost 1 until one is
// denied, or in one request of cost Remaining when bulk is set (for
// limits too large to count one by one).
func greedy(l Limit, st *State, start, end int64, bulk bool) []admission {
	var ad []admission
	for now := start; now < end; now++ {
		if bulk {
			if rem := int64(remainingAt(l, *st, now)); rem > 0 {
				var ok bool
				if *st, _, ok = take(l, *st, now, rem); !ok {
					panic(fmt.Sprintf("%v: cost Remaining %d denied", l, rem))
				}
				ad = append(ad, admission{now, rem})
			}
			continue
		}
		for {
			var ok bool
			if *st, _, ok = take(l, *st, now, 1); !ok {
				break
			}
			ad = append(ad, admission{now, 1})
		}
	}
	return ad
}

// steady simulates a client that sends a request of cost c every gap ms
// from start to end.
func steady(l Limit, st *State, start, end, gap, c int64) []admission {
	var ad []admission
	for now := start; now < end; now += gap {
		var ok bool
		if *st, _, ok = take(l, *st, now, c); ok {
			ad = append(ad, admission{now, c})
		}
	}
	return ad
}

// random simulates a client with random costs and pauses.
func random(l Limit, st *State, rng *rand.Rand, start, end, w int64) []admission {
	var ad []admission
	costs := costsFor(l)
	for now := start; now < end; now += rng.Int64N(max(w/5, 2)) {
		c := costs[rng.IntN(len(costs))]
		var ok bool
		if *st, _, ok = take(l, *st, now, c); ok && c > 0 {
			ad = append(ad, admission{now, c})
		}
	}
	return ad
}

// mostIn returns the most units admitted in any half-open interval of
// length w.
func mostIn(ad []admission, w int64) int64 {
	best, sum, j := int64(0), int64(0), 0
	for i := range ad {
		sum += ad[i].N
		for ad[i].At-ad[j].At >= w {
			sum -= ad[j].N
			j++
		}
		best = max(best, sum)
	}
	return best
}

// countIn returns the units admitted in [from, to).
func countIn(ad []admission, from, to int64) int64 {
	n := int64(0)
	for _, a := range ad {
		if a.At >= from && a.At < to {
			n += a.N
		}
	}
	return n
}

// clients runs steady, greedy and random clients on l from start to end,
// each on a fresh counter, and returns what each was admitted.
func clients(l Limit, start, end int64, bulk bool) map[string][]admission {
	w := l.Span().Milliseconds()
	out := map[string][]admission{}
	var s State
	out["greedy"] = greedy(l, &s, start, end, bulk)
	if !bulk {
		gaps := []int64{1, 3, max(w/int64(l.Requests), 1), max(w/7, 1)}
		slices.Sort(gaps)
		for _, gap := range slices.Compact(gaps) {
			s = State{}
			out[fmt.Sprintf("steady every %d ms", gap)] = steady(l, &s, start, end, gap, 1)
		}
		s = State{}
		out["steady cost 2"] = steady(l, &s, start, end, max(w/13, 1), 2)
	}
	s = State{}
	out["random"] = random(l, &s, rand.New(rand.NewPCG(uint64(start), uint64(end))), start, end, w)
	return out
}

// TestTakeMixedAlgorithms: one request charged to limits of every
// algorithm is admitted only when all of them admit it, and a denied
// request charges none of them.
func TestTakeMixedAlgorithms(t *testing.T) {
	t.Parallel()
	token := Limit{Requests: 4, Window: time.Second, Algorithm: TokenBucket}
	fixed := Limit{Requests: 3, Window: time.Minute, Algorithm: FixedWindow}
	log := Limit{Requests: 5, Window: 10 * time.Second, Algorithm: SlidingLog}
	sliding := Limit{Requests: 10, Window: time.Second}
	charges := []Charge{
		{Key: "k", Name: "token", Limit: token, Cost: 1},
		{Key: "k", Name: "fixed", Limit: fixed, Cost: 1},
		{Key: "k", Name: "log", Limit: log, Cost: 1},
		{Key: "k", Name: "sliding", Limit: sliding, Cost: 1},
	}
	const t0 = 1_699_999_980_000 // a minute boundary: 28,333,333 * 60,000
	states, out := make([]State, len(charges)), make([]Decision, len(charges))
	request := func(now int64, cs []Charge) bool {
		t.Helper()
		rolled := make([]State, len(states))
		ats := make([]int64, len(states))
		for i := range states {
			rolled[i], ats[i] = cs[i].Limit.Roll(cloneState(states[i]), now)
		}
		ok := Take(states, now, cs, out)
		for i := range states {
			want := cloneState(rolled[i])
			if ok {
				Add(&want, ats[i], cs[i].Limit, int64(cs[i].Cost))
			}
			if !sameState(states[i], want) {
				t.Fatalf("at %d (admitted %v): %s state %+v, want %+v", now, ok, cs[i].Name, states[i], want)
			}
			fits := Fits(rolled[i], ats[i], cs[i].Limit, int64(cs[i].Cost))
			if d := Describe(want, ats[i], cs[i].Limit, int64(cs[i].Cost), fits); out[i] != d {
				t.Fatalf("at %d: %s decision %+v, want %+v", now, cs[i].Name, out[i], d)
			}
		}
		return ok
	}
	// One request every 100 ms: the token bucket would admit 4 and then one
	// every 250 ms, but the fixed window stops the request at 3.
	admitted := 0
	for i := int64(0); i < 20; i++ {
		if request(t0+i*100, charges) {
			admitted++
		}
	}
	if admitted != 3 {
		t.Fatalf("admitted %d, want 3", admitted)
	}
	if states[1].Curr != 3 || states[2].Curr != 3 || states[3].Curr+states[3].Prev != 3 {
		t.Fatalf("states %+v: want 3 counted by each", states)
	}
	// At t0+1900 the token bucket is full again (3 tokens spent at t0,
	// t0+100, t0+200 refill by t0+950): only the fixed window denies.
	if !out[0].Allowed || out[1].Allowed || !out[2].Allowed || !out[3].Allowed {
		t.Fatalf("last decisions %+v: want only the fixed window denying", out)
	}
	if out[1].RetryAfter != 58100*time.Millisecond {
		t.Errorf("fixed window RetryAfter %v, want 58.1s", out[1].RetryAfter)
	}
	// The next minute the fixed window admits again; the token bucket
	// denies a cost of 5, above its burst of 4, with RetryAfter -1ns, and
	// nobody is charged.
	next := t0 + minute
	big := slices.Clone(charges)
	big[0].Cost = 5
	if request(next, big) {
		t.Fatal("cost above a token bucket's burst admitted")
	}
	if out[0].Allowed || out[0].RetryAfter != -1 || !out[1].Allowed || out[1].Remaining != 3 {
		t.Fatalf("decisions %+v", out)
	}
	// Cost 2 everywhere: every counter is empty or whole again (the log's
	// entries left at t0+10.2s at the latest), and admits it.
	two := slices.Clone(charges)
	for i := range two {
		two[i].Cost = 2
	}
	if !request(next, two) {
		t.Fatalf("cost 2 denied: %+v", out)
	}
	// Cost 2 again: the fixed window has 1 left and denies; the token
	// bucket (2 left) would admit. None is charged.
	if request(next+1, two) {
		t.Fatal("cost 2 admitted over the fixed window")
	}
	if !out[0].Allowed || out[1].Allowed || out[1].Remaining != 1 || out[0].Remaining != 2 {
		t.Fatalf("decisions %+v", out)
	}
	// A read (cost 0) is admitted by all and charges nothing.
	zero := slices.Clone(charges)
	for i := range zero {
		zero[i].Cost = 0
	}
	if !request(next+2, zero) {
		t.Fatalf("read denied: %+v", out)
	}
	// More than eight charges take the other path through Take.
	many := append(slices.Clone(charges), charges...)
	many = append(many, charges[:2]...)
	mstates, mout := make([]State, len(many)), make([]Decision, len(many))
	for i := range 4 {
		if ok := Take(mstates, next+int64(i), many, mout); ok != (i < 3) {
			t.Fatalf("request %d of 10 charges: admitted %v", i, ok)
		}
	}
	if mstates[1].Curr != 3 || mstates[5].Curr != 3 || mstates[9].Curr != 3 {
		t.Fatalf("states %+v", mstates)
	}
}

// TestClockBackwards: a request whose clock is behind the instant a
// counter was last charged at, by any amount, is decided at least as
// strictly as at that instant: it gets what is left there and no more,
// and what it is charged stays counted when the clock comes back.
func TestClockBackwards(t *testing.T) {
	t.Parallel()
	paris := mustLoad(t, "Europe/Paris")
	limits := []Limit{
		{Requests: 10, Window: time.Second},
		{Requests: 3, Window: time.Minute, Algorithm: FixedWindow},
		{Requests: 1, Window: 10 * time.Millisecond, Algorithm: FixedWindow},
		{Requests: 3, Algorithm: FixedWindow, Period: CalendarDay, Location: paris},
		{Requests: 3, Algorithm: FixedWindow, Period: CalendarMonth, Location: paris},
		bucket(4, time.Second, 4), bucket(4, time.Second, 10), bucket(3, 7*time.Millisecond, 1), hugeBucket, hugeBurst, teraBucket,
		slidingLog(3, 10*time.Second), slidingLog(100, time.Second), slidingLog(1, 10*time.Millisecond),
	}
	// Instants of the last charge: the middle of a window, tick and day,
	// and the first ms of a Paris day.
	instants := []int64{1_700_000_000_731, time.Date(2024, 3, 31, 0, 0, 0, 0, paris).UnixMilli()}
	for _, l := range limits {
		for _, t0 := range instants {
			t.Run(fmt.Sprintf("%v at %d", l, t0), func(t *testing.T) {
				t.Parallel()
				capacity := int64(l.Capacity())
				w := min(l.Span().Milliseconds(), t0/10)
				for _, back := range []int64{1, 2, 7, w / 2, w - 1, w, w + 1, 3 * w, 10 * w, t0} {
					left := min(capacity-1, 1) // 0 when the capacity is 1
					s, _, ok := take(l, State{}, t0, capacity-left)
					if !ok {
						t.Fatalf("%d on a new counter denied", capacity-left)
					}
					// Behind by back: exactly what was left.
					admitted := int64(0)
					for {
						var d Decision
						if s, d, ok = take(l, s, t0-back, 1); !ok {
							if d.Remaining != 0 {
								t.Errorf("%d ms behind: denied with remaining %d", back, d.Remaining)
							}
							break
						}
						if admitted++; admitted > left {
							t.Fatalf("%d ms behind: %d admitted, %d was left", back, admitted, left)
						}
					}
					if admitted != left {
						t.Errorf("%d ms behind: %d admitted, %d was left", back, admitted, left)
					}
					// Back at t0: what was charged behind still counts.
					if got := remainingAt(l, s, t0); got != 0 {
						t.Errorf("%d ms behind, then at t0: remaining %d, want 0", back, got)
					}
					if _, _, ok := take(l, s, t0, 1); ok {
						t.Errorf("%d ms behind, then at t0: admitted over the limit", back)
					}
				}
			})
		}
	}
}
