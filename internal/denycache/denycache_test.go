package denycache

import (
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/window"
)

var t0 = time.Date(2009, 11, 10, 23, 0, 0, 0, time.UTC)

func at(d time.Duration) time.Time { return t0.Add(d) }

// charge returns a charge of cost on key under the rule "api", 100 per
// minute unless requests says otherwise.
func charge(key string, requests, cost int) window.Charge {
	return window.Charge{Key: key, Name: "api", Limit: window.Limit{Requests: requests, Window: time.Minute}, Cost: cost}
}

// denied is a store's denial with RetryAfter retry.
func denied(retry time.Duration) window.Decision {
	return window.Decision{Remaining: 2, ResetAfter: 50 * time.Second, RetryAfter: retry, NextAfter: retry / 2}
}

// record records a denial of ch alone at now.
func record(c *Cache, now time.Time, ch window.Charge, d window.Decision) {
	c.Record(now, []window.Charge{ch}, []window.Decision{d})
}

func lookup(c *Cache, now time.Time, chs ...window.Charge) (int, window.Decision, bool) {
	return c.Lookup(now, chs)
}

func TestLookupByCost(t *testing.T) {
	t.Parallel()
	c := New(Config{})
	record(c, t0, charge("ip:1", 100, 3), denied(10*time.Second))
	for _, tt := range []struct {
		cost      int
		wantHit   bool
		wantRetry time.Duration
	}{
		{cost: -1},
		{cost: 0},
		{cost: 1},
		{cost: 2},
		{cost: 3, wantHit: true, wantRetry: 10 * time.Second},
		{cost: 7, wantHit: true, wantRetry: 10 * time.Second},
		{cost: 100, wantHit: true, wantRetry: 10 * time.Second},
		{cost: 101, wantHit: true, wantRetry: -1}, // never fits
	} {
		t.Run(fmt.Sprint(tt.cost), func(t *testing.T) {
			t.Parallel()
			idx, d, ok := lookup(c, t0, charge("ip:1", 100, tt.cost))
			if ok != tt.wantHit {
				t.Fatalf("hit = %v, want %v", ok, tt.wantHit)
			}
			if !ok {
				if idx != -1 || d != (window.Decision{}) {
					t.Fatalf("miss returned %d, %+v", idx, d)
				}
				return
			}
			if idx != 0 || d.Allowed || d.RetryAfter != tt.wantRetry {
				t.Fatalf("got %d, %+v, want 0 and RetryAfter %v", idx, d, tt.wantRetry)
			}
		})
	}
}

func TestLookupIdentity(t *testing.T) {
	t.Parallel()
	c := New(Config{})
	base := charge("user:7", 100, 1)
	record(c, t0, base, denied(time.Second))
	other := func(f func(*window.Charge)) window.Charge {
		ch := base
		f(&ch)
		return ch
	}
	for _, tt := range []struct {
		name string
		ch   window.Charge
		want bool
	}{
		{"same", base, true},
		{"key", other(func(c *window.Charge) { c.Key = "user:8" }), false},
		{"key prefix", other(func(c *window.Charge) { c.Key = "user:" }), false},
		{"name", other(func(c *window.Charge) { c.Name = "login" }), false},
		{"window", other(func(c *window.Charge) { c.Limit.Window = time.Hour }), false},
		{"plan up", other(func(c *window.Charge) { c.Limit.Requests = 200 }), false},
		{"plan down", other(func(c *window.Charge) { c.Limit.Requests = 50 }), false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if _, _, got := lookup(c, t0, tt.ch); got != tt.want {
				t.Fatalf("hit = %v, want %v", got, tt.want)
			}
		})
	}
}

