package redisstore

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/internal/window"
)

// The algorithms' cross-check: one table of requests at fixed instants,
// decided by window.Take over states kept in a Go map (the reference) and
// by the store on a real server, which must agree on every field of every
// Decision.

var (
	newYork = mustLoad("America/New_York")
	havana  = mustLoad("America/Havana")
)

func mustLoad(name string) *time.Location {
	loc, err := time.LoadLocation(name)
	if err != nil {
		panic(err)
	}
	return loc
}

// Limits of each algorithm.
func swl(n int, w time.Duration) window.Limit { return window.Limit{Requests: n, Window: w} }
func fxl(n int, w time.Duration) window.Limit {
	return window.Limit{Requests: n, Window: w, Algorithm: window.FixedWindow}
}
func call(n int, p window.Period, loc *time.Location) window.Limit {
	return window.Limit{Requests: n, Algorithm: window.FixedWindow, Period: p, Location: loc}
}
func tbl(n int, w time.Duration, burst int) window.Limit {
	return window.Limit{Requests: n, Window: w, Algorithm: window.TokenBucket, Burst: burst}
}
func lkl(n int, w time.Duration, queue int, maxDelay time.Duration) window.Limit {
	return window.Limit{Requests: n, Window: w, Algorithm: window.LeakyBucket, Burst: queue, MaxDelay: maxDelay}
}
func sll(n int, w time.Duration) window.Limit {
	return window.Limit{Requests: n, Window: w, Algorithm: window.SlidingLog}
}

// xstep is one request of the cross-check.
type xstep struct {
	at      time.Time
	charges []window.Charge
}

func xc(key, name string, l window.Limit, cost int) window.Charge {
	return window.Charge{Key: key, Name: name, Limit: l, Cost: cost}
}

func at(t time.Time, charges ...window.Charge) xstep { return xstep{t, charges} }

// reference is window.Take over a map of states. As in every store, only
// admitted charges with a cost change a counter, and a counter that two
// charges name gets both costs, each rolled in under its own limit.
type reference map[refID]window.State

type refID struct {
	key, name string
	series    uint64
}

func (m reference) state(c window.Charge) window.State {
	st := m[refID{c.Key, c.Name, c.Limit.Series()}]
	st.Log = slices.Clone(st.Log)
	return st
}

func (m reference) take(now time.Time, charges []window.Charge, out []window.Decision) bool {
	states := make([]window.State, len(charges))
	for i, c := range charges {
		states[i] = m.state(c)
	}
	ms := window.Millis(now)
	ok := window.Take(states, ms, charges, out)
	if ok {
		for _, c := range charges {
			if c.Cost > 0 {
				st, t := c.Limit.Roll(m.state(c), ms)
				window.Add(&st, t, c.Limit, int64(c.Cost))
				m[refID{c.Key, c.Name, c.Limit.Series()}] = st
			}
		}
	}
	return ok
}

