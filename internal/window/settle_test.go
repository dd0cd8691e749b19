package window

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"
)

// settle runs SettleAll for one charge on a copy of s.
func settle(l Limit, s State, now, cost int64) (State, Decision) {
	states, out := []State{cloneState(s)}, make([]Decision, 1)
	SettleAll(states, now, []Charge{{Key: "k", Limit: l, Cost: int(cost)}}, out)
	return states[0], out[0]
}

// TestSettleTable settles usage past the limit under each algorithm and
// checks, at fixed instants, the debt and when the client gets back in.
func TestSettleTable(t *testing.T) {
	t.Parallel()
	const t0 = 60 * sec // a multiple of every window below
	type check struct {
		at     int64
		cost   int64
		wantOK bool
		want   Decision
	}
	tests := []struct {
		name   string
		l      Limit
		admit  int64 // at t0
		settle int64 // at t0 + 100 ms
		after  Decision
		checks []check
	}{
		{"sliding window", Limit{Requests: 10, Window: time.Second}, 4, 16,
			// 20 in the window: 10 past the limit; Remaining grows in the
			// next window once 20*(999-y) <= 9000: y = 549.
			Decision{Allowed: true, ResetAfter: 1899 * ms, NextAfter: 1449 * ms, Debt: 10},
			[]check{
				// Still in the settle's window: nothing fits.
				{t0 + 999, 1, false, Decision{ResetAfter: 1000 * ms, RetryAfter: 550 * ms, NextAfter: 550 * ms, Debt: 10}},
				// The next window: the debt weighs 20 * (999-e)/1000, 9
				// at e = 549; Remaining grows 1000/20 ticks on.
				{t0 + 1000 + 549, 1, true, Decision{Allowed: true, ResetAfter: 1450 * ms, NextAfter: 50 * ms}},
				// A request of cost 5 waits until 20*(999-e) <= 5000.
				{t0 + 1000 + 549, 5, false, Decision{Remaining: 1, ResetAfter: 450 * ms, RetryAfter: 200 * ms}},
			}},
		{"fixed window", Limit{Requests: 10, Window: time.Second, Algorithm: FixedWindow}, 4, 16,
			Decision{Allowed: true, ResetAfter: 900 * ms, NextAfter: 900 * ms, Debt: 10},
			[]check{
				{t0 + 999, 1, false, Decision{ResetAfter: ms, RetryAfter: ms, NextAfter: ms, Debt: 10}},
				// The next window starts empty: a fixed window renews
				// whole at its boundary, debt included.
				{t0 + 1000, 10, true, Decision{Allowed: true, ResetAfter: 1000 * ms, NextAfter: 1000 * ms}},
			}},
		{"token bucket", Limit{Requests: 10, Window: time.Second, Algorithm: TokenBucket}, 4, 16,
			// A token is 1000 drops, 10 refill per ms: 4000 - 100*10 +
			// 16000 = 19000 drops at t0+100, 9 tokens past empty; a token
			// is there once the level is 9000, 1000 ms on.
			Decision{Allowed: true, ResetAfter: 1900 * ms, NextAfter: 1000 * ms, Debt: 9},
			[]check{
				// The debt is refilled (level 9010 of 10000), the first
				// token not yet.
				{t0 + 1099, 1, false, Decision{ResetAfter: 901 * ms, RetryAfter: ms, NextAfter: ms}},
				{t0 + 1100, 1, true, Decision{Allowed: true, ResetAfter: 1000 * ms, NextAfter: 100 * ms}},
			}},
		{"sliding log", Limit{Requests: 10, Window: time.Second, Algorithm: SlidingLog}, 4, 16,
			// Entries of 4 at t0 and 16 at t0+100: 10 past the limit, and
			// a unit fits once the 16 leave at t0+1100.
			Decision{Allowed: true, ResetAfter: 1000 * ms, NextAfter: 1000 * ms, Debt: 10},
			[]check{
				{t0 + 1000, 1, false, Decision{ResetAfter: 100 * ms, RetryAfter: 100 * ms, NextAfter: 100 * ms, Debt: 6}},
				{t0 + 1100, 10, true, Decision{Allowed: true, ResetAfter: 1000 * ms, NextAfter: 1000 * ms}},
			}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			s, _, ok := take(tt.l, State{}, t0, tt.admit)
			if !ok {
				t.Fatalf("admitting %d denied", tt.admit)
			}
			s, d := settle(tt.l, s, t0+100, tt.settle)
			if d != tt.after {
				t.Errorf("settle %d: %+v, want %+v", tt.settle, d, tt.after)
			}
			checkExact(t, tt.l, s, t0+100, costsFor(tt.l))
			for _, c := range tt.checks {
				_, d, ok := take(tt.l, s, c.at, c.cost)
				if ok != c.wantOK || d != c.want {
					t.Errorf("at t0+%d cost %d: %v %+v, want %v %+v", c.at-t0, c.cost, ok, d, c.wantOK, c.want)
				}
				checkExact(t, tt.l, s, c.at, costsFor(tt.l))
			}
		})
	}
}