func TestExpiry(t *testing.T) {
	t.Parallel()
	const retry = 10 * time.Second
	for _, tt := range []struct {
		after time.Duration
		want  bool
	}{
		{-time.Hour, true}, // an instant read before the record
		{0, true},
		{retry - time.Nanosecond, true},
		{retry, false},
		{retry + time.Nanosecond, false},
		{time.Hour, false},
	} {
		t.Run(tt.after.String(), func(t *testing.T) {
			t.Parallel()
			c := New(Config{})
			ch := charge("ip:1", 100, 1)
			record(c, at(time.Minute), ch, denied(retry))
			_, _, got := lookup(c, at(time.Minute+tt.after), ch)
			if got != tt.want {
				t.Fatalf("hit = %v, want %v", got, tt.want)
			}
			// A Lookup that meets an expired entry drops it.
			if wantLen := map[bool]int{true: 1, false: 0}[tt.want]; c.Len() != wantLen {
				t.Fatalf("Len = %d, want %d", c.Len(), wantLen)
			}
		})
	}
}

func TestAged(t *testing.T) {
	t.Parallel()
	stored := window.Decision{Remaining: 4, ResetAfter: 50 * time.Second, RetryAfter: 10 * time.Second, NextAfter: 5 * time.Second}
	ms := time.Millisecond
	for _, tt := range []struct {
		elapsed time.Duration
		stored  window.Decision
		want    window.Decision
	}{
		{0, stored, stored},
		{4 * time.Second, stored, window.Decision{Remaining: 4, ResetAfter: 46 * time.Second, RetryAfter: 6 * time.Second, NextAfter: time.Second}},
		{5*time.Second - ms, stored, window.Decision{Remaining: 4, ResetAfter: 45*time.Second + ms, RetryAfter: 5*time.Second + ms, NextAfter: ms}},
		{6 * time.Second, stored, window.Decision{Remaining: 4, ResetAfter: 44 * time.Second, RetryAfter: 4 * time.Second, NextAfter: ms}},
		{10*time.Second - time.Nanosecond, stored, window.Decision{Remaining: 4, ResetAfter: 40*time.Second + 1, RetryAfter: ms, NextAfter: ms}},
		{10*time.Second - 2*ms, stored, window.Decision{Remaining: 4, ResetAfter: 40*time.Second + 2*ms, RetryAfter: 2 * ms, NextAfter: ms}},
		// Zero figures stay zero.
		{3 * time.Second, window.Decision{RetryAfter: 10 * time.Second}, window.Decision{RetryAfter: 7 * time.Second}},
		// An instant before the record ages nothing.
		{-time.Second, stored, stored},
	} {
		t.Run(tt.elapsed.String(), func(t *testing.T) {
			t.Parallel()
			c := New(Config{})
			ch := charge("ip:1", 100, 1)
			record(c, t0, ch, tt.stored)
			_, got, ok := lookup(c, at(tt.elapsed), ch)
			if !ok || got != tt.want {
				t.Fatalf("got %+v, %v, want %+v", got, ok, tt.want)
			}
		})
	}
}