// crossCheckTable returns the table. Sections use keys of their own and go
// forward in time, except where a step says the clock went back; a step
// never goes back to before a counter's expiry, since Redis drops expired
// counters in real time. Windows are long enough that no counter expires
// in real time while the test runs.
func crossCheckTable() []xstep {
	T := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	s, ms, m, h := time.Second, time.Millisecond, time.Minute, time.Hour
	var steps []xstep
	add := func(st ...xstep) { steps = append(steps, st...) }

	// Sliding window: 5/min, 100/h with costs, and the clock going back.
	sw5, sw100 := swl(5, m), swl(100, h)
	for i := 0; i < 6; i++ {
		add(at(T.Add(10*s), xc("sw", "a", sw5, 1)))
	}
	add(at(T.Add(40*s), xc("sw", "a", sw5, 0)),
		at(T.Add(75*s), xc("sw", "a", sw5, 2)),
		at(T.Add(81999*ms), xc("sw", "a", sw5, 1)),
		at(T.Add(30*s), xc("sw", "a", sw5, 1)), // back into the first window
		at(T.Add(30*s), xc("sw", "a", sw5, 0)),
		at(T.Add(95*s), xc("sw", "a", sw5, 9)), // above the limit
		at(T.Add(200*s), xc("sw", "a", sw5, 3)),
		at(T.Add(5*m), xc("sw", "b", sw100, 40)),
		at(T.Add(6*m), xc("sw", "b", sw100, 40)),
		at(T.Add(7*m), xc("sw", "b", sw100, 30)),
		at(T.Add(65*m), xc("sw", "b", sw100, 30)),
		at(T.Add(95*m), xc("sw", "b", sw100, 30)))

	// Fixed windows aligned to the epoch: 3/min and 7 per 90 s.
	fx3, fx7 := fxl(3, m), fxl(7, 90*s)
	add(at(T.Add(10*s), xc("fx", "a", fx3, 1)),
		at(T.Add(20*s), xc("fx", "a", fx3, 2)),
		at(T.Add(30*s), xc("fx", "a", fx3, 1)),
		at(T.Add(59999*ms), xc("fx", "a", fx3, 0)),
		at(T.Add(60*s), xc("fx", "a", fx3, 2)),
		at(T.Add(50*s), xc("fx", "a", fx3, 1)), // back: decided in the count's window
		at(T.Add(50*s), xc("fx", "a", fx3, 1)),
		at(T.Add(61*s), xc("fx", "a", fx3, 4)), // above the limit
		at(T.Add(121*s), xc("fx", "a", fx3, 3)),
		at(T.Add(100*s), xc("fx", "b", fx7, 5)),
		at(T.Add(170*s), xc("fx", "b", fx7, 3)),
		at(T.Add(179999*ms), xc("fx", "b", fx7, 2)),
		at(T.Add(180*s), xc("fx", "b", fx7, 2)),
		at(T.Add(181*s), xc("fx", "b", fx7, 6)))

	// Calendar periods in New York, across the end of February and the
	// start of daylight-saving time on Sunday 10 March 2030 (02:00 EST
	// becomes 03:00 EDT: a day of 23 hours, in a week of 167).
	ny := func(mo time.Month, d, hh, mm int) time.Time { return time.Date(2030, mo, d, hh, mm, 0, 0, newYork) }
	day, week, month := call(3, window.CalendarDay, newYork), call(5, window.CalendarWeek, newYork), call(4, window.CalendarMonth, newYork)
	add(at(ny(2, 27, 12, 0), xc("cal", "d", day, 2), xc("cal", "w", week, 2), xc("cal", "m", month, 2)),
		at(ny(2, 28, 23, 0), xc("cal", "d", day, 2), xc("cal", "w", week, 2), xc("cal", "m", month, 2)),
		at(ny(2, 28, 23, 30), xc("cal", "d", day, 1), xc("cal", "m", month, 1)),
		at(ny(2, 28, 23, 59).Add(59999*ms), xc("cal", "m", month, 1)),
		at(ny(3, 1, 0, 0), xc("cal", "d", day, 3), xc("cal", "w", week, 1), xc("cal", "m", month, 3)),
		at(ny(2, 28, 23, 45), xc("cal", "d", day, 1)), // back into February
		at(ny(3, 1, 0, 1), xc("cal", "m", month, 2)),
		at(ny(3, 3, 23, 59), xc("cal", "w", week, 1)),
		at(ny(3, 4, 0, 0), xc("cal", "w", week, 5)), // Monday: a new week
		at(ny(3, 9, 23, 0), xc("cal", "d", day, 3), xc("cal", "w", week, 0)),
		at(ny(3, 10, 0, 0), xc("cal", "d", day, 2)),
		at(ny(3, 10, 1, 59), xc("cal", "d", day, 1)),
		at(ny(3, 10, 3, 0), xc("cal", "d", day, 1), xc("cal", "w", week, 1)),
		at(ny(3, 10, 23, 59), xc("cal", "d", day, 1), xc("cal", "w", week, 1)),
		at(ny(3, 11, 0, 0), xc("cal", "d", day, 1), xc("cal", "w", week, 1)),
		at(ny(3, 31, 23, 0), xc("cal", "m", month, 4)),
		at(ny(4, 1, 0, 0), xc("cal", "m", month, 4)),
		// The end of daylight-saving time: 3 November has 25 hours.
		at(ny(11, 2, 23, 30), xc("cal", "d", day, 3), xc("cal", "m", month, 3)),
		at(ny(11, 3, 0, 0), xc("cal", "d", day, 3), xc("cal", "m", month, 3)),
		at(ny(11, 3, 1, 30), xc("cal", "d", day, 1)),
		at(ny(11, 3, 1, 30).Add(h), xc("cal", "d", day, 1)), // the second 01:30
		at(ny(11, 3, 23, 59), xc("cal", "d", day, 1)),
		at(ny(11, 4, 0, 0), xc("cal", "d", day, 2)))
	// Havana changes time at midnight: 10 March 2030 has none (23:59:59
	// CST is followed by 01:00 CDT), and 3 November 2030 has two (00:59:59
	// CDT is followed by 00:00 CST).
	hday := call(2, window.CalendarDay, havana)
	hav := func(d, hh, mm int) time.Time { return time.Date(2030, 11, d, hh, mm, 0, 0, havana) }
	hmar := func(d, hh, mm int) time.Time {
		return time.Date(2030, 3, 9, 0, 0, 0, 0, havana).Add(time.Duration((d-9)*24*60+hh*60+mm) * time.Minute)
	}
	add(at(hmar(9, 22, 0), xc("hav", "d", hday, 1)),
		at(hmar(9, 23, 30), xc("hav", "d", hday, 1)),
		at(hmar(9, 23, 59), xc("hav", "d", hday, 1)),
		at(hmar(10, 0, 0), xc("hav", "d", hday, 2)), // 01:00 CDT, the first instant of 10 March
		at(hmar(10, 0, 30), xc("hav", "d", hday, 1)),
		at(hmar(9, 23, 0), xc("hav", "d", hday, 0)), // back into 9 March
		at(hmar(10, 23, 30), xc("hav", "d", hday, 2)),
		at(hav(2, 22, 0), xc("hav", "d", hday, 2)),
		at(hav(3, 0, 30), xc("hav", "d", hday, 1)),
		at(hav(3, 0, 30).Add(h), xc("hav", "d", hday, 1)),
		at(hav(3, 0, 30).Add(h), xc("hav", "d", hday, 1)),
		at(hav(3, 23, 59), xc("hav", "d", hday, 1)),
		at(hav(4, 0, 0), xc("hav", "d", hday, 2)))

	// Token buckets: 6/min holding 3 (ticks of 1 ms); 1e9/h (ticks of
	// 2 ms, so instants inside a tick); a bucket whose burst is lowered
	// (the level is capped) and one whose refill is raised so much that
	// its tick changes (the level is re-expressed); the clock going back.
	tb6, tbBig := tbl(6, m, 3), tbl(1e9, h, 0)
	add(at(T, xc("tb", "a", tb6, 1)),
		at(T, xc("tb", "a", tb6, 2)),
		at(T, xc("tb", "a", tb6, 1)),
		at(T.Add(9999*ms), xc("tb", "a", tb6, 1)),
		at(T.Add(10*s), xc("tb", "a", tb6, 1)),
		at(T.Add(5*s), xc("tb", "a", tb6, 0)), // back
		at(T.Add(5*s), xc("tb", "a", tb6, 1)),
		at(T.Add(40*s), xc("tb", "a", tb6, 4)), // above the burst
		at(T.Add(40*s), xc("tb", "a", tb6, 3)),
		at(T.Add(55*s), xc("tb", "a", tb6, 1)),
		at(T.Add(3*m), xc("tb", "a", tb6, 0)),
		at(T, xc("tb", "big", tbBig, 600_000_000)),
		at(T.Add(1*ms), xc("tb", "big", tbBig, 400_000_001)),
		at(T.Add(2*ms), xc("tb", "big", tbBig, 400_000_001)),
		at(T.Add(3*ms), xc("tb", "big", tbBig, 1)),
		at(T.Add(5*ms), xc("tb", "big", tbBig, 999_999_999)),
		at(T.Add(time.Minute+1*ms), xc("tb", "big", tbBig, 0)),
		at(T.Add(time.Minute+1*ms), xc("tb", "big", tbBig, 1_000_000_001)),
		at(T, xc("tb", "cap", tbl(10, h, 10), 10)),
		at(T.Add(ms), xc("tb", "cap", tbl(10, h, 2), 0)),
		at(T.Add(6*m), xc("tb", "cap", tbl(10, h, 2), 1)),
		at(T.Add(13*m), xc("tb", "cap", tbl(10, h, 2), 1)),
		at(T.Add(13*m), xc("tb", "cap", tbl(10, h, 10), 0)),
		// 10/h holding 100 (ticks of 1 ms), then holding 4e9 (ticks of
		// 5 ms): the same refill, re-expressed.
		at(T.Add(ms), xc("tb", "tick", tbl(10, h, 100), 50)),
		at(T.Add(7*ms), xc("tb", "tick", tbl(10, h, 4e9), 0)),
		at(T.Add(8*ms), xc("tb", "tick", tbl(10, h, 4e9), 1000)),
		at(T.Add(3*ms), xc("tb", "tick", tbl(10, h, 4e9), 0)), // back, before the level's tick
		at(T.Add(time.Second), xc("tb", "tick", tbl(10, h, 4e9), 3_999_998_950)),
		at(T.Add(time.Second), xc("tb", "tick", tbl(10, h, 4e9), 3_999_998_951)),
		// Back to ticks of 1 ms with a capacity of 100: the level is
		// capped at 101 tokens as it is re-expressed.
		at(T.Add(2*time.Second), xc("tb", "tick", tbl(10, h, 100), 1)),
		at(T.Add(2*time.Second), xc("tb", "tick", tbl(10, h, 100), 0)),
		at(T.Add(10*m), xc("tb", "tick", tbl(10, h, 4e9), 1)),
		// A refill raised so much that the tick changes: the level drains
		// at once.
		at(T, xc("tb", "fast", tbl(3600, h, 0), 2000)),
		at(T.Add(7*ms), xc("tb", "fast", tbl(4e9, h, 3600), 0)),
		at(T.Add(7*ms), xc("tb", "fast", tbl(4e9, h, 3600), 3600)),
		at(T.Add(8*ms), xc("tb", "fast", tbl(4e9, h, 3600), 1)))

	// Leaky buckets: 2/s with a queue of 3 and waits of at most 1 s; 6/min
	// with a queue of 6 and no bound on the wait; 1e9/h (ticks of 2 ms)
	// with a wait of at most 3 ms; the clock going back.
	lk2, lk6, lkBig := lkl(2, s, 3, s), lkl(6, m, 0, 0), lkl(1e9, h, 0, 3*ms)
	for i := 0; i < 5; i++ {
		add(at(T.Add(time.Duration(i)*ms), xc("lk", "a", lk2, 1)))
	}
	add(at(T.Add(499*ms), xc("lk", "a", lk2, 1)),
		at(T.Add(500*ms), xc("lk", "a", lk2, 1)),
		at(T.Add(400*ms), xc("lk", "a", lk2, 0)), // back
		at(T.Add(400*ms), xc("lk", "a", lk2, 2)),
		at(T.Add(3*s), xc("lk", "a", lk2, 5)), // above the queue
		at(T.Add(3*s), xc("lk", "a", lk2, 4)),
		at(T.Add(3*s), xc("lk", "a", lk2, 1)),
		at(T, xc("lk", "b", lk6, 3)),
		at(T.Add(s), xc("lk", "b", lk6, 4)),
		at(T.Add(2*s), xc("lk", "b", lk6, 1)),
		at(T.Add(20*s), xc("lk", "b", lk6, 2)),
		at(T.Add(20*s), xc("lk", "b", lk6, 0)),
		at(T, xc("lk", "big", lkBig, 1)),
		at(T, xc("lk", "big", lkBig, 1_000_000)),
		at(T.Add(ms), xc("lk", "big", lkBig, 1_000_000)),
		at(T.Add(ms), xc("lk", "big", lkBig, 1)),
		at(T.Add(2*ms), xc("lk", "big", lkBig, 1)))

	// Sliding logs: 3/min with costs, a long run of 20/min with costs at
	// many instants, a log of 100,000 (MaxLog), the clock going back.
	sl3, sl20 := sll(3, m), sll(20, m)
	add(at(T, xc("sl", "a", sl3, 2)),
		at(T.Add(20*s), xc("sl", "a", sl3, 1)),
		at(T.Add(30*s), xc("sl", "a", sl3, 1)),
		at(T.Add(59999*ms), xc("sl", "a", sl3, 2)),
		at(T.Add(60*s), xc("sl", "a", sl3, 2)),
		at(T.Add(50*s), xc("sl", "a", sl3, 0)), // back: decided at the newest entry
		at(T.Add(50*s), xc("sl", "a", sl3, 1)),
		at(T.Add(79999*ms), xc("sl", "a", sl3, 1)),
		at(T.Add(80*s), xc("sl", "a", sl3, 1)),
		at(T.Add(80*s), xc("sl", "a", sl3, 4)), // above the limit
		at(T.Add(80*s), xc("sl", "a", sl3, 0)))
	for i := 0; i < 60; i++ {
		add(at(T.Add(time.Duration(i*i%97+i*1500)*ms), xc("sl", "b", sl20, i%4)))
	}
	big := sll(100_000, h)
	big.MaxLog = 100_000
	add(at(T, xc("sl", "big", big, 99_999)),
		at(T.Add(ms), xc("sl", "big", big, 2)),
		at(T.Add(ms), xc("sl", "big", big, 1)),
		at(T.Add(h), xc("sl", "big", big, 2)),
		at(T.Add(h+ms), xc("sl", "big", big, 100_000)))

	// Large values, exact: 2^50 a day in fixed windows, 1e12 per 366 days
	// in a sliding window (ticks of about 3 hours), a token bucket of 2^50
	// an hour (2 ticks a window).
	fxBig, swBig, tbHuge := fxl(1<<50, 24*h), swl(1e12, 366*24*h), tbl(1<<50, h, 0)
	add(at(T.Add(h), xc("big", "fx", fxBig, 1<<50-1), xc("big", "sw", swBig, 999_999_999_999), xc("big", "tb", tbHuge, 1<<49)),
		at(T.Add(2*h), xc("big", "fx", fxBig, 2), xc("big", "sw", swBig, 2), xc("big", "tb", tbHuge, 1<<49+1)),
		at(T.Add(2*h), xc("big", "fx", fxBig, 1), xc("big", "sw", swBig, 1), xc("big", "tb", tbHuge, 1<<49)),
		at(T.Add(25*h), xc("big", "fx", fxBig, 1<<50), xc("big", "sw", swBig, 0), xc("big", "tb", tbHuge, 1<<50)))

	// Requests combining algorithms, on one Key (one script run) and on
	// several (one run per Key on Redis Cluster, with refunds when a
	// later Key denies).
	mixed := func(k1, k2, k3, k4 string, cost int) []window.Charge {
		return []window.Charge{
			xc(k1, "sw", swl(10, m), cost),
			xc(k2, "tb", tbl(2, m, 2), cost),
			xc(k3, "fx", fxl(5, h), cost),
			xc(k4, "sl", sll(3, m), cost),
			xc(k3, "cal", call(4, window.CalendarDay, newYork), cost),
			xc(k1, "lk", lkl(3, m, 2, 30*s), cost),
		}
	}
	for _, keys := range [][4]string{{"m", "m", "m", "m"}, {"m1", "m2", "m3", "m4"}, {"n4", "n3", "n2", "n1"}} {
		k1, k2, k3, k4 := keys[0], keys[1], keys[2], keys[3]
		add(at(T.Add(h), mixed(k1, k2, k3, k4, 1)...),
			at(T.Add(h+s), mixed(k1, k2, k3, k4, 1)...),
			at(T.Add(h+2*s), mixed(k1, k2, k3, k4, 1)...), // the bucket denies
			at(T.Add(h+3*s), mixed(k1, k2, k3, k4, 0)...),
			at(T.Add(h+30*s), mixed(k1, k2, k3, k4, 1)...),
			at(T.Add(h+40*s), mixed(k1, k2, k3, k4, 1)...), // the log denies
			at(T.Add(h+61*s), mixed(k1, k2, k3, k4, 2)...),
			at(T.Add(h+2*m), mixed(k1, k2, k3, k4, 1)...),
			at(T.Add(h+2*m), mixed(k1, k2, k3, k4, 0)...),
			// Two charges on each counter.
			at(T.Add(h+3*m), append(mixed(k1, k2, k3, k4, 1), mixed(k1, k2, k3, k4, 1)...)...),
			at(T.Add(h+4*m), append(mixed(k1, k2, k3, k4, 1), mixed(k1, k2, k3, k4, 0)...)...),
			at(T.Add(h+5*m), append(mixed(k1, k2, k3, k4, 1), mixed(k1, k2, k3, k4, 1)...)...),
			at(T.Add(h+6*m), mixed(k1, k2, k3, k4, 0)...))
	}
	// One counter named three times with different bursts: each charge is
	// rolled in under its own limit (the level is capped in between).
	add(at(T, xc("dup", "t", tbl(6, h, 5), 4), xc("dup", "t", tbl(6, h, 5), 4), xc("dup", "t", tbl(6, h, 2), 1)),
		at(T.Add(m), xc("dup", "t", tbl(6, h, 12), 0)),
		at(T.Add(m), xc("dup", "t", tbl(6, h, 12), 8)))
	return steps
}