// TestSettleIsExact drives random clients that settle usage above their
// estimates, often far past the limit, and checks every promise of every
// Decision (checkExact) at each step, for every algorithm and for limits
// whose counts, levels and ticks are at the extremes.
func TestSettleIsExact(t *testing.T) {
	t.Parallel()
	limits := append([]Limit{
		{Requests: 1e12, Window: 366 * day}, {Requests: MaxRequests, Window: MaxWindow}, {Requests: 1, Window: MaxWindow},
		{Requests: 1e9, Window: time.Hour}, {Requests: 3, Window: time.Minute, Algorithm: FixedWindow},
		{Requests: 5, Algorithm: FixedWindow, Period: CalendarDay, Location: mustLoad(t, "Europe/Paris")},
		{Requests: MaxRequests / 4, Window: 3600 * time.Millisecond, Algorithm: FixedWindow},
	}, limitsUnderTest...)
	limits = append(limits, bucketsUnderTest...)
	limits = append(limits, logsUnderTest[:6]...)
	for i, l := range limits {
		t.Run(l.String(), func(t *testing.T) {
			t.Parallel()
			rng := rand.New(rand.NewPCG(uint64(i), 7))
			w := l.Span().Milliseconds()
			n := int64(l.Capacity())
			now := int64(1_700_000_000_731)
			var s State
			for range 150 {
				switch k := rng.IntN(6); {
				case k < 2:
				case k < 4:
					now += rng.Int64N(max(w/10, 2))
				default:
					now += rng.Int64N(2*w + 1)
				}
				checkExact(t, l, s, now, costsFor(l))
				if rng.IntN(3) == 0 {
					// A settle: up to ten times the limit past it, or
					// absurdly large.
					c := []int64{1, n, 3 * n, 10 * n, MaxCount}[rng.IntN(5)]
					var d Decision
					s, d = settle(l, s, now, c)
					if d.Remaining != 0 && d.Debt != 0 || d.Debt < 0 {
						t.Fatalf("settle %d at %d: %+v", c, now, d)
					}
					checkCounts(t, l, s)
					continue
				}
				s, _, _ = take(l, s, now, []int64{0, 1, 1, n / 2, n}[rng.IntN(5)])
			}
		})
	}
}

// checkCounts checks that settles keep a state within the bounds that keep
// the arithmetic exact.
func checkCounts(t *testing.T, l Limit, s State) {
	t.Helper()
	switch l.Algorithm {
	case TokenBucket, LeakyBucket:
		if s.Curr > tokenParams(l).most() {
			t.Fatalf("%v: level %d above %d", l, s.Curr, tokenParams(l).most())
		}
	case SlidingLog:
		if s.Curr > MaxLogCount {
			t.Fatalf("%v: log sum %d above %d", l, s.Curr, int64(MaxLogCount))
		}
	default:
		if s.Prev > MaxCount || s.Curr > MaxCount {
			t.Fatalf("%v: counts %+v above %d", l, s, int64(MaxCount))
		}
	}
}

