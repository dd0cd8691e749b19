// Package storetest is the conformance suite that every store runs, so that
// they all give the same answers: the memory store and the Redis store,
// standalone and on Redis Cluster.
//
// Run drives a store at fixed instants (T0 plus offsets) and compares every
// Decision with values worked out by hand from the formulas of package
// window, written into the tables. TestAgainstReference, also run by Run,
// then replays a long pseudo-random sequence against window.Take itself.
// RunSettle and RunRefund do the same for the stores that settle a usage
// after the fact (window.SettleAll) and take admitted charges back
// (window.Refund), with the requests decided after them.
//
// Every test uses Keys of its own, so stores that share a server may run
// the suite side by side; windows are long (a minute or more) so that a
// store whose counters expire in real time (Redis) never loses one while a
// test steps its fake clock.
package storetest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"math"
	mrand "math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/window"
)

// Store is the contract under test; it is middleware.Store, restated here
// so that this package does not import middleware.
type Store interface {
	Take(ctx context.Context, now time.Time, charges []window.Charge, out []window.Decision) (bool, error)
}

// paris is a time zone whose days start at 23:00 UTC in winter.
var paris = mustLoad("Europe/Paris")

func mustLoad(name string) *time.Location {
	loc, err := time.LoadLocation(name)
	if err != nil {
		panic(err)
	}
	return loc
}

// T0 is the fake instant the tables count from. It starts a minute, an
// hour and a day, so offsets from it are offsets into a window.
var T0 = time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)

const (
	ms  = time.Millisecond
	sec = time.Second
	min = time.Minute
)

// Run runs the conformance suite. newStore returns a fresh store for one
// subtest (which may share its backend with other subtests) and arranges
// its cleanup with t.Cleanup. Subtests run in parallel.
func Run(t *testing.T, newStore func(t *testing.T) Store) {
	t.Run("Scenarios", func(t *testing.T) {
		t.Parallel()
		for _, sc := range scenarios {
			t.Run(sc.name, func(t *testing.T) {
				t.Parallel()
				runScenario(t, newStore(t), sc)
			})
		}
	})
	tests := []struct {
		name string
		fn   func(*testing.T, Store)
	}{
		{"ManyKeys", testManyKeys},
		{"HostileKeys", testHostileKeys},
		{"StoreClock", testStoreClock},
		{"Errors", testErrors},
		{"AgainstReference", testAgainstReference},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			tt.fn(t, newStore(t))
		})
	}
}

// step is one call to Take at T0+at, with the answers expected.
type step struct {
	at      time.Duration
	charges []window.Charge
	allowed bool
	want    []want
}

// want is what a step expects of one charge, worked out by hand; the
// durations of every Decision are checked against window.Take, the model,
// at the same instant.
type want struct {
	allowed   bool
	remaining int
}

type scenario struct {
	name  string
	steps []step
}

func perMin(n int) window.Limit  { return window.Limit{Requests: n, Window: time.Minute} }
func perHour(n int) window.Limit { return window.Limit{Requests: n, Window: time.Hour} }

// ch is a charge; key is made unique to the test by runScenario.
func ch(key, name string, l window.Limit, cost int) window.Charge {
	return window.Charge{Key: key, Name: name, Limit: l, Cost: cost}
}

// d is what a charge is expected to get.
func d(allowed bool, remaining int) want { return want{allowed, remaining} }

// one is a step with a single charge.
func one(at time.Duration, c window.Charge, w want) step {
	return step{at: at, charges: []window.Charge{c}, allowed: w.allowed, want: []want{w}}
}

