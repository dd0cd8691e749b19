package fleet

import (
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/window"
)

var (
	sliding = window.Limit{Requests: 10, Window: time.Second}
	fixed   = window.Limit{Requests: 10, Window: time.Second, Algorithm: window.FixedWindow}
	token   = window.Limit{Requests: 10, Window: time.Second, Algorithm: window.TokenBucket}
)

func TestLeaseSize(t *testing.T) {
	for _, tc := range []struct{ want, rem, servers, size int64 }{
		{100, 1000, 1, 100},
		{100, 1000, 4, 100},
		{100, 400, 4, 50},
		{100, 16, 4, 2},
		{100, 7, 4, 1}, // falls to 1 near the limit
		{100, 1, 16, 1},
		{100, 0, 1, 0},
		{0, 100, 1, 0},
		{5, 3, 0, 1}, // no server seen counts as one
		{100, -3, 1, 0},
	} {
		if got := LeaseSize(tc.want, tc.rem, tc.servers); got != tc.size {
			t.Errorf("LeaseSize(%d, %d, %d) = %d, want %d", tc.want, tc.rem, tc.servers, got, tc.size)
		}
	}
}

func TestSliceLife(t *testing.T) {
	for _, tc := range []struct {
		l                         window.Limit
		remaining, servers, lease int64
		life                      int64
	}{
		{sliding, 400, 4, 100, LongLife * 100},
		{sliding, 399, 4, 100, 100}, // near the limit: one interval
		{fixed, 1000, 1, 100, LongLife * 100},
		{fixed, 99, 1, 100, 100},
		{sliding, 100, 0, 100, LongLife * 100}, // no holder seen counts as one
		{token, 1_000_000, 1, 100, 100},        // token buckets: always one interval
	} {
		if got := SliceLife(&tc.l, 100, tc.remaining, tc.servers, tc.lease); got != tc.life {
			t.Errorf("SliceLife(%s, 100, %d, %d, %d) = %d, want %d", tc.l.Algorithm, tc.remaining, tc.servers, tc.lease, got, tc.life)
		}
	}
}

func TestViewTakeSliding(t *testing.T) {
	// Windows of 1 s anchored at the first request (t0 = 1000).
	var v View
	l := sliding
	steps := []struct {
		at       int64
		ok       bool
		c        window.State
		unsynced int64
	}{
		{1000, true, window.State{Start: 1000, Curr: 1}, 1},
		{1500, true, window.State{Start: 1000, Curr: 2}, 2},
		// One window on: the current counts become the previous ones, in
		// C and in U alike.
		{2000, true, window.State{Start: 2000, Prev: 2, Curr: 1}, 3},
		// Two windows on from 2000: everything is forgotten.
		{4100, true, window.State{Start: 4100, Curr: 1}, 1},
	}
	for _, s := range steps {
		_, ok := v.Take(&l, s.at, 1)
		if ok != s.ok || v.C.Start != s.c.Start || v.C.Prev != s.c.Prev || v.C.Curr != s.c.Curr || v.Unsynced() != s.unsynced {
			t.Fatalf("at %d: ok %v C %+v unsynced %d, want %v %+v %d", s.at, ok, v.C, v.Unsynced(), s.ok, s.c, s.unsynced)
		}
		if v.U.Start != v.C.Start {
			t.Fatalf("at %d: U starts at %d, C at %d", s.at, v.U.Start, v.C.Start)
		}
	}
	// Fill the window: 9 more fit, the tenth does not.
	for i := 0; i < 9; i++ {
		if _, ok := v.Take(&l, 4200, 1); !ok {
			t.Fatalf("request %d denied", i)
		}
	}
	if _, ok := v.Take(&l, 4200, 1); ok {
		t.Fatal("11th request in a window of 10 admitted")
	}
	d := v.Detach()
	if d != (Delta{Start: 4100, Curr: 10}) || v.Unsynced() != 0 || v.C.Curr != 10 {
		t.Fatalf("Detach = %+v, unsynced %d, C %+v", d, v.Unsynced(), v.C)
	}
}

