package window

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"
)

func bucket(n int, w time.Duration, burst int) Limit {
	return Limit{Requests: n, Window: w, Algorithm: TokenBucket, Burst: burst}
}

// Token buckets whose tick is more than 1 ms: the bound of Limit.Tick on
// 3 * (max(requests, burst) + 1) * ticks.
var (
	// 2^48 per 3.6 s: at most 10 ticks per window, so ticks of 360 ms, a
	// token is 10 drops and 2^48 drops refill per tick.
	hugeBucket = bucket(MaxRequests/4, 3600*time.Millisecond, 0)
	// 10 per 3.6 s with a burst of 2^47: at most 21 ticks, 180 ms each
	// (the smallest divisor of 3600 from 172); a token is 20 drops and 10
	// refill per tick, one token every 360 ms.
	hugeBurst = bucket(10, 3600*time.Millisecond, MaxRequests/8)
	// 2^50 per 3.6 s: at most 2 ticks of 1800 ms.
	maxBucket = bucket(MaxRequests, 3600*time.Millisecond, 0)
	// 1e12 per hour: ticks of 1200 ms, a token is 3000 drops.
	teraBucket = bucket(1e12, time.Hour, 0)
)

func TestTokenBucketTicks(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		l    Limit
		want int64
	}{
		{bucket(4, time.Second, 0), 1}, {bucket(1e9, 3600*time.Millisecond, 0), 1},
		{hugeBucket, 360}, {hugeBurst, 180}, {maxBucket, 1800}, {teraBucket, 1200},
	} {
		if got := tt.l.Tick(); got != tt.want {
			t.Errorf("%v.Tick() = %d, want %d", tt.l, got, tt.want)
		}
	}
}

// TestTokenBucketTable: 4 per second with a burst of 4. A token is 1000
// drops, the bucket holds 4000, and 4 drops refill per ms: one token every
// 250 ms.
func TestTokenBucketTable(t *testing.T) {
	t.Parallel()
	l := bucket(4, time.Second, 4)
	const t0 = 10_000
	st := func(start, level int64) State { return State{Start: start, Prev: 1, Curr: level} }
	runSteps(t, l, []step{
		// Level 1000: 3 left; empty in 1000/4 = 250 ms, when the 4th is
		// back too.
		{"first", t0, 1, true,
			Decision{Allowed: true, Remaining: 3, ResetAfter: 250 * ms, NextAfter: 250 * ms},
			st(t0, 1000)},
		// Level 4000, empty in 1 s; the first token back when the level is
		// 3000, in 250 ms.
		{"the whole burst", t0, 3, true,
			Decision{Allowed: true, Remaining: 0, ResetAfter: time.Second, NextAfter: 250 * ms},
			st(t0, 4000)},
		// 100 ms on the level is 3600: a token needs 3000, 600/4 = 150 ms.
		{"empty", t0 + 100, 1, false,
			Decision{Remaining: 0, ResetAfter: 900 * ms, RetryAfter: 150 * ms, NextAfter: 150 * ms},
			st(t0+100, 3600)},
		// Two tokens need the level at 2000: 1600/4 = 400 ms.
		{"cost 2", t0 + 100, 2, false,
			Decision{Remaining: 0, ResetAfter: 900 * ms, RetryAfter: 400 * ms, NextAfter: 150 * ms},
			st(t0+100, 3600)},
		{"cost above the burst", t0 + 100, 5, false,
			Decision{Remaining: 0, ResetAfter: 900 * ms, RetryAfter: -1, NextAfter: 150 * ms},
			st(t0+100, 3600)},
		// At RetryAfter: level 3000, fits, back to 4000.
		{"at RetryAfter", t0 + 250, 1, true,
			Decision{Allowed: true, Remaining: 0, ResetAfter: time.Second, NextAfter: 250 * ms},
			st(t0+250, 4000)},
		// 350 ms on: level 2600, one token left; spent: 3600, the next
		// back at 3000, 150 ms on.
		{"one back", t0 + 600, 1, true,
			Decision{Allowed: true, Remaining: 0, ResetAfter: 900 * ms, NextAfter: 150 * ms},
			st(t0+600, 3600)},
		{"full again", t0 + 5000, 0, true,
			Decision{Allowed: true, Remaining: 4},
			st(t0+5000, 0)},
		{"burst again", t0 + 5000, 4, true,
			Decision{Allowed: true, Remaining: 0, ResetAfter: time.Second, NextAfter: 250 * ms},
			st(t0+5000, 4000)},
	})

	// A burst of 10 refilled at 4 per second: 10000 drops, empty in 2.5 s.
	runSteps(t, bucket(4, time.Second, 10), []step{
		{"burst of 10", t0, 10, true,
			Decision{Allowed: true, Remaining: 0, ResetAfter: 2500 * ms, NextAfter: 250 * ms},
			st(t0, 10000)},
		// 1 s on: level 6000, 4 left; 5 need the level at 5000: 250 ms.
		{"cost 5 after a second", t0 + 1000, 5, false,
			Decision{Remaining: 4, ResetAfter: 1500 * ms, RetryAfter: 250 * ms},
			st(t0+1000, 6000)},
	})

	// 3 per second with a burst of 1: 3 drops per ms, a token every
	// 333.3 ms.
	runSteps(t, bucket(3, time.Second, 1), []step{
		{"one", t0, 1, true,
			Decision{Allowed: true, Remaining: 0, ResetAfter: 334 * ms, NextAfter: 334 * ms},
			st(t0, 1000)},
		// Level 1000 - 999 = 1: 1 ms to go.
		{"333 ms on", t0 + 333, 1, false,
			Decision{Remaining: 0, ResetAfter: ms, RetryAfter: ms, NextAfter: ms},
			st(t0+333, 1)},
		{"334 ms on", t0 + 334, 1, true,
			Decision{Allowed: true, Remaining: 0, ResetAfter: 334 * ms, NextAfter: 334 * ms},
			st(t0+334, 1000)},
	})
}

