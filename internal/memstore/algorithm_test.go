package memstore

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/window"
)

// The tests of this file drive every algorithm through the store and
// compare it with window.Take on a reference map.

// paris is a time zone whose days start at 23:00 UTC in winter.
var paris = func() *time.Location {
	loc, err := time.LoadLocation("Europe/Paris")
	if err != nil {
		panic(err)
	}
	return loc
}()

// refID names a counter as the store does: Key, Name and the limit's
// Series.
type refID struct {
	key, name string
	series    uint64
}

func refIDOf(c window.Charge) refID { return refID{c.Key, c.Name, c.Limit.Series()} }

// refCounter is a counter of the reference, and when it expires.
type refCounter struct {
	st    window.State
	until int64
}

// reference is what the store must answer: window.Take over a map of
// states that, as in the store, only admitted charges that cost something
// write (each charge that repeats a counter rolled again under its own
// limit before its cost is added), and that a counter no longer affects
// once it has expired (window.ExpiryOf under the limit that charged it
// last).
type reference map[refID]refCounter

// state returns a copy of the counter's state at now.
func (m reference) state(id refID, now int64) window.State {
	c, ok := m[id]
	if !ok || now >= c.until {
		return window.State{}
	}
	st := c.st
	st.Log = slices.Clone(st.Log)
	return st
}

func (m reference) take(now int64, charges []window.Charge) (bool, []window.Decision) {
	states := make([]window.State, len(charges))
	for i, c := range charges {
		states[i] = m.state(refIDOf(c), now)
	}
	out := make([]window.Decision, len(charges))
	ok := window.Take(states, now, charges, out)
	if ok {
		for _, c := range charges {
			if c.Cost == 0 {
				continue
			}
			id := refIDOf(c)
			st, at := c.Limit.Roll(m.state(id, now), now)
			window.Add(&st, at, c.Limit, int64(c.Cost))
			exp := now
			if d := window.ExpiryOf(c.Limit, st, now); d > 0 {
				exp += int64((d + time.Millisecond - 1) / time.Millisecond)
			}
			m[id] = refCounter{st: st, until: exp}
		}
	}
	return ok, out
}

// giveBack gives back, at now, the places of the charges of cs that cost
// something on a token or leaky bucket, as Store.GiveBack does.
func (m reference) giveBack(now int64, cs []window.Charge) {
	for _, c := range cs {
		if a := c.Limit.Algorithm; c.Cost == 0 || a != window.TokenBucket && a != window.LeakyBucket {
			continue
		}
		id := refIDOf(c)
		if rc, ok := m[id]; !ok || now >= rc.until {
			continue
		}
		st, _ := c.Limit.Roll(m.state(id, now), now)
		window.GiveBack(&st, c.Limit, int64(c.Cost))
		exp := now
		if d := window.ExpiryOf(c.Limit, st, now); d > 0 {
			exp += int64((d + time.Millisecond - 1) / time.Millisecond)
		}
		m[id] = refCounter{st: st, until: exp}
	}
}

// giveBackRef gives back cs at now to the store and to the reference, and
// fails t unless the store then holds the reference's states.
func giveBackRef(t *testing.T, s *Store, m reference, now int64, cs []window.Charge) {
	t.Helper()
	if err := s.GiveBack(context.Background(), time.UnixMilli(now), cs); err != nil {
		t.Fatal(err)
	}
	m.giveBack(now, cs)
	for _, c := range cs {
		rc, live := m[refIDOf(c)]
		if !live || now >= rc.until {
			continue
		}
		if got, held := s.stateOfLimit(c.Name, c.Key, c.Limit); !held || !sameState(got, rc.st) {
			t.Fatalf("after giving back %v at T0+%v: store holds %+v (%v), want %+v", cs, time.UnixMilli(now).Sub(t0), got, held, rc.st)
		}
	}
}

// sameState reports whether two states are equal, a nil Log being equal
// to an empty one.
func sameState(a, b window.State) bool {
	return a.Start == b.Start && a.Prev == b.Prev && a.Curr == b.Curr && slices.Equal(a.Log, b.Log)
}

