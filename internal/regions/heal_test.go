package regions

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/regiontest"
)

// TestRetryAtOnceAfterFailure: once a push to a peer has failed, the next
// tick pushes again, without waiting for the sync interval, so that the
// counts go through as soon as the link heals.
func TestRetryAtOnceAfterFailure(t *testing.T) {
	sim := regiontest.New(t, []string{"us", "eu"}, func(string, string) time.Duration { return 0 })
	ctx := context.Background()
	s, err := New(Config{Region: "us", Local: sim.Local(t, "us"), Peers: sim.Peers(t, "us")}, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	const T = 1000 // the sync interval, ms
	c := Charge{Counter: sim.Servers["us"].Prefix(t) + "c", Limit: 10, Window: 60_000, Cost: 1, Interval: T * time.Millisecond}
	d, err := s.Decide(ctx, 1_000, c)
	if err != nil || !d.Allowed {
		t.Fatal(d, err)
	}
	sim.Partition("eu")
	if err := s.Sync(ctx, 1_000+T); err == nil {
		t.Fatal("a push through a cut link succeeded")
	}
	sim.Heal("eu")
	peer := sim.Local(t, "eu")
	// A tick later, well before the next interval.
	for i, at := range []int64{1_000 + T + 50, 1_000 + T + 100} {
		err := s.Sync(ctx, at)
		n, _ := peer.HGet(ctx, key(c.Counter, d.Start), "us").Int64()
		if err == nil && n == 1 {
			return
		}
		t.Logf("tick %d after healing: %v, the peer holds %d", i+1, err, n)
	}
	t.Errorf("the count did not reach the healed peer in the two ticks after healing (sync interval %d ms)", T)
}

// TestPushTimeoutBounded: a push to a peer that does not answer ends at
// Config.Timeout, although the client would wait its read timeout.
func TestPushTimeoutBounded(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	accepted := make(chan net.Conn, 64)
	defer func() {
		ln.Close()
		for len(accepted) > 0 {
			(<-accepted).Close()
		}
	}()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			select {
			case accepted <- c: // accepted, never answered
			default:
				c.Close()
			}
		}
	}()
	sim := regiontest.New(t, []string{"us"}, nil)
	peer := redis.NewClient(&redis.Options{Addr: ln.Addr().String(), ReadTimeout: 10 * time.Second, MaxRetries: -1})
	defer peer.Close()
	s, err := New(Config{Region: "us", Local: sim.Local(t, "us"), Peers: map[string]redis.UniversalClient{"eu": peer}, Timeout: 100 * time.Millisecond}, 0)
	if err != nil {
		t.Fatal(err)
	}
	began := time.Now()
	err = s.Sync(context.Background(), 1_000)
	if took := time.Since(began); err == nil || took > 2*time.Second {
		t.Errorf("a push to a peer that does not answer: %v after %v; want a failure after about 100ms", err, took)
	}
}

// TestLastPushAfterWindowEnd: with a sync interval as long as the window,
// a counter's only push is due 1 ms before the window ends; a syncer whose
// tick steps over that millisecond still pushes it, at its first tick
// after the end, before dropping the counter.
func TestLastPushAfterWindowEnd(t *testing.T) {
	sim := regiontest.New(t, []string{"us", "eu"}, func(string, string) time.Duration { return 0 })
	ctx := context.Background()
	s, err := New(Config{Region: "us", Local: sim.Local(t, "us"), Peers: sim.Peers(t, "us")}, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	c := Charge{Counter: sim.Servers["us"].Prefix(t) + "c", Limit: 10, Window: 1000, Cost: 1, Interval: time.Second}
	d, err := s.Decide(ctx, 1_500, c)
	if err != nil || !d.Allowed {
		t.Fatal(d, err)
	}
	for _, at := range []int64{1_990, 2_005, 2_015} { // ticks of 10 ms + 5 ms
		if err := s.Sync(ctx, at); err != nil {
			t.Fatal(err)
		}
	}
	if n, err := sim.Local(t, "eu").HGet(ctx, key(c.Counter, d.Start), "us").Int64(); n != 1 {
		t.Errorf("the peer holds %d, %v; want the window's count, 1", n, err)
	}
	s.mu.Lock()
	left := len(s.keys)
	s.mu.Unlock()
	if left != 0 {
		t.Errorf("%d counters still tracked after their last push", left)
	}
}