// The tables. Windows start at a counter's first request (or its first
// after it was empty again). In the comments, W is the window in ms, e the
// ms elapsed in the current window, p and c the previous and current
// counts; a request of cost k fits when p*(W-1-e) + (c+k)*W <= limit*W,
// and Remaining = floor((limit*W - p*(W-1-e) - c*W) / W), at least 0.
var scenarios = []scenario{
	{"BurstThenDeny", []step{
		// 5/min from 10 s on: c = 1..5, Remaining 4..0.
		one(10*sec, ch("k", "r", perMin(5), 1), d(true, 4)),
		one(10*sec, ch("k", "r", perMin(5), 1), d(true, 3)),
		one(10*sec, ch("k", "r", perMin(5), 1), d(true, 2)),
		one(10*sec, ch("k", "r", perMin(5), 1), d(true, 1)),
		one(10*sec, ch("k", "r", perMin(5), 1), d(true, 0)),
		// c=5: 6W > 5W.
		one(10*sec, ch("k", "r", perMin(5), 1), d(false, 0)),
		// Window 2 starts at 70 s. e=11998: 5*48001 + 60000 > 300000.
		one(81998*ms, ch("k", "r", perMin(5), 1), d(false, 0)),
		// One millisecond later it fits exactly: 5*48000 + 60000 = 5W.
		one(81999*ms, ch("k", "r", perMin(5), 1), d(true, 0)),
		one(81999*ms, ch("k", "r", perMin(5), 1), d(false, 0)),
	}},
	{"WorkedExample", []step{
		// 100/min: 80 in the first window (from 5 s), 40 in the second
		// (from 65 s), e=20 s: 80*39999 + 40*60000 <= 6e6, 6 left.
		one(5*sec, ch("k", "r", perMin(100), 80), d(true, 20)),
		one(85*sec, ch("k", "r", perMin(100), 40), d(true, 6)),
		// e=30 s: the estimate is 80*29999/60000 + 40, just under 80.
		one(95*sec, ch("k", "r", perMin(100), 0), d(true, 20)),
		one(95*sec, ch("k", "r", perMin(100), 1), d(true, 19)),
	}},
	{"Costs", []step{
		one(0, ch("k", "r", perMin(10), 4), d(true, 6)),
		one(0, ch("k", "r", perMin(10), 4), d(true, 2)),
		// c=8: 12 > 10.
		one(0, ch("k", "r", perMin(10), 4), d(false, 2)),
		one(0, ch("k", "r", perMin(10), 2), d(true, 0)),
		// A cost above the limit never fits.
		one(0, ch("k", "r", perMin(10), 11), d(false, 0)),
		one(0, ch("k2", "r", perMin(10), 11), d(false, 10)),
		one(0, ch("k2", "r", perMin(10), 1<<40), d(false, 10)),
		// A cost equal to the limit fits an empty counter.
		one(0, ch("k3", "r", perMin(10), 10), d(true, 0)),
	}},
	{"DeniedIsNotCharged", []step{
		one(30*sec, ch("k", "r", perMin(10), 8), d(true, 2)),
		one(30*sec, ch("k", "r", perMin(10), 5), d(false, 2)),
		one(30*sec, ch("k", "r", perMin(10), 2), d(true, 0)),
		one(30*sec, ch("k", "r", perMin(10), 0), d(true, 0)),
	}},
	{"RollOver", []step{
		one(30*sec, ch("k", "r", perMin(10), 6), d(true, 4)),
		// Window 2 (from 90 s), e=0: 6*59999 + 7*60000... with c=1: 3 left.
		one(90*sec, ch("k", "r", perMin(10), 1), d(true, 3)),
		// Window 3 (from 150 s), e=30 s, p=1: 29999 + 60000, 8 left.
		one(180*sec, ch("k", "r", perMin(10), 1), d(true, 8)),
		// Two windows after the last write: a fresh counter.
		one(375*sec, ch("k", "r", perMin(10), 1), d(true, 9)),
	}},
	{"SkipTwoWindows", []step{
		one(10*sec, ch("k", "r", perMin(10), 10), d(true, 0)),
		// Window 2, e=0: p=10 weighs 59999/60000.
		one(70*sec, ch("k", "r", perMin(10), 1), d(false, 0)),
		// Window 3: the count of window 1 no longer weighs.
		one(130*sec, ch("k", "r", perMin(10), 10), d(true, 0)),
	}},
	{"Expiry", []step{
		// 100/h, filled 30 min in.
		one(30*min, ch("k", "r", perHour(100), 100), d(true, 0)),
		// Two ticks before its window 3: p=100 weighs 1/3600000.
		one(150*min-2*ms, ch("k", "r", perHour(100), 0), d(true, 99)),
		// The last tick of window 2: p no longer weighs.
		one(150*min-ms, ch("k", "r", perHour(100), 0), d(true, 100)),
		// Idle for a full window after its own: empty.
		one(150*min, ch("k", "r", perHour(100), 0), d(true, 100)),
		one(5*time.Hour, ch("k", "r", perHour(100), 100), d(true, 0)),
	}},
	{"ClockBackwards", []step{
		one(30*sec, ch("k", "r", perMin(10), 6), d(true, 4)),
		// Window 2 (from 90 s), e=10 s: 6*49999 + 2*60000, 3 left.
		one(100*sec, ch("k", "r", perMin(10), 2), d(true, 3)),
		// Back in window 1: decided at the start of window 2 (e=0).
		one(85*sec, ch("k", "r", perMin(10), 0), d(true, 2)),
		one(85*sec, ch("k", "r", perMin(10), 2), d(true, 0)),
		one(85*sec, ch("k", "r", perMin(10), 1), d(false, 0)),
		// Forward again, e=15s: 6*44999 + 4*60000, 1 left.
		one(105*sec, ch("k", "r", perMin(10), 0), d(true, 1)),
		// Far back, before the counter's first window: still window 2.
		one(0, ch("k", "r", perMin(10), 0), d(true, 0)),
	}},
	{"ReadsAndDeniesChangeNothing", []step{
		// Only admitted charges with a cost change a counter. A read or a
		// deny in a later window does not roll it, which shows when the
		// clock then goes back to the counter's own window.
		one(10*sec, ch("k", "r", perMin(10), 4), d(true, 6)),
		one(80*sec, ch("k", "r", perMin(10), 0), d(true, 6)),
		// 4*49999 + 9*60000 > 10W.
		one(80*sec, ch("k", "r", perMin(10), 9), d(false, 6)),
		// Back to e=20s of window 1, with c=4 as written.
		one(30*sec, ch("k", "r", perMin(10), 0), d(true, 6)),
		// A denied request with two charges leaves the one that fits alone.
		{at: 30 * sec, charges: []window.Charge{ch("k", "r", perMin(10), 1), ch("k", "r2", perMin(1), 2)},
			allowed: false, want: []want{d(true, 6), d(false, 1)}},
		one(30*sec, ch("k", "r", perMin(10), 0), d(true, 6)),
	}},
	{"AllOrNothingSameKey", allOrNothing("k", "k")},
	{"AllOrNothingTwoKeys", allOrNothing("k1", "k2")},
	{"AllOrNothingDenierFirst", []step{
		{at: 0, charges: []window.Charge{ch("k2", "b", perMin(1), 1), ch("k1", "a", perMin(10), 1)},
			allowed: true, want: []want{d(true, 0), d(true, 9)}},
		// b: c=1, 2 > 1; a fits alone.
		{at: 0, charges: []window.Charge{ch("k2", "b", perMin(1), 1), ch("k1", "a", perMin(10), 1)},
			allowed: false, want: []want{d(false, 0), d(true, 9)}},
		one(0, ch("k1", "a", perMin(10), 0), d(true, 9)),
	}},
	{"AllOrNothingThreeKeys", []step{
		{at: 0, charges: []window.Charge{ch("k1", "a", perMin(10), 3), ch("k2", "b", perMin(5), 3), ch("k3", "c", perHour(10), 3)},
			allowed: true, want: []want{d(true, 7), d(true, 2), d(true, 7)}},
		// 6 > 5 on b.
		{at: 0, charges: []window.Charge{ch("k1", "a", perMin(10), 3), ch("k2", "b", perMin(5), 3), ch("k3", "c", perHour(10), 3)},
			allowed: false, want: []want{d(true, 7), d(false, 2), d(true, 7)}},
		{at: 0, charges: []window.Charge{ch("k1", "a", perMin(10), 0), ch("k3", "c", perHour(10), 0)},
			allowed: true, want: []want{d(true, 7), d(true, 7)}},
		// Two charges on k1 and one on k2; k2 denies (8 > 5), so k1 keeps
		// 3 and x stays empty.
		{at: 0, charges: []window.Charge{ch("k1", "a", perMin(10), 1), ch("k2", "b", perMin(5), 5), ch("k1", "x", perMin(10), 2)},
			allowed: false, want: []want{d(true, 7), d(false, 2), d(true, 10)}},
		one(0, ch("k1", "a", perMin(10), 0), d(true, 7)),
		one(0, ch("k1", "x", perMin(10), 0), d(true, 10)),
	}},
	{"SameCounterTwice", []step{
		// Each charge is decided against the counter as it was; both are
		// counted: 3+3 here, although 6 > 5.
		{at: 0, charges: []window.Charge{ch("k", "r", perMin(5), 3), ch("k", "r", perMin(5), 3)},
			allowed: true, want: []want{d(true, 2), d(true, 2)}},
		// Even a read does not fit 6 > 5.
		one(0, ch("k", "r", perMin(5), 0), d(false, 0)),
		// Window 2, e=30s: p=6 weighs 6*29999/60000, just under 3.
		one(90*sec, ch("k", "r", perMin(5), 0), d(true, 2)),
		{at: 90 * sec, charges: []window.Charge{ch("k", "r", perMin(5), 1), ch("k", "r", perMin(5), 1)},
			allowed: true, want: []want{d(true, 1), d(true, 1)}},
		one(90*sec, ch("k", "r", perMin(5), 0), d(true, 0)),
	}},
	{"SameKeyOtherName", []step{
		one(0, ch("k", "a", perMin(1), 1), d(true, 0)),
		one(0, ch("k", "a", perMin(1), 1), d(false, 0)),
		one(0, ch("k", "b", perMin(1), 1), d(true, 0)),
	}},
	{"SameKeyOtherWindow", []step{
		one(0, ch("k", "a", perMin(1), 1), d(true, 0)),
		one(0, ch("k", "a", perMin(1), 1), d(false, 0)),
		one(0, ch("k", "a", perHour(1), 1), d(true, 0)),
		one(0, ch("k", "a", window.Limit{Requests: 1, Window: 2 * min}, 1), d(true, 0)),
	}},
	{"LimitChangeKeepsCount", []step{
		one(0, ch("k", "r", perMin(10), 5), d(true, 5)),
		one(0, ch("k", "r", perMin(20), 0), d(true, 15)),
		// Over a lowered limit, even for a read.
		one(0, ch("k", "r", perMin(3), 1), d(false, 0)),
		one(0, ch("k", "r", perMin(3), 0), d(false, 0)),
	}},
	{"LargeLimits", []step{
		// 1e12 per 366 days (ticks of 10,540,800 ms) and 1e6 per 30 days.
		one(0, ch("k", "year", window.Limit{Requests: 1e12, Window: 366 * 24 * time.Hour}, 999_999_999_999), d(true, 1)),
		one(0, ch("k", "year", window.Limit{Requests: 1e12, Window: 366 * 24 * time.Hour}, 2), d(false, 1)),
		one(time.Hour, ch("k", "year", window.Limit{Requests: 1e12, Window: 366 * 24 * time.Hour}, 1), d(true, 0)),
		one(0, ch("k", "month", window.Limit{Requests: 1e6, Window: 30 * 24 * time.Hour}, 1e6), d(true, 0)),
		one(29*24*time.Hour, ch("k", "month", window.Limit{Requests: 1e6, Window: 30 * 24 * time.Hour}, 1), d(false, 0)),
		// In the next window the first window's million weighs
		// 1e6*(W-1-e)/W: one unit is free once 1e6*(1+e) >= W, at
		// e = 2,592 - 1 ms.
		one(30*24*time.Hour+2590*ms, ch("k", "month", window.Limit{Requests: 1e6, Window: 30 * 24 * time.Hour}, 1), d(false, 0)),
		one(30*24*time.Hour+2591*ms, ch("k", "month", window.Limit{Requests: 1e6, Window: 30 * 24 * time.Hour}, 1), d(true, 0)),
		one(0, ch("k", "hour", window.Limit{Requests: 1e9, Window: time.Hour}, 1e9), d(true, 0)),
	}},
	{"TokenBucket", []step{
		// 6/min, burst 3: a token is W = 60000 drops, the bucket holds
		// 180000 and refills 6 drops a ms (a token every 10 s). Remaining
		// = floor((180000 - level) / 60000).
		one(0, ch("k", "r", tb(6, 3), 1), d(true, 2)),
		one(0, ch("k", "r", tb(6, 3), 1), d(true, 1)),
		one(0, ch("k", "r", tb(6, 3), 1), d(true, 0)),
		one(0, ch("k", "r", tb(6, 3), 1), d(false, 0)),
		// 9.999 s later the level is 180000 - 59994 = 120006: one more
		// token does not fit.
		one(9999*ms, ch("k", "r", tb(6, 3), 1), d(false, 0)),
		one(10*sec, ch("k", "r", tb(6, 3), 1), d(true, 0)),
		// 30 s after the bucket was last empty it is full again.
		one(40*sec, ch("k", "r", tb(6, 3), 4), d(false, 3)), // above the burst: never
		one(40*sec, ch("k", "r", tb(6, 3), 3), d(true, 0)),
		// 15 s later: 180000 - 90000 = 90000, +60000 = 150000.
		one(55*sec, ch("k", "r", tb(6, 3), 1), d(true, 0)),
		// Burst 0 means Requests: 2/min holds 2.
		one(0, ch("k2", "r", tb(2, 0), 2), d(true, 0)),
		one(30*sec, ch("k2", "r", tb(2, 0), 1), d(true, 0)),
		one(30*sec, ch("k2", "r", tb(2, 0), 1), d(false, 0)),
	}},
	{"FixedWindow", []step{
		// 3/min in windows aligned to the epoch: T0 starts one.
		one(10*sec, ch("k", "r", fw(3), 1), d(true, 2)),
		one(20*sec, ch("k", "r", fw(3), 2), d(true, 0)),
		one(30*sec, ch("k", "r", fw(3), 1), d(false, 0)),
		one(59999*ms, ch("k", "r", fw(3), 1), d(false, 0)),
		// The next window renews the whole quota at once.
		one(60*sec, ch("k", "r", fw(3), 3), d(true, 0)),
		one(119999*ms, ch("k", "r", fw(3), 1), d(false, 0)),
		one(120*sec, ch("k", "r", fw(3), 1), d(true, 2)),
		one(120*sec, ch("k", "r", fw(3), 4), d(false, 2)), // above the limit: never
	}},
	{"CalendarMonth", []step{
		// 2 per calendar month in Paris: T0 (1 January 00:00 UTC) is
		// 01:00 in Paris, and January ends there at 31 January 23:00 UTC.
		one(0, ch("k", "r", cal(2, window.CalendarMonth), 1), d(true, 1)),
		one(time.Hour, ch("k", "r", cal(2, window.CalendarMonth), 1), d(true, 0)),
		one(2*time.Hour, ch("k", "r", cal(2, window.CalendarMonth), 1), d(false, 0)),
		one(30*24*time.Hour+23*time.Hour-ms, ch("k", "r", cal(2, window.CalendarMonth), 1), d(false, 0)),
		one(30*24*time.Hour+23*time.Hour, ch("k", "r", cal(2, window.CalendarMonth), 1), d(true, 1)),
		// A calendar day in Paris ends at 23:00 UTC.
		one(0, ch("k", "day", cal(1, window.CalendarDay), 1), d(true, 0)),
		one(23*time.Hour-ms, ch("k", "day", cal(1, window.CalendarDay), 1), d(false, 0)),
		one(23*time.Hour, ch("k", "day", cal(1, window.CalendarDay), 1), d(true, 0)),
	}},
	{"SlidingLog", []step{
		// 3/min, exact: an entry admitted at t counts until t + 60 s.
		one(0, ch("k", "r", sl(3), 2), d(true, 1)),
		one(20*sec, ch("k", "r", sl(3), 1), d(true, 0)),
		one(30*sec, ch("k", "r", sl(3), 1), d(false, 0)),
		one(59999*ms, ch("k", "r", sl(3), 1), d(false, 0)),
		// The two units of 0 s leave at 60 s.
		one(60*sec, ch("k", "r", sl(3), 2), d(true, 0)),
		one(79999*ms, ch("k", "r", sl(3), 1), d(false, 0)),
		one(80*sec, ch("k", "r", sl(3), 1), d(true, 0)),
		one(80*sec, ch("k", "r", sl(3), 4), d(false, 0)), // above the limit: never
		// Requests in one ms merge into one entry.
		one(0, ch("k2", "r", sl(3), 1), d(true, 2)),
		one(0, ch("k2", "r", sl(3), 1), d(true, 1)),
		one(59999*ms, ch("k2", "r", sl(3), 2), d(false, 1)),
		one(60*sec, ch("k2", "r", sl(3), 3), d(true, 0)),
	}},
	{"MixedAlgorithms", []step{
		// One request, four algorithms, all or nothing: the token bucket
		// (1/min, burst 1) denies the second request, which then counts
		// nowhere.
		{at: 0, charges: mixed("k"), allowed: true, want: []want{d(true, 9), d(true, 0), d(true, 4), d(true, 2)}},
		{at: sec, charges: mixed("k"), allowed: false, want: []want{d(true, 9), d(false, 0), d(true, 4), d(true, 2)}},
		// A minute on: the sliding window's first minute weighs
		// 1 * (W-1)/W, the bucket is full again, the hour goes on, and
		// the log's first entry has left.
		{at: 60 * sec, charges: mixed("k"), allowed: true, want: []want{d(true, 8), d(true, 0), d(true, 3), d(true, 2)}},
	}},
	{"MixedAlgorithmsAcrossKeys", allOrNothingAlgorithms("a", "b")},
}