// TestTokenBucketTableCoarseTicks: 1e12 per hour counts in ticks of
// 1200 ms; a token is 3000 drops and 1e12 drops refill per tick. A request
// 500 ms into a tick is counted at the tick's start, and waits are to the
// start of a later tick.
func TestTokenBucketTableCoarseTicks(t *testing.T) {
	t.Parallel()
	l := teraBucket
	const base = 1_800_000_000_000 // a multiple of 1200
	const t0 = base + 500
	const full = int64(3e15) // the burst, in drops
	st := func(start, level int64) State { return State{Start: start, Prev: 1200, Curr: level} }
	runSteps(t, l, []step{
		// Empty after 3000 ticks, 3000*1200 - 500 ms on; a token back after
		// one tick, 700 ms on.
		{"the whole burst", t0, 1e12, true,
			Decision{Allowed: true, Remaining: 0, ResetAfter: 3_599_500 * ms, NextAfter: 700 * ms},
			st(base, full)},
		{"last ms of the tick", t0 + 699, 1, false,
			Decision{Remaining: 0, ResetAfter: 3_598_801 * ms, RetryAfter: ms, NextAfter: ms},
			st(base, full)},
		// One tick on: 1e12 drops back, 333,333,333 tokens and 1000
		// drops; one more token needs a second tick.
		{"one more than came back", t0 + 700, 333_333_334, false,
			Decision{Remaining: 333_333_333, ResetAfter: 3_598_800 * ms, RetryAfter: 1200 * ms},
			st(base+1200, full-1e12)},
		{"what came back", t0 + 700, 333_333_333, true,
			Decision{Allowed: true, Remaining: 0, ResetAfter: 3_600_000 * ms, NextAfter: 1200 * ms},
			st(base+1200, full-1000)},
	})
}