// TestSettleCaps: settles stop at the caps that keep the arithmetic exact.
func TestSettleCaps(t *testing.T) {
	t.Parallel()
	const now = 1_700_000_000_000
	sw := Limit{Requests: 10, Window: time.Second}
	s, d := settle(sw, State{}, now, 1<<62)
	if s.Curr != MaxCount || d.Debt != MaxCount-10 {
		t.Errorf("sliding window: %+v %+v", s, d)
	}
	s, _ = settle(sw, s, now, 5)
	if s.Curr != MaxCount {
		t.Errorf("sliding window past the cap: %+v", s)
	}
	tb := bucket(10, time.Second, 20)
	s, d = settle(tb, State{}, now, 1<<62)
	if s.Curr != 42*1000 || d.Debt != 22 {
		t.Errorf("token bucket: %+v %+v, want a level of 42 tokens, a debt of 22", s, d)
	}
	lg := slidingLog(10, time.Second)
	s, _ = settle(lg, State{}, now, MaxLogCount-3)
	s, d = settle(lg, s, now+1, 10)
	if s.Curr != MaxLogCount || len(s.Log) != 2 || s.Log[1].N != 3 || d.Debt != MaxLogCount-10 {
		t.Errorf("sliding log: %+v %+v", s, d)
	}
	if s2, _ := settle(lg, s, now+2, 1); len(s2.Log) != 2 {
		t.Errorf("sliding log at its cap: an entry was added: %+v", s2)
	}
	for _, c := range []int64{0, -5} {
		if s2, _ := settle(sw, State{Start: now, Curr: 3}, now, c); s2.Curr != 3 {
			t.Errorf("settle %d changed the count: %+v", c, s2)
		}
	}
}

// TestRefundLog takes back charges of a sliding log from the entry of
// their instant.
func TestRefundLog(t *testing.T) {
	t.Parallel()
	l := slidingLog(10, time.Second)
	s := State{Curr: 6, Log: []Entry{{At: 100, N: 2}, {At: 200, N: 3}, {At: 300, N: 1}}}
	for _, tt := range []struct {
		at, c   int64
		changed bool
		want    State
	}{
		{200, 1, true, State{Curr: 5, Log: []Entry{{At: 100, N: 2}, {At: 200, N: 2}, {At: 300, N: 1}}}},
		{200, 7, true, State{Curr: 3, Log: []Entry{{At: 100, N: 2}, {At: 300, N: 1}}}},
		{250, 1, false, s},
		{300, 1, true, State{Curr: 5, Log: []Entry{{At: 100, N: 2}, {At: 200, N: 3}}}},
		{50, 1, false, s},
		{400, 1, false, s},
	} {
		got := cloneState(s)
		if changed := Refund(&got, l, tt.at, tt.c); changed != tt.changed || !sameState(got, tt.want) {
			t.Errorf("Refund at %d of %d: %v %+v, want %v %+v", tt.at, tt.c, changed, got, tt.changed, tt.want)
		}
	}
}

// TestDebtWaitedOff: a client that settles far past its limit gets its
// next unit exactly when NextAfter says, under every algorithm, and not
// later than the stated horizon: the end of the next window for the
// sliding and fixed windows, one window after the settle for the log, and
// the refill of its debt (at most a capacity and a token) for the bucket.
func TestDebtWaitedOff(t *testing.T) {
	t.Parallel()
	const now = 1_700_000_000_000
	for _, l := range []Limit{
		{Requests: 100, Window: time.Minute},
		{Requests: 100, Window: time.Minute, Algorithm: FixedWindow},
		{Requests: 100, Window: time.Minute, Algorithm: SlidingLog},
		{Requests: 100, Window: time.Minute, Algorithm: TokenBucket},
	} {
		for _, debt := range []int64{1, 50, 100, 1000, 1e6} {
			t.Run(fmt.Sprintf("%v debt %d", l, debt), func(t *testing.T) {
				s, _, _ := take(l, State{}, now, 100)
				s, d := settle(l, s, now+1, debt)
				wait := d.NextAfter.Milliseconds()
				horizon := 2 * l.Window.Milliseconds()
				if l.Algorithm == TokenBucket {
					horizon = (2*101 - 100 + 1) * 600 // the level's cap, less a burst, refilled
				}
				if wait <= 0 || wait > horizon {
					t.Fatalf("NextAfter %d ms, want within %d", wait, horizon)
				}
				if fitsAt(l, s, now+1+wait-1, 1) || !fitsAt(l, s, now+1+wait, 1) {
					t.Fatalf("one unit does not fit exactly NextAfter (%d ms) after the settle", wait)
				}
			})
		}
	}
}