func TestSeveralCharges(t *testing.T) {
	t.Parallel()
	c := New(Config{})
	perIP := window.Charge{Key: "ip:1", Name: "ip", Limit: window.Limit{Requests: 10, Window: time.Second}, Cost: 1}
	perUser := window.Charge{Key: "user:1", Name: "user", Limit: window.Limit{Requests: 100, Window: time.Minute}, Cost: 1}
	perRoute := window.Charge{Key: "user:1", Name: "route", Limit: window.Limit{Requests: 5, Window: time.Minute}, Cost: 1}
	// The store denied on the route only; the others fit.
	c.Record(t0, []window.Charge{perIP, perUser, perRoute}, []window.Decision{
		{Allowed: true, Remaining: 9},
		{Allowed: true, Remaining: 99},
		denied(3 * time.Second),
	})
	if c.Len() != 1 {
		t.Fatalf("Len = %d, want 1", c.Len())
	}
	for _, tt := range []struct {
		name    string
		chs     []window.Charge
		wantIdx int
	}{
		{"last", []window.Charge{perIP, perUser, perRoute}, 2},
		{"first", []window.Charge{perRoute, perIP}, 0},
		{"middle", []window.Charge{perUser, perRoute, perIP}, 1},
		{"none", []window.Charge{perIP, perUser}, -1},
		{"empty", nil, -1},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			idx, d, ok := c.Lookup(at(time.Second), tt.chs)
			if idx != tt.wantIdx || ok != (tt.wantIdx >= 0) {
				t.Fatalf("got %d, %v, want %d", idx, ok, tt.wantIdx)
			}
			if ok && d.RetryAfter != 2*time.Second {
				t.Fatalf("RetryAfter = %v, want 2s", d.RetryAfter)
			}
		})
	}

	// Two denials on one request: the first matching charge is reported.
	c.Record(t0, []window.Charge{perIP}, []window.Decision{denied(500 * time.Millisecond)})
	if idx, _, _ := c.Lookup(t0, []window.Charge{perRoute, perIP}); idx != 0 {
		t.Fatalf("idx = %d, want 0", idx)
	}
	if idx, _, _ := c.Lookup(t0, []window.Charge{perIP, perRoute}); idx != 0 {
		t.Fatalf("idx = %d, want 0", idx)
	}
}

func TestNever(t *testing.T) {
	t.Parallel()
	never := window.Decision{Remaining: 7, ResetAfter: 20 * time.Second, RetryAfter: -1, NextAfter: 0}

	t.Run("cached for NeverTTL", func(t *testing.T) {
		t.Parallel()
		c := New(Config{})
		record(c, t0, charge("k", 100, 150), never)
		for _, tt := range []struct {
			after time.Duration
			cost  int
			want  bool
		}{
			{0, 150, true},
			{0, 101, true}, // every cost above the limit
			{0, 100, false},
			{0, 1, false},
			{NeverTTL - 1, 101, true},
			{NeverTTL, 101, false},
		} {
			_, d, ok := lookup(c, at(tt.after), charge("k", 100, tt.cost))
			if ok != tt.want {
				t.Fatalf("after %v cost %d: hit = %v, want %v", tt.after, tt.cost, ok, tt.want)
			}
			if ok && (d.RetryAfter != -1 || d.Remaining != 7 || d.ResetAfter != 20*time.Second-tt.after || d.NextAfter != 0) {
				t.Fatalf("after %v cost %d: got %+v", tt.after, tt.cost, d)
			}
		}
	})
	t.Run("does not replace a live entry", func(t *testing.T) {
		t.Parallel()
		c := New(Config{})
		record(c, t0, charge("k", 100, 3), denied(10*time.Second))
		record(c, t0, charge("k", 100, 150), never)
		if _, d, ok := lookup(c, at(5*time.Second), charge("k", 100, 3)); !ok || d.RetryAfter != 5*time.Second {
			t.Fatalf("got %+v, %v", d, ok)
		}
		// The live entry answers costs above the limit too, as never.
		if _, d, ok := lookup(c, at(5*time.Second), charge("k", 100, 101)); !ok || d.RetryAfter != -1 {
			t.Fatalf("got %+v, %v", d, ok)
		}
	})
	t.Run("replaced by a denial", func(t *testing.T) {
		t.Parallel()
		c := New(Config{})
		record(c, t0, charge("k", 100, 150), never)
		record(c, t0, charge("k", 100, 3), denied(10*time.Second))
		if _, _, ok := lookup(c, at(5*time.Second), charge("k", 100, 3)); !ok {
			t.Fatal("miss")
		}
		if c.Len() != 1 {
			t.Fatalf("Len = %d, want 1", c.Len())
		}
	})
	t.Run("limit at MaxInt", func(t *testing.T) {
		t.Parallel()
		c := New(Config{})
		record(c, t0, charge("k", math.MaxInt, 1), never)
		if c.Len() != 0 {
			t.Fatalf("Len = %d, want 0", c.Len())
		}
	})
}