// TestCrossCheck drives the table through the reference and through the
// store, on a standalone server and on Redis Cluster, and requires the
// same answers; it also checks that the table reaches both admissions and
// denials of every algorithm.
func TestCrossCheck(t *testing.T) {
	t.Parallel()
	run := func(t *testing.T, client redis.UniversalClient, prefix string) {
		s := newTestStore(t, client, prefix)
		ref := reference{}
		charged := map[refID]window.Charge{}
		type tally struct{ allowed, denied int }
		seen := map[string]*tally{}
		ctx := context.Background()
		for i, st := range crossCheckTable() {
			want := make([]window.Decision, len(st.charges))
			wantOK := ref.take(st.at, st.charges, want)
			got := make([]window.Decision, len(st.charges))
			ok, err := s.Take(ctx, st.at, st.charges, got)
			if err != nil {
				t.Fatalf("step %d at %s: %v", i, st.at, err)
			}
			if ok != wantOK || !slices.Equal(got, want) {
				t.Fatalf("step %d at %s (%s):\n got %v %+v\nwant %v %+v", i, st.at.UTC().Format(time.RFC3339Nano),
					chargesString(st.charges), ok, got, wantOK, want)
			}
			for j, c := range st.charges {
				if ok && c.Cost > 0 {
					charged[refID{c.Key, c.Name, c.Limit.Series()}] = c
				}
				a := c.Limit.Algorithm.String()
				if c.Limit.Period != window.NoPeriod {
					a += "/" + c.Limit.Period.String()
				}
				if seen[a] == nil {
					seen[a] = &tally{}
				}
				if got[j].Allowed {
					seen[a].allowed++
				} else {
					seen[a].denied++
				}
			}
		}
		for a, n := range seen {
			if n.allowed == 0 || n.denied == 0 {
				t.Errorf("%s: %d allowed and %d denied; the table should reach both", a, n.allowed, n.denied)
			}
		}
		if len(seen) != 8 {
			t.Errorf("the table reaches %d algorithms and periods, want 8: %v", len(seen), seen)
		}
		// Every counter holds exactly the reference's state, and says
		// when it stops mattering as window.ExpiryOf does (unless it was
		// already dropped as expired).
		found := 0
		for id, c := range charged {
			v, ok := rawCounter(t, s, client, c)
			if !ok {
				continue
			}
			found++
			got, exp := storedState(t, c.Limit.Algorithm, v)
			want := ref[id]
			if len(want.Log) == 0 {
				want.Log = nil
			}
			if !reflect.DeepEqual(got, want) {
				t.Errorf("%s/%s %s: stored %+v, want %+v", c.Key, c.Name, c.Limit, got, want)
			}
			// The instant of the state's last write is unknown here;
			// ExpiryOf counts from any instant before the expiry.
			from := want.Start
			if n := len(want.Log); n > 0 {
				from = want.Log[n-1].At
			}
			if d := window.ExpiryOf(c.Limit, want, from); d > 0 && exp != from+d.Milliseconds() && exp != 1<<47-1 {
				t.Errorf("%s/%s %s: stored expiry %d, want %d", c.Key, c.Name, c.Limit, exp, from+d.Milliseconds())
			}
		}
		t.Logf("%d of %d counters checked", found, len(charged))
		if found < len(charged)/2 {
			t.Errorf("only %d of %d counters found", found, len(charged))
		}
	}
	t.Run("Standalone", func(t *testing.T) {
		t.Parallel()
		srv := redistest.Shared(t)
		run(t, srv.Client(t, nil), srv.Prefix(t))
	})
	t.Run("Cluster", func(t *testing.T) {
		t.Parallel()
		cl := redistest.SharedCluster(t)
		run(t, cl.Client(t, nil), cl.Prefix(t))
	})
}

