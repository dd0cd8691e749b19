package memstore

import (
	"context"
	"runtime"
	"strconv"
	"testing"
	"time"
	"unsafe"

	"github.com/sluicehq/sluice/internal/window"
)

// The tests in this file measure the heap, so they are not parallel: the
// testing package runs every parallel test after them, not beside them.

// maxBytesPerKey is what a counter may cost before TestBytesPerKey fails. It
// is set a little above the measured figure quoted in the package doc.
const maxBytesPerKey = 240

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
// t0.
func fill(t testing.TB, s *Store, key func([]byte, int) []byte, first, n int) {
	t.Helper()
	charges := []window.Charge{{Name: "per-ip", Limit: perMinute(100), Cost: 1}}
	out := make([]window.Decision, 1)
	var buf []byte
	for i := first; i < first+n; i++ {
		buf = key(buf, i)
		// The key's memory is reused for the next key, as a caller may do.
		charges[0].Key = unsafe.String(&buf[0], len(buf))
		if ok, err := s.Take(context.Background(), t0, charges, out); !ok || err != nil {
			t.Fatalf("Take(%s) = %v, %v", charges[0].Key, ok, err)
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

// bytesPerKey returns the heap growth per counter of a store filled with n
// keys made by key.
func bytesPerKey(t testing.TB, key func([]byte, int) []byte, n int) float64 {
	before := heapAlloc()
	s, err := New(Config{SweepInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	fill(t, s, key, 0, n)
	after := heapAlloc()
	if got := s.Len(); got != n {
		t.Fatalf("Len() = %d, want %d", got, n)
	}
	runtime.KeepAlive(s)
	return float64(int64(after)-int64(before)) / float64(n)
}

var keyShapes = []struct {
	name string
	key  func([]byte, int) []byte
}{
	{"ipv4", ipKey},
	{"ipv6", ip6Key},
}

func TestBytesPerKey(t *testing.T) {
	if testing.Short() {
		t.Skip("fills a store with 200,000 keys")
	}
	const n = 200_000
	for _, tt := range keyShapes {
		per := bytesPerKey(t, tt.key, n)
		t.Logf("%s: %.0f bytes per key (%d keys such as %q)", tt.name, per, n, tt.key(nil, n/2))
		if per > maxBytesPerKey {
			t.Errorf("%s: %.0f bytes per key, want at most %d", tt.name, per, maxBytesPerKey)
		}
	}
}

func BenchmarkBytesPerKey(b *testing.B) {
	const n = 200_000
	for _, tt := range keyShapes {
		b.Run(tt.name, func(b *testing.B) {
			for b.Loop() {
				b.ReportMetric(bytesPerKey(b, tt.key, n), "bytes/key")
			}
		})
	}
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
		// Twice the per-key budget: slack for the map's growth and the
		// garbage left by churn, yet far below the rounds-fold growth of
		// a store that does not evict.
		allowance = maxKeys * maxBytesPerKey * 2
	)
	before := heapAlloc()
	s, err := New(Config{MaxKeys: maxKeys, SweepInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	peak := uint64(0)
	for r := range rounds {
		fill(t, s, ipKey, r*maxKeys, maxKeys)
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
	if !s.has("per-ip", string(ipKey(nil, rounds*maxKeys-1)), time.Minute) {
		t.Errorf("the last key inserted was evicted")
	}
	if s.has("per-ip", string(ipKey(nil, 0)), time.Minute) {
		t.Errorf("the first key inserted is still held")
	}
	runtime.KeepAlive(s)
}