var bucketsUnderTest = []Limit{
	bucket(4, time.Second, 4), bucket(4, time.Second, 10), bucket(3, time.Second, 1), bucket(1, 10*time.Millisecond, 0),
	bucket(7, 300*time.Millisecond, 3), bucket(2000, time.Second, 500), bucket(3, 7*time.Millisecond, 5), bucket(5, 2*time.Second, 2),
	bucket(1, MaxWindow, 3), bucket(MaxRequests, time.Millisecond, 1),
	hugeBucket, hugeBurst, maxBucket, teraBucket, bucket(1e12, time.Hour, 5),
}

// TestTokenBucketExact checks RetryAfter, NextAfter and ResetAfter to the
// millisecond on random clients, for ticks of 1 ms and more.
func TestTokenBucketExact(t *testing.T) {
	t.Parallel()
	checkRandomWalks(t, bucketsUnderTest, []int64{0, 137, 1_700_000_000_731}, 300)
}

// TestTokenBucketBounds hammers token buckets with several clients and
// start phases: no interval of one window admits more than burst +
// requests, and a greedy client starting on a full bucket gets exactly
// burst + requests in the closed interval [t, t+window] (in the half-open
// one too when a tick longer than 1 ms puts a whole window of refill
// before t+window), and burst plus the refill over any longer run. The
// greedy client reaches these only when the bucket never fills between
// two of its requests, which would spill refill: when a token is a whole
// number of ticks, or the burst leaves room for a tick's refill.
func TestTokenBucketBounds(t *testing.T) {
	t.Parallel()
	limits := []Limit{
		bucket(4, time.Second, 4), bucket(4, time.Second, 10), bucket(3, time.Second, 1), bucket(10, 100*time.Millisecond, 3),
		bucket(7, 300*time.Millisecond, 0), bucket(2000, time.Second, 500), bucket(3, 7*time.Millisecond, 5),
		hugeBucket, hugeBurst, maxBucket,
	}
	for _, l := range limits {
		for _, start := range []int64{0, 1, 137, 999_999_999_999, 1_700_000_000_731} {
			t.Run(fmt.Sprintf("%v from %d", l, start), func(t *testing.T) {
				t.Parallel()
				w, r, n, b := l.Window.Milliseconds(), l.Tick(), int64(l.Requests), int64(l.Capacity())
				bulk := r > 1
				windows := int64(5)
				if bulk {
					windows = 3
				}
				end := start + windows*w
				spills := (w/r)%n != 0 && n > (b-1)*(w/r)
				for name, ad := range clients(l, start, end, bulk) {
					if most := mostIn(ad, w+1); most > b+n {
						t.Errorf("%s: %d admitted in an interval of one window, want at most %d", name, most, b+n)
					}
					if name != "greedy" || spills {
						continue
					}
					if most := mostIn(ad, w+1); most != b+n {
						t.Errorf("greedy: %d admitted in [t, t+window], want %d", most, b+n)
					}
					if most := mostIn(ad, w); start%r != 0 && most != b+n {
						t.Errorf("greedy: %d admitted in [t, t+window) from the middle of a tick, want %d", most, b+n)
					}
					// The refill over the run: Requests drops per tick, a
					// token is window/tick drops.
					last := end - 1
					ticks := (last - last%r - (start - start%r)) / r
					if got, want := countIn(ad, start, end), b+ticks*n/(w/r); got != want {
						t.Errorf("greedy: %d admitted over %d windows, want %d", got, windows, want)
					}
				}
			})
		}
	}
}

