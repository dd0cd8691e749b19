package redisstore

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/learn"
	"github.com/sluicehq/sluice/internal/redistest"
)

// TestLearnScript runs learn.lua on the table of learn.Commit, on a
// standalone server and on a cluster (the state is one key, in its
// budget's slot), and checks that it stores and returns what Commit
// says.
func TestLearnScript(t *testing.T) {
	t.Parallel()
	alone, cluster := redistest.Shared(t), redistest.SharedCluster(t)
	for _, on := range []struct {
		client redis.UniversalClient
		prefix string
	}{{alone.Client(t, nil), alone.Prefix(t)}, {cluster.Client(t, nil), cluster.Prefix(t)}} {
		client := on.client
		s := newTestStore(t, client, on.prefix)
		ctx := context.Background()
		for i, tc := range learn.CommitCases() {
			key := "client-" + tc.Name
			if tc.Stored != (learn.State{}) {
				if err := client.HSet(ctx, s.learnKey("rule", key), "lv", tc.Stored.Level, "tg", tc.Stored.Target, "at", tc.Stored.At, "n", tc.Stored.Cuts).Err(); err != nil {
					t.Fatal(err)
				}
			}
			p := tc.P
			st, at, applied, err := s.Learned(ctx, time.UnixMilli(tc.Now), "rule", key, &p, time.Duration(tc.Now-p.Admitted)*time.Millisecond, time.Minute)
			if err != nil {
				t.Fatalf("%d %s: %v", i, tc.Name, err)
			}
			if st != tc.Want || applied != tc.Applied || at != tc.Now {
				t.Errorf("%s: script %+v, %v at %d; want %+v, %v at %d", tc.Name, st, applied, at, tc.Want, tc.Applied, tc.Now)
			}
			read, _, _, err := s.Learned(ctx, time.UnixMilli(tc.Now), "rule", key, nil, 0, 0)
			if err != nil || read != tc.Want {
				t.Errorf("%s: read back %+v (%v), want %+v", tc.Name, read, err, tc.Want)
			}
			if ttl := client.PTTL(ctx, s.learnKey("rule", key)).Val(); tc.Applied && (ttl <= 0 || ttl > time.Minute) {
				t.Errorf("%s: TTL %s after a cut, want a minute at most", tc.Name, ttl)
			}
		}
	}
}

// TestLearnedRead: a budget never cut reads as the zero state, on the
// server's clock; a cut kept for less than a millisecond is refused.
func TestLearnedRead(t *testing.T) {
	t.Parallel()
	srv := redistest.Shared(t)
	s := newTestStore(t, srv.Client(t, nil), srv.Prefix(t))
	before := time.Now().UnixMilli()
	st, at, applied, err := s.Learned(context.Background(), time.Time{}, "rule", "never", nil, 0, 0)
	if err != nil || st != (learn.State{}) || applied {
		t.Fatalf("never cut: %+v, %v, %v", st, applied, err)
	}
	if at < before-1000 || at > time.Now().UnixMilli()+1000 {
		t.Errorf("the server's clock read %d, not near %d", at, before)
	}
	if _, _, _, err := s.Learned(context.Background(), time.Time{}, "rule", "k", &learn.Proposal{}, 0, 0); err == nil {
		t.Error("a cut kept for 0: no error")
	}
}