// takeRef charges cs to the store and to the reference at now (Unix ms),
// fails t unless they answer alike, and then checks that the store holds
// the state of every counter charged, as the reference does.
func takeRef(t *testing.T, s *Store, m reference, now int64, cs ...window.Charge) bool {
	t.Helper()
	ok, _ := takeRefOut(t, s, m, now, cs...)
	return ok
}

// takeRefOut is takeRef, which also returns the decisions.
func takeRefOut(t *testing.T, s *Store, m reference, now int64, cs ...window.Charge) (bool, []window.Decision) {
	t.Helper()
	ok, out := take(t, s, time.UnixMilli(now), cs...)
	wantOK, want := m.take(now, cs)
	if ok != wantOK || !slices.Equal(out, want) {
		t.Fatalf("at T0+%v, %v:\n store %v %+v\n  want %v %+v", time.UnixMilli(now).Sub(t0), cs, ok, out, wantOK, want)
	}
	for _, c := range cs {
		rc, live := m[refIDOf(c)]
		if !live || now >= rc.until {
			continue
		}
		got, held := s.stateOfLimit(c.Name, c.Key, c.Limit)
		if !held || !sameState(got, rc.st) {
			t.Fatalf("at T0+%v, %s/%s %s: store holds %+v (%v), want %+v", time.UnixMilli(now).Sub(t0), c.Key, c.Name, c.Limit, got, held, rc.st)
		}
	}
	return ok, out
}

// Limits of every algorithm, 10 a minute.
var (
	sw10 = perMinute(10)
	fw10 = perMinute(10).FixedWindow()
	tb10 = perMinute(10).TokenBucket(0)
	lb10 = perMinute(10).LeakyBucket(0, 0)
	sl10 = perMinute(10).SlidingLog()
)

var algorithmLimits = []window.Limit{sw10, fw10, tb10, lb10, sl10}

// TestAlgorithmsAgainstReference replays a long pseudo-random sequence of
// requests of every algorithm, mixed in one request, repeating counters,
// with plans that change, calendar periods, a clock that mostly goes
// forward and sweeps, and requires the store to answer as the reference
// and hold the same states.
func TestAlgorithmsAgainstReference(t *testing.T) {
	t.Parallel()
	steps := 20_000
	if testing.Short() {
		steps = 3000
	}
	for seed := range uint64(4) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			t.Parallel()
			// Few shards, so that logs of many counters share a table.
			s := newStore(t, Config{Shards: 2, MaxKeys: 1 << 16})
			m := reference{}
			rng := rand.New(rand.NewPCG(seed, 7))
			keys := []string{"a", "b", "c"}
			names := []string{"x", "y"}
			windows := []time.Duration{time.Second, time.Minute, 90 * time.Second, time.Hour}
			randomCharge := func() window.Charge {
				l := window.Limit{Requests: 1 + rng.IntN(12), Window: windows[rng.IntN(len(windows))]}
				switch a := window.Algorithm(rng.IntN(5)); a {
				case window.TokenBucket:
					l.Algorithm, l.Burst = a, rng.IntN(13)
				case window.LeakyBucket:
					l.Algorithm, l.Burst = a, rng.IntN(13)
					if rng.IntN(2) == 0 {
						l.MaxDelay = time.Duration(1+rng.IntN(60)) * time.Second
					}
				case window.FixedWindow:
					l.Algorithm = a
					if rng.IntN(4) == 0 {
						l.Window, l.Period, l.Location = 0, window.CalendarDay, paris
					}
				default:
					l.Algorithm = a
				}
				c := window.Charge{Key: keys[rng.IntN(len(keys))], Name: names[rng.IntN(len(names))], Limit: l, Cost: rng.IntN(5)}
				if rng.IntN(20) == 0 {
					c.Cost = 13 + rng.IntN(5) // more than any limit
				}
				return c
			}
			now, latest := t0.UnixMilli(), t0.UnixMilli()
			for step := range steps {
				switch r := rng.IntN(100); {
				case r < 3:
					// Back, but never to before the expiry of a counter
					// that had expired by the latest instant: the store may
					// have dropped it.
					back := now - rng.Int64N(90_000)
					for _, c := range m {
						if c.until <= latest && c.until > back {
							back = c.until
						}
					}
					now = back
				case r < 60:
					now += rng.Int64N(300)
				case r < 95:
					now += rng.Int64N(5_000)
				default:
					now += rng.Int64N(2 * 3600_000)
				}
				latest = max(latest, now)
				if rng.IntN(50) == 0 {
					s.sweep(time.UnixMilli(now))
				}
				n := 1 + rng.IntN(4)
				cs := make([]window.Charge, 0, n)
				for len(cs) < n {
					c := randomCharge()
					if len(cs) > 0 && rng.IntN(4) == 0 {
						// The same counter again, under its own plan and cost.
						p := cs[rng.IntN(len(cs))]
						c.Key, c.Name, c.Limit.Algorithm, c.Limit.Window, c.Limit.Period, c.Limit.Location = p.Key, p.Name, p.Limit.Algorithm, p.Limit.Window, p.Limit.Period, p.Limit.Location
						if a := c.Limit.Algorithm; a != window.TokenBucket && a != window.LeakyBucket {
							c.Limit.Burst = 0
						}
						if c.Limit.Algorithm != window.LeakyBucket {
							c.Limit.MaxDelay = 0
						}
					}
					cs = append(cs, c)
				}
				if takeRef(t, s, m, now, cs...) && rng.IntN(4) == 0 {
					// The requests that waited give their places back,
					// at once or later.
					back := now + rng.Int64N(3)*rng.Int64N(2000)
					giveBackRef(t, s, m, back, cs)
					latest = max(latest, back)
				}
				if step%500 == 0 {
					checkInvariants(t, s)
				}
			}
			checkInvariants(t, s)
		})
	}
}

