package memstore

import (
	"context"
	"runtime"
	"strconv"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/sluicehq/sluice/internal/window"
)

// The tests in this file measure the heap, so they are not parallel: the
// testing package runs every parallel test after them, not beside them.

// maxBytesPerKey is what a counter may cost before TestBytesPerKey fails:
// the goal set for the store, above the 50 bytes measured (see the package
// doc).
const maxBytesPerKey = 64

// memKeys is how many keys the memory tests fill a store with: a million,
// or a quarter of it under the race detector (memScale), which makes a
// fill about a hundred times slower (three minutes of make test's time
// on two cores). A quarter fills the tables' powers of two to the same
// share, so that a counter costs about the same (50.1 bytes against 48.8
// measured without the race detector) and the budgets are the same; the
// figures of the docs come from the runs without it.
const memKeys = 1_000_000 / memScale

// tenSeconds is the limit of the memory tests' one rule.
var tenSeconds = window.Limit{Requests: 100, Window: 10 * time.Second}

// ipKey appends to buf[:0] a distinct key for every i below 1<<24, such as
// "ip:203.1.13.64" (14 to 18 bytes).
func ipKey(buf []byte, i int) []byte {
	buf = append(buf[:0], "ip:203."...)
	buf = strconv.AppendInt(buf, int64(i>>16&255), 10)
	buf = append(buf, '.')
	buf = strconv.AppendInt(buf, int64(i>>8&255), 10)
	buf = append(buf, '.')
	buf = strconv.AppendInt(buf, int64(i&255), 10)
	return buf
}

// ip6Key appends to buf[:0] a distinct key for every i below 1<<32, such as
// "ip:2001:db8:1:a2b3::/64" (21 to 27 bytes), an IPv6 /64 prefix.
func ip6Key(buf []byte, i int) []byte {
	buf = append(buf[:0], "ip:2001:db8:"...)
	buf = strconv.AppendInt(buf, int64(i>>16&0xffff), 16)
	buf = append(buf, ':')
	buf = strconv.AppendInt(buf, int64(i&0xffff), 16)
	return append(buf, "::/64"...)
}

// fill charges the n distinct keys made by key from first on, once each at
// now, under tenSeconds.
func fill(t testing.TB, s *Store, key func([]byte, int) []byte, first, n int, now time.Time) {
	t.Helper()
	fillLimit(t, s, key, tenSeconds, 1, first, n, now)
}

// fillLimit charges the n distinct keys made by key from first on under l,
// each times times, a millisecond apart from now on: a sliding log of as
// many requests ends full, with times entries.
func fillLimit(t testing.TB, s *Store, key func([]byte, int) []byte, l window.Limit, times, first, n int, now time.Time) {
	t.Helper()
	charges := []window.Charge{{Name: "per-ip", Limit: l, Cost: 1}}
	out := make([]window.Decision, 1)
	var buf []byte
	for j := range times {
		at := now.Add(time.Duration(j) * time.Millisecond)
		for i := first; i < first+n; i++ {
			buf = key(buf, i)
			// The key's memory is reused for the next key, as a caller may do.
			charges[0].Key = unsafe.String(&buf[0], len(buf))
			if ok, err := s.Take(context.Background(), at, charges, out); !ok || err != nil {
				t.Fatalf("Take(%s) = %v, %v", charges[0].Key, ok, err)
			}
		}
	}
}