func TestMerge(t *testing.T) {
	t.Parallel()
	type rec struct {
		cost  int
		retry time.Duration
	}
	for _, tt := range []struct {
		name        string
		first, then rec
		// wantCost and wantRetry describe the entry kept, probed 1s later.
		wantCost  int
		wantRetry time.Duration
	}{
		{"old dominates", rec{2, 10 * time.Second}, rec{3, 5 * time.Second}, 2, 9 * time.Second},
		{"equal keeps old", rec{2, 10 * time.Second}, rec{2, 10 * time.Second}, 2, 9 * time.Second},
		{"new dominates", rec{3, 5 * time.Second}, rec{2, 10 * time.Second}, 2, 9 * time.Second},
		{"new smaller cost, shorter", rec{3, 10 * time.Second}, rec{2, 5 * time.Second}, 2, 4 * time.Second},
		{"new larger cost, longer", rec{2, 5 * time.Second}, rec{3, 10 * time.Second}, 3, 9 * time.Second},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			c := New(Config{})
			record(c, t0, charge("k", 100, tt.first.cost), denied(tt.first.retry))
			record(c, t0, charge("k", 100, tt.then.cost), denied(tt.then.retry))
			if c.Len() != 1 {
				t.Fatalf("Len = %d, want 1", c.Len())
			}
			if _, _, ok := lookup(c, at(time.Second), charge("k", 100, tt.wantCost-1)); ok {
				t.Fatalf("cost %d denied", tt.wantCost-1)
			}
			_, d, ok := lookup(c, at(time.Second), charge("k", 100, tt.wantCost))
			if !ok || d.RetryAfter != tt.wantRetry {
				t.Fatalf("cost %d: got %+v, %v, want RetryAfter %v", tt.wantCost, d, ok, tt.wantRetry)
			}
		})
	}
	t.Run("expired is replaced", func(t *testing.T) {
		t.Parallel()
		c := New(Config{})
		record(c, t0, charge("k", 100, 1), denied(time.Second))
		record(c, at(time.Second), charge("k", 100, 5), denied(time.Second))
		if _, _, ok := lookup(c, at(time.Second), charge("k", 100, 1)); ok {
			t.Fatal("expired entry still denies")
		}
		if c.Len() != 1 {
			t.Fatalf("Len = %d, want 1", c.Len())
		}
	})
}

func TestForget(t *testing.T) {
	t.Parallel()
	c := New(Config{})
	a1 := charge("ip:1", 100, 1)
	a2 := window.Charge{Key: "ip:1", Name: "login", Limit: window.Limit{Requests: 5, Window: time.Hour}, Cost: 1}
	b := charge("ip:2", 100, 1)
	c.Record(t0, []window.Charge{a1, a2, b}, []window.Decision{denied(time.Minute), denied(time.Minute), denied(time.Minute)})
	if c.Len() != 3 {
		t.Fatalf("Len = %d, want 3", c.Len())
	}
	c.Forget("ip:1")
	c.Forget("ip:3") // nothing
	c.Forget("")
	if c.Len() != 1 {
		t.Fatalf("Len = %d, want 1", c.Len())
	}
	for _, ch := range []window.Charge{a1, a2} {
		if _, _, ok := lookup(c, t0, ch); ok {
			t.Fatalf("%+v still denied", ch)
		}
	}
	if _, _, ok := lookup(c, t0, b); !ok {
		t.Fatal("ip:2 forgotten")
	}
}

func TestMaxTTL(t *testing.T) {
	t.Parallel()
	c := New(Config{MaxTTL: 2 * time.Second})
	ch := charge("k", 100, 1)
	record(c, t0, ch, denied(time.Minute))
	if _, d, ok := lookup(c, at(2*time.Second-1), ch); !ok || d.RetryAfter != time.Minute-2*time.Second+1 {
		t.Fatalf("got %+v, %v", d, ok)
	}
	if _, _, ok := lookup(c, at(2*time.Second), ch); ok {
		t.Fatal("denied after MaxTTL")
	}
	c = New(Config{MaxTTL: time.Millisecond})
	record(c, t0, charge("k", 100, 150), window.Decision{RetryAfter: -1})
	if _, _, ok := lookup(c, at(time.Millisecond), charge("k", 100, 150)); ok {
		t.Fatal("never entry outlived MaxTTL")
	}
}

