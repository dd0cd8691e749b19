package regiontest

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

func TestProxyDelayOrderCutHeal(t *testing.T) {
	const d = 30 * time.Millisecond
	sim := New(t, []string{"a", "b"}, func(string, string) time.Duration { return d })
	ctx := context.Background()
	peer := sim.Peers(t, "a")["b"]
	key := sim.Servers["b"].Prefix(t) + "k"

	// The first command also dials; measure the second.
	if err := peer.Ping(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if err := peer.Ping(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	if rtt := time.Since(start); rtt < 2*d || rtt > 2*d+200*time.Millisecond {
		t.Fatalf("round trip %v, want about %v", rtt, 2*d)
	}

	// A pipeline of 200 commands costs one round trip, and keeps order.
	start = time.Now()
	cmds, err := peer.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i := 0; i < 200; i++ {
			p.RPush(ctx, key, i)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if rtt := time.Since(start); rtt > 2*d+300*time.Millisecond {
		t.Fatalf("pipeline took %v, want one round trip of %v", rtt, 2*d)
	}
	for i, c := range cmds {
		if n := c.(*redis.IntCmd).Val(); n != int64(i+1) {
			t.Fatalf("reply %d is %d: order lost", i, n)
		}
	}
	got, err := sim.Local(t, "b").LRange(ctx, key, 0, -1).Result()
	if err != nil {
		t.Fatal(err)
	}
	for i, v := range got {
		if v != fmt.Sprint(i) {
			t.Fatalf("element %d is %s: order lost", i, v)
		}
	}

	// Cut: commands fail; heal: they work again, still delayed.
	sim.Partition("a")
	if err := peer.Ping(ctx).Err(); err == nil {
		t.Fatal("ping through a cut link succeeded")
	}
	sim.Heal("a")
	var ok bool
	for i := 0; i < 20 && !ok; i++ {
		ok = peer.Ping(ctx).Err() == nil
	}
	if !ok {
		t.Fatal("ping after heal failed")
	}
	start = time.Now()
	if err := peer.Ping(ctx).Err(); err != nil || time.Since(start) < 2*d {
		t.Fatalf("after heal: %v in %v, want a delayed success", err, time.Since(start))
	}
}

func TestNotesDelays(t *testing.T) {
	for _, c := range []struct {
		a, b string
		want time.Duration
	}{
		{USEast1, EUWest1, 40 * time.Millisecond},
		{EUWest1, USEast1, 40 * time.Millisecond},
		{EUWest1, APSoutheast1, 90 * time.Millisecond},
		{APSoutheast1, USEast1, 120 * time.Millisecond},
	} {
		if got := NotesDelays(c.a, c.b); got != c.want {
			t.Errorf("%s-%s: %v, want %v", c.a, c.b, got, c.want)
		}
	}
	if got := ScaledDelays(10)(USEast1, APSoutheast1); got != 12*time.Millisecond {
		t.Errorf("scaled: %v", got)
	}
}
