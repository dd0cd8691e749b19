package redisstore

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/fleet"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/internal/window"
)

// encodeState returns st as decide.lua stores a counter of l, or "" for
// a counter that was never written.
func encodeState(l *window.Limit, st window.State) string {
	if st.Start == 0 && st.Prev == 0 && st.Curr == 0 {
		return ""
	}
	le := binary.LittleEndian
	i6 := func(b []byte, x int64) []byte {
		var a [8]byte
		le.PutUint64(a[:], uint64(x))
		return append(b, a[:6]...)
	}
	f64 := func(b []byte, x int64) []byte { return le.AppendUint64(b, math.Float64bits(float64(x))) }
	switch l.Algorithm {
	case window.SlidingWindow:
		b := f64(nil, st.Start)
		b = f64(b, st.Prev)
		b = f64(b, st.Curr)
		return string(f64(b, l.Window.Milliseconds()))
	case window.FixedWindow:
		_, end := l.Bounds(st.Start)
		return string(f64(i6(i6([]byte{'F'}, end), st.Start), st.Curr))
	default:
		rate := int64(l.Requests)
		e := st.Start + (st.Curr+rate-1)/rate*st.Prev
		return string(f64(i6(i6(i6([]byte{'T'}, e), st.Start), st.Prev), st.Curr))
	}
}

func fleetCharge(key string, l window.Limit) window.Charge {
	return window.Charge{Key: key, Name: "fleet", Limit: l, Cost: 1}
}

// putState writes st as the stored counter of charge c.
func putState(t *testing.T, s *Store, client redis.Cmdable, c *window.Charge, st window.State) {
	t.Helper()
	ctx := context.Background()
	key, field := string(s.appendKey(nil, c.Key)), string(appendField(nil, c))
	if err := client.HDel(ctx, key, field, field+"h").Err(); err != nil {
		t.Fatal(err)
	}
	if v := encodeState(&c.Limit, st); v != "" {
		if err := client.HSet(ctx, key, field, v).Err(); err != nil {
			t.Fatal(err)
		}
		client.PExpire(ctx, key, time.Minute)
	}
}

// TestFleetCrossCheck runs fleet.lua on the tables of internal/fleet and
// checks that it stores and returns what fleet.Apply and fleet.Grant say.
func TestFleetCrossCheck(t *testing.T) {
	t.Parallel()
	srv := redistest.Shared(t)
	client := srv.Client(t, nil)
	s := newTestStore(t, client, srv.Prefix(t))
	ctx := context.Background()
	for _, tc := range fleet.ApplyCases() {
		c := fleetCharge("apply:"+tc.Name, tc.Limit)
		putState(t, s, client, &c, tc.Stored)
		rep, err := s.Fleet(ctx, time.Time{}, &fleet.Call{ID: FleetID(&c), Limit: &c.Limit, Now: tc.Now, Delta: tc.Delta})
		if err != nil {
			t.Fatalf("%s: %v", tc.Name, err)
		}
		if !same(rep.State, tc.Want) || rep.Now != tc.Now {
			t.Errorf("%s: script returned %+v at %d, want %+v", tc.Name, rep.State, rep.Now, tc.Want)
		}
		if v, ok := rawCounter(t, s, client, c); ok && (tc.Want.Curr != 0 || tc.Want.Prev != 0) {
			got, _ := storedState(t, c.Limit.Algorithm, v)
			if !same(got, tc.Want) {
				t.Errorf("%s: stored %+v, want %+v", tc.Name, got, tc.Want)
			}
		}
	}
	for _, tc := range fleet.GrantCases() {
		c := fleetCharge("grant:"+tc.Name, tc.Limit)
		putState(t, s, client, &c, tc.Stored)
		// Other holders, so that the script sees tc.Servers in all.
		for h := int64(1); h < tc.Servers; h++ {
			if _, err := s.Fleet(ctx, time.Time{}, &fleet.Call{ID: FleetID(&c), Limit: &c.Limit, Now: tc.Now, Lease: true, Holder: uint32(100 + h), Until: tc.Now + 60_000}); err != nil {
				t.Fatal(err)
			}
		}
		call := &fleet.Call{ID: FleetID(&c), Limit: &c.Limit, Now: tc.Now, Lease: true, Want: tc.Want, Give: tc.Give, From: tc.From, Holder: 7, Until: tc.Now + 1000}
		rep, err := s.Fleet(ctx, time.Time{}, call)
		if err != nil {
			t.Fatalf("%s: %v", tc.Name, err)
		}
		if !same(rep.State, tc.WantState) || rep.Granted != tc.Granted {
			t.Errorf("%s: script returned %+v granting %d, want %+v granting %d", tc.Name, rep.State, rep.Granted, tc.WantState, tc.Granted)
		}
		if tc.Want > 0 && rep.Servers != max(tc.Servers, 1) {
			t.Errorf("%s: %d servers seen, want %d", tc.Name, rep.Servers, tc.Servers)
		}
	}
}