func TestRecordSkips(t *testing.T) {
	t.Parallel()
	c := New(Config{})
	ch := charge("k", 100, 1)
	c.Record(t0, []window.Charge{ch, ch, charge("k", 100, -1)}, []window.Decision{
		{Allowed: true},
		{Allowed: false, RetryAfter: 0},
		denied(time.Second),
	})
	c.Record(t0, []window.Charge{ch}, nil) // lengths differ: the shorter counts
	c.Record(time.Time{}, []window.Charge{ch}, []window.Decision{denied(time.Second)})
	c.Record(t0.AddDate(200, 0, 0), []window.Charge{ch}, []window.Decision{denied(time.Second)})
	if c.Len() != 0 {
		t.Fatalf("Len = %d, want 0", c.Len())
	}
}

func TestUnusableTimes(t *testing.T) {
	t.Parallel()
	c := New(Config{})
	ch := charge("k", 100, 1)
	record(c, t0, ch, denied(time.Hour))
	for _, now := range []time.Time{{}, t0.AddDate(-200, 0, 0), t0.AddDate(200, 0, 0)} {
		if _, _, ok := lookup(c, now, ch); ok {
			t.Fatalf("hit at %v", now)
		}
	}
	// Monotonic readings work, and so does a clock far from the Cache's.
	c = New(Config{})
	now := time.Now()
	record(c, now, ch, denied(time.Hour))
	if _, d, ok := lookup(c, now.Add(time.Minute), ch); !ok || d.RetryAfter != 59*time.Minute {
		t.Fatalf("monotonic: got %+v, %v", d, ok)
	}
	old := time.Unix(0, 0)
	record(c, old, charge("old", 100, 1), denied(time.Hour))
	if _, d, ok := lookup(c, old.Add(time.Minute), charge("old", 100, 1)); !ok || d.RetryAfter != 59*time.Minute {
		t.Fatalf("1970: got %+v, %v", d, ok)
	}
}

func TestHugeDurations(t *testing.T) {
	t.Parallel()
	c := New(Config{})
	ch := charge("k", 100, 1)
	huge := time.Duration(math.MaxInt64)
	record(c, t0, ch, window.Decision{ResetAfter: huge, RetryAfter: huge, NextAfter: huge})
	_, d, ok := lookup(c, at(100*365*24*time.Hour), ch)
	if !ok || d.RetryAfter <= 0 || d.ResetAfter <= 0 || d.NextAfter <= 0 {
		t.Fatalf("got %+v, %v", d, ok)
	}
}

func TestCapacity(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct{ max, want int }{
		{0, DefaultMaxEntries},
		{-5, DefaultMaxEntries},
		{1, 1},
		{7, 7},
		{8, 8},
		{9, 8},
		{100, 96},
		{65536, 65536},
	} {
		if got := New(Config{MaxEntries: tt.max}).Cap(); got != tt.want {
			t.Errorf("MaxEntries %d: Cap = %d, want %d", tt.max, got, tt.want)
		}
	}
}