// TestDuplicateCharges charges one counter of each algorithm twice in one
// request: each charge is decided on the counter as it was, and both costs
// are counted, for a token bucket as cost * W drops and for a sliding log
// in the one entry of the instant.
func TestDuplicateCharges(t *testing.T) {
	t.Parallel()
	for _, l := range algorithmLimits {
		t.Run(l.Algorithm.String(), func(t *testing.T) {
			t.Parallel()
			s := newStore(t, Config{})
			m := reference{}
			ms := t0.UnixMilli()
			c := func(cost int) window.Charge { return charge("k", l, cost) }
			if !takeRef(t, s, m, ms, c(2), c(3)) {
				t.Fatal("2 + 3 denied")
			}
			// A read first, then a charge: the charge is the one written;
			// then the other way round.
			takeRef(t, s, m, ms+1, c(0), c(1))
			takeRef(t, s, m, ms+1, c(1), c(0))
			// Each fits the counter as it was: 7 + 3 <= 10, so both are
			// admitted and the counter goes above its limit.
			if !takeRef(t, s, m, ms+2, c(3), c(3)) {
				t.Fatal("3 + 3 on 7 denied")
			}
			st, _ := s.stateOfLimit("rule", "k", l)
			switch l.Algorithm {
			case window.TokenBucket, window.LeakyBucket:
				// 13 tokens of 60000 drops, less 2 ms of refill at 10 a ms.
				if want := int64(13*60000 - 2*10); st.Curr != want {
					t.Errorf("level %d, want %d", st.Curr, want)
				}
			case window.SlidingLog:
				want := []window.Entry{{At: ms, N: 5}, {At: ms + 1, N: 2}, {At: ms + 2, N: 6}}
				if !slices.Equal(st.Log, want) || st.Curr != 13 {
					t.Errorf("log %v (sum %d), want %v (13)", st.Log, st.Curr, want)
				}
			default:
				if st.Curr != 13 {
					t.Errorf("count %d, want 13", st.Curr)
				}
			}
			takeRef(t, s, m, ms+3, c(1), c(1))
			if n := s.Len(); n != 1 {
				t.Errorf("Len() = %d, want 1", n)
			}
			checkInvariants(t, s)
		})
	}
	t.Run("plans", func(t *testing.T) {
		t.Parallel()
		// Two plans of one token bucket in one request: the second cost is
		// added after rolling again under its own limit.
		s := newStore(t, Config{})
		m := reference{}
		a := charge("k", perMinute(10).TokenBucket(4), 2)
		b := charge("k", perMinute(600).TokenBucket(20), 5)
		for i := range 20 {
			takeRef(t, s, m, t0.UnixMilli()+int64(i)*700, a, b, a)
		}
	})
}

