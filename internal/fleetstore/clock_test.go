package fleetstore

import (
	"testing"
	"time"
)

// TestStoreClock feeds storeClock samples of a store whose clock is
// 5,000 ms ahead of this one: the offset is taken at the midpoint of a
// call, and a call whose round trip is far longer than the recent
// shortest (a redirected call, a slow reply) does not move it, until a
// second has passed.
func TestStoreClock(t *testing.T) {
	t.Parallel()
	base := time.UnixMilli(1_700_000_000_000)
	at := func(ms int) time.Time { return base.Add(time.Duration(ms) * time.Millisecond) }
	// The store decides at local instant decided, so says local + 5000.
	store := func(decided int) int64 { return at(decided).UnixMilli() + 5000 }
	var c storeClock
	for _, tt := range []struct {
		name                    string
		sent, decided, answered int
		want                    int64
	}{
		{"first sample, decided at the midpoint", 0, 1, 2, 5000},
		{"a reply decided at once, answered 40 ms later: not used", 10, 10, 50, 5000},
		{"a fast one", 60, 60, 61, 5000},
		{"decided late in a 2 ms round trip: off by 1 ms at most", 70, 72, 72, 5001},
		{"a slow one past the second: used, at its midpoint", 1100, 1100, 1140, 5000 - 20},
		{"then a fast one", 1150, 1150, 1150, 5000},
	} {
		c.sample(store(tt.decided), at(tt.sent), at(tt.answered))
		if got := c.offset.Load(); got != tt.want {
			t.Errorf("%s: offset %d, want %d", tt.name, got, tt.want)
		}
	}
}
