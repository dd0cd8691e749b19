package hitters

import (
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
)

// TestRingConcurrent: producers on every shard and a drainer at once:
// every event arrives once and whole, or is counted as dropped.
func TestRingConcurrent(t *testing.T) {
	t.Parallel()
	r := NewRing()
	const producers, each = 8, 20_000
	var wg sync.WaitGroup
	for p := range producers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sh := r.Shard()
			key := "user:" + strconv.Itoa(p)
			for i := range each {
				r.Put(sh, "rule", key, int64(p*1000+i%1000), Kind(i%2))
			}
		}()
	}
	var stop atomic.Bool
	got := map[string]int{}
	drain := func() {
		r.Drain(func(rule string, key []byte, units int64, kind Kind) {
			p, err := strconv.Atoi(strings.TrimPrefix(string(key), "user:"))
			if err != nil || rule != "rule" || int(units)/1000 != p || Kind(units%2) != kind {
				t.Errorf("torn event: %s %q %d %v", rule, key, units, kind)
			}
			got[string(key)]++
		})
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for !stop.Load() {
			drain()
		}
	}()
	wg.Wait()
	stop.Store(true)
	<-done
	drain()
	total := 0
	for _, n := range got {
		total += n
	}
	dropped, _ := r.Dropped()
	if total+int(dropped) != producers*each {
		t.Errorf("received %d + dropped %d, want %d", total, dropped, producers*each)
	}
	if total == 0 {
		t.Error("nothing received")
	}
}

// TestRingFull: with no drainer, a shard takes slotsPerShard events, drops
// and counts the rest, and hands the kept ones over in order.
func TestRingFull(t *testing.T) {
	t.Parallel()
	r := NewRing()
	sh := r.Shard()
	for i := range slotsPerShard + 10 {
		r.Put(sh, "r", "k", int64(i), Charged)
	}
	if ev, units := r.Dropped(); ev != 10 {
		t.Fatalf("dropped %d events (%d units), want 10", ev, units)
	}
	next := int64(0)
	n := r.Drain(func(_ string, _ []byte, units int64, _ Kind) {
		if units != next {
			t.Fatalf("event %d, want %d", units, next)
		}
		next++
	})
	if n != slotsPerShard {
		t.Fatalf("drained %d, want %d", n, slotsPerShard)
	}
	// Room again.
	r.Put(sh, "r", "k", 7, Denied)
	if n := r.Drain(func(string, []byte, int64, Kind) {}); n != 1 {
		t.Fatalf("drained %d after the ring emptied, want 1", n)
	}
}

// TestRingKeys: a key is copied, so the caller may reuse its bytes; a key
// longer than a slot holds arrives whole.
func TestRingKeys(t *testing.T) {
	t.Parallel()
	r := NewRing()
	sh := r.Shard()
	buf := []byte("ip:192.0.2.1")
	r.Put(sh, "r", string(buf), 1, Charged)
	copy(buf, "xxxxxxxxxxxx")
	long := strings.Repeat("y", 300)
	r.Put(sh, "r", long, 1, Charged)
	var got []string
	r.Drain(func(_ string, key []byte, _ int64, _ Kind) { got = append(got, string(key)) })
	if len(got) != 2 || got[0] != "ip:192.0.2.1" || got[1] != long {
		t.Fatalf("got %q", got)
	}
}

// TestRingPutAllocatesNothing: putting a short key allocates nothing once
// the shard exists.
func TestRingPutAllocatesNothing(t *testing.T) {
	r := NewRing()
	sh := r.Shard()
	key := string([]byte("user:alice"))
	r.Put(sh, "r", key, 1, Charged)
	n := 0
	if a := testing.AllocsPerRun(1000, func() {
		r.Put(sh, "r", key, 1, Charged)
		if n++; n%256 == 0 {
			r.Drain(func(string, []byte, int64, Kind) {})
		}
	}); a != 0 {
		t.Fatalf("%v allocations per Put", a)
	}
}

// BenchmarkRingPut: what a request pays to note an event, on every core
// at once, each producer on its own shard.
func BenchmarkRingPut(b *testing.B) {
	r := NewRing()
	stop := make(chan struct{})
	go func() {
		for {
			select {
			case <-stop:
				return
			case <-r.Wake():
				r.Drain(func(string, []byte, int64, Kind) {})
			}
		}
	}()
	defer close(stop)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		sh := r.Shard()
		for pb.Next() {
			r.Put(sh, "default", "ip:10.0.0.1", 1, Charged)
		}
	})
}