// TestTokenBucketCostAboveBurst: a cost above the burst never fits, even
// on a full bucket, and says so with RetryAfter -1ns; a cost of the burst
// fits a full bucket, however far above Requests it is.
func TestTokenBucketCostAboveBurst(t *testing.T) {
	t.Parallel()
	for _, l := range bucketsUnderTest {
		b := int64(l.Capacity())
		for _, now := range []int64{0, 1_700_000_000_731} {
			for _, c := range []int64{b + 1, 2 * b, MaxRequests + 1, 1<<62 - 1, 1<<63 - 1} {
				s, d, ok := take(l, State{}, now, c)
				if ok || d.RetryAfter != -1 || int64(d.Remaining) != b || d.NextAfter != 0 || s.Curr != 0 {
					t.Errorf("%v: cost %d on a full bucket: %v %+v %+v", l, c, ok, d, s)
				}
			}
			if _, d, ok := take(l, State{}, now, b); !ok || d.Remaining != 0 {
				t.Errorf("%v: the whole burst on a full bucket: %v %+v", l, ok, d)
			}
		}
	}
}

// TestTokenBucketTickChange: a plan change that changes the tick (a huge
// limit, whose ticks are 360 ms, for one of 1000 per 3.6 s, whose ticks
// are 1 ms) re-expresses the level in whole tokens, rounded up and capped
// at 2 * (burst + 1), as of the last instant the old limit's level holds: the
// new limit never counts as refilled what the old one counted as spent.
func TestTokenBucketTickChange(t *testing.T) {
	t.Parallel()
	small := bucket(1000, 3600*time.Millisecond, 0) // a token is 3600 drops, 1000 refill per ms
	const t0 = 1_800_000_000_000                    // a multiple of 360
	tests := []struct {
		name      string
		from      Limit
		spentAt   int64
		spent     int64
		to        Limit
		readAt    int64
		want      Decision // of a read under to
		wantState State
	}{
		{"at the tick's start", hugeBucket, t0, 7, small, t0,
			// 7 tokens: 25200 drops, empty in 25.2 ms; 994 left once the
			// level is 6 tokens, 3600 drops or 3.6 ms on.
			Decision{Allowed: true, Remaining: 993, ResetAfter: 26 * ms, NextAfter: 4 * ms},
			State{Start: t0, Prev: 1, Curr: 7 * 3600}},
		{"inside the tick", hugeBucket, t0 + 100, 7, small, t0 + 100,
			Decision{Allowed: true, Remaining: 993, ResetAfter: 26 * ms, NextAfter: 4 * ms},
			State{Start: t0 + 100, Prev: 1, Curr: 7 * 3600}},
		// The huge limit still counts 7 spent in the last ms of its tick;
		// the small one starts refilling them then.
		{"read later in the tick", hugeBucket, t0 + 100, 7, small, t0 + 359,
			Decision{Allowed: true, Remaining: 993, ResetAfter: 26 * ms, NextAfter: 4 * ms},
			State{Start: t0 + 359, Prev: 1, Curr: 7 * 3600}},
		// After the huge limit's tick the level is counted from its last
		// ms: 41 ms of refill at 1000 drops per ms empties it.
		{"read after the tick", hugeBucket, t0 + 100, 7, small, t0 + 400,
			Decision{Allowed: true, Remaining: 1000},
			State{Start: t0 + 400, Prev: 1}},
		{"read just after the tick", hugeBucket, t0 + 100, 7, small, t0 + 362,
			// 25200 - 3000 drops: 6.17 tokens, 7 still short.
			Decision{Allowed: true, Remaining: 993, ResetAfter: 23 * ms, NextAfter: ms},
			State{Start: t0 + 362, Prev: 1, Curr: 22200}},
		// More than the small burst: capped at 2002 tokens, twice the
		// burst and a token (a debt of 1002). Even a read is denied until
		// the level is back within the burst, 1002 tokens or 3607.2 ms
		// on; a token is back after 1003 have refilled, 3610.8 ms.
		{"above the new burst", hugeBucket, t0 + 100, 5000, small, t0 + 100,
			Decision{Remaining: 0, ResetAfter: 7208 * ms, RetryAfter: 3608 * ms, NextAfter: 3611 * ms, Debt: 1002},
			State{Start: t0 + 100, Prev: 1, Curr: 2002 * 3600}},
		// From 1 ms ticks to 360 ms ticks: 999 tokens of 10 drops, at the
		// start of the 360 ms tick, refilled a tick later.
		{"to coarser ticks", small, t0 + 100, 999, hugeBucket, t0 + 200,
			Decision{Allowed: true, Remaining: MaxRequests/4 - 999, ResetAfter: 160 * ms, NextAfter: 160 * ms},
			State{Start: t0, Prev: 360, Curr: 9990}},
		// From the burst-driven ticks of 180 ms (a token is 20 drops, 10
		// refill per tick) to 1 ms: 3 tokens, counted from now.
		{"from a huge burst", hugeBurst, t0 + 100, 3, small, t0 + 150,
			Decision{Allowed: true, Remaining: 997, ResetAfter: 11 * ms, NextAfter: 4 * ms},
			State{Start: t0 + 150, Prev: 1, Curr: 3 * 3600}},
	}
	for _, tt := range tests {
		s, _, ok := take(tt.from, State{}, tt.spentAt, tt.spent)
		if !ok {
			t.Fatalf("%s: spending %d under %v denied", tt.name, tt.spent, tt.from)
		}
		ns, d, _ := take(tt.to, s, tt.readAt, 0)
		if d != tt.want || !sameState(ns, tt.wantState) {
			t.Errorf("%s: read = %+v %+v, want %+v %+v", tt.name, d, ns, tt.want, tt.wantState)
		}
	}

	// The round trip small -> huge -> small at one instant keeps the 999
	// tokens spent.
	s, _, _ := take(small, State{}, t0+100, 999)
	s, _, _ = take(hugeBucket, s, t0+100, 0)
	if _, d, _ := take(small, s, t0+100, 0); d.Remaining != 1 {
		t.Errorf("round trip at one instant: remaining %d, want 1", d.Remaining)
	}
	// A cost above the new burst never fits, whatever the old level.
	s, _, _ = take(hugeBucket, State{}, t0, 10)
	if _, d, ok := take(small, s, t0+10*minute, 1001); ok || d.RetryAfter != -1 {
		t.Errorf("cost 1001 above a burst of 1000: %v %+v", ok, d)
	}
}