func chargesString(cs []window.Charge) string {
	var b []byte
	for i, c := range cs {
		if i > 0 {
			b = append(b, ", "...)
		}
		b = fmt.Appendf(b, "%s/%s %s cost %d", c.Key, c.Name, c.Limit, c.Cost)
	}
	return string(b)
}

// storedState decodes a counter's value as the scripts write it, for a
// limit of algorithm a: the state, and the instant it stops mattering
// (the end of its window, when its bucket is full again or its newest
// entry leaves; two windows after its window started for a sliding
// window).
func storedState(t *testing.T, a window.Algorithm, v string) (window.State, int64) {
	t.Helper()
	i6 := func(b string) int64 {
		var x int64
		for k := 5; k >= 0; k-- {
			x = x<<8 | int64(b[k])
		}
		return x << 16 >> 16 // sign-extend 48 bits
	}
	u32 := func(b string) int64 { return int64(binary.LittleEndian.Uint32([]byte(b[:4]))) }
	f64 := func(b string) int64 {
		return int64(math.Float64frombits(binary.LittleEndian.Uint64([]byte(b[:8]))))
	}
	switch {
	case a == window.SlidingWindow && len(v) == 32:
		f, _ := decodeCounter(v)
		return window.State{Start: f[0], Prev: f[1], Curr: f[2]}, f[0] + 2*f[3]
	case a == window.FixedWindow && len(v) == 21 && v[0] == 'F':
		return window.State{Start: i6(v[7:]), Curr: f64(v[13:])}, i6(v[1:])
	case (a == window.TokenBucket || a == window.LeakyBucket) && len(v) == 27 && v[0] == 'T':
		return window.State{Start: i6(v[7:]), Prev: i6(v[13:]), Curr: f64(v[19:])}, i6(v[1:])
	case a == window.SlidingLog && len(v) >= 21 && (len(v)-11)%10 == 0 && v[0] == 'L':
		st := window.State{Curr: u32(v[7:])}
		for p := 11; p < len(v); p += 10 {
			st.Log = append(st.Log, window.Entry{At: i6(v[p:]), N: u32(v[p+6:])})
		}
		return st, i6(v[1:])
	}
	t.Fatalf("%q is not a %s counter", v, a)
	return window.State{}, 0
}

