package redisstore

import (
	"context"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/redistest"
)

// TestTopSummaries drives top.lua on a real Redis with explicit instants:
// a reader gets each live server's last payload with its age, a server
// that stopped publishing is dropped after the TTL, and rules are kept
// apart.
func TestTopSummaries(t *testing.T) {
	t.Parallel()
	srv := redistest.Shared(t)
	s := newTestStore(t, srv.Client(t, nil), srv.Prefix(t))
	t0 := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	ctx := context.Background()
	const ttl = 3 * time.Second
	put := func(at time.Duration, rule, server, payload string) {
		t.Helper()
		if err := s.PublishTop(ctx, t0.Add(at), rule, server, []byte(payload), ttl); err != nil {
			t.Fatal(err)
		}
	}
	get := func(at time.Duration, rule string) map[string]TopSummary {
		t.Helper()
		list, err := s.CollectTop(ctx, t0.Add(at), rule, ttl)
		if err != nil {
			t.Fatal(err)
		}
		m := map[string]TopSummary{}
		for _, ts := range list {
			m[ts.Server] = ts
		}
		return m
	}
	if got := get(0, "api"); len(got) != 0 {
		t.Fatalf("before any publish: %v", got)
	}
	put(0, "api", "a", "a1")
	put(time.Second, "api", "b", "b1\x00\xff")
	put(2*time.Second, "api", "a", "a2")
	put(2*time.Second, "other", "c", "c1")
	got := get(2500*time.Millisecond, "api")
	if len(got) != 2 || string(got["a"].Payload) != "a2" || string(got["b"].Payload) != "b1\x00\xff" ||
		got["a"].Age != 500*time.Millisecond || got["b"].Age != 1500*time.Millisecond {
		t.Fatalf("at 2.5s: %+v", got)
	}
	// b published at 1 s: gone after 4 s.
	if got := get(4500*time.Millisecond, "api"); len(got) != 1 || got["a"].Payload == nil {
		t.Fatalf("at 4.5s: %+v", got)
	}
	if got := get(4500*time.Millisecond, "other"); len(got) != 1 {
		t.Fatalf("other rule at 4.5s: %+v", got)
	}
	if got := get(10*time.Second, "api"); len(got) != 0 {
		t.Fatalf("at 10s: %+v", got)
	}
	if err := s.PublishTop(ctx, t0, "api", "", nil, ttl); err == nil {
		t.Error("empty server name: no error")
	}
}