// TestReadsAndDenialsLeaveAlgorithms checks, for every algorithm, that a
// read and a denied request at a later instant neither change a counter
// nor roll it (a sliding log keeps its entries, in the same memory), which
// shows when the clock goes back to the counter's own instant.
func TestReadsAndDenialsLeaveAlgorithms(t *testing.T) {
	t.Parallel()
	for _, l := range algorithmLimits {
		t.Run(l.Algorithm.String(), func(t *testing.T) {
			t.Parallel()
			s := newStore(t, Config{Shards: 1})
			m := reference{}
			ms := t0.UnixMilli()
			takeRef(t, s, m, ms+10_000, charge("k", l, 4))
			takeRef(t, s, m, ms+30_000, charge("k", l, 3))
			written, _ := s.stateOfLimit("rule", "k", l)
			sh := &s.shards[0]
			rec := *sh.rec(0)
			var slot logSlot
			if l.Algorithm == window.SlidingLog {
				slot = sh.logs.slots[uint32(rec.counts)]
			}
			full := charge("full", perMinute(1), 1)
			takeRef(t, s, m, ms, full)
			for _, at := range []int64{ms + 75_000, ms + 89_000, ms + 30_001} {
				takeRef(t, s, m, at, charge("k", l, 0))
				takeRef(t, s, m, at, charge("k", l, 12))      // above the limit
				takeRef(t, s, m, at, charge("k", l, 1), full) // denied by another
				if got, _ := s.stateOfLimit("rule", "k", l); !sameState(got, written) {
					t.Fatalf("at T0+%v: state %+v, want %+v as written", time.UnixMilli(at).Sub(t0), got, written)
				}
			}
			if got := *sh.rec(0); got.start != rec.start || got.counts != rec.counts || uint32(got.meta) != uint32(rec.meta) {
				t.Errorf("record %+v, want %+v but for its access stamp", got, rec)
			}
			if l.Algorithm == window.SlidingLog {
				now := sh.logs.slots[uint32(rec.counts)]
				if &now.buf[0] != &slot.buf[0] || len(now.buf) != len(slot.buf) || now.curr != slot.curr {
					t.Errorf("log slot moved from %+v to %+v", slot, now)
				}
			}
		})
	}
}

// TestTokenLevels checks the encodings of a token bucket: counted in 1 ms
// ticks, its level is kept whole in a narrow record even far above 2^32;
// in coarser ticks it needs a wide record, which is given back when the
// bucket is full again.
func TestTokenLevels(t *testing.T) {
	t.Parallel()
	day := 24 * time.Hour
	tests := []struct {
		name  string
		l     window.Limit
		cost  int
		wide  bool
		level int64 // the level after the first charge
	}{
		// A token is 30 days = 2,592,000,000 drops: 5 tokens are 1.3e10.
		{name: "month", l: window.Limit{Requests: 10, Window: 30 * day}.TokenBucket(0), cost: 5, level: 5 * 2_592_000_000},
		// 1000 tokens of 3660 days, 3.2e14 drops, full again in 3660 days.
		{name: "longest window", l: window.Limit{Requests: 1000, Window: window.MaxWindow}.TokenBucket(0), cost: 1000, level: 1000 * window.MaxWindow.Milliseconds()},
		// Full again in 8 * 3660 days, beyond the 68 years of a life code.
		{name: "longest life", l: window.Limit{Requests: 1, Window: window.MaxWindow}.TokenBucket(8), cost: 8, wide: true},
		// 1e6 per 3660 days needs ticks above 1 ms.
		{name: "coarse ticks", l: window.Limit{Requests: 1_000_000, Window: window.MaxWindow}.TokenBucket(0), cost: 3, wide: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			s := newStore(t, Config{Shards: 1, MaxKeys: 10})
			sh := &s.shards[0]
			m := reference{}
			ms := t0.UnixMilli()
			takeRef(t, s, m, ms, charge("k", tt.l, tt.cost))
			st, _ := s.stateOfLimit("rule", "k", tt.l)
			if got := len(sh.wide); got != map[bool]int{false: 0, true: 1}[tt.wide] {
				t.Errorf("%d wide records, want wide %v", got, tt.wide)
			}
			if !tt.wide && st.Curr != tt.level {
				t.Errorf("level %d, want %d", st.Curr, tt.level)
			}
			for _, d := range []time.Duration{time.Millisecond, time.Second, time.Hour, day, 10 * day} {
				takeRef(t, s, m, ms+d.Milliseconds(), charge("k", tt.l, 0))
				takeRef(t, s, m, ms+d.Milliseconds(), charge("k", tt.l, 1))
			}
			checkInvariants(t, s)
			// Once full again the bucket expires, and a sweep drops it.
			exp := m[refIDOf(charge("k", tt.l, 0))].until
			if n := s.sweep(time.UnixMilli(exp + 1000)); n != 1 || sh.wide != nil {
				t.Errorf("sweep at expiry dropped %d, wide map %v", n, sh.wide)
			}
		})
	}
}

