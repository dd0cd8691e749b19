package redistest

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// TestAddMasterMoveSlots adds a master to a cluster, moves slots that
// hold keys to it, then rebalances a few more: every key is still there
// with its TTL, on the master that now serves its slot.
func TestAddMasterMoveSlots(t *testing.T) {
	t.Parallel()
	cl := Cluster(t)
	ctx := context.Background()
	c := cl.Client(t, nil)
	prefix := cl.Prefix(t)
	// Keys in a few slots, several per slot (hash tags), so that a slot
	// takes several MIGRATE batches.
	var keys []string
	slots := map[int]bool{}
	for tag := range 4 {
		for i := range 25 {
			k := prefix + "{t" + strconv.Itoa(tag) + "}:" + strconv.Itoa(i)
			if err := c.Set(ctx, k, i, time.Hour).Err(); err != nil {
				t.Fatal(err)
			}
			keys = append(keys, k)
			slots[KeySlot(k)] = true
		}
	}
	added := time.Now()
	n, err := cl.AddMaster(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("master added in %v", time.Since(added))
	if got := len(cl.Masters(ctx)); got != clusterMasters+1 {
		t.Fatalf("%d masters after AddMaster, want %d", got, clusterMasters+1)
	}
	var moving []int
	for s := range slots {
		moving = append(moving, s)
	}
	m, err := cl.MoveSlots(ctx, n, moving, MoveOptions{Batch: 7})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("moved %+v", m)
	if m.Slots != len(moving) || m.Keys != len(keys) || m.Batches != 4*4 {
		t.Errorf("moved %d slots, %d keys in %d batches; want %d, %d in 16", m.Slots, m.Keys, m.Batches, len(moving), len(keys))
	}
	for _, k := range keys {
		owner, err := cl.MasterForKey(ctx, k)
		if err != nil {
			t.Fatal(err)
		}
		if owner != n {
			t.Fatalf("%s served by %s, want the new master %s", k, owner.Addr(), n.Addr())
		}
	}
	// A client made now follows the new map; the old one gets MOVED and
	// follows it too.
	for _, cc := range []*redis.ClusterClient{c, cl.Client(t, nil)} {
		for _, k := range keys {
			ttl, err := cc.PTTL(ctx, k).Result()
			if err != nil || ttl < 59*time.Minute {
				t.Fatalf("%s after the move: TTL %v, %v; want about an hour", k, ttl, err)
			}
		}
	}

	r, err := cl.Rebalance(ctx, MoveOptions{Max: 40})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("rebalanced %+v", r)
	owned, err := cl.SlotsOf(ctx, n)
	if err != nil {
		t.Fatal(err)
	}
	if r.Slots != 40 || len(owned) != len(moving)+40 {
		t.Errorf("rebalance moved %d slots and the new master serves %d, want 40 and %d", r.Slots, len(owned), len(moving)+40)
	}
}
