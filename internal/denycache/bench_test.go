package denycache

import (
	"fmt"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/window"
)

// fullCache returns a cache holding DefaultMaxEntries live denials of keys
// such as "ip:10.0.3.7", and the charges of 4096 keys it does not hold.
func fullCache(b *testing.B) (*Cache, [][]window.Charge) {
	b.Helper()
	c := New(Config{})
	chs := []window.Charge{charge("", 100, 1)}
	ds := []window.Decision{denied(time.Hour)}
	for i := 0; c.Len() < c.Cap() && i < 4*DefaultMaxEntries; i++ {
		chs[0].Key = fmt.Sprintf("ip:10.%d.%d.%d", i>>16&255, i>>8&255, i&255)
		c.Record(t0, chs, ds)
	}
	// The entry the hits find, recorded last so that it was not evicted.
	record(c, t0, charge("ip:10.0.0.1", 100, 1), denied(time.Hour))
	absent := make([][]window.Charge, 4096)
	for i := range absent {
		absent[i] = []window.Charge{charge(fmt.Sprintf("ip:192.0.%d.%d", i>>8, i&255), 100, 1)}
	}
	return c, absent
}

func BenchmarkLookup(b *testing.B) {
	now := at(time.Second)
	b.Run("miss/empty", func(b *testing.B) {
		c := New(Config{})
		chs := []window.Charge{charge("ip:192.0.2.1", 100, 1)}
		b.ReportAllocs()
		for b.Loop() {
			if _, _, ok := c.Lookup(now, chs); ok {
				b.Fatal("hit")
			}
		}
	})
	b.Run("miss/full", func(b *testing.B) {
		c, absent := fullCache(b)
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			if _, _, ok := c.Lookup(now, absent[i&4095]); ok {
				b.Fatal("hit")
			}
			i++
		}
	})
	b.Run("miss/key-held-smaller-cost", func(b *testing.B) {
		c, _ := fullCache(b)
		chs := []window.Charge{charge("ip:10.0.0.2", 100, 1)}
		record(c, t0, charge("ip:10.0.0.2", 100, 5), denied(time.Hour))
		b.ReportAllocs()
		for b.Loop() {
			if _, _, ok := c.Lookup(now, chs); ok {
				b.Fatal("hit")
			}
		}
	})
	b.Run("hit", func(b *testing.B) {
		c, _ := fullCache(b)
		chs := []window.Charge{charge("ip:10.0.0.1", 100, 1)}
		b.ReportAllocs()
		for b.Loop() {
			if _, _, ok := c.Lookup(now, chs); !ok {
				b.Fatal("miss")
			}
		}
	})
	b.Run("hit/third-of-3-charges", func(b *testing.B) {
		c, _ := fullCache(b)
		chs := []window.Charge{
			{Key: "user:1", Name: "user", Limit: window.Limit{Requests: 100, Window: time.Minute}, Cost: 1},
			{Key: "user:1", Name: "route", Limit: window.Limit{Requests: 10, Window: time.Minute}, Cost: 1},
			charge("ip:10.0.0.1", 100, 1),
		}
		b.ReportAllocs()
		for b.Loop() {
			if i, _, _ := c.Lookup(now, chs); i != 2 {
				b.Fatal("miss")
			}
		}
	})
}

func BenchmarkLookupParallel(b *testing.B) {
	now := at(time.Second)
	b.Run("hit/one-key", func(b *testing.B) {
		c, _ := fullCache(b)
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			chs := []window.Charge{charge("ip:10.0.0.1", 100, 1)}
			for pb.Next() {
				if _, _, ok := c.Lookup(now, chs); !ok {
					b.Error("miss")
					return
				}
			}
		})
	})
	b.Run("miss/full", func(b *testing.B) {
		c, absent := fullCache(b)
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			i := 0
			for pb.Next() {
				if _, _, ok := c.Lookup(now, absent[i&4095]); ok {
					b.Error("hit")
					return
				}
				i++
			}
		})
	})
	b.Run("hit/one-key-while-recording", func(b *testing.B) {
		// One Record for every 64 Lookups, on the same key.
		c, _ := fullCache(b)
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			chs := []window.Charge{charge("ip:10.0.0.1", 100, 1)}
			ds := []window.Decision{denied(time.Hour)}
			i := 0
			for pb.Next() {
				if i&63 == 0 {
					c.Record(now, chs, ds)
				} else {
					c.Lookup(now, chs)
				}
				i++
			}
		})
	})
}

func BenchmarkRecord(b *testing.B) {
	c, absent := fullCache(b)
	ds := []window.Decision{denied(time.Hour)}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		c.Record(at(time.Duration(i)), absent[i&4095], ds)
		i++
	}
}