// TestFixedWindowEncoding checks that a fixed window, of any length or
// calendar period, is a narrow record: its start and count.
func TestFixedWindowEncoding(t *testing.T) {
	t.Parallel()
	s := newStore(t, Config{Shards: 1, MaxKeys: 10})
	m := reference{}
	limits := []window.Limit{
		fw10,
		window.Limit{Requests: 1 << 31, Window: window.MaxWindow}.FixedWindow(),
		{Requests: 7, Algorithm: window.FixedWindow, Period: window.CalendarMonth, Location: paris},
		{Requests: 7, Algorithm: window.FixedWindow, Period: window.CalendarWeek},
	}
	for i, l := range limits {
		for _, d := range []time.Duration{0, time.Minute, 40 * 24 * time.Hour} {
			takeRef(t, s, m, at(d).UnixMilli(), charge(fmt.Sprint(i), l, 3))
		}
	}
	if len(s.shards[0].wide) != 0 {
		t.Errorf("%d wide records, want 0", len(s.shards[0].wide))
	}
	checkInvariants(t, s)
}

// TestConcurrentAlgorithms has many goroutines charge one key of each
// algorithm: exactly the limit is admitted (the burst for the token
// bucket), with time frozen, and for the algorithms whose limit does not
// renew within the test under a clock that moves a millisecond per
// request too, so that a sliding log grows entry by entry.
func TestConcurrentAlgorithms(t *testing.T) {
	t.Parallel()
	const goroutines, attempts, limit = 32, 100, 1000
	tests := []struct {
		l      window.Limit
		moving bool
	}{
		{perHour(limit), false},
		{perHour(limit).FixedWindow(), false},
		{perHour(10).TokenBucket(limit), false},
		{perHour(10).LeakyBucket(limit-1, 0), false},
		{perHour(limit).SlidingLog(), false},
		{perHour(limit), true},
		{perHour(limit).FixedWindow(), true},
		{perHour(limit).SlidingLog(), true},
	}
	for _, tt := range tests {
		l := tt.l
		t.Run(fmt.Sprint(l, map[bool]string{false: " frozen", true: " moving"}[tt.moving]), func(t *testing.T) {
			t.Parallel()
			var clock atomic.Int64
			now := func() time.Time {
				if tt.moving {
					return at(time.Duration(clock.Add(1)) * time.Millisecond)
				}
				return t0
			}
			s := newStore(t, Config{Now: now, Shards: 2, MaxKeys: 1024})
			var admitted atomic.Int64
			var wg sync.WaitGroup
			for g := range goroutines {
				wg.Go(func() {
					// Every goroutine also charges a key of its own, and
					// reads the hot one.
					cs := []window.Charge{charge("hot", l, 1), charge(fmt.Sprint("own", g), l, 1)}
					read := []window.Charge{charge("hot", l, 0)}
					out := make([]window.Decision, 2)
					for range attempts {
						ok, err := s.Take(context.Background(), time.Time{}, cs, out)
						if err != nil {
							t.Error(err)
							return
						}
						if ok {
							admitted.Add(1)
						}
						if _, err := s.Take(context.Background(), time.Time{}, read, out[:1]); err != nil {
							t.Error(err)
							return
						}
					}
				})
			}
			wg.Wait()
			if got := admitted.Load(); got != limit {
				t.Errorf("%d admitted, want exactly %d", got, limit)
			}
			checkInvariants(t, s)
		})
	}
}

