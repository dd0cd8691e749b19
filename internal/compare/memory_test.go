package compare

import (
	"os"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/middleware"
)

// memKeys is the number of keys of the memory measurements.
const memKeys = 1_000_000

// requireCompare skips t unless SLUICE_COMPARE is set: the tests that fill
// stores with a million keys take minutes and gigabytes.
func requireCompare(t *testing.T) {
	t.Helper()
	if os.Getenv("SLUICE_COMPARE") == "" {
		t.Skip("set SLUICE_COMPARE=1 to run: fills stores with 1,000,000 keys")
	}
}

// heapLive returns the bytes of live heap objects after two collections.
func heapLive() uint64 {
	var m runtime.MemStats
	runtime.GC()
	runtime.GC()
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// fill makes one decision for each of the clients 0 to n-1, from one
// goroutine, and fails t on an error or a denial.
func fill(t *testing.T, m memCounter, n int) {
	t.Helper()
	for i := 0; i < n; i++ {
		if err := m.take(ipv4(i)); err != nil {
			t.Fatalf("decision %d (%s): %v", i, ipv4(i), err)
		}
	}
}

// checkCounted fails t unless the store holds a count of 1 for every
// 1000th of the clients 0 to n-1: the stores really were filled.
func checkCounted(t *testing.T, m memCounter, n int) {
	t.Helper()
	for i := 0; i < n; i += 1000 {
		ok, err := m.counted(ipv4(i))
		if err != nil || !ok {
			t.Fatalf("client %d (%s) not counted: %v", i, ipv4(i), err)
		}
	}
}

// TestMemoryPerKey measures the live heap per key of each limiter's
// in-memory store, with its default options, after one decision (an
// admission) for each of 1,000,000 client addresses ("10.a.b.c", keyed as
// each limiter's middleware keys them) and runtime.GC:
//
//	SLUICE_COMPARE=1 go test -run TestMemoryPerKey -v -timeout 20m
//
// The figure is the growth of runtime.MemStats.HeapAlloc from before the
// store was built to after it was filled, divided by 1,000,000; it includes
// everything the store keeps (maps, entries, copies of keys). A sample of
// the keys is checked to hold a count of 1 after the measurement.
//
// The sluice-expiry case fills a sluice memory store whose window is 10 s
// and whose clock is injected (MemoryConfig.Now), moves the clock 30 s on
// (past the 2 windows after which a counter can no longer matter), waits
// for the store's sweeper (SweepInterval 100ms) to drop every counter, and
// measures the heap again; then it fills the store with 1,000,000 other
// keys and measures once more, to see whether what stayed behind is reused.
// The middleware.Store interface has no method to count or sweep counters:
// the test reads the count from the Len method of the store's concrete type
// and lets the sweeper, configured through MemoryConfig, do the sweeping.
func TestMemoryPerKey(t *testing.T) {
	requireCompare(t)
	for _, l := range memLimiters {
		t.Run(l.name, func(t *testing.T) {
			before := heapLive()
			m := l.new(t)
			fill(t, m, memKeys)
			after := heapLive()
			checkCounted(t, m, memKeys)
			runtime.KeepAlive(m)
			t.Logf("%s: %.0f bytes per key (%d keys, live heap %+.1f MB)",
				l.name, float64(int64(after)-int64(before))/memKeys, memKeys, float64(int64(after)-int64(before))/1e6)
		})
	}
	t.Run("sluice-expiry", testSluiceMemoryExpiry)
}

func testSluiceMemoryExpiry(t *testing.T) {
	var now atomic.Int64
	now.Store(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano())
	clock := func() time.Time { return time.Unix(0, now.Load()) }

	before := heapLive()
	st, err := middleware.NewMemoryStore(middleware.MemoryConfig{Now: clock, SweepInterval: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	m := sluiceMemCounter(st, middleware.Limit{Requests: bigLimit, Window: 10 * time.Second})
	perKey := func(h uint64) float64 { return float64(int64(h)-int64(before)) / memKeys }

	fill(t, m, memKeys)
	full := heapLive()
	checkCounted(t, m, memKeys)
	if n := st.Len(); n != memKeys {
		t.Fatalf("Len() = %d after filling, want %d", n, memKeys)
	}

	now.Add(int64(30 * time.Second))
	deadline := time.Now().Add(20 * time.Second)
	for st.Len() > 0 && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	left := st.Len()
	swept := heapLive()

	// 1,000,000 new clients, at the new instant.
	for i := 0; i < memKeys; i++ {
		if err := m.take(ipv4(memKeys + i)); err != nil {
			t.Fatalf("refill %d: %v", i, err)
		}
	}
	refilled := heapLive()
	runtime.KeepAlive(st)

	t.Logf("sluice, 10 s window: %.0f bytes per key filled; %d counters left and %.0f bytes per key (%.1f MB) still live once expired and swept; %.0f bytes per key after 1,000,000 new keys",
		perKey(full), left, perKey(swept), float64(int64(swept)-int64(before))/1e6, perKey(refilled))
	if left != 0 {
		t.Errorf("%d counters left 20 s after they expired", left)
	}
}