// tb is a token bucket of n a minute holding burst.
func tb(n, burst int) window.Limit { return perMin(n).TokenBucket(burst) }

// fw is a fixed window of n a minute.
func fw(n int) window.Limit { return perMin(n).FixedWindow() }

// sl is a sliding log of n a minute.
func sl(n int) window.Limit { return perMin(n).SlidingLog() }

// cal is n per calendar period p in Paris.
func cal(n int, p window.Period) window.Limit {
	return window.Limit{Requests: n, Algorithm: window.FixedWindow, Period: p, Location: paris}
}

// mixed charges one key under four algorithms at once.
func mixed(key string) []window.Charge {
	return []window.Charge{
		ch(key, "sw", perMin(10), 1),
		ch(key, "tb", tb(1, 1), 1),
		ch(key, "fw", window.Limit{Requests: 5, Window: time.Hour, Algorithm: window.FixedWindow}, 1),
		ch(key, "sl", sl(3), 1),
	}
}

// allOrNothingAlgorithms is a token bucket of 10/min on keyA and a sliding
// log of 2/min on keyB, charged together until b denies; on Redis Cluster
// the two keys lie in different slots, so the deny refunds a's charge.
func allOrNothingAlgorithms(keyA, keyB string) []step {
	both := func(cost int) []window.Charge {
		return []window.Charge{ch(keyA, "a", tb(10, 0), cost), ch(keyB, "b", sl(2), cost)}
	}
	return []step{
		{at: 0, charges: both(1), allowed: true, want: []want{d(true, 9), d(true, 1)}},
		{at: 0, charges: both(1), allowed: true, want: []want{d(true, 8), d(true, 0)}},
		// b: 3 > 2; a, which fits, is described as not charged.
		{at: 0, charges: both(1), allowed: false, want: []want{d(true, 8), d(false, 0)}},
		one(0, ch(keyA, "a", tb(10, 0), 0), d(true, 8)),
		// a's refill: one token every 6 s.
		{at: 6 * sec, charges: both(0), allowed: true, want: []want{d(true, 9), d(true, 0)}},
		{at: 60 * sec, charges: both(1), allowed: true, want: []want{d(true, 9), d(true, 1)}},
	}
}

