package window

import (
	"fmt"
	"reflect"
	"testing"
	"time"
)

const (
	sec    = int64(1000)
	minute = 60 * sec
	day    = 24 * time.Hour
)

func TestLimitValidate(t *testing.T) {
	t.Parallel()
	tests := []struct {
		l    Limit
		want string
	}{
		{Limit{Requests: 100, Window: time.Minute}, ""},
		{Limit{Requests: 1_000_000, Window: 30 * day}, ""},
		{Limit{Requests: 1e12, Window: 366 * day}, ""},
		{Limit{Requests: MaxRequests, Window: time.Millisecond}, ""},
		{Limit{Requests: MaxRequests, Window: MaxWindow}, ""},
		{Limit{Requests: 0, Window: time.Minute}, "limit 0/1m0s: requests must be > 0"},
		{Limit{Requests: -1, Window: time.Minute}, "limit -1/1m0s: requests must be > 0"},
		{Limit{Requests: MaxRequests + 1, Window: time.Minute}, "limit 1125899906842625/1m0s: requests 1125899906842625 must be at most 2^50 (1125899906842624)"},
		{Limit{Requests: 1, Window: 0}, "limit 1/0s: window must be > 0"},
		{Limit{Requests: 1, Window: 1500 * time.Microsecond}, "limit 1/1.5ms: window must be a whole number of milliseconds"},
		{Limit{Requests: 1, Window: MaxWindow + time.Millisecond}, "limit 1/87840h0m0.001s: window 87840h0m0.001s must be at most 3660d"},
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

// exactTicks reports whether r is a valid tick for l: it divides the
// window and keeps 3*(limit+1)*ticks within 2^53.
func exactTicks(l Limit, r int64) bool {
	w := l.Window.Milliseconds()
	if w%r != 0 {
		return false
	}
	n, ticks := int64(l.Requests)+1, w/r
	return ticks <= exact/(3*n)
}

func TestTick(t *testing.T) {
	t.Parallel()
	tests := []struct {
		l    Limit
		want int64
	}{
		{Limit{Requests: 100, Window: time.Minute}, 1},
		{Limit{Requests: 1_000_000, Window: 30 * day}, 1},
		{Limit{Requests: 1e9, Window: time.Hour}, 2},
		{Limit{Requests: 1e12, Window: time.Millisecond}, 1},
		{Limit{Requests: 1e12, Window: time.Hour}, 1200},
		{Limit{Requests: MaxRequests, Window: 1000 * time.Millisecond}, 500},
		// 366 days = 2^11 * 3^4 * 5^5 * 61 ms; the bound asks for at
		// least 10,533,802 ms per tick.
		{Limit{Requests: 1e12, Window: 366 * day}, 10_540_800},
		// A prime number of ms has only itself: one tick per window.
		{Limit{Requests: 1e12, Window: 1_000_003 * time.Millisecond}, 1_000_003},
	}
	for _, tt := range tests {
		got := tt.l.Tick()
		if got != tt.want {
			t.Errorf("%v.Tick() = %d, want %d", tt.l, got, tt.want)
		}
		if !exactTicks(tt.l, got) {
			t.Errorf("%v.Tick() = %d breaks the bound", tt.l, got)
		}
	}
}

// TestTickIsSmallest checks Tick against a brute-force search.
func TestTickIsSmallest(t *testing.T) {
	t.Parallel()
	for _, l := range []Limit{
		{Requests: MaxRequests, Window: 997 * time.Millisecond},
		{Requests: MaxRequests / 3, Window: 3600 * time.Millisecond},
		{Requests: 1 << 40, Window: 12345 * time.Millisecond},
		{Requests: 1 << 42, Window: 65536 * time.Millisecond},
		{Requests: 1 << 45, Window: 99991 * time.Millisecond},
	} {
		got := l.Tick()
		want := int64(0)
		for r := int64(1); ; r++ {
			if exactTicks(l, r) {
				want = r
				break
			}
		}
		if got != want {
			t.Errorf("%v.Tick() = %d, want %d", l, got, want)
		}
	}
}

func TestRoll(t *testing.T) {
	t.Parallel()
	const w = minute
	tests := []struct {
		name   string
		s      State
		now    int64
		want   State
		wantAt int64
	}{
		{"same window", State{Start: 7, Prev: 3, Curr: 4}, 7 + 5*sec, State{Start: 7, Prev: 3, Curr: 4}, 7 + 5*sec},
		{"last ms of the window", State{Start: 7, Curr: 4}, 7 + w - 1, State{Start: 7, Curr: 4}, 7 + w - 1},
		{"next window", State{Start: 7, Prev: 3, Curr: 4}, 7 + w, State{Start: 7 + w, Prev: 4}, 7 + w},
		{"next window, later", State{Start: 7, Prev: 3, Curr: 4}, 7 + w + 59*sec, State{Start: 7 + w, Prev: 4}, 7 + w + 59*sec},
		{"next window, empty again: afresh", State{Start: 7, Prev: 3}, 7 + w + 10, State{Start: 7 + w + 10}, 7 + w + 10},
		{"two windows later: afresh", State{Start: 7, Prev: 3, Curr: 4}, 7 + 2*w + 5, State{Start: 7 + 2*w + 5}, 7 + 2*w + 5},
		{"new counter: anchored at now", State{}, 5*minute + 7, State{Start: 5*minute + 7}, 5*minute + 7},
		{"clock backwards", State{Start: 2 * minute, Curr: 4}, minute + 30*sec, State{Start: 2 * minute, Curr: 4}, 2 * minute},
	}
	for _, tt := range tests {
		got, at := Roll(tt.s, tt.now, w)
		if !reflect.DeepEqual(got, tt.want) || at != tt.wantAt {
			t.Errorf("%s: Roll(%+v, %d) = %+v, %d; want %+v, %d", tt.name, tt.s, tt.now, got, at, tt.want, tt.wantAt)
		}
	}
}

// TestWorkedExample is the example of the design: 100/minute, 80 requests in
// the previous window, 40 in the current, 30 s in: the estimate is
// 80*29999/60000 + 40, just under 80.
func TestWorkedExample(t *testing.T) {
	t.Parallel()
	l := Limit{Requests: 100, Window: time.Minute}
	now := 10*minute + 30*sec
	states := []State{{Start: 10 * minute, Prev: 80, Curr: 40}}
	out := make([]Decision, 1)
	charge := []Charge{{Key: "k", Limit: l, Cost: 1}}
	if !Take(states, now, charge, out) {
		t.Fatal("request at estimate 80 denied")
	}
	// free = 6,000,000 - 80*29999 - 41*60000 = 1,140,080: 19 left, and the
	// 20th comes when free reaches 1,200,000, 59,920/80 = 749 ticks later.
	want := Decision{Allowed: true, Remaining: 19, ResetAfter: 89999 * time.Millisecond, NextAfter: 749 * time.Millisecond}
	if out[0] != want {
		t.Errorf("decision = %+v, want %+v", out[0], want)
	}
	if states[0].Curr != 41 {
		t.Errorf("curr = %d, want 41", states[0].Curr)
	}
	for i := 0; i < 19; i++ {
		if !Take(states, now, charge, out) {
			t.Fatalf("request %d denied at remaining %d", i, out[0].Remaining)
		}
	}
	if out[0].Remaining != 0 || states[0].Curr != 60 {
		t.Fatalf("after filling: remaining %d curr %d, want 0 and 60", out[0].Remaining, states[0].Curr)
	}
	if Take(states, now, charge, out) {
		t.Fatal("request over the limit admitted")
	}
	// Denied: not charged; retry when 80*(29999-d)/60000 + 61 <= 100, i.e.
	// d >= 29999 - 29250 = 749 ticks.
	want = Decision{Remaining: 0, ResetAfter: 89999 * time.Millisecond, RetryAfter: 749 * time.Millisecond, NextAfter: 749 * time.Millisecond}
	if out[0] != want || states[0].Curr != 60 {
		t.Errorf("denied decision = %+v curr %d, want %+v curr 60", out[0], states[0].Curr, want)
	}
	if Take(states, now+748, charge, out) {
		t.Error("request a ms before RetryAfter admitted")
	}
	if !Take(states, now+749, charge, out) {
		t.Error("request at now+RetryAfter denied")
	}
}

func TestTakeTable(t *testing.T) {
	t.Parallel()
	l := Limit{Requests: 10, Window: time.Second}
	const s0 = 5*sec + 250
	tests := []struct {
		name      string
		s         State
		now       int64
		cost      int
		wantOK    bool
		want      Decision
		wantState State
	}{
		{"new counter", State{}, s0, 1, true,
			// The 10th unit comes back when the request stops weighing,
			// in the last tick of the next window.
			Decision{Allowed: true, Remaining: 9, ResetAfter: 1999 * time.Millisecond, NextAfter: 1999 * time.Millisecond},
			State{Start: s0, Curr: 1}},
		{"cost 10 fills", State{}, s0, 10, true,
			// NextAfter: the next window, y in: 10*(999-y) <= 9000 -> y = 99.
			Decision{Allowed: true, Remaining: 0, ResetAfter: 1999 * time.Millisecond, NextAfter: 1099 * time.Millisecond},
			State{Start: s0, Curr: 10}},
		{"cost 11 never fits", State{}, s0, 11, false,
			Decision{Remaining: 10, RetryAfter: -1},
			State{Start: s0}},
		{"full, wait for next window", State{Start: s0, Curr: 10}, s0 + 400, 1, false,
			// next window y in: 10*(999-y) + 1000 <= 10000 -> y >= 99
			Decision{Remaining: 0, ResetAfter: 1599 * time.Millisecond, RetryAfter: 699 * time.Millisecond, NextAfter: 699 * time.Millisecond},
			State{Start: s0, Curr: 10}},
		{"full, cost 5", State{Start: s0, Curr: 10}, s0 + 400, 5, false,
			// 10*(999-y) + 5000 <= 10000 -> y >= 499
			Decision{Remaining: 0, ResetAfter: 1599 * time.Millisecond, RetryAfter: 1099 * time.Millisecond, NextAfter: 699 * time.Millisecond},
			State{Start: s0, Curr: 10}},
		{"previous decays", State{Start: s0 - sec, Curr: 10}, s0 + 500, 1, true,
			// 10*499/1000 + 1 = 5.99 -> 4 left; the 5th when
			// 10*(499-d) <= 4000: d = 99.
			Decision{Allowed: true, Remaining: 4, ResetAfter: 1499 * time.Millisecond, NextAfter: 99 * time.Millisecond},
			State{Start: s0, Prev: 10, Curr: 1}},
		{"only previous, denied", State{Start: s0, Prev: 10, Curr: 5}, s0 + 200, 1, false,
			// 10*(799-d) + 6000 <= 10000 -> d = 399
			// The estimate, 12.99, is 3 units (rounded up) past the limit.
			Decision{Remaining: 0, ResetAfter: 1799 * time.Millisecond, RetryAfter: 399 * time.Millisecond, NextAfter: 399 * time.Millisecond, Debt: 3},
			State{Start: s0, Prev: 10, Curr: 5}},
		{"denied cost 5 but one unit fits", State{Start: s0, Prev: 10, Curr: 2}, s0 + 500, 5, false,
			// 10*499 + 7000 > 10000; 10*499 + 3000 <= 10000, 3 left;
			// 10*(499-d) <= 3000 -> d = 199
			Decision{Remaining: 3, ResetAfter: 1499 * time.Millisecond, RetryAfter: 199 * time.Millisecond},
			State{Start: s0, Prev: 10, Curr: 2}},
		{"read of a previous-only counter", State{Start: s0 - sec, Curr: 3}, s0 + 100, 0, true,
			// free 10000 - 3*899 = 7303; 8000 after ceil(697/3) = 233
			Decision{Allowed: true, Remaining: 7, ResetAfter: 899 * time.Millisecond, NextAfter: 233 * time.Millisecond},
			State{Start: s0, Prev: 3}},
		{"read of a new counter", State{}, s0, 0, true,
			Decision{Allowed: true, Remaining: 10},
			State{Start: s0}},
		{"count above the limit (plan changed)", State{Start: s0, Prev: 1e9, Curr: 1e9}, s0 + 10, 1, false,
			// Counts weigh in full: next window y in:
			// 1e9*(999-y) + 1000 <= 10000 -> y = 999, its last tick.
			Decision{Remaining: 0, ResetAfter: 1989 * time.Millisecond, RetryAfter: 1989 * time.Millisecond, NextAfter: 1989 * time.Millisecond, Debt: 1988999990},
			State{Start: s0, Prev: 1e9, Curr: 1e9}},
		{"a debt in the previous window", State{Start: s0 - sec, Curr: 30}, s0 + 500, 1, false,
			// 30*499/1000 = 14.97: 5 past the limit; one unit fits once
			// 30*(499-d) <= 9000: d = 199.
			Decision{Remaining: 0, ResetAfter: 499 * time.Millisecond, RetryAfter: 199 * time.Millisecond, NextAfter: 199 * time.Millisecond, Debt: 5},
			State{Start: s0, Prev: 30}},
		{"a debt in the previous window, at its last tick", State{Start: s0 - sec, Curr: 1e9}, s0 + 999, 10, true,
			// The previous count weighs 0 in the window's last tick,
			// whatever its size: the whole limit is there. NextAfter: the
			// next window, y in: 10*(999-y) <= 9000 -> y = 99, 1 + 99 ms.
			Decision{Allowed: true, Remaining: 0, ResetAfter: 1000 * time.Millisecond, NextAfter: 100 * time.Millisecond},
			State{Start: s0, Prev: 1e9, Curr: 10}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			states := []State{tt.s}
			out := make([]Decision, 1)
			ok := Take(states, tt.now, []Charge{{Key: "k", Limit: l, Cost: tt.cost}}, out)
			if ok != tt.wantOK || out[0] != tt.want || !reflect.DeepEqual(states[0], tt.wantState) {
				t.Errorf("Take = %v %+v %+v; want %v %+v %+v", ok, out[0], states[0], tt.wantOK, tt.want, tt.wantState)
			}
		})
	}
}

func TestTakeAllOrNothing(t *testing.T) {
	t.Parallel()
	perSec, perMin := Limit{Requests: 10, Window: time.Second}, Limit{Requests: 15, Window: time.Minute}
	charges := []Charge{{Key: "k", Limit: perSec, Cost: 1}, {Key: "k", Limit: perMin, Cost: 1}}
	states := make([]State, 2)
	out := make([]Decision, 2)
	admitted := 0
	// 10 per second, evenly spaced from the first request, for 3 seconds:
	// the first second admits 10, the second 5 before the minute limit
	// stops it at 15.
	for s := int64(0); s < 3; s++ {
		for i := int64(0); i < 10; i++ {
			if Take(states, s*sec+i*100, charges, out) {
				admitted++
			}
		}
	}
	if admitted != 15 {
		t.Fatalf("admitted %d, want 15", admitted)
	}
	// The per-second counter saw only admitted requests: 5 in second 1,
	// none in second 2.
	if states[0].Start != 2*sec || states[0].Curr != 0 || states[0].Prev != 5 {
		t.Errorf("per-second state %+v: denied requests were charged", states[0])
	}
	if !out[0].Allowed || out[1].Allowed {
		t.Errorf("last decisions %+v: want per-second allowing, per-minute denying", out)
	}
}

// limitsUnderTest span small and large limits, and ticks of 1 ms and more.
var limitsUnderTest = []Limit{
	{Requests: 1, Window: 10 * time.Millisecond},
	{Requests: 7, Window: 300 * time.Millisecond},
	{Requests: 10, Window: time.Second},
	{Requests: 100, Window: time.Second},
	{Requests: 2000, Window: time.Second}, // more than one request per tick
	{Requests: 5, Window: 2 * time.Second},
	{Requests: MaxRequests / 4, Window: 3600 * time.Millisecond}, // ticks of 360 ms
}

// TestRetryAfterIsExact checks, for many states, that a request fits at
// at+RetryAfter and not a millisecond earlier, and that NextAfter is
// RetryAfter of a one-unit request.
func TestRetryAfterIsExact(t *testing.T) {
	t.Parallel()
	for _, l := range limitsUnderTest {
		w, n := l.Window.Milliseconds(), int64(l.Requests)
		counts := []int64{0, 1, n / 3, n/2 + 1, n - 1, n, n + 1, n + 5}
		costs := []int64{1, 2, n / 2, n}
		for _, prev := range counts {
			for _, curr := range counts {
				for e := int64(0); e < w; e += max(1, w/37) {
					for _, cost := range costs {
						s := State{Start: 1000, Prev: prev, Curr: curr}
						if cost < 1 || cost > n {
							if cost > n && Describe(s, s.Start+e, l, cost, false).RetryAfter != -1 {
								t.Fatalf("%v: cost %d over the limit has a RetryAfter", l, cost)
							}
							continue
						}
						if s.Prev == 0 && s.Curr == 0 {
							continue // Roll anchors it afresh
						}
						at := s.Start + e
						fitsAt := func(t int64) bool {
							r, now := Roll(s, t, w)
							return Fits(r, now, l, cost)
						}
						if fitsAt(at) {
							continue
						}
						d := Describe(s, at, l, cost, false)
						wait := d.RetryAfter.Milliseconds()
						if !fitsAt(at + wait) {
							t.Fatalf("%v %+v e=%d cost=%d: not admitted at RetryAfter %d", l, s, e, cost, wait)
						}
						if wait > 0 && fitsAt(at+wait-1) {
							t.Fatalf("%v %+v e=%d cost=%d: admitted before RetryAfter %d", l, s, e, cost, wait)
						}
						one := Describe(s, at, l, 1, false).RetryAfter
						if fitsAt1 := Fits(s, at, l, 1); fitsAt1 && d.NextAfter != 0 || !fitsAt1 && d.NextAfter != one {
							t.Fatalf("%v %+v e=%d cost=%d: NextAfter %v, want RetryAfter of one unit %v", l, s, e, cost, d.NextAfter, one)
						}
					}
				}
			}
		}
	}
}

// TestNextAfterIsExact checks, for many allowed states, that Remaining
// grows at at+NextAfter and not a millisecond earlier.
func TestNextAfterIsExact(t *testing.T) {
	t.Parallel()
	for _, l := range limitsUnderTest {
		w, n := l.Window.Milliseconds(), int64(l.Requests)
		counts := []int64{0, 1, n / 3, n - 1, n}
		for _, prev := range counts {
			for _, curr := range counts {
				if prev == 0 && curr == 0 {
					continue
				}
				for e := int64(0); e < w; e += max(1, w/41) {
					s := State{Start: 5000, Prev: prev, Curr: curr}
					at := s.Start + e
					remAt := func(t int64) int {
						r, now := Roll(s, t, w)
						return Describe(r, now, l, 0, true).Remaining
					}
					d := Describe(s, at, l, 0, true)
					if d.Remaining >= l.Requests {
						if d.NextAfter != 0 {
							t.Fatalf("%v %+v e=%d: whole limit, NextAfter %v", l, s, e, d.NextAfter)
						}
						continue
					}
					next := d.NextAfter.Milliseconds()
					if next <= 0 {
						t.Fatalf("%v %+v e=%d: NextAfter %v with %d remaining", l, s, e, d.NextAfter, d.Remaining)
					}
					if got := remAt(at + next); got <= d.Remaining {
						t.Fatalf("%v %+v e=%d: remaining %d at NextAfter %d, was %d", l, s, e, got, next, d.Remaining)
					}
					if got := remAt(at + next - 1); got > d.Remaining {
						t.Fatalf("%v %+v e=%d: remaining grew to %d before NextAfter %d", l, s, e, got, next)
					}
				}
			}
		}
	}
}

func TestExpiry(t *testing.T) {
	t.Parallel()
	if got := Expiry(minute, minute+10*sec, minute); got != 110*time.Second {
		t.Errorf("Expiry = %v, want 1m50s", got)
	}
	if got := Expiry(minute, 3*minute, minute); got > 0 {
		t.Errorf("Expiry at the end = %v, want <= 0", got)
	}
}

func TestHugeCostNeverFits(t *testing.T) {
	t.Parallel()
	l := Limit{Requests: 10, Window: time.Minute}
	for _, c := range []int64{11, 1 << 50, 1<<63 - 1} {
		if Fits(State{Start: 0}, 0, l, c) {
			t.Errorf("cost %d fits a limit of 10", c)
		}
	}
}

// hammer simulates a client that keeps pushing: at every millisecond from
// start to end it sends requests of cost 1 until one is denied. It returns
// the instants of the admitted requests.
func hammer(l Limit, st *State, start, end int64) []int64 {
	var admitted []int64
	states, out := []State{*st}, make([]Decision, 1)
	charge := []Charge{{Key: "k", Limit: l, Cost: 1}}
	for now := start; now < end; now++ {
		for Take(states, now, charge, out) {
			admitted = append(admitted, now)
		}
	}
	*st = states[0]
	return admitted
}

// maxInWindow returns the most instants in any half-open interval of
// length w.
func maxInWindow(ts []int64, w int64) int {
	best, j := 0, 0
	for i := range ts {
		for ts[i]-ts[j] >= w {
			j++
		}
		best = max(best, i-j+1)
	}
	return best
}

// TestSteadyHammerGetsTheWholeLimit: a client that keeps pushing gets
// exactly the limit in every window, the first included, and never more
// than limit + 1 in any interval of one window, whenever it starts.
func TestSteadyHammerGetsTheWholeLimit(t *testing.T) {
	t.Parallel()
	for _, l := range []Limit{
		{Requests: 5, Window: 2 * time.Second}, {Requests: 10, Window: time.Second}, {Requests: 100, Window: time.Second}, {Requests: 7, Window: 300 * time.Millisecond},
		{Requests: 3000, Window: time.Second}, {Requests: 1, Window: 50 * time.Millisecond},
	} {
		for _, start := range []int64{0, 1, 137, 999_999_999_999} {
			t.Run(fmt.Sprintf("%v from %d", l, start), func(t *testing.T) {
				w := l.Window.Milliseconds()
				var st State
				ts := hammer(l, &st, start, start+12*w)
				// Windows are anchored at the first request.
				for k := int64(0); k < 12; k++ {
					n := 0
					for _, x := range ts {
						if x >= start+k*w && x < start+(k+1)*w {
							n++
						}
					}
					if n != l.Requests {
						t.Errorf("window %d admitted %d, want %d", k, n, l.Requests)
					}
				}
				if got := maxInWindow(ts, w); got > l.Requests+1 {
					t.Errorf("%d admitted in one window's interval, want at most %d", got, l.Requests+1)
				}
			})
		}
	}
}

// TestNoColdStartBurst: a client that bursts on a cold counter, then
// hammers, never gets more than limit + 1 in any interval of one window,
// and a counter left alone starts afresh.
func TestNoColdStartBurst(t *testing.T) {
	t.Parallel()
	l := Limit{Requests: 100, Window: time.Second}
	w := l.Window.Milliseconds()
	var st State
	// Any phase of an epoch-aligned window: the anchor follows the client.
	start := int64(1_700_000_000_731)
	ts := hammer(l, &st, start, start+5*w)
	if got := maxInWindow(ts, w); got > l.Requests+1 {
		t.Fatalf("%d in one window after a cold start, want at most %d", got, l.Requests+1)
	}
	// Quiet for two windows, then again.
	later := start + 7*w + 333
	ts2 := hammer(l, &st, later, later+3*w)
	if ts2[0] != later || st.Start < later {
		t.Fatalf("counter did not start afresh: first admission %d, start %d", ts2[0], st.Start)
	}
	if got := maxInWindow(append(ts, ts2...), w); got > l.Requests+1 {
		t.Fatalf("%d in one window after a restart, want at most %d", got, l.Requests+1)
	}
}

// TestExtremes decides at the largest limits and windows: a counter filled
// in one request, then exact waits.
func TestExtremes(t *testing.T) {
	t.Parallel()
	for _, l := range []Limit{
		{Requests: 1e12, Window: 366 * day}, {Requests: 1e12, Window: time.Millisecond}, {Requests: 1e12, Window: time.Hour}, {Requests: 1_000_000, Window: 30 * day},
		{Requests: 1e9, Window: time.Hour}, {Requests: MaxRequests, Window: MaxWindow}, {Requests: 1, Window: MaxWindow}, {Requests: MaxRequests, Window: time.Millisecond}, {Requests: 1, Window: time.Millisecond},
	} {
		t.Run(l.String(), func(t *testing.T) {
			t.Parallel()
			w, n := l.Window.Milliseconds(), int64(l.Requests)
			now := int64(1_800_000_000_000)
			states, out := []State{{}}, make([]Decision, 1)
			take := func(at int64, cost int64) bool {
				return Take(states, at, []Charge{{Key: "k", Limit: l, Cost: int(cost)}}, out)
			}
			if !take(now, n-1) || out[0].Remaining != 1 {
				t.Fatalf("limit-1 on a new counter: %+v", out[0])
			}
			if !take(now, 1) || out[0].Remaining != 0 {
				t.Fatalf("last unit: %+v", out[0])
			}
			if take(now, 1) {
				t.Fatal("admitted over the limit")
			}
			retry := out[0].RetryAfter.Milliseconds()
			if retry <= 0 || retry > 2*w {
				t.Fatalf("RetryAfter %d ms for a window of %d ms", retry, w)
			}
			if retry > 1 && take(now+retry-1, 1) {
				t.Fatalf("admitted before RetryAfter %d", retry)
			}
			if !take(now+retry, 1) {
				t.Fatalf("denied at RetryAfter %d: %+v", retry, out[0])
			}
			if c := states[0].Prev + states[0].Curr; c < n || c > n+1 {
				t.Fatalf("counts %+v after limit+1 admissions", states[0])
			}
			// Two windows on, the counter starts afresh with the whole
			// limit.
			if !take(now+retry+2*w, n) {
				t.Fatalf("whole limit not available two windows on: %+v", out[0])
			}
		})
	}
}

// TestTakeOneIsTake checks TakeOne and DescribeTo against Take on one
// charge: the same state afterwards, the same verdict and Decision, for
// every algorithm, over random requests, costs, gaps and clocks that go
// backwards.
func TestTakeOneIsTake(t *testing.T) {
	t.Parallel()
	limits := []Limit{
		{Requests: 5, Window: time.Second},
		{Requests: 100, Window: time.Minute},
		{Requests: 1 << 40 / 1000, Window: time.Second},
		{Requests: 1e9, Window: time.Hour}, // ticks of 2 ms
		{Requests: 3, Window: 1500 * time.Millisecond, Algorithm: FixedWindow},
		{Requests: 4, Window: time.Second, Algorithm: TokenBucket, Burst: 8},
		{Requests: 2, Window: time.Second, Algorithm: LeakyBucket, Burst: 3},
		{Requests: 6, Window: time.Second, Algorithm: SlidingLog},
	}
	var seed uint64 = 7
	next := func(n int64) int64 {
		seed = seed*6364136223846793005 + 1442695040888963407
		return int64((seed >> 33) % uint64(n))
	}
	for _, l := range limits {
		var a, b State
		now := int64(1_700_000_000_000)
		for i := range 5000 {
			switch next(10) {
			case 0:
				now -= next(300) // a clock that went backwards
			case 1:
				now += next(3 * l.Window.Milliseconds())
			default:
				now += next(l.Window.Milliseconds()/4 + 1)
			}
			c := next(3)
			if next(50) == 0 {
				c = int64(l.Requests) + 1
			}
			states := []State{a}
			states[0].Log = append([]Entry(nil), a.Log...)
			charges := []Charge{{Key: "k", Name: "n", Limit: l, Cost: int(c)}}
			out := make([]Decision, 1)
			want := Take(states, now, charges, out)
			at, got := TakeOne(&b, now, &l, c)
			var d Decision
			DescribeTo(&d, &b, at, &l, c, got)
			if got != want || d != out[0] {
				t.Fatalf("%v, request %d at %d cost %d: TakeOne %v %+v, Take %v %+v", l, i, now, c, got, d, want, out[0])
			}
			if !want {
				states[0] = a // a denied request leaves the counter as it was
				b = a
				b.Log = append([]Entry(nil), a.Log...)
			}
			if !reflect.DeepEqual(states[0].Log, b.Log) && len(states[0].Log)+len(b.Log) > 0 ||
				states[0].Start != b.Start || states[0].Prev != b.Prev || states[0].Curr != b.Curr {
				t.Fatalf("%v, request %d: TakeOne left %+v, Take %+v", l, i, b, states[0])
			}
			a = states[0]
		}
	}
}