// TestTokenBucketPlanChanges drives a client through random plan changes
// among buckets of one window with ticks of 1, 180, 360 and 1800 ms: at a
// change within the old level's tick, the new limit counts exactly the
// tokens the old one counted as spent (up to twice its burst + 1), and the
// decisions after the change keep every promise.
func TestTokenBucketPlanChanges(t *testing.T) {
	t.Parallel()
	const w = 3600 * time.Millisecond
	plans := []Limit{hugeBucket, hugeBurst, maxBucket, bucket(1000, w, 0), bucket(1e9, w, 0), bucket(3, w, 5), bucket(1e6, w, 20)}
	for seed := range uint64(4) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			t.Parallel()
			rng := rand.New(rand.NewPCG(seed, 42))
			var s State
			now := int64(1_700_000_000_731)
			cur := plans[0]
			for range 400 {
				now += []int64{0, 1, rng.Int64N(200), rng.Int64N(2000)}[rng.IntN(4)]
				if rng.IntN(3) == 0 {
					next := plans[rng.IntN(len(plans))]
					old := remainingAt(cur, s, now)
					got := remainingAt(next, s, now)
					if s.Curr > 0 && now < s.Start+s.Prev {
						oc, nc := cur.Capacity(), next.Capacity()
						want := max(0, nc-(oc-old)) // Remaining > 0: exact
						if old == 0 && got > want {
							t.Fatalf("%v -> %v at %d, state %+v: remaining %d, want at most %d", cur, next, now, s, got, want)
						}
						if old > 0 && got != want {
							t.Fatalf("%v -> %v at %d, state %+v: remaining %d, want %d", cur, next, now, s, got, want)
						}
					}
					checkExact(t, next, s, now, costsFor(next))
					cur = next
				}
				costs := costsFor(cur)
				s, _, _ = take(cur, s, now, costs[rng.IntN(len(costs))])
			}
		})
	}
}