// TestLogBuffer follows the buffer of one sliding log through a burst, a
// long steady stream at the limit and a quiet spell: it never holds more
// than the limit's Requests entries, in a buffer at most a sixteenth (plus
// the allocator's rounding) larger, and gives its memory back once the log
// shrinks.
func TestLogBuffer(t *testing.T) {
	t.Parallel()
	const requests = 1000
	l := window.Limit{Requests: requests, Window: time.Second}.SlidingLog()
	s := newStore(t, Config{Shards: 1, MaxKeys: 10})
	sh := &s.shards[0]
	m := reference{}
	// slot returns the log's buffer, its offset there and its length.
	slot := func() ([]window.Entry, uint32, uint32) {
		r := sh.rec(0)
		sl := &sh.logs.slots[uint32(r.counts)]
		off := uint32(r.meta)
		return sl.buf[:cap(sl.buf)], off, uint32(len(sl.buf)) - off
	}
	most := cap(slices.Grow([]window.Entry(nil), logRoom(requests, requests)))
	ms := t0.UnixMilli()
	moves, grows := 0, 0
	var last *window.Entry
	var lastOff uint32
	check := func(i int) {
		t.Helper()
		buf, off, n := slot()
		if n > requests || len(buf) > most {
			t.Fatalf("request %d: %d entries in a buffer of %d, want at most %d in %d", i, n, len(buf), requests, most)
		}
		if i >= requests && int(off+n) >= len(buf) {
			t.Fatalf("request %d: no room left after the full log", i)
		}
		if &buf[0] != last {
			grows++
		} else if off < lastOff {
			moves++
		}
		last, lastOff = &buf[0], off
	}
	// 1000 requests in distinct milliseconds, then 5 s at the limit: one
	// request a millisecond, each admitted as the oldest entry leaves.
	for i := range 6000 {
		now := ms + int64(i)
		if !takeRef(t, s, m, now, charge("k", l, 1)) && i >= requests {
			t.Fatalf("request %d at the limit denied", i)
		}
		if i%97 == 0 {
			checkInvariants(t, s)
		}
		check(i)
	}
	buf, _, n := slot()
	t.Logf("buffer of %d entries for a log of %d: %d allocations, %d moves to the front in 6000 requests", len(buf), n, grows, moves)
	if grows > 20 {
		t.Errorf("%d buffers allocated, want the buffer to settle", grows)
	}
	// Then one request every 100 ms: the log shrinks to 10 entries, and
	// its buffer with it.
	ms += 6000
	for i := range 30 {
		takeRef(t, s, m, ms+int64(i)*100, charge("k", l, 1))
	}
	if buf, _, n := slot(); n != 10 || len(buf) > 4*10+16 {
		t.Errorf("%d entries in a buffer of %d, want 10 in at most %d", n, len(buf), 4*10+16)
	}
	checkInvariants(t, s)
}

