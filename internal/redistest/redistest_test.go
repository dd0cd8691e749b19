package redistest

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

func TestMain(m *testing.M) { Main(m) }

func TestStandaloneStopRestart(t *testing.T) {
	t.Parallel()
	s := Standalone(t)
	c := s.Client(t, &redis.Options{MaxRetries: -1, DialTimeout: 200 * time.Millisecond})
	ctx := context.Background()
	if err := c.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	s.Stop()
	s.Stop() // idempotent
	if err := c.Ping(ctx).Err(); err == nil {
		t.Fatal("PING succeeded on a stopped server")
	}
	if err := s.Restart(); err != nil {
		t.Fatal(err)
	}
	// Persistence is off: the restarted server is empty.
	if n, err := c.Exists(ctx, "k").Result(); err != nil || n != 0 {
		t.Fatalf("EXISTS k after restart = %d, %v; want 0, nil", n, err)
	}
}

func TestPauseResume(t *testing.T) {
	t.Parallel()
	s := Standalone(t)
	c := s.Client(t, &redis.Options{MaxRetries: -1, ReadTimeout: 100 * time.Millisecond})
	ctx := context.Background()
	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	if err := s.Pause(); err != nil {
		t.Fatal(err)
	}
	if err := c.Ping(ctx).Err(); err == nil {
		t.Fatal("PING answered by a paused server")
	}
	if err := s.Resume(); err != nil {
		t.Fatal(err)
	}
	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatal(err)
	}
}

func TestSharedIsShared(t *testing.T) {
	t.Parallel()
	if a, b := Shared(t), Shared(t); a != b {
		t.Fatal("Shared returned two servers")
	}
}

func TestPrefixDeletesKeys(t *testing.T) {
	t.Parallel()
	s := Shared(t)
	c := s.Client(t, nil)
	ctx := context.Background()
	var prefix string
	t.Run("inner", func(t *testing.T) {
		prefix = s.Prefix(t)
		if strings.ContainsAny(prefix, "{}*?[]") {
			t.Fatalf("prefix %q has special characters", prefix)
		}
		if err := c.Set(ctx, prefix+"a", 1, 0).Err(); err != nil {
			t.Fatal(err)
		}
	})
	if n, err := c.Exists(ctx, prefix+"a").Result(); err != nil || n != 0 {
		t.Fatalf("key left after the test: EXISTS = %d, %v", n, err)
	}
}

func TestCluster(t *testing.T) {
	t.Parallel()
	cl := SharedCluster(t)
	if got := len(cl.Addrs()); got != clusterMasters {
		t.Fatalf("%d masters, want %d", got, clusterMasters)
	}
	c := cl.Client(t, nil)
	ctx := context.Background()
	prefix := cl.Prefix(t)
	// Keys in many slots, so every master is written to.
	for i := 0; i < 30; i++ {
		k := prefix + strings.Repeat("x", i)
		if err := c.Set(ctx, k, i, time.Minute).Err(); err != nil {
			t.Fatalf("SET %s: %v", k, err)
		}
	}
	var masters atomic.Int32
	err := c.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
		keys, err := m.Keys(ctx, prefix+"*").Result()
		if len(keys) > 0 {
			masters.Add(1)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if masters := int(masters.Load()); masters != clusterMasters {
		t.Fatalf("keys on %d masters, want %d", masters, clusterMasters)
	}
}
