package redisstore

import (
	"context"
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
	if _, _, err := s.PublishSpare(ctx, t0, "", 1, time.Second); err == nil {
		t.Error("empty server name: no error")
	}
	if _, _, err := s.PublishSpare(ctx, t0, "a", 1, 0); err == nil {
		t.Error("zero ttl: no error")
	}
}
