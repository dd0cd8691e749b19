package window

import (
	"math/rand/v2"
	"testing"
	"time"
)

// TestLeakyBucketTable: 2 a second (a drop of 1000 per request, 2 drops a
// ms, so one request every 500 ms), a queue of 2.
func TestLeakyBucketTable(t *testing.T) {
	t.Parallel()
	l := PerSecondLeaky(2, 2, 0)
	const t0 = int64(1_800_000_000_000)
	runSteps(t, l, []step{
		// Empty: served at once. Level 1000 (one being served).
		{"first", t0, 1, true, Decision{Allowed: true, Remaining: 2, ResetAfter: 500 * ms, NextAfter: 500 * ms}, State{Start: t0, Prev: 1, Curr: 1000}},
		// 1000 ahead: waits 500 ms. Level 2000.
		{"second waits", t0, 1, true, Decision{Allowed: true, Remaining: 1, ResetAfter: time.Second, NextAfter: 500 * ms, Delay: 500 * ms}, State{Start: t0, Prev: 1, Curr: 2000}},
		// 2000 ahead: waits 1 s. Level 3000 = (queue+1) * 1000: full.
		{"third waits", t0, 1, true, Decision{Allowed: true, Remaining: 0, ResetAfter: 1500 * ms, NextAfter: 500 * ms, Delay: time.Second}, State{Start: t0, Prev: 1, Curr: 3000}},
		// Full: denied until 1000 drops have drained.
		{"queue full", t0 + 100, 1, false, Decision{Remaining: 0, ResetAfter: 1400 * ms, RetryAfter: 400 * ms, NextAfter: 400 * ms}, State{Start: t0 + 100, Prev: 1, Curr: 2800}},
		{"a place", t0 + 500, 1, true, Decision{Allowed: true, Remaining: 0, ResetAfter: 1500 * ms, NextAfter: 500 * ms, Delay: time.Second}, State{Start: t0 + 500, Prev: 1, Curr: 3000}},
		// Cost 4 is more than the queue and the one served: never.
		{"too big", t0 + 500, 4, false, Decision{Remaining: 0, ResetAfter: 1500 * ms, RetryAfter: -1, NextAfter: 500 * ms}, State{Start: t0 + 500, Prev: 1, Curr: 3000}},
		// Idle for 2 s: empty again, served at once.
		{"idle", t0 + 2500, 1, true, Decision{Allowed: true, Remaining: 2, ResetAfter: 500 * ms, NextAfter: 500 * ms}, State{Start: t0 + 2500, Prev: 1, Curr: 1000}},
	})

	// With a MaxDelay of 600 ms the third request (1 s wait) is refused,
	// though the queue has room: it may join once 800 drops have drained,
	// at a wait of exactly 600 ms.
	l = PerSecondLeaky(2, 2, 600*time.Millisecond)
	runSteps(t, l, []step{
		{"first", t0, 1, true, Decision{Allowed: true, Remaining: 2, ResetAfter: 500 * ms, NextAfter: 500 * ms}, State{Start: t0, Prev: 1, Curr: 1000}},
		// 1000 ahead (500 ms) <= 600 ms. After it 2000 ahead: 1 s, too long
		// for the next, so Remaining is 0 until 2000 - 2d <= 1200: 400 ms.
		{"second", t0, 1, true, Decision{Allowed: true, Remaining: 0, ResetAfter: time.Second, NextAfter: 400 * ms, Delay: 500 * ms}, State{Start: t0, Prev: 1, Curr: 2000}},
		{"third too long", t0, 1, false, Decision{Remaining: 0, ResetAfter: time.Second, RetryAfter: 400 * ms, NextAfter: 400 * ms}, State{Start: t0, Prev: 1, Curr: 2000}},
		// 1200 ahead: 600 ms. After it 2200 ahead; the next may join once
		// 2200 - 2d <= 1200: in 500 ms.
		{"third later", t0 + 400, 1, true, Decision{Allowed: true, Remaining: 0, ResetAfter: 1100 * ms, NextAfter: 500 * ms, Delay: 600 * ms}, State{Start: t0 + 400, Prev: 1, Curr: 2200}},
	})
}