// allOrNothing is a 10/min limit a on keyA and a 3/min limit b on keyB,
// charged together until b denies.
func allOrNothing(keyA, keyB string) []step {
	both := func(cost int) []window.Charge {
		return []window.Charge{ch(keyA, "a", perMin(10), cost), ch(keyB, "b", perMin(3), cost)}
	}
	return []step{
		{at: 0, charges: both(1), allowed: true, want: []want{d(true, 9), d(true, 2)}},
		{at: 0, charges: both(1), allowed: true, want: []want{d(true, 8), d(true, 1)}},
		{at: 0, charges: both(1), allowed: true, want: []want{d(true, 7), d(true, 0)}},
		// b: 4 > 3; a, which fits, is described as not charged.
		{at: 0, charges: both(1), allowed: false, want: []want{d(true, 7), d(false, 0)}},
		one(0, ch(keyA, "a", perMin(10), 0), d(true, 7)),
		{at: 0, charges: both(0), allowed: true, want: []want{d(true, 7), d(true, 0)}},
	}
}

// counterID names a counter as every store does: Key, Name and the
// limit's Series (its window, and its algorithm, period and time zone).
type counterID struct {
	key, name string
	series    uint64
}

func idOf(c window.Charge) counterID { return counterID{c.Key, c.Name, c.Limit.Series()} }