func TestEviction(t *testing.T) {
	t.Parallel()
	key := func(i int) window.Charge { return charge(fmt.Sprintf("ip:%d", i), 100, 1) }
	t.Run("soonest to expire", func(t *testing.T) {
		t.Parallel()
		c := New(Config{MaxEntries: 8}) // one bucket
		for i := range 8 {
			// Key 5 expires first.
			retry := time.Duration(20-i) * time.Second
			if i == 5 {
				retry = time.Second
			}
			record(c, t0, key(i), denied(retry))
		}
		record(c, t0, key(8), denied(time.Minute))
		if c.Len() != 8 {
			t.Fatalf("Len = %d, want 8", c.Len())
		}
		for i := range 9 {
			if _, _, ok := lookup(c, t0, key(i)); ok != (i != 5) {
				t.Errorf("key %d: hit = %v", i, ok)
			}
		}
	})
	t.Run("expired first", func(t *testing.T) {
		t.Parallel()
		c := New(Config{MaxEntries: 8})
		for i := range 8 {
			retry := time.Minute
			if i == 2 || i == 6 {
				retry = time.Second
			}
			record(c, t0, key(i), denied(retry))
		}
		record(c, at(2*time.Second), key(8), denied(time.Minute))
		if c.Len() != 7 { // both expired entries dropped
			t.Fatalf("Len = %d, want 7", c.Len())
		}
		for i := range 9 {
			if _, _, ok := lookup(c, at(2*time.Second), key(i)); ok != (i != 2 && i != 6) {
				t.Errorf("key %d: hit = %v", i, ok)
			}
		}
	})
	t.Run("tiny", func(t *testing.T) {
		t.Parallel()
		c := New(Config{MaxEntries: 1})
		record(c, t0, key(0), denied(time.Minute))
		record(c, t0, key(1), denied(time.Hour))
		if c.Len() != 1 {
			t.Fatalf("Len = %d, want 1", c.Len())
		}
		if _, _, ok := lookup(c, t0, key(1)); !ok {
			t.Fatal("newest entry missing")
		}
	})
}

// TestBounded records a million distinct keys (a quarter of a million
// under the race detector, which makes them a hundred times slower: still
// nearly four times MaxEntries): the cache stays within MaxEntries, in
// count and in memory, and keeps working.
func TestBounded(t *testing.T) {
	if testing.Short() {
		t.Skip("a million records")
	}
	const keys = 1_000_000 / raceScale
	c := New(Config{})
	var before runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)

	chs := []window.Charge{charge("", 100, 1)}
	ds := []window.Decision{denied(time.Hour)}
	buf := make([]byte, 0, 64)
	for i := range keys {
		buf = fmt.Appendf(buf[:0], "ip:%d.%d.%d.%d/attacker-invented-suffix", i>>24, i>>16&255, i>>8&255, i&255)
		chs[0].Key = string(buf)
		c.Record(at(time.Duration(i)), chs, ds)
		if i%4096 == 0 && c.Len() > DefaultMaxEntries {
			t.Fatalf("after %d keys: Len = %d > %d", i+1, c.Len(), DefaultMaxEntries)
		}
	}
	if c.Len() > DefaultMaxEntries || c.Len() < DefaultMaxEntries*9/10 {
		t.Fatalf("Len = %d, want at most and about %d", c.Len(), DefaultMaxEntries)
	}
	if _, _, ok := c.Lookup(at(keys), chs); !ok {
		t.Fatal("last key not denied")
	}

	var after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&after)
	grown := int64(after.HeapAlloc) - int64(before.HeapAlloc)
	perEntry := float64(grown) / float64(c.Cap())
	t.Logf("%d entries: %d bytes of heap, %.1f per entry", c.Len(), grown, perEntry)
	if perEntry > 128 {
		t.Fatalf("%.1f bytes per entry", perEntry)
	}
	runtime.KeepAlive(c)
}