// PerSecondLeaky is n a second released by a leaky bucket with a queue
// and a longest wait.
func PerSecondLeaky(n, queue int, maxDelay time.Duration) Limit {
	return Limit{Requests: n, Window: time.Second}.LeakyBucket(queue, maxDelay)
}

// TestLeakyBucketExact checks every figure of a Decision to the
// millisecond on random clients, Delay included.
func TestLeakyBucketExact(t *testing.T) {
	t.Parallel()
	limits := []Limit{
		PerSecondLeaky(2, 2, 0),
		PerSecondLeaky(10, 0, 0), // queue of 10
		PerSecondLeaky(3, 5, 700*time.Millisecond),
		{Requests: 7, Window: 3 * time.Second, Algorithm: LeakyBucket, Burst: 1},
		{Requests: 1 << 40, Window: time.Hour, Algorithm: LeakyBucket, Burst: 1 << 41, MaxDelay: time.Minute}, // ticks > 1 ms
	}
	checkRandomWalks(t, limits, []int64{0, 1_800_000_000_123}, 300)
	for _, l := range limits {
		rng := rand.New(rand.NewPCG(7, uint64(l.Requests)))
		randomWalk(l, rng, 1_800_000_000_000, l.Window.Milliseconds(), 300, func(s State, now int64) {
			for _, c := range costsFor(l) {
				ns, d, ok := take(l, s, now, c)
				if !ok {
					if d.Delay != 0 {
						t.Fatalf("%v: denied with a Delay %v", l, d.Delay)
					}
					continue
				}
				// The request's turn: when the work ahead of it has drained.
				p := leakyParams(l)
				ahead := ns.Curr - c*p.w
				if ahead < 0 {
					t.Fatalf("%v: level %d below the request's own work", l, ns.Curr)
				}
				wantTicks := (ahead + p.rate - 1) / p.rate
				if got := d.Delay; got != p.ms(ns, now, wantTicks) {
					t.Fatalf("%v state %+v cost %d: Delay %v, want %d ticks", l, s, c, got, wantTicks)
				}
				if l.MaxDelay > 0 && d.Delay > l.MaxDelay {
					t.Fatalf("%v: Delay %v above MaxDelay", l, d.Delay)
				}
			}
		})
	}
}

// TestLeakyBucketReleasesAtTheRate: a greedy client that takes every turn
// it is given is released (admission instant plus Delay) at the steady
// rate, never two turns closer than one interval, and never has more than
// the queue waiting.
func TestLeakyBucketReleasesAtTheRate(t *testing.T) {
	t.Parallel()
	for _, l := range []Limit{PerSecondLeaky(4, 3, 0), PerSecondLeaky(2, 10, 2*time.Second), PerSecondLeaky(100, 20, 0)} {
		interval := l.Window.Milliseconds() / int64(l.Requests)
		var s State
		var releases []int64
		start := int64(1_800_000_000_000)
		for now := start; now < start+5*l.Window.Milliseconds(); now += 7 {
			for {
				ns, d, ok := take(l, s, now, 1)
				if !ok {
					break
				}
				s = ns
				releases = append(releases, now+d.Delay.Milliseconds())
				waiting := 0
				for _, r := range releases {
					if r > now {
						waiting++
					}
				}
				if waiting > l.Burst {
					t.Fatalf("%v at %d: %d waiting, more than the queue of %d", l, now-start, waiting, l.Burst)
				}
			}
		}
		for i := 1; i < len(releases); i++ {
			if gap := releases[i] - releases[i-1]; gap < interval {
				t.Fatalf("%v: releases %d and %d are %d ms apart, less than the interval %d", l, i-1, i, gap, interval)
			}
		}
		if len(releases) < 5*l.Requests {
			t.Errorf("%v: %d released in 5 windows, want at least %d", l, len(releases), 5*l.Requests)
		}
	}
}