// counter is a counter of the model: its state, the limit it was last
// charged under and when.
type counter struct {
	st  window.State
	l   window.Limit
	at  int64
	set bool
}

// expiresAt is when the counter stops mattering.
func (c counter) expiresAt() int64 {
	d := window.ExpiryOf(c.l, c.st, c.at)
	if d < 0 {
		return c.at
	}
	return c.at + d.Milliseconds()
}

// model is the reference store: window.Take over a map of states. Like
// every store, only admitted charges with a cost change a counter.
type model map[counterID]counter

// state returns a copy of the counter's state at now, safe to modify: an
// empty state once the counter has expired (window.ExpiryOf, under the
// limit it was last charged with), as every store forgets it then.
func (m model) state(id counterID, now int64) window.State {
	c := m[id]
	if !c.set || now >= c.expiresAt() {
		return window.State{}
	}
	st := c.st
	st.Log = slices.Clone(st.Log)
	return st
}

// take decides charges at now and, if admitted, counts them.
func (m model) take(now time.Time, charges []window.Charge) (bool, []window.Decision) {
	ms := window.Millis(now)
	states := make([]window.State, len(charges))
	for i, c := range charges {
		states[i] = m.state(idOf(c), ms)
	}
	out := make([]window.Decision, len(charges))
	allowed := window.Take(states, ms, charges, out)
	if allowed {
		// Counters named twice get every cost, rolled once.
		for _, c := range charges {
			if c.Cost > 0 {
				k := idOf(c)
				st, at := c.Limit.Roll(m.state(k, ms), ms)
				window.Add(&st, at, c.Limit, int64(c.Cost))
				m[k] = counter{st: st, l: c.Limit, at: at, set: true}
			}
		}
	}
	return allowed, out
}

