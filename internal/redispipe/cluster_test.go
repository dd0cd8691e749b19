package redispipe

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/redistest"
)

func TestSlot(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		key  string
		want int
	}{
		{"", 0},
		{"foo", 12182},
		{"bar", 5061},
		{"123456789", 0x31C3 % Slots}, // the CRC-16/XMODEM check value
		{"{user1000}.following", Slot("user1000")},
		{"foo{}{bar}", Slot("foo{}{bar}")}, // empty tag: the whole key
		{"foo{{bar}}zap", Slot("{bar")},
		{"foo{bar}{zap}", Slot("bar")},
		{"{", Slot("{")},
	} {
		if got := Slot(tc.key); got != tc.want {
			t.Errorf("Slot(%q) = %d, want %d", tc.key, got, tc.want)
		}
	}

	cl := redistest.SharedCluster(t)
	c := redis.NewClient(&redis.Options{Addr: cl.Addrs()[0]})
	defer c.Close()
	ctx := context.Background()
	keys := []string{"", "{}", "{}x", "a{b}c", "{{}}", "}{", "\xff\x00binary", "sluice:{abcdefghijklmnopqrstuv}:per-ip:60000"}
	for i := 0; i < 200; i++ {
		keys = append(keys, "key:"+strconv.Itoa(i*7919), "{t"+strconv.Itoa(i)+"}:x")
	}
	for _, k := range keys {
		want, err := c.ClusterKeySlot(ctx, k).Result()
		if err != nil {
			t.Fatal(err)
		}
		if got := Slot(k); int64(got) != want {
			t.Errorf("Slot(%q) = %d, CLUSTER KEYSLOT says %d", k, got, want)
		}
	}
}

// TestClusterRouting sends concurrent calls for keys on every master and
// checks that each master answered its own, in batches.
func TestClusterRouting(t *testing.T) {
	t.Parallel()
	cl := redistest.SharedCluster(t)
	prefix := cl.Prefix(t)
	h := &pipeCounter{}
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cl.Addrs(), PoolSize: 128, ContextTimeoutEnabled: true})
	defer cc.Close()
	cc.OnNewNode(func(c *redis.Client) { c.AddHook(h) })
	p := newPipeliner(t, cc, Config{StallThreshold: testStall})
	ctx := context.Background()
	byNode := keysOnNodes(t, cc, prefix, 8)

	nodes := map[string]*redis.Client{}
	before := map[string]int{}
	for addr := range byNode {
		nodes[addr] = redis.NewClient(&redis.Options{Addr: addr})
		defer nodes[addr].Close()
		before[addr] = commandCalls(t, nodes[addr], "evalsha")
	}

	const each = 30
	var wg sync.WaitGroup
	for _, keys := range byNode {
		for _, key := range keys {
			for g := 0; g < 4; g++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := 0; i < each; i++ {
						if _, err := runDecide(ctx, p, key); err != nil {
							t.Errorf("%s: %v", key, err)
							return
						}
					}
				}()
			}
		}
	}
	wg.Wait()
	for addr, keys := range byNode {
		for _, key := range keys {
			n, err := nodes[addr].HGet(ctx, key, "c").Int()
			if err != nil || n != 4*each {
				t.Errorf("%s on %s: count %d, %v; want %d", key, addr, n, err, 4*each)
			}
		}
		// Every call ran where its key lives, with no redirection.
		if got, want := commandCalls(t, nodes[addr], "evalsha")-before[addr], 4*each*len(keys); got < want {
			t.Errorf("%s ran EVALSHA %d times, want at least %d", addr, got, want)
		}
	}
	pipes, cmds, largest := h.stats()
	t.Logf("%d calls over %d masters in %d pipelines, largest %d", cmds, len(byNode), pipes, largest)
	if largest < 2 {
		t.Error("no batching on the Cluster")
	}
	p.mu.Lock()
	var names []string
	for name := range p.byName {
		names = append(names, name)
	}
	p.mu.Unlock()
	slices.Sort(names)
	want := cl.Addrs()[:3]
	slices.Sort(want)
	if !slices.Equal(names, want) {
		t.Errorf("destinations %v, want the masters %v", names, want)
	}
}

