package window

import (
	"testing"
	"time"
)

const (
	sec = int64(1000)
	min = 60 * sec
)

func TestLimitValidate(t *testing.T) {
	t.Parallel()
	tests := []struct {
		l    Limit
		want string
	}{
		{Limit{100, time.Minute}, ""},
		{Limit{0, time.Minute}, "limit 0/1m0s: requests must be > 0"},
		{Limit{-1, time.Minute}, "limit -1/1m0s: requests must be > 0"},
		{Limit{1, 0}, "limit 1/0s: window must be > 0"},
		{Limit{1, 1500 * time.Microsecond}, "limit 1/1.5ms: window must be a whole number of milliseconds"},
		{Limit{1 << 30, 24 * time.Hour}, "limit 1073741824/24h0m0s: requests * window (in ms) must not exceed 2^50"},
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

func TestRoll(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		s      State
		now    int64
		want   State
		wantAt int64
	}{
		{"same window", State{Start: min, Prev: 3, Curr: 4}, min + 5*sec, State{Start: min, Prev: 3, Curr: 4}, min + 5*sec},
		{"next window", State{Start: min, Prev: 3, Curr: 4}, 2*min + 1, State{Start: 2 * min, Prev: 4}, 2*min + 1},
		{"two windows later", State{Start: min, Prev: 3, Curr: 4}, 3 * min, State{Start: 3 * min}, 3 * min},
		{"empty", State{}, 5*min + 7, State{Start: 5 * min}, 5*min + 7},
		{"clock backwards", State{Start: 2 * min, Curr: 4}, min + 30*sec, State{Start: 2 * min, Curr: 4}, 2 * min},
	}
	for _, tt := range tests {
		got, at := Roll(tt.s, tt.now, min)
		if got != tt.want || at != tt.wantAt {
			t.Errorf("%s: Roll(%+v, %d) = %+v, %d; want %+v, %d", tt.name, tt.s, tt.now, got, at, tt.want, tt.wantAt)
		}
	}
}

// TestWorkedExample is the example of the design: 100/min, 80 requests in
// the previous window, 40 in the current, 30 s in: the estimate is
// 80*0.5+40 = 80.
func TestWorkedExample(t *testing.T) {
	t.Parallel()
	l := Limit{100, time.Minute}
	now := 10*min + 30*sec
	states := []State{{Start: 10 * min, Prev: 80, Curr: 40}}
	out := make([]Decision, 1)
	if !Take(states, now, []Charge{{Key: "k", Limit: l, Cost: 1}}, out) {
		t.Fatal("request at estimate 80 denied")
	}
	want := Decision{Allowed: true, Remaining: 19, ResetAfter: 90 * time.Second}
	if out[0] != want {
		t.Errorf("decision = %+v, want %+v", out[0], want)
	}
	if states[0].Curr != 41 {
		t.Errorf("curr = %d, want 41", states[0].Curr)
	}
	// 19 more fit (estimate 81+19 = 100), the next does not.
	for i := 0; i < 19; i++ {
		if !Take(states, now, []Charge{{Key: "k", Limit: l, Cost: 1}}, out) {
			t.Fatalf("request %d denied at remaining %d", i, out[0].Remaining)
		}
	}
	if out[0].Remaining != 0 || states[0].Curr != 60 {
		t.Fatalf("after filling: remaining %d curr %d, want 0 and 60", out[0].Remaining, states[0].Curr)
	}
	if Take(states, now, []Charge{{Key: "k", Limit: l, Cost: 1}}, out) {
		t.Fatal("request over the limit admitted")
	}
	// Denied: not charged; retry when 80*(30-d)/60 + 61 <= 100, i.e.
	// d >= 30 - 29.25 = 0.75 s.
	want = Decision{Remaining: 0, ResetAfter: 90 * time.Second, RetryAfter: 750 * time.Millisecond}
	if out[0] != want || states[0].Curr != 60 {
		t.Errorf("denied decision = %+v curr %d, want %+v curr 60", out[0], states[0].Curr, want)
	}
	if !Take(states, now+750, []Charge{{Key: "k", Limit: l, Cost: 1}}, out) {
		t.Error("request at now+RetryAfter denied")
	}
}

func TestTakeTable(t *testing.T) {
	t.Parallel()
	l := Limit{10, time.Second}
	tests := []struct {
		name      string
		s         State
		now       int64
		cost      int
		wantOK    bool
		want      Decision
		wantState State
	}{
		{"empty", State{}, 5*sec + 250, 1, true,
			Decision{Allowed: true, Remaining: 9, ResetAfter: 1750 * time.Millisecond},
			State{Start: 5 * sec, Curr: 1}},
		{"cost 10 fills", State{}, 5 * sec, 10, true,
			Decision{Allowed: true, Remaining: 0, ResetAfter: 2 * time.Second},
			State{Start: 5 * sec, Curr: 10}},
		{"cost 11 never fits", State{}, 5 * sec, 11, false,
			Decision{Remaining: 10, RetryAfter: -1},
			State{Start: 5 * sec}},
		{"full, wait for next window", State{Start: 5 * sec, Curr: 10}, 5*sec + 400, 1, false,
			// next window x in: 10*(1000-x)/1000 + 1 <= 10 -> x >= 100
			Decision{Remaining: 0, ResetAfter: 1600 * time.Millisecond, RetryAfter: 700 * time.Millisecond},
			State{Start: 5 * sec, Curr: 10}},
		{"previous decays", State{Start: 4 * sec, Curr: 10}, 5*sec + 500, 1, true,
			// 10*0.5 + 1 = 6 -> 4 left
			Decision{Allowed: true, Remaining: 4, ResetAfter: 1500 * time.Millisecond},
			State{Start: 5 * sec, Prev: 10, Curr: 1}},
		{"only previous, denied", State{Start: 5 * sec, Prev: 10, Curr: 5}, 5*sec + 200, 1, false,
			// 10*(800-d)/1000 + 6 <= 10 -> 800-d <= 400 -> d = 400
			Decision{Remaining: 0, ResetAfter: 1800 * time.Millisecond, RetryAfter: 400 * time.Millisecond},
			State{Start: 5 * sec, Prev: 10, Curr: 5}},
		{"reset after previous only", State{Start: 4 * sec, Curr: 3}, 5*sec + 100, 0, true,
			Decision{Allowed: true, Remaining: 7, ResetAfter: 900 * time.Millisecond},
			State{Start: 5 * sec, Prev: 3}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			states := []State{tt.s}
			out := make([]Decision, 1)
			ok := Take(states, tt.now, []Charge{{Key: "k", Limit: l, Cost: tt.cost}}, out)
			if ok != tt.wantOK || out[0] != tt.want || states[0] != tt.wantState {
				t.Errorf("Take = %v %+v %+v; want %v %+v %+v", ok, out[0], states[0], tt.wantOK, tt.want, tt.wantState)
			}
		})
	}
}