// unique returns a string unique to this run of the test, to make its Keys
// its own.
func unique(t *testing.T) string {
	var r [6]byte
	_, _ = rand.Read(r[:])
	return t.Name() + "/" + hex.EncodeToString(r[:]) + "/"
}

func runScenario(t *testing.T, s Store, sc scenario) {
	u := unique(t)
	ctx := context.Background()
	m := model{}
	for i, st := range sc.steps {
		charges := make([]window.Charge, len(st.charges))
		for j, c := range st.charges {
			c.Key = u + c.Key
			charges[j] = c
		}
		out := make([]window.Decision, len(charges))
		allowed, err := s.Take(ctx, T0.Add(st.at), charges, out)
		if err != nil {
			t.Fatalf("step %d (T0+%s): Take: %v", i, st.at, err)
		}
		ok := allowed == st.allowed && len(out) == len(st.want)
		for j := range out {
			ok = ok && out[j].Allowed == st.want[j].allowed && out[j].Remaining == st.want[j].remaining
		}
		if !ok {
			t.Fatalf("step %d (T0+%s) %s:\n got %v %s\nwant %v %v",
				i, st.at, describeCharges(st.charges), allowed, fmtDecisions(out), st.allowed, st.want)
		}
		refAllowed, ref := m.take(T0.Add(st.at), charges)
		if allowed != refAllowed || !equal(out, ref) {
			t.Fatalf("step %d (T0+%s) %s: the store and window.Take disagree:\n  store %v %s\n model %v %s",
				i, st.at, describeCharges(st.charges), allowed, fmtDecisions(out), refAllowed, fmtDecisions(ref))
		}
	}
}

func equal(a, b []window.Decision) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func describeCharges(cs []window.Charge) string {
	var b strings.Builder
	for i, c := range cs {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%s/%s %s cost %d", c.Key, c.Name, c.Limit, c.Cost)
	}
	return b.String()
}

func fmtDecisions(ds []window.Decision) string {
	var b strings.Builder
	for i, x := range ds {
		if i > 0 {
			b.WriteString(" ")
		}
		fmt.Fprintf(&b, "{allowed=%v remaining=%d reset=%s retry=%s next=%s debt=%d}", x.Allowed, x.Remaining, x.ResetAfter, x.RetryAfter, x.NextAfter, x.Debt)
	}
	return b.String()
}