func TestViewTakeFixedAndToken(t *testing.T) {
	var f View
	for i := 0; i < 10; i++ {
		if _, ok := f.Take(&fixed, 1500, 1); !ok {
			t.Fatalf("fixed: request %d denied", i)
		}
	}
	if _, ok := f.Take(&fixed, 1999, 1); ok {
		t.Fatal("fixed: 11th request admitted")
	}
	// A new window forgets the unsynced counts of the old one.
	if _, ok := f.Take(&fixed, 2000, 1); !ok || f.Unsynced() != 1 || f.U.Start != 2000 {
		t.Fatalf("fixed: new window: ok %v unsynced %d U %+v", ok, f.Unsynced(), f.U)
	}

	var b View
	for i := 0; i < 10; i++ {
		if _, ok := b.Take(&token, 1000, 1); !ok {
			t.Fatalf("token: request %d denied", i)
		}
	}
	if _, ok := b.Take(&token, 1000, 1); ok {
		t.Fatal("token: 11th token admitted")
	}
	// 100 ms refill one token; the unsynced tokens stay to be pushed.
	if _, ok := b.Take(&token, 1100, 1); !ok || b.Unsynced() != 11 {
		t.Fatalf("token: after refill: ok %v unsynced %d", ok, b.Unsynced())
	}
}

// TestApply is the table fleet.lua is cross-checked against too
// (internal/redisstore).
func TestApply(t *testing.T) {
	for _, tc := range ApplyCases() {
		got, _ := Apply(&tc.Limit, tc.Stored, tc.Delta, tc.Now)
		if got.Start != tc.Want.Start || got.Prev != tc.Want.Prev || got.Curr != tc.Want.Curr {
			t.Errorf("%s: Apply = %+v, want %+v", tc.Name, got, tc.Want)
		}
	}
}

func TestGrant(t *testing.T) {
	for _, tc := range GrantCases() {
		got, g, _ := Grant(&tc.Limit, tc.Stored, tc.Now, tc.Want, tc.Give, tc.From, tc.Servers)
		if got.Start != tc.WantState.Start || got.Prev != tc.WantState.Prev || got.Curr != tc.WantState.Curr || g != tc.Granted {
			t.Errorf("%s: Grant = %+v, %d; want %+v, %d", tc.Name, got, g, tc.WantState, tc.Granted)
		}
		// What is granted fits, as an admitted request of that cost would.
		r, at := tc.Limit.Roll(tc.Stored, tc.Now)
		if g > 0 && tc.Give == 0 && !window.Fits(r, at, tc.Limit, g) {
			t.Errorf("%s: granted %d, which does not fit %+v", tc.Name, g, r)
		}
	}
}

func TestRemainingMatchesFits(t *testing.T) {
	for _, l := range []window.Limit{sliding, fixed, token, {Requests: 1000, Window: time.Minute}} {
		var v View
		for at := int64(1000); at < 4000; at += 37 {
			v.Take(&l, at, 1)
			r, a := l.Roll(v.C, at+5)
			rem := Remaining(&l, r, a)
			if rem > 0 && !window.Fits(r, a, l, rem) {
				t.Fatalf("%s at %d: remaining %d does not fit", l, at, rem)
			}
			if window.Fits(r, a, l, rem+1) {
				t.Fatalf("%s at %d: remaining %d, yet %d fits", l, at, rem, rem+1)
			}
		}
	}
}

func TestSyncedKeepsUnsynced(t *testing.T) {
	l := sliding
	var v View
	v.Take(&l, 1000, 1)
	v.Take(&l, 1100, 1)
	d := v.Detach()
	v.Take(&l, 1200, 1) // counted while the push was on its way
	// Redis had 5 from other servers in a window anchored at 900, and the
	// push added 2.
	stored, _ := Apply(&l, window.State{Start: 900, Curr: 5}, d, 1150)
	v.Synced(&l, stored, 1250, 0)
	if v.C.Start != 900 || v.C.Curr != 8 || v.Unsynced() != 1 || v.U.Start != 900 {
		t.Fatalf("after sync: C %+v U %+v", v.C, v.U)
	}
	// A failed push is restored into the current windows.
	var f View
	f.Take(&l, 1000, 3)
	d = f.Detach()
	f.Take(&l, 2100, 1) // one window on
	f.Restore(&l, d)
	if f.U.Prev != 3 || f.U.Curr != 1 {
		t.Fatalf("restored U %+v, want prev 3 curr 1", f.U)
	}
}