// rawCounter returns the value of c's counter, and whether it exists.
func rawCounter(t *testing.T, s *Store, c redis.Cmdable, ch window.Charge) (string, bool) {
	t.Helper()
	v, err := c.HGet(context.Background(), string(s.appendKey(nil, ch.Key)), string(appendField(nil, &ch))).Result()
	if err == redis.Nil {
		return "", false
	}
	if err != nil {
		t.Fatal(err)
	}
	return v, true
}

// keysOnTwoMasters returns two Keys whose buckets lie in the slot ranges of
// different masters of the shared three-master cluster.
func keysOnTwoMasters(t *testing.T, s *Store, c *redis.ClusterClient) (string, string) {
	t.Helper()
	slotOf := func(k string) int64 {
		slot, err := c.ClusterKeySlot(context.Background(), string(s.appendKey(nil, k))).Result()
		if err != nil {
			t.Fatal(err)
		}
		return slot
	}
	k1 := "user:1"
	for i := 2; ; i++ {
		if k := "user:" + strconv.Itoa(i); slotOf(k)/5462 != slotOf(k1)/5462 {
			return k1, k
		}
	}
}

// TestCrossSlotAlgorithms denies, on Redis Cluster, requests whose charge
// of each algorithm was counted on one master before another master's Key
// denied: the refund puts the counter back byte for byte, and a counter
// the request created goes. The decisions are those of the reference.
func TestCrossSlotAlgorithms(t *testing.T) {
	t.Parallel()
	cl := redistest.SharedCluster(t)
	c := cl.Client(t, nil)
	s := newTestStore(t, c, cl.Prefix(t))
	k1, k2 := keysOnTwoMasters(t, s, c)
	T := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	m, h := time.Minute, time.Hour
	ctx := context.Background()
	for _, l := range []window.Limit{
		swl(10, m), fxl(10, m), call(10, window.CalendarDay, newYork),
		tbl(10, m, 0), tbl(10, h, 4e9), sll(10, m), lkl(10, m, 20, 0),
	} {
		for _, same := range []bool{false, true} {
			name := fmt.Sprintf("%s/same=%v", l, same)
			ref := reference{}
			a, fresh := xc(k1, name, l, 3), xc(k1, name+"/fresh", l, 2)
			deny := xc(k2, name, swl(5, m), 1)
			step := func(now time.Time, wantAllowed bool, charges ...window.Charge) {
				t.Helper()
				want := make([]window.Decision, len(charges))
				wantOK := ref.take(now, charges, want)
				got := make([]window.Decision, len(charges))
				ok, err := s.Take(ctx, now, charges, got)
				if err != nil || ok != wantOK || ok != wantAllowed || !slices.Equal(got, want) {
					t.Fatalf("%s at %s: got %v %+v %v, want %v %+v", name, now.Sub(T), ok, got, err, wantOK, want)
				}
			}
			step(T.Add(time.Second), true, a, deny)
			before, ok := rawCounter(t, s, c, a)
			if !ok {
				t.Fatalf("%s: no counter after an admitted charge", name)
			}
			// Charged at the same instant as the stored state (a sliding
			// log's entry is then shared) or later.
			now := T.Add(time.Second)
			if !same {
				now = now.Add(1500 * time.Millisecond)
			}
			deny.Cost = 5
			step(now, false, a, deny)
			if after, _ := rawCounter(t, s, c, a); after != before {
				t.Errorf("%s: %x after the refund, want %x as before", name, after, before)
			}
			step(now, false, a, fresh, deny)
			if v, ok := rawCounter(t, s, c, fresh); ok {
				t.Errorf("%s: the counter created by a denied request is still there: %x", name, v)
			}
			// Denied by the first Key: the second is only read.
			step(now, false, deny, a, fresh)
			if after, _ := rawCounter(t, s, c, a); after != before {
				t.Errorf("%s: %x after a dry run, want %x", name, after, before)
			}
			a.Cost = 0
			step(now, true, a)
		}
	}
}

