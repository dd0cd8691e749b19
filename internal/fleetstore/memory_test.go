package fleetstore

import (
	"runtime"
	"strconv"
	"testing"
	"time"
	"unsafe"

	"github.com/sluicehq/sluice/internal/fleet"
	"github.com/sluicehq/sluice/internal/window"
)

// TestMemoryPerKey fills the table with counters and measures what it
// takes per counter in process: the heap's growth (entries, index, the
// allocator's rounding; after a collection, so without the chunks and
// indexes that growing left behind) and what the table holds (entries
// with the unused end of each shard's last chunk, and index). Both must
// stay at most 128 bytes per counter, the bound, from 100,000
// counters (the figure) up; below that, the 64 shards' last chunks
// and indexes weigh more per counter.
func TestMemoryPerKey(t *testing.T) {
	if n := unsafe.Sizeof(entry{}); n != 112 {
		t.Errorf("entry is %d bytes, the package doc says 112", n)
	}
	for _, n := range []int{100_000, 117_000, 150_000, 230_000, 400_000} {
		t.Run(strconv.Itoa(n), func(t *testing.T) {
			s := new(Store)
			for i := range s.shards {
				s.shards[i].max = n
			}
			var before, after runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&before)
			for i := 0; i < n; i++ {
				id := ident{h1: uint64(i) * 0x9e3779b97f4a7c15, h2: mix64(uint64(i))}
				sh := &s.shards[id.h2%shards]
				e, _, _ := sh.insert(id)
				e.uc = 1
			}
			runtime.GC()
			runtime.ReadMemStats(&after)
			held := 0
			for i := range s.shards {
				sh := &s.shards[i]
				held += 4 * cap(sh.slots)
				for _, c := range sh.chunks {
					held += entrySize * cap(c)
				}
			}
			per := float64(held) / float64(n)
			grew := (float64(after.HeapAlloc) - float64(before.HeapAlloc)) / float64(n)
			t.Logf("%.1f bytes per counter held by the table; heap grew by %.1f per counter", per, grew)
			if per > 128 {
				t.Errorf("the table holds %.1f bytes per counter, want at most 128", per)
			}
			if grew > 128 {
				t.Errorf("the heap grew by %.1f bytes per counter, want at most 128", grew)
			}
			runtime.KeepAlive(s)
		})
	}
}

// TestTableRemove removes entries in every order and checks that the
// others stay reachable (the index's backward shift).
func TestTableRemove(t *testing.T) {
	var sh shard
	sh.max = 1 << 20
	ids := make([]ident, 3000)
	for i := range ids {
		// Few distinct homes, at both ends of the index: long probe runs,
		// some of which wrap around.
		ids[i] = ident{h1: uint64(i % 97), h2: uint64(i)}
		if i%2 == 1 {
			ids[i].h1 = ^uint64(0) - uint64(i%97)
		}
		sh.insert(ids[i])
	}
	for k := 0; k < len(ids); k += 3 {
		_, i := sh.lookup(ids[k])
		if i < 0 {
			t.Fatalf("entry %d lost", k)
		}
		sh.remove(i)
	}
	for k, id := range ids {
		e, _ := sh.lookup(id)
		if (k%3 == 0) != (e == nil) || (e != nil && e.id != id) {
			t.Fatalf("entry %d: found %v after removing every third", k, e != nil)
		}
	}
	if sh.n != 2000 {
		t.Fatalf("%d entries left, want 2000", sh.n)
	}
}

// TestBindings binds the charges of 200 rules and limits, more than the
// lock-free slots hold (so that some share one), in turns, and checks that
// each gets its own binding, with the settings last set.
func TestBindings(t *testing.T) {
	s := &Store{bindings: map[bindKey]*binding{}}
	charge := func(i int) window.Charge {
		return window.Charge{Name: "rule" + strconv.Itoa(i%50), Limit: window.Limit{Requests: 10 + i/50, Window: time.Second}}
	}
	for round, lease := range []int{0, 7, 9} {
		rules := map[string]Settings{}
		for i := 0; i < 50; i++ {
			rules["rule"+strconv.Itoa(i)] = Settings{Mode: fleet.Lease, Lease: lease + i}
		}
		for k := 0; k < 3; k++ {
			for j := 0; j < 200; j++ {
				i := (j*37 + k) % 200
				c := charge(i)
				b := s.bind(rules, &c, nil)
				if b == nil || b.name != c.Name || b.lim != c.Limit || b.set != rules[c.Name] {
					t.Fatalf("round %d: charge %d (%s, %d requests) got binding %+v", round, i, c.Name, c.Limit.Requests, b)
				}
			}
		}
	}
	c := charge(3)
	if b := s.bind(map[string]Settings{"other": {Mode: fleet.Lease}}, &c, nil); b != nil {
		t.Fatalf("a charge of a rule without settings got binding %+v", b)
	}
}

// TestUses checks the memory of lease counters' last uses: unknown at
// first, recent or stale by the window asked (a use soon after the one
// recorded is not recorded), unknown again once another counter takes the
// slot, and right across the 40-bit wrap of instants.
func TestUses(t *testing.T) {
	var u uses
	a := ident{h1: 0xabc << 44, h2: 7 << 32}
	b := ident{h1: 0xdef << 44, h2: 7 << 32} // the same slot, another tag
	steps := []struct {
		id     ident
		ms     int64
		within int64
		want   int
	}{
		{a, 1000, 200, useUnknown},
		{a, 1150, 200, useRecent},
		{a, 1400, 200, useStale},
		{a, 1420, 200, useRecent}, // within a quarter: not recorded
		{a, 1610, 200, useStale},  // 210 ms after the use recorded
		{b, 1650, 200, useUnknown},
		{a, 1700, 200, useUnknown},
		{a, 1<<40 + 100, 200, useStale},
		{a, 1<<40 + 250, 200, useRecent},
		{a, 1<<41 - 50, 200, useStale},
		{a, 1<<41 + 50, 200, useRecent},
	}
	for i, st := range steps {
		if got := u.note(st.id, st.ms, st.within); got != st.want {
			t.Errorf("step %d: note at %d = %d, want %d", i, st.ms, got, st.want)
		}
	}
}