// TestConcurrent hammers a few hot keys and many cold ones from 64
// goroutines with Lookup, Record and Forget; run it with -race.
func TestConcurrent(t *testing.T) {
	t.Parallel()
	c := New(Config{MaxEntries: 512})
	var clock atomic.Int64 // ns since t0
	var wg sync.WaitGroup
	var hits atomic.Int64
	for g := range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(g), 1))
			chs := make([]window.Charge, 2)
			ds := make([]window.Decision, 2)
			for range 2000 {
				now := at(time.Duration(clock.Add(int64(rng.IntN(1000)))))
				for k := range chs {
					key := "hot"
					if rng.IntN(4) == 0 {
						key = fmt.Sprintf("cold:%d", rng.IntN(10000))
					}
					chs[k] = charge(key, 10+rng.IntN(2), rng.IntN(4))
					ds[k] = denied(time.Duration(1+rng.IntN(1e6)) * time.Nanosecond)
					ds[k].Allowed = rng.IntN(3) == 0
				}
				switch rng.IntN(10) {
				case 0:
					c.Record(now, chs, ds)
				case 1:
					c.Forget("hot")
				default:
					idx, d, ok := c.Lookup(now, chs)
					if ok {
						hits.Add(1)
						if idx < 0 || idx >= len(chs) || d.Allowed || d.RetryAfter < time.Millisecond {
							t.Errorf("bad hit: %d, %+v", idx, d)
						}
					} else if idx != -1 {
						t.Errorf("miss with idx %d", idx)
					}
				}
				if n := c.Len(); n > c.Cap() || n < 0 {
					t.Errorf("Len = %d, Cap = %d", n, c.Cap())
				}
			}
		}()
	}
	wg.Wait()
	t.Logf("%d hits", hits.Load())
	if hits.Load() == 0 {
		t.Error("no hits")
	}
	// Len counts the entries held.
	held := 0
	for i := range c.buckets {
		if b := c.buckets[i].Load(); b != nil {
			for j := range c.ways {
				if b.tags[j].Load() != 0 {
					held++
				}
			}
		}
	}
	if held != c.Len() {
		t.Fatalf("Len = %d, %d held", c.Len(), held)
	}
}

func TestLookupAllocs(t *testing.T) {
	// Not parallel: AllocsPerRun counts every goroutine's allocations.
	c := New(Config{})
	hot := []window.Charge{charge("ip:1", 100, 1), charge("ip:1", 100, 5)}
	record(c, t0, hot[1], denied(time.Hour))
	for i := range 1000 {
		record(c, t0, charge(fmt.Sprintf("ip:x%d", i), 100, 1), denied(time.Hour))
	}
	now := at(time.Second)
	for _, tt := range []struct {
		name string
		chs  []window.Charge
		want bool
	}{
		{"miss", []window.Charge{charge("ip:2", 100, 1)}, false},
		{"miss, same key", hot[:1], false},
		{"hit", hot, true},
	} {
		var ok bool
		allocs := testing.AllocsPerRun(1000, func() { _, _, ok = c.Lookup(now, tt.chs) })
		if ok != tt.want || allocs != 0 {
			t.Errorf("%s: hit = %v, %v allocs", tt.name, ok, allocs)
		}
	}
	empty := New(Config{})
	if allocs := testing.AllocsPerRun(1000, func() { empty.Lookup(now, hot) }); allocs != 0 {
		t.Errorf("empty: %v allocs", allocs)
	}
}