// chargeOnce counts one charge at now through the script and returns what
// a refund of it needs.
func chargeOnce(t *testing.T, s *Store, ch window.Charge, now time.Time) (*scratch, []window.Charge) {
	t.Helper()
	cs := []window.Charge{ch}
	sc := &scratch{keys: []string{string(s.appendKey(nil, ch.Key))}, fields: appendField(nil, &cs[0]), info: make([]counter, 1)}
	ms := window.Millis(now)
	if ok, _, err := s.run(context.Background(), sc, ms, true, cs, []int{0}, make([]window.Decision, 1)); err != nil || !ok {
		t.Fatalf("charge %s at %s: %v, %v", ch.Limit, now, ok, err)
	}
	return sc, cs
}

// TestRefundAlgorithms exercises refund.lua on counters that other
// requests changed between the charge and its refund.
func TestRefundAlgorithms(t *testing.T) {
	t.Parallel()
	srv := redistest.Shared(t)
	c := srv.Client(t, nil)
	s := newTestStore(t, c, srv.Prefix(t))
	ctx := context.Background()
	T := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	t0 := window.Millis(T)
	sec, m := time.Second, time.Minute
	state := func(ch window.Charge) (window.State, bool) {
		t.Helper()
		v, ok := rawCounter(t, s, c, ch)
		if !ok {
			return window.State{}, false
		}
		st, _ := storedState(t, ch.Limit.Algorithm, v)
		return st, true
	}
	check := func(what string, ch window.Charge, want window.State, exists bool) {
		t.Helper()
		got, ok := state(ch)
		if ok != exists || (ok && !reflect.DeepEqual(got, want)) {
			t.Errorf("%s: %+v (exists %v), want %+v (exists %v)", what, got, ok, want, exists)
		}
	}
	refund := func(sc *scratch, cs []window.Charge, now time.Time) {
		s.refund(ctx, sc, window.Millis(now), cs, []int{0})
	}

	// Fixed window: the count of the charged window goes down, to a
	// deletion at zero; a later window is left alone.
	fx := xc("fx", "r", fxl(10, m), 3)
	sc, cs := chargeOnce(t, s, fx, T.Add(sec))
	chargeOnce(t, s, xc("fx", "r", fxl(10, m), 2), T.Add(2*sec))
	refund(sc, cs, T.Add(sec))
	check("fixed, touched", fx, window.State{Start: t0, Curr: 2}, true)
	refund(sc, cs, T.Add(sec))
	check("fixed, below zero", fx, window.State{}, false)
	sc, cs = chargeOnce(t, s, fx, T.Add(sec))
	chargeOnce(t, s, fx, T.Add(61*sec))
	refund(sc, cs, T.Add(sec))
	check("fixed, next window", fx, window.State{Start: t0 + 60_000, Curr: 3}, true)

	// Token bucket (6/min: a token is 60000 drops, 6 drain a ms): cost
	// tokens come off the level, which is deleted at zero.
	tb := xc("tb", "r", tbl(6, m, 0), 3)
	sc, cs = chargeOnce(t, s, tb, T)
	chargeOnce(t, s, xc("tb", "r", tbl(6, m, 0), 1), T.Add(sec))
	// 180000 - 6000 + 60000, less 180000.
	refund(sc, cs, T)
	check("token, touched", tb, window.State{Start: t0 + 1000, Prev: 1, Curr: 54000}, true)
	refund(sc, cs, T)
	check("token, below zero", tb, window.State{}, false)

	// Sliding log: the entry at the request's instant goes down, or goes;
	// the log goes with its last entry.
	sl := xc("sl", "r", sll(10, m), 3)
	sc, cs = chargeOnce(t, s, sl, T)
	chargeOnce(t, s, xc("sl", "r", sll(10, m), 2), T)
	chargeOnce(t, s, xc("sl", "r", sll(10, m), 1), T.Add(sec))
	refund(sc, cs, T)
	check("log, shared entry", sl, window.State{Curr: 3, Log: []window.Entry{{At: t0, N: 2}, {At: t0 + 1000, N: 1}}}, true)
	refund(sc, cs, T)
	check("log, entry gone", sl, window.State{Curr: 1, Log: []window.Entry{{At: t0 + 1000, N: 1}}}, true)
	sc2, cs2 := chargeOnce(t, s, xc("sl", "r", sll(10, m), 1), T.Add(2*sec))
	refund(sc2, cs2, T.Add(2*sec))
	check("log, newest entry gone", sl, window.State{Curr: 1, Log: []window.Entry{{At: t0 + 1000, N: 1}}}, true)
	if _, exp := storedState(t, window.SlidingLog, must(rawCounter(t, s, c, sl))); exp != t0+1000+60_000 {
		t.Errorf("log: expiry %d after its newest entry went, want %d", exp, t0+61_000)
	}
	sc, cs = chargeOnce(t, s, xc("sl", "r2", sll(10, m), 4), T)
	refund(sc, cs, T)
	check("log, last entry", xc("sl", "r2", sll(10, m), 4), window.State{}, false)
}