// TestLogsEvictedAndSwept checks that the logs of counters evicted or
// swept give their slots and buffers back, and that slots serve again.
func TestLogsEvictedAndSwept(t *testing.T) {
	t.Parallel()
	s := newStore(t, Config{Shards: 1, MaxKeys: 50})
	sh := &s.shards[0]
	l := perSecond(20).SlidingLog()
	for i := range 500 {
		for j := range 5 {
			take(t, s, at(time.Duration(i*10+j)*time.Millisecond), charge(fmt.Sprint(i), l, 1))
		}
	}
	checkInvariants(t, s)
	if n := s.Len(); n != 50 {
		t.Errorf("Len() = %d, want 50", n)
	}
	if got := len(sh.logs.slots); got > 50 {
		t.Errorf("%d log slots for 50 logs", got)
	}
	// Half of the logs held are kept alive, the others expire and are
	// swept.
	var held []string
	for i := range 500 {
		if k := fmt.Sprint(i); s.hasLimit("rule", k, l) {
			held = append(held, k)
		}
	}
	kept := 0
	for i := 0; i < len(held); i += 2 {
		take(t, s, at(6*time.Second), charge(held[i], l, 1))
		kept++
	}
	if n := s.sweep(at(6 * time.Second)); n != len(held)-kept {
		t.Errorf("sweep dropped %d, want %d", n, len(held)-kept)
	}
	checkInvariants(t, s)
	if live := len(sh.logs.slots) - len(sh.logs.unused); live != kept {
		t.Errorf("%d live log slots, want %d", live, kept)
	}
	s.sweep(at(time.Hour))
	if sh.logs != nil || s.Len() != 0 {
		t.Errorf("after every log expired: Len() = %d, log table %v", s.Len(), sh.logs)
	}
}

// TestLogTableRenumbered checks that a sweep that leaves few logs in a
// large table rebuilds it, renumbering the records.
func TestLogTableRenumbered(t *testing.T) {
	t.Parallel()
	s := newStore(t, Config{Shards: 1, MaxKeys: 1000})
	sh := &s.shards[0]
	short, long := perSecond(5).SlidingLog(), perHour(5).SlidingLog()
	m := reference{}
	for i := range 1000 {
		l := short
		if i%100 == 0 {
			l = long
		}
		takeRef(t, s, m, t0.UnixMilli(), charge(fmt.Sprint(i), l, 2))
	}
	s.sweep(at(time.Second))
	checkInvariants(t, s)
	if len(sh.logs.slots) != 10 || len(sh.logs.unused) != 0 {
		t.Errorf("%d log slots, %d free, want 10 and 0", len(sh.logs.slots), len(sh.logs.unused))
	}
	for i := 0; i < 1000; i += 100 {
		takeRef(t, s, m, at(time.Second).UnixMilli(), charge(fmt.Sprint(i), long, 1))
	}
}

// TestAllocsAlgorithms checks that Take allocates nothing on existing
// counters of every algorithm, a sliding log included, once its buffer
// has room.
func TestAllocsAlgorithms(t *testing.T) {
	s := newStore(t, Config{})
	ctx := context.Background()
	for _, l := range []window.Limit{
		perHour(1 << 30).FixedWindow(),
		perHour(1 << 30).TokenBucket(0),
		perHour(1<<30).LeakyBucket(0, 0),
		perSecond(1000).SlidingLog(),
		{Requests: 1 << 30, Algorithm: window.FixedWindow, Period: window.CalendarDay},
	} {
		c := []window.Charge{charge("k", l, 1)}
		out := make([]window.Decision, 1)
		clock := t0
		next := func() {
			clock = clock.Add(time.Millisecond)
			if ok, err := s.Take(ctx, clock, c, out); !ok || err != nil {
				t.Fatalf("%s: %v, %v", l, ok, err)
			}
		}
		for range 2000 {
			next()
		}
		if allocs := testing.AllocsPerRun(500, next); allocs != 0 {
			t.Errorf("%s: %v allocations per Take, want 0", l, allocs)
		}
	}
}

// TestTokenBucketPlanAfterExpiry checks what a token bucket is once it has
// expired, full again under the plan that charged it last: absent, even to
// a slower plan, under which rolling its old level would leave it part
// empty (see the package doc, Expiry).
func TestTokenBucketPlanAfterExpiry(t *testing.T) {
	t.Parallel()
	s := newStore(t, Config{})
	m := reference{}
	fast, slow := perMinute(600).TokenBucket(10), perMinute(1).TokenBucket(10)
	ms := t0.UnixMilli()
	takeRef(t, s, m, ms, charge("k", fast, 10)) // full again 1 s later
	_, out := take(t, s, at(2*time.Second), charge("k", slow, 1))
	if !out[0].Allowed || out[0].Remaining != 9 {
		t.Errorf("slow plan after the fast one expired: %+v, want allowed with 9 remaining", out[0])
	}
	// Rolled at 1 drop a ms, the old level of 600,000 would be 598,000.
	st, at := slow.Roll(window.State{Start: ms, Prev: 1, Curr: 600_000}, ms+2000)
	if window.Fits(st, at, slow, 1) {
		t.Errorf("rolling the old level under the slow plan: %+v fits", st)
	}
}