// TestFleetSharesExactCounters checks that exact decisions and fleet calls
// count in one counter, so that a rule can change modes.
func TestFleetSharesExactCounters(t *testing.T) {
	t.Parallel()
	srv := redistest.Shared(t)
	client := srv.Client(t, nil)
	s := newTestStore(t, client, srv.Prefix(t))
	ctx := context.Background()
	for _, l := range []window.Limit{
		{Requests: 10, Window: time.Second},
		{Requests: 10, Window: time.Second, Algorithm: window.FixedWindow},
		{Requests: 10, Window: time.Second, Algorithm: window.TokenBucket},
		{Requests: 10, Algorithm: window.FixedWindow, Period: window.CalendarMonth},
	} {
		c := fleetCharge("shared:"+l.String(), l)
		at := t0.Add(10 * time.Millisecond)
		for i := 0; i < 3; i++ {
			take(t, s, at, c)
		}
		// A lease of 4 and a push of 2 on top of the 3 exact decisions.
		ms := at.UnixMilli()
		rep, err := s.Fleet(ctx, time.Time{}, &fleet.Call{ID: FleetID(&c), Limit: &c.Limit, Now: ms, Lease: true, Want: 4, Holder: 1, Until: ms + 500})
		if err != nil || rep.Granted != 3 { // 7 left, one server: 7/2 = 3
			t.Fatalf("%s: lease granted %d (%v), want 3", l, rep.Granted, err)
		}
		if _, err := s.Fleet(ctx, time.Time{}, &fleet.Call{ID: FleetID(&c), Limit: &c.Limit, Now: ms, Delta: fleet.Delta{Start: rep.State.Start, Curr: 2}}); err != nil {
			t.Fatal(err)
		}
		ok, d := take(t, s, at, c)
		if !ok || d.Remaining != 1 {
			t.Fatalf("%s: exact decision after the fleet calls: allowed %v remaining %d, want true 1", l, ok, d.Remaining)
		}
	}
}

// TestFleetClusterAndClock runs a lease on a Cluster with the server's
// clock.
func TestFleetClusterAndClock(t *testing.T) {
	t.Parallel()
	cl := redistest.SharedCluster(t)
	client := cl.Client(t, nil)
	s := newTestStore(t, client, cl.Prefix(t))
	c := fleetCharge("cluster", window.Limit{Requests: 100, Window: time.Minute})
	now := time.Now().UnixMilli()
	rep, err := s.Fleet(context.Background(), time.Time{}, &fleet.Call{ID: FleetID(&c), Limit: &c.Limit, Now: -1, Lease: true, Want: 20, Holder: 3, Until: now + 1000})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Granted != 20 || rep.Servers != 1 || rep.Now < now-5000 || rep.Now > now+5000 {
		t.Fatalf("lease: %+v", rep)
	}
	// The bucket lives as long as its counter matters (two windows), not
	// only as long as the lease.
	if ttl := client.PTTL(context.Background(), string(s.appendKey(nil, c.Key))).Val(); ttl < 100*time.Second {
		t.Fatalf("bucket expires in %s, want about two minutes", ttl)
	}
	_, d := take(t, s, time.Time{}, c)
	if d.Remaining != 79 {
		t.Fatalf("exact decision after a lease of 20: remaining %d, want 79", d.Remaining)
	}
}