// TestClusterMoved moves a slot to another master behind the client's
// back: calls for it must still succeed, following the MOVED reply.
func TestClusterMoved(t *testing.T) {
	t.Parallel()
	cl := redistest.Cluster(t)
	prefix := cl.Prefix(t)
	cc := cl.Client(t, &redis.ClusterOptions{PoolSize: 128})
	p := newPipeliner(t, cc, Config{StallThreshold: testStall})
	ctx := context.Background()

	key := prefix + "{moving}:c"
	if _, err := runDecide(ctx, p, key); err != nil {
		t.Fatal(err)
	}
	from, err := cc.MasterForKey(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	var to *redis.Client
	for _, addr := range cl.Addrs() {
		if addr != from.Options().Addr {
			to = redis.NewClient(&redis.Options{Addr: addr})
			defer to.Close()
			break
		}
	}
	if err := moveSlot(ctx, cl, Slot(key), from.Options().Addr, to.Options().Addr); err != nil {
		t.Fatal(err)
	}

	var wg sync.WaitGroup
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 10; i++ {
				if _, err := runDecide(ctx, p, key); err != nil {
					t.Errorf("after the move: %v", err)
				}
			}
		}()
	}
	wg.Wait()
	n, err := to.HGet(ctx, key, "c").Int()
	if err != nil || n != 81 {
		t.Errorf("count on the new master %d, %v; want 81", n, err)
	}
	moved := redistest.ErrorStats(t, from)["MOVED"]
	t.Logf("%d calls were redirected", moved)
	if moved == 0 {
		t.Error("no call was redirected: the move was not noticed")
	}
	// The client reloads its slot map: calls go to the new master again.
	ok := waitFor(2*time.Second, func() bool {
		m, err := cc.MasterForKey(ctx, key)
		return err == nil && m.Options().Addr == to.Options().Addr
	})
	if !ok {
		t.Error("the client's slot map still has the old master")
	}
}

// moveSlot moves slot and its keys from the master at src to the master
// at dst, as redis-cli --cluster reshard does.
func moveSlot(ctx context.Context, cl *redistest.ClusterServer, slot int, src, dst string) error {
	s := redis.NewClient(&redis.Options{Addr: src})
	defer s.Close()
	d := redis.NewClient(&redis.Options{Addr: dst})
	defer d.Close()
	srcID, err := s.Do(ctx, "CLUSTER", "MYID").Text()
	if err != nil {
		return err
	}
	dstID, err := d.Do(ctx, "CLUSTER", "MYID").Text()
	if err != nil {
		return err
	}
	if err := d.Do(ctx, "CLUSTER", "SETSLOT", slot, "IMPORTING", srcID).Err(); err != nil {
		return fmt.Errorf("importing: %w", err)
	}
	if err := s.Do(ctx, "CLUSTER", "SETSLOT", slot, "MIGRATING", dstID).Err(); err != nil {
		return fmt.Errorf("migrating: %w", err)
	}
	keys, err := s.ClusterGetKeysInSlot(ctx, slot, 1000).Result()
	if err != nil {
		return err
	}
	host, port, _ := splitAddr(dst)
	if len(keys) > 0 {
		args := []any{"MIGRATE", host, port, "", 0, 5000, "KEYS"}
		for _, k := range keys {
			args = append(args, k)
		}
		if err := s.Do(ctx, args...).Err(); err != nil {
			return fmt.Errorf("migrate: %w", err)
		}
	}
	for _, addr := range cl.Addrs() {
		n := redis.NewClient(&redis.Options{Addr: addr})
		err := n.Do(ctx, "CLUSTER", "SETSLOT", slot, "NODE", dstID).Err()
		_ = n.Close()
		if err != nil {
			return fmt.Errorf("setslot node on %s: %w", addr, err)
		}
	}
	return nil
}

func splitAddr(addr string) (string, string, error) {
	for i := len(addr) - 1; i >= 0; i-- {
		if addr[i] == ':' {
			return addr[:i], addr[i+1:], nil
		}
	}
	return "", "", fmt.Errorf("no port in %q", addr)
}

// TestRing checks that a Ring's shards each get their own calls.
func TestRing(t *testing.T) {
	t.Parallel()
	a, b := redistest.Standalone(t), redistest.Standalone(t)
	prefix := redistest.Prefix(t)
	ring := redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"a": a.Addr(), "b": b.Addr()}})
	defer ring.Close()
	p := newPipeliner(t, ring, Config{StallThreshold: testStall})
	ctx := context.Background()
	// Wait for the Ring's first heartbeat to see both shards up.
	if !waitFor(5*time.Second, func() bool { return len(ring.GetShardClients()) == 2 }) {
		t.Fatal("the Ring's shards are not up")
	}
	var wg sync.WaitGroup
	for g := 0; g < 64; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 5; i++ {
				if _, err := runDecide(ctx, p, prefix+strconv.Itoa(g)); err != nil {
					t.Errorf("call: %v", err)
				}
			}
		}()
	}
	wg.Wait()
	for _, srv := range []*redistest.Server{a, b} {
		c := srv.Client(t, nil)
		n, err := c.Keys(ctx, prefix+"*").Result()
		if err != nil {
			t.Fatal(err)
		}
		if len(n) == 0 {
			t.Errorf("shard %s got no keys", srv.Addr())
		}
		for _, k := range n {
			if v, err := c.HGet(ctx, k, "c").Int(); err != nil || v != 5 {
				t.Errorf("%s: count %d, %v; want 5", k, v, err)
			}
		}
		deleteAll(ctx, c, n)
	}
}

func deleteAll(ctx context.Context, c *redis.Client, keys []string) {
	if len(keys) > 0 {
		_ = c.Del(ctx, keys...).Err()
	}
}