// TestNeverDeniesWhatStoreAdmits runs random traffic against the reference
// store (window.Take) with the cache in front, as a Limiter would, and
// checks at every request the cache denies that the store would have
// denied it too: with Record given the store's instant, the cache never
// denies more than the store.
func TestNeverDeniesWhatStoreAdmits(t *testing.T) {
	t.Parallel()
	type counter struct {
		key, name string
		w         time.Duration
	}
	for seed := range uint64(8) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			t.Parallel()
			rng := rand.New(rand.NewPCG(seed, 42))
			c := New(Config{})
			states := map[counter]window.State{}
			rules := []struct {
				name  string
				w     time.Duration
				plans []int
			}{
				{"burst", time.Second, []int{3, 5, 8}}, // plans change
				{"hour", 10 * time.Second, []int{20}},
				{"tiny", 50 * time.Millisecond, []int{2}},
			}
			var hits, denials, calls int
			ms := int64(0)
			for range 30000 {
				ms += int64(rng.IntN(120))
				now := at(time.Duration(ms) * time.Millisecond)
				n := 1 + rng.IntN(3)
				chs := make([]window.Charge, n)
				ids := make([]counter, n)
				for i := range chs {
					r := rules[rng.IntN(len(rules))]
					key := []string{"a", "b"}[rng.IntN(2)]
					chs[i] = window.Charge{Key: key, Name: r.name, Limit: window.Limit{Requests: r.plans[rng.IntN(len(r.plans))], Window: r.w}, Cost: rng.IntN(10)}
					ids[i] = counter{key, r.name, r.w}
				}
				st := make([]window.State, n)
				for i, id := range ids {
					st[i] = states[id]
				}
				out := make([]window.Decision, n)
				peek := append([]window.State(nil), st...)
				storeAllows := window.Take(peek, window.Millis(now), chs, out)

				if idx, d, ok := c.Lookup(now, chs); ok {
					hits++
					if storeAllows || out[idx].Allowed {
						t.Fatalf("ms %d: cache denied %+v on charge %d, store admits: %+v", ms, chs, idx, out)
					}
					if want := out[idx].RetryAfter; want < 0 && d.RetryAfter != -1 || want > 0 && (d.RetryAfter <= 0 || d.RetryAfter > want) {
						t.Fatalf("ms %d: RetryAfter %v, store's %v", ms, d.RetryAfter, want)
					}
					continue
				}
				calls++
				allowed := window.Take(st, window.Millis(now), chs, out)
				if !allowed {
					denials++
					c.Record(now, chs, out)
				}
				// window.Take charged each copy of a counter that a request
				// names twice with its own cost; like memstore, charge the
				// counter with all of them.
				sum := map[counter]int64{}
				for i, id := range ids {
					sum[id] += int64(chs[i].Cost)
				}
				for i, id := range ids {
					s := st[i]
					if allowed {
						s.Curr += sum[id] - int64(chs[i].Cost)
					}
					states[id] = s
				}
			}
			t.Logf("%d requests from the cache, %d store calls, %d denied", hits, calls, denials)
			if hits < 1000 {
				t.Fatalf("only %d hits", hits)
			}
		})
	}
}

func FuzzLookup(f *testing.F) {
	f.Add("ip:1", "api", 100, int64(time.Minute), 3, int64(time.Second), 3, int64(0))
	f.Add("", "", 0, int64(0), 0, int64(-1), 1, int64(-1))
	f.Add("k", "n", -1, int64(-5), -3, int64(math.MaxInt64), math.MaxInt, int64(math.MinInt64))
	f.Add("k", "n", math.MaxInt, int64(math.MaxInt64), math.MinInt, int64(math.MinInt64), math.MaxInt, int64(math.MaxInt64))
	c := New(Config{MaxEntries: 64})
	f.Fuzz(func(t *testing.T, key, name string, requests int, w int64, cost int, retry int64, lcost int, dt int64) {
		ch := window.Charge{Key: key, Name: name, Limit: window.Limit{Requests: requests, Window: time.Duration(w)}, Cost: cost}
		d := window.Decision{Remaining: requests, ResetAfter: time.Duration(retry), RetryAfter: time.Duration(retry), NextAfter: time.Duration(dt)}
		c.Record(t0, []window.Charge{ch}, []window.Decision{d})
		probe := ch
		probe.Cost = lcost
		now := t0.Add(time.Duration(dt))
		idx, got, ok := c.Lookup(now, []window.Charge{ch, probe})
		if !ok {
			if idx != -1 {
				t.Fatalf("miss with idx %d", idx)
			}
			return
		}
		if idx < 0 || idx > 1 || got.Allowed || got.RetryAfter == 0 || got.RetryAfter < -1 {
			t.Fatalf("bad hit: %d, %+v", idx, got)
		}
		if c.Len() > c.Cap() {
			t.Fatalf("Len = %d > Cap = %d", c.Len(), c.Cap())
		}
	})
}