// TestAlgorithmsApart checks that one Name and Key count apart under each
// algorithm and calendar period of one window, and alike under different
// plans of one algorithm.
func TestAlgorithmsApart(t *testing.T) {
	t.Parallel()
	s := newStore(t, Config{})
	day := window.Limit{Requests: 10, Algorithm: window.FixedWindow, Period: window.CalendarDay}
	limits := append(slices.Clone(algorithmLimits), day, window.Limit{Requests: 10, Algorithm: window.FixedWindow, Period: window.CalendarDay, Location: paris})
	for i, l := range limits {
		take(t, s, t0, charge("k", l, i+1))
	}
	for i, l := range limits {
		l.Requests = 20
		if l.Algorithm == window.TokenBucket {
			l.Burst = 10 // the same capacity, a faster refill
		}
		if got, want := remaining(t, s, t0, "k", l), l.Capacity()-(i+1); got != want {
			t.Errorf("%s: remaining %d, want %d", l, got, want)
		}
	}
	if n := s.Len(); n != len(limits) {
		t.Errorf("Len() = %d, want %d", n, len(limits))
	}
}

// TestGiveBack checks that a request admitted with a Delay by a leaky
// bucket gives its place back, so that the next request waits less, and
// that GiveBack creates nothing and leaves other algorithms alone.
func TestGiveBack(t *testing.T) {
	t.Parallel()
	s := newStore(t, Config{})
	m := reference{}
	lb := perSecond(1).LeakyBucket(5, 0)
	ms := t0.UnixMilli()
	for _, want := range []time.Duration{0, time.Second, 2 * time.Second} {
		if _, out := takeRefOut(t, s, m, ms, charge("k", lb, 1)); out[0].Delay != want {
			t.Errorf("delay %v, want %v", out[0].Delay, want)
		}
	}
	// The third request (a 2 s wait) leaves; the next one takes its turn.
	giveBackRef(t, s, m, ms, []window.Charge{charge("k", lb, 1)})
	if _, out := takeRefOut(t, s, m, ms, charge("k", lb, 1)); out[0].Delay != 2*time.Second {
		t.Errorf("delay after a place was given back: %v, want 2s", out[0].Delay)
	}
	// Never below empty, never a new counter, nothing for the others.
	giveBackRef(t, s, m, ms+500, []window.Charge{charge("k", lb, 5), charge("k", lb, 5)})
	if st, _ := s.stateOfLimit("rule", "k", lb); st.Curr != 0 {
		t.Errorf("level %d after giving back more than was spent, want 0", st.Curr)
	}
	take(t, s, t0, charge("k", sw10, 3), charge("k", tb10, 3))
	before := s.Len()
	giveBackRef(t, s, m, ms, []window.Charge{charge("new", lb, 1), charge("k", sw10, 3)})
	if s.Len() != before {
		t.Errorf("Len() = %d after giving back, want %d", s.Len(), before)
	}
	if got := remaining(t, s, t0, "k", sw10); got != 7 {
		t.Errorf("sliding window remaining %d after a give back, want 7 (untouched)", got)
	}
	if err := s.GiveBack(context.Background(), t0, []window.Charge{charge("k", tb10, 2)}); err != nil {
		t.Fatal(err)
	}
	if got := remaining(t, s, t0, "k", tb10); got != 9 {
		t.Errorf("token bucket remaining %d after 2 of 3 were given back, want 9", got)
	}
	if err := s.GiveBack(context.Background(), t0, []window.Charge{charge("k", lb, -1)}); err == nil {
		t.Errorf("GiveBack of a negative cost: no error")
	}
	checkInvariants(t, s)
}
