package memstore

import (
	"context"
	"math/rand/v2"
	"strconv"
	"testing"
	"time"
	"unsafe"

	"github.com/sluicehq/sluice/internal/window"
)

func BenchmarkTake(b *testing.B) {
	// Large enough that the counters never fill during a benchmark.
	big := window.Limit{Requests: 1 << 30, Window: time.Minute}
	ctx := context.Background()

	b.Run("hot", func(b *testing.B) {
		s := newStore(b, Config{})
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			charges := []window.Charge{{Name: "per-ip", Key: "ip:203.0.113.7", Limit: big, Cost: 1}}
			out := make([]window.Decision, 1)
			for pb.Next() {
				s.Take(ctx, t0, charges, out)
			}
		})
	})

	b.Run("hot-two-limits", func(b *testing.B) {
		s := newStore(b, Config{})
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			charges := []window.Charge{
				{Name: "burst", Key: "ip:203.0.113.7", Limit: big, Cost: 1},
				{Name: "quota", Key: "ip:203.0.113.7", Limit: window.Limit{Requests: 1 << 30, Window: time.Hour / 4}, Cost: 1},
			}
			out := make([]window.Decision, 2)
			for pb.Next() {
				s.Take(ctx, t0, charges, out)
			}
		})
	})

	b.Run("distinct-100k", func(b *testing.B) {
		const n = 100_000
		s := newStore(b, Config{})
		keys := make([]string, n)
		out := make([]window.Decision, 1)
		for i := range keys {
			keys[i] = "ip:10." + strconv.Itoa(i>>16&255) + "." + strconv.Itoa(i>>8&255) + "." + strconv.Itoa(i&255)
			s.Take(ctx, t0, []window.Charge{{Name: "per-ip", Key: keys[i], Limit: big, Cost: 1}}, out)
		}
		if s.Len() != n {
			b.Fatalf("Len() = %d after populating, want %d", s.Len(), n)
		}
		b.ReportAllocs()
		b.ResetTimer()
		b.RunParallel(func(pb *testing.PB) {
			charges := []window.Charge{{Name: "per-ip", Limit: big, Cost: 1}}
			out := make([]window.Decision, 1)
			i := rand.IntN(n)
			for pb.Next() {
				charges[0].Key = keys[i]
				s.Take(ctx, t0, charges, out)
				if i++; i == n {
					i = 0
				}
			}
		})
	})

	b.Run("new-keys-at-cap", func(b *testing.B) {
		// Every Take inserts a new counter into a full store, which evicts
		// one.
		s := newStore(b, Config{MaxKeys: 1 << 14})
		charges := []window.Charge{{Name: "per-ip", Limit: big, Cost: 1}}
		out := make([]window.Decision, 1)
		var buf []byte
		for i := range 1 << 14 {
			buf = ipKey(buf, i)
			charges[0].Key = string(buf)
			s.Take(ctx, t0, charges, out)
		}
		// Only the store's own allocations count: the key is not copied.
		b.ReportAllocs()
		b.ResetTimer()
		i := 1 << 14
		for b.Loop() {
			buf = ipKey(buf, i&(1<<24-1))
			i++
			charges[0].Key = unsafe.String(&buf[0], len(buf))
			s.Take(ctx, t0, charges, out)
		}
	})

	b.Run("clock", func(b *testing.B) {
		// As the middleware calls it: the zero time, so the store reads
		// time.Now.
		s := newStore(b, Config{})
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			charges := []window.Charge{{Name: "per-ip", Key: "ip:203.0.113.7", Limit: big, Cost: 1}}
			out := make([]window.Decision, 1)
			for pb.Next() {
				s.Take(ctx, time.Time{}, charges, out)
			}
		})
	})
}

// BenchmarkTakeAlgorithms measures Take on one hot counter of each
// algorithm other than the sliding window (see BenchmarkTake), and on
// sliding logs of 1000 entries: admitted as the oldest entry leaves, and
// denied.
func BenchmarkTakeAlgorithms(b *testing.B) {
	ctx := context.Background()
	for _, l := range []window.Limit{
		{Requests: 1 << 30, Window: time.Minute, Algorithm: window.FixedWindow},
		{Requests: 1 << 30, Window: time.Minute, Algorithm: window.TokenBucket},
		{Requests: 1 << 30, Window: time.Minute, Algorithm: window.LeakyBucket},
		{Requests: 1 << 30, Algorithm: window.FixedWindow, Period: window.CalendarDay},
	} {
		name := l.Algorithm.String()
		if l.Period != window.NoPeriod {
			name = l.Period.String()
		}
		b.Run("hot-"+name, func(b *testing.B) {
			s := newStore(b, Config{})
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				charges := []window.Charge{{Name: "per-ip", Key: "ip:203.0.113.7", Limit: l, Cost: 1}}
				out := make([]window.Decision, 1)
				for pb.Next() {
					s.Take(ctx, t0, charges, out)
				}
			})
		})
	}

	log := window.Limit{Requests: 1000, Window: time.Second}.SlidingLog()
	fillLog := func(b *testing.B, s *Store, charges []window.Charge) time.Time {
		out := make([]window.Decision, 1)
		now := t0
		for range 2000 {
			now = now.Add(time.Millisecond)
			if ok, _ := s.Take(ctx, now, charges, out); !ok {
				b.Fatal("denied while filling")
			}
		}
		return now
	}
	b.Run("log-1000-steady", func(b *testing.B) {
		// One request a millisecond, at the limit: each is admitted as
		// the oldest of the log's 1000 entries leaves.
		s := newStore(b, Config{})
		charges := []window.Charge{{Name: "per-ip", Key: "ip:203.0.113.7", Limit: log, Cost: 1}}
		out := make([]window.Decision, 1)
		now := fillLog(b, s, charges)
		b.ReportAllocs()
		b.ResetTimer()
		for b.Loop() {
			now = now.Add(time.Millisecond)
			s.Take(ctx, now, charges, out)
		}
	})
	b.Run("log-1000-denied", func(b *testing.B) {
		s := newStore(b, Config{})
		charges := []window.Charge{{Name: "per-ip", Key: "ip:203.0.113.7", Limit: log, Cost: 1}}
		now := fillLog(b, s, charges)
		b.ReportAllocs()
		b.ResetTimer()
		b.RunParallel(func(pb *testing.PB) {
			out := make([]window.Decision, 1)
			for pb.Next() {
				s.Take(ctx, now, charges, out)
			}
		})
	})
}

// BenchmarkSweep measures a sweep that drops every counter of a store
// filled with 1,000,000 keys, which then gives back their memory.
func BenchmarkSweep(b *testing.B) {
	for b.Loop() {
		b.StopTimer()
		s := newStore(b, Config{})
		fill(b, s, ipKey, 0, memKeys, t0)
		b.StartTimer()
		if n := s.sweep(at(time.Hour)); n != memKeys {
			b.Fatalf("sweep dropped %d, want %d", n, memKeys)
		}
	}
	b.ReportMetric(float64(b.Elapsed())/float64(b.N)/memKeys, "ns/counter")
}