func heapAlloc() uint64 {
	var m runtime.MemStats
	runtime.GC()
	runtime.GC()
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// perKey is the heap growth from before to after, per key of n.
func perKey(before, after uint64, n int) float64 {
	return float64(int64(after)-int64(before)) / float64(n)
}

// bytesPerKey returns the heap growth per counter of a store filled with n
// keys made by key.
func bytesPerKey(t testing.TB, key func([]byte, int) []byte, n int) float64 {
	before := heapAlloc()
	s, err := New(Config{SweepInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	fill(t, s, key, 0, n, t0)
	after := heapAlloc()
	if got := s.Len(); got != n {
		t.Fatalf("Len() = %d, want %d", got, n)
	}
	runtime.KeepAlive(s)
	return perKey(before, after, n)
}

var keyShapes = []struct {
	name string
	key  func([]byte, int) []byte
}{
	{"ipv4", ipKey},
	{"ipv6", ip6Key},
}

// TestBytesPerKey fills a default store with a million keys on one rule
// and checks what each counter costs.
func TestBytesPerKey(t *testing.T) {
	if testing.Short() {
		t.Skip("fills stores with 1,000,000 keys")
	}
	for _, tt := range keyShapes {
		per := bytesPerKey(t, tt.key, memKeys)
		t.Logf("%s: %.1f bytes per key (%d keys such as %q)", tt.name, per, memKeys, tt.key(nil, memKeys/2))
		if per > maxBytesPerKey {
			t.Errorf("%s: %.1f bytes per key, want at most %d", tt.name, per, maxBytesPerKey)
		}
	}
}

// algorithmShapes are the stores TestBytesPerAlgorithm measures: a million
// keys charged once under the limit of every algorithm, and sliding logs
// of 10, 100 and 1000 requests filled to the limit on fewer keys (a
// million requests each).
var algorithmShapes = []struct {
	name        string
	l           window.Limit
	keys, times int
}{
	{"sliding_window", tenSeconds, memKeys, 1},
	{"fixed_window", tenSeconds.FixedWindow(), memKeys, 1},
	{"token_bucket", tenSeconds.TokenBucket(0), memKeys, 1},
	{"leaky_bucket", tenSeconds.LeakyBucket(0, 0), memKeys, 1},
	{"sliding_log/1", tenSeconds.SlidingLog(), memKeys, 1},
	{"sliding_log/10", window.Limit{Requests: 10, Window: 10 * time.Second}.SlidingLog(), memKeys / 10, 10},
	{"sliding_log/100", window.Limit{Requests: 100, Window: 10 * time.Second}.SlidingLog(), memKeys / 100, 100},
	{"sliding_log/1000", window.Limit{Requests: 1000, Window: 10 * time.Second}.SlidingLog(), memKeys / 1000, 1000},
}

// bytesPerAlgorithmKey returns the heap growth per counter of a default
// store filled as shape says.
func bytesPerAlgorithmKey(t testing.TB, l window.Limit, keys, times int) float64 {
	before := heapAlloc()
	s, err := New(Config{SweepInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	fillLimit(t, s, ipKey, l, times, 0, keys, t0)
	after := heapAlloc()
	if got := s.Len(); got != keys {
		t.Fatalf("Len() = %d, want %d", got, keys)
	}
	runtime.KeepAlive(s)
	return perKey(before, after, keys)
}

// maxLogBytes is what a sliding log of n entries may cost before
// TestBytesPerAlgorithm fails: the budget of a counter, its slot in the
// log table (twice: the table grows by doubling) and room for logRoom(n,
// n) entries of 16 bytes, rounded up by the allocator by at most an eighth.
func maxLogBytes(n int) float64 {
	return maxBytesPerKey + 2*float64(unsafe.Sizeof(logSlot{})) + float64(logRoom(n, int64(n)))*16*9/8
}

// TestBytesPerAlgorithm measures what a counter of every algorithm costs,
// a sliding log's entries included.
func TestBytesPerAlgorithm(t *testing.T) {
	if testing.Short() {
		t.Skip("fills stores with 1,000,000 keys or requests")
	}
	for _, tt := range algorithmShapes {
		per := bytesPerAlgorithmKey(t, tt.l, tt.keys, tt.times)
		t.Logf("%-16s %7.1f bytes per key (%d keys, %d entries)", tt.name, per, tt.keys, tt.times)
		budget := float64(maxBytesPerKey)
		if tt.l.Algorithm == window.SlidingLog {
			budget = maxLogBytes(tt.times)
		}
		if per > budget {
			t.Errorf("%s: %.1f bytes per key, want at most %.0f", tt.name, per, budget)
		}
	}
}

// TestLogMemoryReleased checks that sliding logs give their memory back
// when they expire and are swept, and that a store full of logs stays
// within MaxKeys logs of the limit's size however many keys churn through
// it.
func TestLogMemoryReleased(t *testing.T) {
	if testing.Short() {
		t.Skip("fills stores with 500,000 requests")
	}
	const keys, entries = 5000, 100
	l := window.Limit{Requests: entries, Window: 10 * time.Second}.SlidingLog()
	t.Run("swept", func(t *testing.T) {
		before := heapAlloc()
		s, err := New(Config{SweepInterval: -1})
		if err != nil {
			t.Fatal(err)
		}
		fillLimit(t, s, ipKey, l, entries, 0, keys, t0)
		full := heapAlloc()
		t.Logf("%d logs of %d entries: %.1f bytes per key", keys, entries, perKey(before, full, keys))
		if n := s.sweep(at(10*time.Second + entries*time.Millisecond)); n != keys {
			t.Fatalf("sweep dropped %d, want %d", n, keys)
		}
		checkInvariants(t, s)
		for i := range s.shards {
			if s.shards[i].logs != nil {
				t.Fatalf("shard %d keeps its log table after its last log was swept", i)
			}
		}
		kept := int64(heapAlloc()) - int64(before)
		t.Logf("after the sweep: %d bytes kept of %d", kept, full-before)
		if limit := int64(64 << 10); kept > limit {
			t.Errorf("an emptied store keeps %d bytes, want at most %d", kept, limit)
		}
		runtime.KeepAlive(s)
	})
	t.Run("evicted", func(t *testing.T) {
		const maxKeys, rounds = 1000, 5
		before := heapAlloc()
		s, err := New(Config{MaxKeys: maxKeys, SweepInterval: -1})
		if err != nil {
			t.Fatal(err)
		}
		peak := uint64(0)
		for r := range rounds {
			fillLimit(t, s, ipKey, l, entries, r*maxKeys, maxKeys, t0.Add(time.Duration(r)*time.Second))
			if n := s.Len(); n > maxKeys {
				t.Fatalf("round %d: Len() = %d, want at most %d", r, n, maxKeys)
			}
			checkInvariants(t, s)
			peak = max(peak, heapAlloc())
		}
		growth := int64(peak) - int64(before)
		// Twice the budget: slack for unevenly filled shards.
		allowance := int64(2 * maxKeys * maxLogBytes(entries))
		t.Logf("%d keys of %d entries inserted, %d kept, heap grew by at most %d bytes (%.0f per kept key)",
			rounds*maxKeys, entries, s.Len(), growth, float64(growth)/maxKeys)
		if growth > allowance {
			t.Errorf("heap grew by %d bytes, want at most %d", growth, allowance)
		}
		runtime.KeepAlive(s)
	})
}

func BenchmarkBytesPerKey(b *testing.B) {
	for _, tt := range keyShapes {
		b.Run(tt.name, func(b *testing.B) {
			for b.Loop() {
				b.ReportMetric(bytesPerKey(b, tt.key, memKeys), "bytes/key")
			}
		})
	}
}

// TestMemoryReleased checks that the memory of expired counters is given
// back by the first sweep once they have expired, 2 windows after their
// last write: by the sweeper's loop, on the store's clock.
func TestMemoryReleased(t *testing.T) {
	if testing.Short() {
		t.Skip("fills a store with 1,100,000 keys")
	}
	const late = memKeys / 10
	var now atomic.Int64
	now.Store(t0.UnixMilli())
	clock := func() time.Time { return time.UnixMilli(now.Load()) }
	before := heapAlloc()
	s, err := New(Config{Now: clock, SweepInterval: -1, MaxKeys: 2 * memKeys})
	if err != nil {
		t.Fatal(err)
	}
	tick := make(chan time.Time) // unbuffered: a send waits for the previous sweep
	st := &stopper{stop: make(chan struct{}), done: make(chan struct{})}
	go sweepLoop(s.shards, clock, tick, st)
	defer func() { st.signal(); <-st.done }()
	sweepAt := func(d time.Duration) {
		now.Store(at(d).UnixMilli())
		tick <- time.Time{}
		tick <- time.Time{} // returns once the first sweep is over
	}

	// A million counters at t0, which expire at t0+20s, then a tenth as
	// many at t0+15s, which expire at t0+35s.
	fill(t, s, ipKey, 0, memKeys, t0)
	full := heapAlloc()
	fill(t, s, ipKey, memKeys, late, at(15*time.Second))
	t.Logf("%d keys: %.1f bytes per key", memKeys, perKey(before, full, memKeys))

	sweepAt(20*time.Second - time.Millisecond)
	if n := s.Len(); n != memKeys+late {
		t.Fatalf("Len() = %d 1 ms before the first counters expire, want %d", n, memKeys+late)
	}
	sweepAt(20 * time.Second)
	if n := s.Len(); n != late {
		t.Fatalf("Len() = %d after the first counters expired, want %d", n, late)
	}
	checkInvariants(t, s)
	part := heapAlloc()
	t.Logf("%d keys left: %.1f bytes per key", late, perKey(before, part, late))
	if per := perKey(before, part, late); per > maxBytesPerKey {
		t.Errorf("%d keys left: %.1f bytes per key, want at most %d", late, per, maxBytesPerKey)
	}
	// The late counters still count.
	lateKey := window.Charge{Name: "per-ip", Key: string(ipKey(nil, memKeys)), Limit: tenSeconds}
	if _, out := take(t, s, at(20*time.Second), lateKey); out[0].Remaining != tenSeconds.Requests-1 {
		t.Errorf("remaining on a late key = %d, want %d", out[0].Remaining, tenSeconds.Requests-1)
	}

	sweepAt(35 * time.Second)
	if n := s.Len(); n != 0 {
		t.Fatalf("Len() = %d after every counter expired, want 0", n)
	}
	checkInvariants(t, s)
	empty := heapAlloc()
	kept := int64(empty) - int64(before)
	t.Logf("after the last sweep: %d bytes kept of %d (%.2f bytes per key)", kept, full-before, perKey(before, empty, memKeys))
	// What an empty store keeps: its shards and their smallest indexes.
	if limit := int64(64 << 10); kept > limit {
		t.Errorf("an emptied store keeps %d bytes, want at most %d", kept, limit)
	}
	runtime.KeepAlive(s)
}

// TestKeyCapBoundsMemory inserts ten times MaxKeys distinct keys. Without
// eviction the store would grow to ten times its bound, well past the
// allowance checked here.
func TestKeyCapBoundsMemory(t *testing.T) {
	if testing.Short() {
		t.Skip("inserts 200,000 keys")
	}
	const (
		maxKeys = 20_000
		rounds  = 10
		// Twice the per-key budget: slack for shards of 312 counters,
		// which fill two chunks of 256 and an index of 512 slots, yet far
		// below the rounds-fold growth of a store that does not evict.
		allowance = maxKeys * maxBytesPerKey * 2
	)
	before := heapAlloc()
	s, err := New(Config{MaxKeys: maxKeys, SweepInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	peak := uint64(0)
	for r := range rounds {
		fill(t, s, ipKey, r*maxKeys, maxKeys, t0)
		if n := s.Len(); n > maxKeys {
			t.Fatalf("round %d: Len() = %d, want at most %d", r, n, maxKeys)
		}
		peak = max(peak, heapAlloc())
	}
	if n := s.Len(); n != maxKeys {
		t.Errorf("Len() = %d, want %d: a full store should stay full", n, maxKeys)
	}
	checkInvariants(t, s)
	growth := int64(peak) - int64(before)
	t.Logf("%d keys inserted, %d kept, heap grew by at most %d bytes (%.0f per kept key)",
		rounds*maxKeys, s.Len(), growth, float64(growth)/maxKeys)
	if growth > allowance {
		t.Errorf("heap grew by %d bytes, want at most %d", growth, allowance)
	}
	// The most recent keys are the ones kept.
	if !s.has("per-ip", string(ipKey(nil, rounds*maxKeys-1)), tenSeconds.Window) {
		t.Errorf("the last key inserted was evicted")
	}
	if s.has("per-ip", string(ipKey(nil, 0)), tenSeconds.Window) {
		t.Errorf("the first key inserted is still held")
	}
	runtime.KeepAlive(s)
}
