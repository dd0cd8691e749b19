// Package storetest is the conformance suite that every store runs, so that
// they all give the same answers: the memory store and the Redis store,
// standalone and on Redis Cluster.
//
// Run drives a store at fixed instants (T0 plus offsets) and compares every
// Decision with values worked out by hand from the formulas of package
// window, written into the tables. TestAgainstReference, also run by Run,
// then replays a long pseudo-random sequence against window.Take itself.
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
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/window"
)

// Store is the contract under test; it is middleware.Store, restated here
// so that this package does not import middleware.
type Store interface {
	Take(ctx context.Context, now time.Time, charges []window.Charge, out []window.Decision) (bool, error)
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
	want    []window.Decision
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

// d is a Decision.
func d(allowed bool, remaining int, reset, retry time.Duration) window.Decision {
	return window.Decision{Allowed: allowed, Remaining: remaining, ResetAfter: reset, RetryAfter: retry}
}

// one is a step with a single charge.
func one(at time.Duration, c window.Charge, want window.Decision) step {
	return step{at: at, charges: []window.Charge{c}, allowed: want.Allowed, want: []window.Decision{want}}
}

// never is the RetryAfter of a charge that costs more than its limit.
const never = -1

// The tables. In the comments, w is the window in ms, e the time elapsed in
// the current window, p and c the previous and current counts; a request
// of cost k fits when p*(w-e) + (c+k)*w <= limit*w, and
//
//	Remaining  = floor((limit*w - p*(w-e) - c*w) / w), at least 0
//	ResetAfter = 2w-e if c > 0, else w-e if p > 0, else 0
//	RetryAfter = max(0, w-e - (limit-c-k)*w/p)   if limit-c-k >= 0
//	           = w-e + w - (limit-k)*w/c          otherwise
var scenarios = []scenario{
	{"BurstThenDeny", []step{
		// 5/min, all at e=10s: c = 1..5, Remaining 4..0, reset 120-10 s.
		one(10*sec, ch("k", "r", perMin(5), 1), d(true, 4, 110*sec, 0)),
		one(10*sec, ch("k", "r", perMin(5), 1), d(true, 3, 110*sec, 0)),
		one(10*sec, ch("k", "r", perMin(5), 1), d(true, 2, 110*sec, 0)),
		one(10*sec, ch("k", "r", perMin(5), 1), d(true, 1, 110*sec, 0)),
		one(10*sec, ch("k", "r", perMin(5), 1), d(true, 0, 110*sec, 0)),
		// c=5: 6w > 5w. Retry in the next window: 60-10 + 60 - 4*60/5 = 62 s.
		one(10*sec, ch("k", "r", perMin(5), 1), d(false, 0, 110*sec, 62*sec)),
		// Window 2, e=11.999s, p=5: 5*48001 + 60000 > 300000. Remaining
		// floor(59995/60000) = 0, reset w-e = 48001 ms, retry 60000 -
		// 11999 - 4*60000/5 = 1 ms.
		one(71999*ms, ch("k", "r", perMin(5), 1), d(false, 0, 48001*ms, 1*ms)),
		// One millisecond later it fits exactly: 5*48000 + 60000 = 5w.
		one(72*sec, ch("k", "r", perMin(5), 1), d(true, 0, 108*sec, 0)),
		// p=5, c=1, e=12s: retry 48000 - 3*60000/5 = 12 s.
		one(72*sec, ch("k", "r", perMin(5), 1), d(false, 0, 108*sec, 12*sec)),
	}},
	{"WorkedExample", []step{
		// 100/min: 80 in the first window, 40 in the second, then 30 s
		// into the second window the estimate is 80*30/60 + 40 = 80.
		one(5*sec, ch("k", "r", perMin(100), 80), d(true, 20, 115*sec, 0)),
		// e=25s: 80*35000 + 40*60000 = 5.2e6 <= 6e6; Remaining 13.
		one(85*sec, ch("k", "r", perMin(100), 40), d(true, 13, 95*sec, 0)),
		one(90*sec, ch("k", "r", perMin(100), 0), d(true, 20, 90*sec, 0)),
		// Estimate 81 after this request: Remaining 19.
		one(90*sec, ch("k", "r", perMin(100), 1), d(true, 19, 90*sec, 0)),
	}},
	{"Costs", []step{
		one(0, ch("k", "r", perMin(10), 4), d(true, 6, 120*sec, 0)),
		one(0, ch("k", "r", perMin(10), 4), d(true, 2, 120*sec, 0)),
		// c=8: 12 > 10. Retry 60 + 60 - 6*60000/8 ms = 75 s.
		one(0, ch("k", "r", perMin(10), 4), d(false, 2, 120*sec, 75*sec)),
		one(0, ch("k", "r", perMin(10), 2), d(true, 0, 120*sec, 0)),
		// A cost above the limit never fits.
		one(0, ch("k", "r", perMin(10), 11), d(false, 0, 120*sec, never)),
		one(0, ch("k2", "r", perMin(10), 11), d(false, 10, 0, never)),
		one(0, ch("k2", "r", perMin(10), 1<<40), d(false, 10, 0, never)),
		// A cost equal to the limit fits an empty counter.
		one(0, ch("k3", "r", perMin(10), 10), d(true, 0, 120*sec, 0)),
	}},
	{"DeniedIsNotCharged", []step{
		one(30*sec, ch("k", "r", perMin(10), 8), d(true, 2, 90*sec, 0)),
		// 13 > 10; retry 60-30 + 60 - 5*60000/8 ms = 52.5 s.
		one(30*sec, ch("k", "r", perMin(10), 5), d(false, 2, 90*sec, 52500*ms)),
		one(30*sec, ch("k", "r", perMin(10), 2), d(true, 0, 90*sec, 0)),
		one(30*sec, ch("k", "r", perMin(10), 0), d(true, 0, 90*sec, 0)),
	}},
	{"RollOver", []step{
		one(30*sec, ch("k", "r", perMin(10), 6), d(true, 4, 90*sec, 0)),
		// Window 2, e=0: p=6 counts in full; 6+1 = 7.
		one(60*sec, ch("k", "r", perMin(10), 1), d(true, 3, 120*sec, 0)),
		// Window 3, e=30s, p=1 (window 2's count): 1*30000 + 60000 = 1.5w,
		// Remaining floor(8.5) = 8.
		one(150*sec, ch("k", "r", perMin(10), 1), d(true, 8, 90*sec, 0)),
		// Window 6, three windows after the last write: a fresh counter.
		one(315*sec, ch("k", "r", perMin(10), 1), d(true, 9, 105*sec, 0)),
	}},
	{"SkipTwoWindows", []step{
		one(10*sec, ch("k", "r", perMin(10), 10), d(true, 0, 110*sec, 0)),
		// Window 2, e=0: p=10 still counts in full. Retry 60 - 9*60/10 = 6 s.
		one(60*sec, ch("k", "r", perMin(10), 1), d(false, 0, 60*sec, 6*sec)),
		// Window 3: the count of window 1 no longer weighs.
		one(120*sec, ch("k", "r", perMin(10), 10), d(true, 0, 120*sec, 0)),
	}},
	{"Expiry", []step{
		// 100/h, filled 30 min into window 1.
		one(30*min, ch("k", "r", perHour(100), 100), d(true, 0, 90*min, 0)),
		// 1 ms before window 3: p=100 weighs 1/3600000, Remaining
		// floor((360000000-100)/3600000) = 99, reset w-e = 1 ms.
		one(2*time.Hour-ms, ch("k", "r", perHour(100), 0), d(true, 99, ms, 0)),
		// Idle for a full window after its own: empty.
		one(2*time.Hour, ch("k", "r", perHour(100), 0), d(true, 100, 0, 0)),
		one(5*time.Hour, ch("k", "r", perHour(100), 100), d(true, 0, 2*time.Hour, 0)),
	}},
	{"ClockBackwards", []step{
		one(30*sec, ch("k", "r", perMin(10), 6), d(true, 4, 90*sec, 0)),
		// Window 2, e=10s: 6*50000 + 2*60000 = 7w.
		one(70*sec, ch("k", "r", perMin(10), 2), d(true, 3, 110*sec, 0)),
		// Back in window 1: decided at the start of window 2 (e=0), where
		// p=6 counts in full: 6+2 = 8.
		one(55*sec, ch("k", "r", perMin(10), 0), d(true, 2, 120*sec, 0)),
		one(55*sec, ch("k", "r", perMin(10), 2), d(true, 0, 120*sec, 0)),
		// 6+5 > 10; retry 60 - 0 - 5*60000/6 ms = 10 s.
		one(55*sec, ch("k", "r", perMin(10), 1), d(false, 0, 120*sec, 10*sec)),
		// Forward again, e=15s: 6*45000 + 4*60000 = 510000, Remaining 1.
		one(75*sec, ch("k", "r", perMin(10), 0), d(true, 1, 105*sec, 0)),
		// Far back, before the counter's first window: still window 2.
		one(0, ch("k", "r", perMin(10), 0), d(true, 0, 120*sec, 0)),
	}},
	{"ReadsAndDeniesChangeNothing", []step{
		// Only admitted charges with a cost change a counter. A read or a
		// deny in a later window does not roll it, which shows when the
		// clock then goes back to the counter's own window.
		one(10*sec, ch("k", "r", perMin(10), 4), d(true, 6, 110*sec, 0)),
		one(70*sec, ch("k", "r", perMin(10), 0), d(true, 6, 50*sec, 0)),
		// 4*50000 + 9*60000 > 10w; retry 60 - 10 - 1*60000/4 ms = 35 s.
		one(70*sec, ch("k", "r", perMin(10), 9), d(false, 6, 50*sec, 35*sec)),
		// Back to e=20s of window 1, with c=4 as written.
		one(20*sec, ch("k", "r", perMin(10), 0), d(true, 6, 100*sec, 0)),
		// A denied request with two charges leaves the one that fits alone.
		{at: 20 * sec, charges: []window.Charge{ch("k", "r", perMin(10), 1), ch("k", "r2", perMin(1), 2)},
			allowed: false, want: []window.Decision{d(true, 6, 100*sec, 0), d(false, 1, 0, never)}},
		one(20*sec, ch("k", "r", perMin(10), 0), d(true, 6, 100*sec, 0)),
	}},
	{"AllOrNothingSameKey", allOrNothing("k", "k")},
	{"AllOrNothingTwoKeys", allOrNothing("k1", "k2")},
	{"AllOrNothingDenierFirst", []step{
		{at: 0, charges: []window.Charge{ch("k2", "b", perMin(1), 1), ch("k1", "a", perMin(10), 1)},
			allowed: true, want: []window.Decision{d(true, 0, 120*sec, 0), d(true, 9, 120*sec, 0)}},
		// b: c=1, 2 > 1, retry 60 + 60 - 0 = 120 s; a fits alone.
		{at: 0, charges: []window.Charge{ch("k2", "b", perMin(1), 1), ch("k1", "a", perMin(10), 1)},
			allowed: false, want: []window.Decision{d(false, 0, 120*sec, 120*sec), d(true, 9, 120*sec, 0)}},
		one(0, ch("k1", "a", perMin(10), 0), d(true, 9, 120*sec, 0)),
	}},
	{"AllOrNothingThreeKeys", []step{
		{at: 0, charges: []window.Charge{ch("k1", "a", perMin(10), 3), ch("k2", "b", perMin(5), 3), ch("k3", "c", perHour(10), 3)},
			allowed: true, want: []window.Decision{d(true, 7, 120*sec, 0), d(true, 2, 120*sec, 0), d(true, 7, 2*time.Hour, 0)}},
		// 6 > 5 on b: retry 60 + 60 - 2*60000/3 ms = 80 s.
		{at: 0, charges: []window.Charge{ch("k1", "a", perMin(10), 3), ch("k2", "b", perMin(5), 3), ch("k3", "c", perHour(10), 3)},
			allowed: false, want: []window.Decision{d(true, 7, 120*sec, 0), d(false, 2, 120*sec, 80*sec), d(true, 7, 2*time.Hour, 0)}},
		{at: 0, charges: []window.Charge{ch("k1", "a", perMin(10), 0), ch("k3", "c", perHour(10), 0)},
			allowed: true, want: []window.Decision{d(true, 7, 120*sec, 0), d(true, 7, 2*time.Hour, 0)}},
		// Two charges on k1 and one on k2; k2 denies (8 > 5, retry 60 + 60
		// - 0 s), so k1 keeps 3 and x stays empty.
		{at: 0, charges: []window.Charge{ch("k1", "a", perMin(10), 1), ch("k2", "b", perMin(5), 5), ch("k1", "x", perMin(10), 2)},
			allowed: false, want: []window.Decision{d(true, 7, 120*sec, 0), d(false, 2, 120*sec, 120*sec), d(true, 10, 0, 0)}},
		one(0, ch("k1", "a", perMin(10), 0), d(true, 7, 120*sec, 0)),
		one(0, ch("k1", "x", perMin(10), 0), d(true, 10, 0, 0)),
	}},
	{"SameCounterTwice", []step{
		// Each charge is decided against the counter as it was; both are
		// counted: 3+3 here, although 6 > 5.
		{at: 0, charges: []window.Charge{ch("k", "r", perMin(5), 3), ch("k", "r", perMin(5), 3)},
			allowed: true, want: []window.Decision{d(true, 2, 120*sec, 0), d(true, 2, 120*sec, 0)}},
		// Even a read does not fit 6 > 5: retry 60 + 60 - 5*60000/6 ms.
		one(0, ch("k", "r", perMin(5), 0), d(false, 0, 120*sec, 70*sec)),
		// Window 2, e=30s: p=6 weighs 3.
		one(90*sec, ch("k", "r", perMin(5), 0), d(true, 2, 30*sec, 0)),
		{at: 90 * sec, charges: []window.Charge{ch("k", "r", perMin(5), 1), ch("k", "r", perMin(5), 1)},
			allowed: true, want: []window.Decision{d(true, 1, 90*sec, 0), d(true, 1, 90*sec, 0)}},
		one(90*sec, ch("k", "r", perMin(5), 0), d(true, 0, 90*sec, 0)),
	}},
	{"SameKeyOtherName", []step{
		one(0, ch("k", "a", perMin(1), 1), d(true, 0, 120*sec, 0)),
		one(0, ch("k", "a", perMin(1), 1), d(false, 0, 120*sec, 120*sec)),
		one(0, ch("k", "b", perMin(1), 1), d(true, 0, 120*sec, 0)),
	}},
	{"SameKeyOtherWindow", []step{
		one(0, ch("k", "a", perMin(1), 1), d(true, 0, 120*sec, 0)),
		one(0, ch("k", "a", perMin(1), 1), d(false, 0, 120*sec, 120*sec)),
		one(0, ch("k", "a", perHour(1), 1), d(true, 0, 2*time.Hour, 0)),
		one(0, ch("k", "a", window.Limit{Requests: 1, Window: 2 * min}, 1), d(true, 0, 4*min, 0)),
	}},
	{"LimitChangeKeepsCount", []step{
		one(0, ch("k", "r", perMin(10), 5), d(true, 5, 120*sec, 0)),
		one(0, ch("k", "r", perMin(20), 0), d(true, 15, 120*sec, 0)),
		// Over a lowered limit: retry 60 + 60 - 2*60000/5 ms = 96 s.
		one(0, ch("k", "r", perMin(3), 1), d(false, 0, 120*sec, 96*sec)),
		// Even a read: 60 + 60 - 3*60000/5 ms = 84 s.
		one(0, ch("k", "r", perMin(3), 0), d(false, 0, 120*sec, 84*sec)),
	}},
}

// allOrNothing is a 10/min limit a on keyA and a 3/min limit b on keyB,
// charged together until b denies.
func allOrNothing(keyA, keyB string) []step {
	both := func(cost int) []window.Charge {
		return []window.Charge{ch(keyA, "a", perMin(10), cost), ch(keyB, "b", perMin(3), cost)}
	}
	return []step{
		{at: 0, charges: both(1), allowed: true, want: []window.Decision{d(true, 9, 120*sec, 0), d(true, 2, 120*sec, 0)}},
		{at: 0, charges: both(1), allowed: true, want: []window.Decision{d(true, 8, 120*sec, 0), d(true, 1, 120*sec, 0)}},
		{at: 0, charges: both(1), allowed: true, want: []window.Decision{d(true, 7, 120*sec, 0), d(true, 0, 120*sec, 0)}},
		// b: 4 > 3, retry 60 + 60 - 2*60000/3 ms = 80 s; a, which fits,
		// is described as not charged.
		{at: 0, charges: both(1), allowed: false, want: []window.Decision{d(true, 7, 120*sec, 0), d(false, 0, 120*sec, 80*sec)}},
		one(0, ch(keyA, "a", perMin(10), 0), d(true, 7, 120*sec, 0)),
		{at: 0, charges: both(0), allowed: true, want: []window.Decision{d(true, 7, 120*sec, 0), d(true, 0, 120*sec, 0)}},
	}
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
		if allowed != st.allowed || !equal(out, st.want) {
			t.Fatalf("step %d (T0+%s) %s:\n got %v %s\nwant %v %s",
				i, st.at, describeCharges(st.charges), allowed, fmtDecisions(out), st.allowed, fmtDecisions(st.want))
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
		fmt.Fprintf(&b, "{allowed=%v remaining=%d reset=%s retry=%s}", x.Allowed, x.Remaining, x.ResetAfter, x.RetryAfter)
	}
	return b.String()
}

// testManyKeys checks that 1,000 keys are counted apart.
func testManyKeys(t *testing.T, s Store) {
	const n = 1000
	u := unique(t)
	ctx := context.Background()
	out := make([]window.Decision, 1)
	for round, want := range []window.Decision{d(true, 0, 90*sec, 0), d(false, 0, 90*sec, 90*sec)} {
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
	for round, want := range []window.Decision{d(true, 0, 120*sec, 0), d(false, 0, 120*sec, 120*sec)} {
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
		{"Overflow", []window.Charge{ch(u+"k", "r", window.Limit{Requests: math.MaxInt32, Window: 24 * time.Hour}, 1)}, 1},
		{"NegativeCost", []window.Charge{ch(u+"k", "r", perMin(10), -1)}, 1},
	}
	for _, tt := range bad {
		if _, err := s.Take(ctx, T0, tt.charges, make([]window.Decision, tt.out)); err == nil {
			t.Errorf("%s: Take returned no error", tt.name)
		}
	}
	// Nothing was counted by the failed calls.
	out := make([]window.Decision, 1)
	if allowed, err := s.Take(ctx, T0, []window.Charge{ch(u+"k", "r", perMin(10), 0)}, out); err != nil || !allowed || out[0] != d(true, 10, 0, 0) {
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
	type id struct {
		key, name string
		w         time.Duration
	}
	model := map[id]window.State{}
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
			for k, st := range model {
				exp := time.UnixMilli(st.Start).Add(2 * k.w)
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
		ids := make([]id, 0, n)
		for len(charges) < n {
			c := window.Charge{
				Key:   keys[rng.IntN(len(keys))],
				Name:  names[rng.IntN(len(names))],
				Limit: window.Limit{Requests: 1 + rng.IntN(12), Window: windows[rng.IntN(len(windows))]},
				Cost:  rng.IntN(5),
			}
			if rng.IntN(20) == 0 {
				c.Cost = 13 + rng.IntN(5) // more than any limit
			}
			charges = append(charges, c)
			ids = append(ids, id{c.Key, c.Name, c.Limit.Window})
			charges[len(charges)-1].Key = u + c.Key
		}
		states := make([]window.State, n)
		for i, k := range ids {
			states[i] = model[k]
		}
		want := make([]window.Decision, n)
		wantAllowed := window.Take(states, window.Millis(now), charges, want)
		if wantAllowed {
			// Counters named twice get every cost, rolled once.
			for i, k := range ids {
				if charges[i].Cost > 0 {
					st := model[k]
					st, _ = window.Roll(st, window.Millis(now), k.w.Milliseconds())
					st.Curr += int64(charges[i].Cost)
					model[k] = st
				}
			}
		}
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