// testManyKeys checks that 1,000 keys are counted apart.
func testManyKeys(t *testing.T, s Store) {
	const n = 1000
	u := unique(t)
	ctx := context.Background()
	out := make([]window.Decision, 1)
	// 1/min: the unit comes back when the request stops weighing, in the
	// last ms of the next window, 119.999 s on.
	for round, want := range []window.Decision{
		{Allowed: true, ResetAfter: 119999 * ms, NextAfter: 119999 * ms},
		{ResetAfter: 119999 * ms, RetryAfter: 119999 * ms, NextAfter: 119999 * ms},
	} {
		for i := 0; i < n; i++ {
			c := []window.Charge{ch(u+strconv.Itoa(i), "r", perMin(1), 1)}
			allowed, err := s.Take(ctx, T0.Add(30*sec), c, out)
			if err != nil {
				t.Fatal(err)
			}
			if allowed != want.Allowed || out[0] != want {
				t.Fatalf("round %d, key %d: got %v %s, want %s", round, i, allowed, fmtDecisions(out), fmtDecisions([]window.Decision{want}))
			}
		}
	}
}

// testHostileKeys checks that keys and names with separators, braces,
// newlines, no bytes at all or a megabyte of them are counted apart.
func testHostileKeys(t *testing.T, s Store) {
	u := unique(t)
	keys := []string{
		"", "a", "b", "{a}", "{b}", "a}", "{a", "}{", "a:b", "a:", ":b", "a\nb", "a\r\nb", "a\x00b",
		"a*", "a?", "a[b]", "é", strings.Repeat("x", 64), strings.Repeat("x", 65), strings.Repeat("x", 1<<20),
		strings.Repeat("x", 1<<20) + "y",
	}
	names := []string{"r", "", "r:1", "{r}", "r\n", strings.Repeat("n", 64), strings.Repeat("n", 65), "r/x"}
	ctx := context.Background()
	out := make([]window.Decision, 1)
	for round, want := range []window.Decision{
		{Allowed: true, ResetAfter: 119999 * ms, NextAfter: 119999 * ms},
		{ResetAfter: 119999 * ms, RetryAfter: 119999 * ms, NextAfter: 119999 * ms},
	} {
		for _, k := range keys {
			for _, name := range names {
				c := []window.Charge{ch(u+k, name, perMin(1), 1)}
				allowed, err := s.Take(ctx, T0, c, out)
				if err != nil {
					t.Fatal(err)
				}
				if allowed != want.Allowed || out[0] != want {
					t.Fatalf("round %d, key %.40q, name %.40q: got %v %s, want %s",
						round, k, name, allowed, fmtDecisions(out), fmtDecisions([]window.Decision{want}))
				}
			}
		}
	}
}

// testStoreClock checks that the zero time means the store's own clock.
func testStoreClock(t *testing.T, s Store) {
	u := unique(t)
	out := make([]window.Decision, 1)
	allowed, err := s.Take(context.Background(), time.Time{}, []window.Charge{ch(u+"k", "r", perMin(10), 1)}, out)
	if err != nil {
		t.Fatal(err)
	}
	if !allowed || !out[0].Allowed || out[0].Remaining != 9 || out[0].RetryAfter != 0 ||
		out[0].ResetAfter <= time.Minute || out[0].ResetAfter > 2*time.Minute {
		t.Fatalf("got %v %s, want allowed, remaining 9, reset in (1m, 2m]", allowed, fmtDecisions(out))
	}
}

// testErrors checks the calls a store must refuse, and the empty request.
func testErrors(t *testing.T, s Store) {
	u := unique(t)
	ctx := context.Background()
	ok := ch(u+"k", "r", perMin(10), 1)
	bad := []struct {
		name    string
		charges []window.Charge
		out     int
	}{
		{"ShortOut", []window.Charge{ok, ch(u+"k", "r2", perMin(10), 1)}, 1},
		{"LongOut", []window.Charge{ok}, 2},
		{"ZeroRequests", []window.Charge{ok, ch(u+"k", "r2", perMin(0), 1)}, 2},
		{"ZeroWindow", []window.Charge{ch(u+"k", "r", window.Limit{Requests: 1}, 1)}, 1},
		{"FractionalWindow", []window.Charge{ch(u+"k", "r", window.Limit{Requests: 1, Window: 1500 * time.Microsecond}, 1)}, 1},
		{"TooManyRequests", []window.Charge{ch(u+"k", "r", window.Limit{Requests: window.MaxRequests + 1, Window: time.Second}, 1)}, 1},
		{"MaxInt", []window.Charge{ch(u+"k", "r", window.Limit{Requests: math.MaxInt, Window: time.Second}, 1)}, 1},
		{"LongWindow", []window.Charge{ch(u+"k", "r", window.Limit{Requests: 1, Window: window.MaxWindow + ms}, 1)}, 1},
		{"NegativeCost", []window.Charge{ch(u+"k", "r", perMin(10), -1)}, 1},
	}
	for _, tt := range bad {
		if _, err := s.Take(ctx, T0, tt.charges, make([]window.Decision, tt.out)); err == nil {
			t.Errorf("%s: Take returned no error", tt.name)
		}
	}
	// Nothing was counted by the failed calls.
	out := make([]window.Decision, 1)
	if allowed, err := s.Take(ctx, T0, []window.Charge{ch(u+"k", "r", perMin(10), 0)}, out); err != nil || !allowed || out[0] != (window.Decision{Allowed: true, Remaining: 10}) {
		t.Errorf("after the errors: got %v %s %v, want an untouched counter", allowed, fmtDecisions(out), err)
	}
	if allowed, err := s.Take(ctx, T0, nil, nil); err != nil || !allowed {
		t.Errorf("Take with no charges = %v, %v; want true, nil", allowed, err)
	}
}

