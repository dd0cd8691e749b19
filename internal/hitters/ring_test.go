package hitters

import (
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
)

// TestRingConcurrent: producers on every shard and a drainer at once,
// each producer's events alternating between two keys and sometimes
// repeating one (runs are added up in a slot): every event's units arrive
// once, or are counted as dropped.
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
			for i := range each {
				key := "user:" + strconv.Itoa(p) + "/" + strconv.Itoa(i/3%2)
				r.Put(sh, "rule", key, int64(p+1), Kind(p%2))
			}
		}()
	}
	var stop atomic.Bool
	units := map[int]int64{}
	events := 0
	drain := func() {
		r.Drain(func(rule string, key []byte, u int64, _ uint64, n uint32, kind Kind) {
			p, err := strconv.Atoi(strings.TrimPrefix(string(key[:len(key)-2]), "user:"))
			if err != nil || rule != "rule" || Kind(p%2) != kind || u != int64(p+1)*int64(n) {
				t.Errorf("torn event: %s %q %d×%d %v", rule, key, u, n, kind)
			}
			units[p] += u
			events += int(n)
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
	dropped, droppedUnits := r.Dropped()
	var total int64
	for p := range producers {
		total += units[p]
	}
	want := int64(0)
	for p := range producers {
		want += int64(p+1) * each
	}
	if events+int(dropped) != producers*each || total+int64(droppedUnits) != want {
		t.Errorf("received %d events, %d units; dropped %d, %d; want %d events, %d units", events, total, dropped, droppedUnits, producers*each, want)
	}
	if events == 0 {
		t.Error("nothing received")
	}
}

// TestRingFull: with no drainer, a shard takes slotsPerShard runs of
// events, drops and counts the rest, and hands the kept ones over in
// order; an event like the last one is added to it rather than dropped.
func TestRingFull(t *testing.T) {
	t.Parallel()
	r := NewRing()
	sh := r.Shard()
	for i := range slotsPerShard + 10 {
		r.Put(sh, "r", "k"+strconv.Itoa(i), int64(i), Charged)
	}
	if ev, units := r.Dropped(); ev != 10 {
		t.Fatalf("dropped %d events (%d units), want 10", ev, units)
	}
	r.Put(sh, "r", "k"+strconv.Itoa(slotsPerShard-1), 1000, Charged) // like the last kept
	if ev, _ := r.Dropped(); ev != 10 {
		t.Fatalf("an event like the last one was dropped")
	}
	next := int64(0)
	n := r.Drain(func(_ string, key []byte, units int64, _ uint64, events uint32, _ Kind) {
		want, wantN := next, uint32(1)
		if next == slotsPerShard-1 {
			want, wantN = next+1000, 2
		}
		if units != want || events != wantN || string(key) != "k"+strconv.Itoa(int(next)) {
			t.Fatalf("slot %d: %q %d×%d, want %d×%d", next, key, units, events, want, wantN)
		}
		next++
	})
	if n != slotsPerShard {
		t.Fatalf("drained %d, want %d", n, slotsPerShard)
	}
	// Room again; the drained slot is not added to.
	r.Put(sh, "r", "k"+strconv.Itoa(slotsPerShard-1), 7, Denied)
	if n := r.Drain(func(string, []byte, int64, uint64, uint32, Kind) {}); n != 1 {
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
	r.Drain(func(_ string, key []byte, _ int64, _ uint64, _ uint32, _ Kind) { got = append(got, string(key)) })
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
			r.Drain(func(string, []byte, int64, uint64, uint32, Kind) {})
		}
	}); a != 0 {
		t.Fatalf("%v allocations per Put", a)
	}
}

// BenchmarkRingPut: what a request pays to note an event, on every core
// at once, each producer on its own shard: one client's burst (added up
// in the last slot) and a new client at every event.
func BenchmarkRingPut(b *testing.B) {
	keys := make([]string, 1024)
	for i := range keys {
		keys[i] = "ip:10.0." + strconv.Itoa(i>>8) + "." + strconv.Itoa(i&255)
	}
	for _, c := range []struct {
		name string
		mask int
	}{{"same-key", 0}, {"distinct", len(keys) - 1}} {
		b.Run(c.name, func(b *testing.B) {
			r := NewRing()
			stop := make(chan struct{})
			go func() {
				for {
					select {
					case <-stop:
						return
					case <-r.Wake():
						r.Drain(func(string, []byte, int64, uint64, uint32, Kind) {})
					}
				}
			}()
			defer close(stop)
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				sh := r.Shard()
				i := 0
				for pb.Next() {
					r.Put(sh, "default", keys[i&c.mask], 1, Charged)
					i++
				}
			})
		})
	}
}