func must(v string, ok bool) string {
	if !ok {
		panic("no counter")
	}
	return v
}

// prunes reports whether decide.lua samples the bucket for expired
// counters when it adds the counter of field at nowMs (see prune there).
func prunes(field []byte, nowMs int64) bool {
	return (int64(field[fieldLen-1])+nowMs)%4 == 0
}

// newCounter returns a sliding-window charge of key, named "new" and a
// number, whose counter added at now samples the bucket if sample is set,
// and does not otherwise.
func newCounter(key string, now time.Time, sample bool) window.Charge {
	for i := 0; ; i++ {
		c := xc(key, "new"+strconv.Itoa(i), swl(10, time.Minute), 1)
		if prunes(appendField(nil, &c), window.Millis(now)) == sample {
			return c
		}
	}
}

// TestSweepAlgorithms shows that adding a counter to a bucket drops the
// expired counters of every algorithm that it samples, and keeps live
// ones and values of unknown form; a new counter that does not sample
// the bucket (three in four) leaves them.
func TestSweepAlgorithms(t *testing.T) {
	t.Parallel()
	srv := redistest.Shared(t)
	c := srv.Client(t, nil)
	s := newTestStore(t, c, srv.Prefix(t))
	ctx := context.Background()
	T := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	m := time.Minute
	for _, l := range []window.Limit{
		swl(10, m), fxl(10, m), call(10, window.CalendarDay, newYork),
		tbl(10, m, 0), tbl(10, time.Hour, 4e9), sll(10, m), lkl(10, m, 5, 0),
	} {
		for _, expired := range []bool{false, true} {
			// One bucket holding one counter of l, to which a sliding
			// window is added when l's counter has just expired, or 1 ms
			// before.
			key := fmt.Sprintf("%s/%v", l, expired)
			old := xc(key, "old", l, 4)
			ref := reference{}
			ref.take(T, []window.Charge{old}, make([]window.Decision, 1))
			st := ref.state(old)
			from := st.Start
			if l.Algorithm == window.SlidingLog {
				from = st.Log[0].At
			}
			exp := from + window.ExpiryOf(l, st, from).Milliseconds()
			take(t, s, T, old)
			now := time.UnixMilli(exp)
			if !expired {
				now = now.Add(-time.Millisecond)
			}
			take(t, s, now, newCounter(key, now, false))
			if _, ok := rawCounter(t, s, c, old); !ok {
				t.Errorf("%s: the counter was dropped by a new counter that does not sample", key)
			}
			take(t, s, now, newCounter(key, now, true))
			if _, ok := rawCounter(t, s, c, old); ok == expired {
				t.Errorf("%s: the counter exists %v at %s, %s after its write", key, ok, now.Sub(T), time.Duration(exp-window.Millis(T))*time.Millisecond)
			}
		}
	}
	// A value of no known form is kept.
	bucket := string(s.appendKey(nil, "garbage"))
	if err := c.HSet(ctx, bucket, "garbage-field", "L12 x").Err(); err != nil {
		t.Fatal(err)
	}
	take(t, s, T.Add(100*24*time.Hour), newCounter("garbage", T.Add(100*24*time.Hour), true))
	if !c.HExists(ctx, bucket, "garbage-field").Val() {
		t.Error("a value of no known form was dropped")
	}
}

