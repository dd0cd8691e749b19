package redisstore

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/redistest"
)

// TestPublishSpare drives spare.lua on a real Redis with explicit instants:
// the fleet's spare capacity is the least of the live entries, an entry
// counts until its expiry, and a server's new figure replaces its old one.
func TestPublishSpare(t *testing.T) {
	t.Parallel()
	srv := redistest.Shared(t)
	s := newTestStore(t, srv.Client(t, nil), srv.Prefix(t))
	t0 := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	ctx := context.Background()
	for _, st := range []struct {
		at      time.Duration
		server  string
		spare   float64
		fleet   float64
		servers int
	}{
		{0, "a", 0.8, 0.8, 1},
		{100 * time.Millisecond, "b", 0.3, 0.3, 2},
		{200 * time.Millisecond, "a", 0.1, 0.1, 2},  // a's new figure replaces its 0.8
		{900 * time.Millisecond, "a", 0.9, 0.3, 2},  // b's 0.3 lives until 1.1s
		{1100 * time.Millisecond, "a", 0.9, 0.9, 1}, // and no longer
		{1150 * time.Millisecond, "c", 1.5, 0.9, 2}, // clamped to 1
		{1200 * time.Millisecond, "c", -1, 0, 2},    // clamped to 0
	} {
		fleet, n, err := s.PublishSpare(ctx, t0.Add(st.at), st.server, st.spare, time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if fleet != st.fleet || n != st.servers {
			t.Fatalf("at %v, %s publishes %.1f: fleet %.3f of %d servers, want %.1f of %d", st.at, st.server, st.spare, fleet, n, st.fleet, st.servers)
		}
	}
	// Many entries expiring at once go at most 64 a call: the count falls
	// to the live servers within a few calls (in a fleet of its own).
	s = newTestStore(t, srv.Client(t, nil), srv.Prefix(t))
	for i := 0; i < 100; i++ {
		if _, _, err := s.PublishSpare(ctx, t0.Add(2*time.Second), "many-"+strconv.Itoa(i), 0.2, time.Second); err != nil {
			t.Fatal(err)
		}
	}
	later := t0.Add(4 * time.Second)
	if fleet, n, err := s.PublishSpare(ctx, later, "a", 0.7, time.Second); err != nil || n != 1+100-64 || fleet != 0.2 {
		t.Fatalf("after 100 entries expired: fleet %.3f of %d servers (%v), want 0.2 of %d, the 64 oldest dropped", fleet, n, err, 1+100-64)
	}
	if fleet, n, err := s.PublishSpare(ctx, later, "a", 0.7, time.Second); err != nil || n != 1 || fleet != 0.7 {
		t.Fatalf("a call later: fleet %.3f of %d servers (%v), want 0.7 of 1", fleet, n, err)
	}
	if _, _, err := s.PublishSpare(ctx, t0, "", 1, time.Second); err == nil {
		t.Error("empty server name: no error")
	}
	if _, _, err := s.PublishSpare(ctx, t0, "a", 1, 0); err == nil {
		t.Error("zero ttl: no error")
	}
}

// BenchmarkPublishSpare measures what one publication of spare capacity
// costs Redis with 1, 16 and 1,000 app servers' entries live in the
// fleet's hash (spare.lua reads them all to find the least), one call at a
// time:
//
//	go test -run '^$' -bench BenchmarkPublishSpare -benchtime 2000x ./internal/redisstore/
func BenchmarkPublishSpare(b *testing.B) {
	for _, servers := range []int{1, 16, 1000} {
		b.Run(strconv.Itoa(servers)+"-servers", func(b *testing.B) {
			srv := redistest.Standalone(b)
			c := srv.Client(b, nil)
			s := newTestStore(b, c, srv.Prefix(b))
			ctx := context.Background()
			for i := 0; i < servers; i++ {
				if _, n, err := s.PublishSpare(ctx, time.Time{}, "server-"+strconv.Itoa(i), 0.5, time.Minute); err != nil || n != i+1 {
					b.Fatalf("server %d: %d live, %v", i, n, err)
				}
			}
			before := redistest.ReadUsage(b, c)
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if _, _, err := s.PublishSpare(ctx, time.Time{}, "server-0", 0.5, time.Minute); err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			u := redistest.ReadUsage(b, c).Sub(before)
			b.ReportMetric(float64(u.CPU.Microseconds())/float64(b.N), "redis-cpu-µs/call")
		})
	}
}