func same(a, b window.State) bool { return a.Start == b.Start && a.Prev == b.Prev && a.Curr == b.Curr }

// TestFleetBucketExpiry checks the expiry fleet.lua gives a bucket: a
// bucket its call makes expires with the counter (two windows for a
// sliding window, the window's end for a fixed one, the instant it is full
// again, rounded up to a window, for a token bucket), or, holding only a
// lease's holders, when the lease ends; a later call in the same window
// leaves the expiry alone, and one in a new window extends it, never
// shortening a longer one.
func TestFleetBucketExpiry(t *testing.T) {
	t.Parallel()
	srv := redistest.Shared(t)
	client := srv.Client(t, nil)
	s := newTestStore(t, client, srv.Prefix(t))
	ctx := context.Background()
	const base = 1_800_000_000_000 // a whole minute
	pttl := func(c *window.Charge) time.Duration {
		return client.PTTL(ctx, string(s.appendKey(nil, c.Key))).Val()
	}
	call := func(c *window.Charge, now int64, lease bool, n int64) {
		t.Helper()
		fc := &fleet.Call{ID: FleetID(c), Limit: &c.Limit, Now: now, Delta: fleet.Delta{Start: now, Curr: n}}
		if lease {
			fc = &fleet.Call{ID: FleetID(c), Limit: &c.Limit, Now: now, Lease: true, Want: n, Holder: 9, Until: now + 3000}
		}
		if _, err := s.Fleet(ctx, time.Time{}, fc); err != nil {
			t.Fatal(err)
		}
	}
	near := func(got, want time.Duration) bool { return got > want-2*time.Second && got <= want }
	for _, tc := range []struct {
		l    window.Limit
		life time.Duration // of a counter written at base
	}{
		{window.Limit{Requests: 100, Window: time.Minute}, 2 * time.Minute},
		{window.Limit{Requests: 100, Window: time.Minute, Algorithm: window.FixedWindow}, time.Minute},
		{window.Limit{Requests: 100, Window: time.Minute, Algorithm: window.TokenBucket}, time.Minute},
	} {
		for _, lease := range []bool{false, true} {
			c := fleetCharge(fmt.Sprintf("expiry:%s:%v", tc.l.Algorithm, lease), tc.l)
			call(&c, base, lease, 5)
			if got := pttl(&c); !near(got, tc.life) {
				t.Errorf("%s, lease %v: a new bucket expires in %s, want %s", tc.l.Algorithm, lease, got, tc.life)
			}
			// A longer expiry (another counter's) is never shortened.
			client.PExpire(ctx, string(s.appendKey(nil, c.Key)), 10*time.Minute)
			call(&c, base+1000, lease, 5)
			call(&c, base+tc.l.Window.Milliseconds()+1000, lease, 5)
			if got := pttl(&c); !near(got, 10*time.Minute) {
				t.Errorf("%s, lease %v: a bucket of 10 min expires in %s after later calls", tc.l.Algorithm, lease, got)
			}
		}
		// A call in a new window extends a shorter expiry.
		c := fleetCharge(fmt.Sprintf("expiry:%s:extend", tc.l.Algorithm), tc.l)
		call(&c, base, false, 5)
		client.PExpire(ctx, string(s.appendKey(nil, c.Key)), time.Second)
		later := base + 3*tc.l.Window.Milliseconds()
		call(&c, later, false, 5)
		if got := pttl(&c); !near(got, tc.life) {
			t.Errorf("%s: after a call in a new window the bucket expires in %s, want %s", tc.l.Algorithm, got, tc.life)
		}
	}
	// Only the holders of a lease that granted nothing: the bucket lives
	// until the lease ends.
	c := fleetCharge("expiry:holders", window.Limit{Requests: 100, Window: time.Minute})
	call(&c, base, true, 0)
	if got := pttl(&c); !near(got, 3*time.Second) {
		t.Errorf("a bucket of holders only expires in %s, want 3s", got)
	}
}