// TestCalendarClockSkew decides a calendar period on a Redis clock that is
// ahead of or behind the application server's, which worked out the
// period boundaries: within a period of it, the script picks the right
// one; beyond, the request fails before anything is written.
func TestCalendarClockSkew(t *testing.T) {
	t.Parallel()
	srv := redistest.Shared(t)
	c := srv.Client(t, nil)
	s := newTestStore(t, c, srv.Prefix(t))
	ctx := context.Background()
	app := time.Date(2030, 3, 10, 12, 0, 0, 0, newYork)
	day := call(2, window.CalendarDay, newYork)
	ref := reference{}
	run := func(key string, skew time.Duration) (bool, window.Decision, error) {
		ch := []window.Charge{xc(key, "d", day, 1)}
		sc := &scratch{keys: []string{string(s.appendKey(nil, key))}, fields: appendField(nil, &ch[0]), info: make([]counter, 1)}
		out := make([]window.Decision, 1)
		// The script decides at the skewed instant, with the calendar
		// boundaries the app server worked out around its own.
		req := appendCharge(appendRequest(nil, window.Millis(app.Add(skew)), true), sc.field(0), &ch[0], window.Millis(app))
		ok, _, err := s.send(ctx, sc, req, true, ch, []int{0}, out)
		return ok, out[0], err
	}
	// Redis 13 h ahead is in the next day, 15 h behind in the day before
	// (with 23 hours, on 10 March).
	for i, skew := range []time.Duration{0, 13 * time.Hour, -15 * time.Hour, 13 * time.Hour, 11 * time.Hour, 13 * time.Hour, -15 * time.Hour, -11 * time.Hour} {
		ok, got, err := run("skew", skew)
		ch := []window.Charge{xc("skew", "d", day, 1)}
		want := make([]window.Decision, 1)
		wantOK := ref.take(app.Add(skew), ch, want)
		if err != nil || ok != wantOK || got != want[0] {
			t.Errorf("step %d, Redis %s ahead: got %v %+v %v, want %v %+v", i, skew, ok, got, err, wantOK, want[0])
		}
	}
	// Beyond the three periods around the application's clock.
	for _, skew := range []time.Duration{40 * time.Hour, -40 * time.Hour} {
		key := "skew" + skew.String()
		if ok, _, err := run(key, skew); err == nil || !strings.Contains(err.Error(), "outside the calendar periods") {
			t.Errorf("Redis %s ahead: %v, %v; want an error", skew, ok, err)
		}
		if n := c.Exists(ctx, string(s.appendKey(nil, key))).Val(); n != 0 {
			t.Errorf("Redis %s ahead: the failed request wrote its bucket", skew)
		}
	}
	// On Redis's own clock.
	if ok, d := take(t, s, time.Time{}, xc("skew-now", "d", day, 1)); !ok || d.Remaining != 1 {
		t.Errorf("on Redis TIME: %v %+v", ok, d)
	}
}