func TestTakeAllOrNothing(t *testing.T) {
	t.Parallel()
	perSec, perMin := Limit{10, time.Second}, Limit{15, time.Minute}
	charges := []Charge{{Key: "k", Limit: perSec, Cost: 1}, {Key: "k", Limit: perMin, Cost: 1}}
	states := make([]State, 2)
	out := make([]Decision, 2)
	admitted := 0
	// 10 per second, evenly spaced, for 3 seconds: the second second
	// admits 9 (the first sees the whole previous window) but the minute
	// limit stops it at 15.
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

// TestRetryAfterIsExact checks, for many states, that a request fits at
// now+RetryAfter and not a millisecond earlier.
func TestRetryAfterIsExact(t *testing.T) {
	t.Parallel()
	l := Limit{7, 300 * time.Millisecond}
	w := int64(300)
	for prev := int64(0); prev <= 9; prev++ {
		for curr := int64(0); curr <= 9; curr++ {
			for e := int64(0); e < w; e += 13 {
				for cost := 1; cost <= 7; cost++ {
					s := State{Start: 0, Prev: prev, Curr: curr}
					if Fits(s, e, 7, w, int64(cost)) {
						continue
					}
					d := Describe(s, e, 7, w, int64(cost), false)
					wait := d.RetryAfter.Milliseconds()
					at := func(t int64) bool {
						r, now := Roll(s, t, w)
						return Fits(r, now, 7, w, int64(cost))
					}
					if !at(e + wait) {
						t.Fatalf("%+v e=%d cost=%d: not admitted at RetryAfter %d", s, e, cost, wait)
					}
					if wait > 0 && at(e+wait-1) {
						t.Fatalf("%+v e=%d cost=%d: admitted before RetryAfter %d", s, e, cost, wait)
					}
				}
			}
		}
	}
	_ = l
}

func TestExpiry(t *testing.T) {
	t.Parallel()
	if got := Expiry(min, min+10*sec, min); got != 110*time.Second {
		t.Errorf("Expiry = %v, want 1m50s", got)
	}
}

func TestHugeCostNeverFits(t *testing.T) {
	t.Parallel()
	for _, c := range []int64{11, 1 << 50, 1<<63 - 1} {
		if Fits(State{}, 0, 10, 60000, c) {
			t.Errorf("cost %d fits a limit of 10", c)
		}
	}
}