func TestModes(t *testing.T) {
	for _, m := range []Mode{Exact, Lease, WriteBack} {
		if got, ok := ParseMode(m.String()); !ok || got != m {
			t.Errorf("ParseMode(%q) = %v, %v", m, got, ok)
		}
	}
	if _, ok := ParseMode("writeback"); ok {
		t.Error("ParseMode accepted writeback")
	}
	for a, want := range map[window.Algorithm]bool{window.SlidingWindow: true, window.FixedWindow: true, window.TokenBucket: true, window.LeakyBucket: false, window.SlidingLog: false} {
		if Supports(a) != want {
			t.Errorf("Supports(%s) = %v", a, !want)
		}
	}
	if OverBound(4, 10) != 40 || FalseDenialBound(4, 25) != 75 || FalseDenialBound(1, 25) != 0 {
		t.Error("bounds")
	}
}

func TestBlind(t *testing.T) {
	s1 := window.Limit{Requests: 1000, Window: time.Second}
	f1 := window.Limit{Requests: 1000, Window: time.Second, Algorithm: window.FixedWindow}
	// A sliding window's budget is half of max_unsynced per period.
	var b Blind
	if !b.Admit(&s1, 1000, 1000, 3, 0, 20) || b.D() != 3 {
		t.Fatalf("first blind admission: D %d", b.D())
	}
	b.Note(&s1, 1000, 1000, 3)
	// D 3 + M 3 + 4 = 10: the budget of max_unsynced 20.
	if !b.Admit(&s1, 1500, 1000, 4, 3, 20) || b.D() != 7 || b.M() != 3 {
		t.Fatalf("second: D %d M %d", b.D(), b.M())
	}
	b.Note(&s1, 1500, 1000, 7)
	if b.Admit(&s1, 1600, 1000, 1, 7, 20) {
		t.Fatalf("admitted past the budget: D %d M %d", b.D(), b.M())
	}
	// The next period (aligned to the epoch) starts afresh, with what is
	// unsynced then as the most held so far.
	if !b.Admit(&s1, 2000, 2000, 1, 2, 20) || b.D() != 1 || b.M() != 2 {
		t.Fatalf("next period: D %d M %d", b.D(), b.M())
	}
	// Holding many unsynced units (not blind) leaves nothing to admit
	// blind in the period.
	b.Note(&s1, 2100, 2000, 9)
	if b.Admit(&s1, 2200, 2000, 1, 0, 20) {
		t.Fatal("admitted blind after holding 9 unsynced units with D 1, budget 10")
	}
	// A fixed window's period is the window, with the whole budget.
	var f Blind
	if !f.Admit(&f1, 5000, 5000, 20, 0, 20) || f.Admit(&f1, 5999, 5000, 1, 0, 20) {
		t.Fatal("fixed window: budget of 20 not kept")
	}
	if !f.Admit(&f1, 6000, 6000, 1, 0, 20) {
		t.Fatal("fixed window: the next window did not start afresh")
	}
	// Never for a token bucket, nor for a cost of 0.
	var tb Blind
	if tb.Admit(&token, 1000, 1000, 1, 0, 100) || b.Admit(&s1, 9000, 9000, 0, 0, 20) {
		t.Fatal("token bucket or cost 0 admitted blind")
	}
	// M saturates above any budget; the budget is at most 2^22.
	var big Blind
	big.Note(&s1, 1000, 1000, 1<<40)
	if big.M() != blindMax || big.Admit(&s1, 1000, 1000, 1, 0, 1<<30) {
		t.Fatalf("saturated M %d admitted", big.M())
	}
	if got := BlindBudget(&f1, 1<<30); got != maxBlindBudget {
		t.Fatalf("budget %d, want %d", got, maxBlindBudget)
	}
	if BlindPeriodStart(&s1, 2500, 2100) != 2000 || BlindPeriodStart(&f1, 2500, 2000) != 2000 {
		t.Fatal("BlindPeriodStart")
	}
}