// testAgainstReference replays a pseudo-random sequence of requests, with a
// clock that mostly goes forward, against the store and against a model
// built on window.Take, and requires identical answers. In the model, as in
// every store, only admitted charges with a cost change a counter.
func testAgainstReference(t *testing.T, s Store) {
	u := unique(t)
	m := model{}
	keys := []string{"a", "b", "c"}
	names := []string{"x", "y"}
	windows := []time.Duration{time.Minute, 90 * time.Second, time.Hour}
	rng := mrand.New(mrand.NewPCG(1, 2))
	ctx := context.Background()
	now, latest := T0, T0
	const steps = 600
	for step := 0; step < steps; step++ {
		switch r := rng.IntN(100); {
		case r < 5:
			// Back, but never to before the expiry of a counter that had
			// expired by the latest instant: a store may have dropped it
			// (as Redis does in real time), which is indistinguishable
			// from an empty counter only while the clock goes forward.
			back := now.Add(-time.Duration(rng.IntN(90_000)) * time.Millisecond)
			for _, c := range m {
				exp := time.UnixMilli(c.expiresAt())
				if !exp.After(latest) && exp.After(back) {
					back = exp
				}
			}
			now = back
		case r < 70:
			now = now.Add(time.Duration(rng.IntN(5_000)) * time.Millisecond)
		default:
			now = now.Add(time.Duration(rng.IntN(60_000)) * time.Millisecond)
		}
		if now.After(latest) {
			latest = now
		}
		n := 1 + rng.IntN(3)
		charges := make([]window.Charge, 0, n)
		for len(charges) < n {
			c := window.Charge{
				Key:   keys[rng.IntN(len(keys))],
				Name:  names[rng.IntN(len(names))],
				Limit: window.Limit{Requests: 1 + rng.IntN(12), Window: windows[rng.IntN(len(windows))]},
				Cost:  rng.IntN(5),
			}
			switch a := window.Algorithm(rng.IntN(4)); a {
			case window.TokenBucket:
				c.Limit.Algorithm, c.Limit.Burst = a, rng.IntN(13)
			case window.FixedWindow:
				c.Limit.Algorithm = a
				if rng.IntN(3) == 0 {
					c.Limit.Window, c.Limit.Period, c.Limit.Location = 0, window.CalendarDay, paris
				}
			default:
				c.Limit.Algorithm = a
			}
			if rng.IntN(20) == 0 {
				c.Cost = 13 + rng.IntN(5) // more than any limit
			}
			c.Key = u + c.Key
			charges = append(charges, c)
		}
		wantAllowed, want := m.take(now, charges)
		got := make([]window.Decision, n)
		allowed, err := s.Take(ctx, now, charges, got)
		if err != nil {
			t.Fatalf("step %d: %v", step, err)
		}
		if allowed != wantAllowed || !equal(got, want) {
			t.Fatalf("step %d at T0+%s, %s:\n got %v %s\nwant %v %s", step, now.Sub(T0), describeCharges(charges),
				allowed, fmtDecisions(got), wantAllowed, fmtDecisions(want))
		}
	}
}

// Model is the reference store: window.Take over a map of states, in
// memory, with no bound and no expiry. Running the suite against it checks
// the hand-worked tables against package window itself.
type Model struct {
	mu sync.Mutex
	m  model
}

// Take decides charges at now (the zero time means time.Now) as every
// store does.
func (s *Model) Take(ctx context.Context, now time.Time, charges []window.Charge, out []window.Decision) (bool, error) {
	if len(out) != len(charges) {
		return false, fmt.Errorf("model: %d decisions for %d charges", len(out), len(charges))
	}
	for i, c := range charges {
		if err := c.Limit.Validate(); err != nil {
			return false, fmt.Errorf("model: charge %d: %w", i, err)
		}
		if c.Cost < 0 {
			return false, fmt.Errorf("model: charge %d: negative cost %d", i, c.Cost)
		}
	}
	if now.IsZero() {
		now = time.Now()
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.m == nil {
		s.m = model{}
	}
	allowed, ds := s.m.take(now, charges)
	copy(out, ds)
	return allowed, nil
}
