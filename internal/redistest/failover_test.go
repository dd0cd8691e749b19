package redistest

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

func TestKillRestartSamePort(t *testing.T) {
	t.Parallel()
	s := Standalone(t)
	addr := s.Addr()
	c := s.Client(t, &redis.Options{MaxRetries: -1, DialTimeout: 200 * time.Millisecond})
	ctx := context.Background()
	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	if !s.Running() {
		t.Fatal("Running() = false on a started server")
	}
	s.Kill()
	s.Kill() // idempotent
	if s.Running() {
		t.Fatal("Running() = true after Kill")
	}
	if err := c.Ping(ctx).Err(); err == nil {
		t.Fatal("PING succeeded on a killed server")
	}
	if err := s.Restart(); err != nil {
		t.Fatal(err)
	}
	if got := s.Addr(); got != addr {
		t.Fatalf("Addr after Restart = %s, want %s", got, addr)
	}
	// The same client reconnects to the new process.
	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatalf("PING after Restart: %v", err)
	}
}

func TestWaitReplicatedWithoutReplica(t *testing.T) {
	t.Parallel()
	if err := Shared(t).WaitReplicated(context.Background()); err == nil {
		t.Fatal("WaitReplicated succeeded on a server without replicas")
	}
}

func TestKeySlot(t *testing.T) {
	t.Parallel()
	cl := SharedCluster(t)
	c := cl.Nodes()[0].Client(t, nil)
	ctx := context.Background()
	keys := []string{"", "a", "foo", "123456789", "{user1000}.following", "foo{}{bar}", "foo{{bar}}zap", "foo{bar}{zap}", "{}x", "x{", "sluicetest:é:{ip:1}"}
	for i := 0; i < 20; i++ {
		keys = append(keys, fmt.Sprintf("sluicetest:k%d", i))
	}
	for _, k := range keys {
		want, err := c.ClusterKeySlot(ctx, k).Result()
		if err != nil {
			t.Fatal(err)
		}
		if got := KeySlot(k); int64(got) != want {
			t.Errorf("KeySlot(%q) = %d, CLUSTER KEYSLOT says %d", k, got, want)
		}
	}
}

func TestClusterFailover(t *testing.T) {
	t.Parallel()
	cl := ClusterWithReplicas(t)
	nodes := cl.Nodes()
	if len(nodes) != 2*clusterMasters {
		t.Fatalf("%d nodes, want %d", len(nodes), 2*clusterMasters)
	}
	c := cl.Client(t, nil)
	ctx := context.Background()
	key := cl.Prefix(t) + "k"
	if err := c.Set(ctx, key, "before", 0).Err(); err != nil {
		t.Fatal(err)
	}
	m, err := cl.MasterForKey(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	i := slices.Index(nodes, m)
	if i < 0 || i >= clusterMasters {
		t.Fatalf("key served by node %d, want one of the first %d", i, clusterMasters)
	}
	if err := m.WaitReplicated(ctx); err != nil {
		t.Fatal(err)
	}

	m.Kill()
	promoted, took, err := cl.WaitFailover(ctx, m)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("cluster failover took %s", took)
	if want := nodes[i+clusterMasters]; promoted != want {
		t.Fatalf("promoted %s, want %s, the replica of %s", promoted.Addr(), want.Addr(), m.Addr())
	}
	if got, err := cl.MasterForKey(ctx, key); err != nil || got != promoted {
		t.Fatalf("MasterForKey after failover = %v, %v; want %s", got, err, promoted.Addr())
	}
	// A client made now finds the promoted replica at once, and reads the
	// write made before the kill.
	fresh := cl.Client(t, nil)
	if got, err := fresh.Get(ctx, key).Result(); err != nil || got != "before" {
		t.Fatalf("GET after failover = %q, %v; want %q", got, err, "before")
	}
	if err := fresh.Set(ctx, key, "after", 0).Err(); err != nil {
		t.Fatalf("SET after failover: %v", err)
	}
	// A client made before the kill still maps the slot to the dead master:
	// go-redis reloads its slot map on MOVED, not on dial errors, or every
	// ClusterStateReloadInterval. Once told to reload, it follows.
	c.ReloadState(ctx)
	err = waitUntil(ctx, 5*time.Second, 50*time.Millisecond, "old client follows", func(ctx context.Context) error {
		got, err := c.Get(ctx, key).Result()
		if err == nil && got != "after" {
			return fmt.Errorf("GET = %q, want %q", got, "after")
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}

	if err := cl.RestartNode(ctx, m); err != nil {
		t.Fatal(err)
	}
	r, err := m.Client(t, nil).Info(ctx, "replication").Result()
	if err != nil {
		t.Fatal(err)
	}
	if f := infoFields(r); f["role"] != "slave" || f["master_port"] != portOf(promoted.Addr()) {
		t.Fatalf("restarted node: role:%s master_port:%s; want a replica of %s", f["role"], f["master_port"], promoted.Addr())
	}
	// The old master holds the new write once it has caught up.
	if err := promoted.WaitReplicated(ctx); err != nil {
		t.Fatal(err)
	}
	ro := m.Client(t, nil)
	if err := ro.ReadOnly(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	if got, err := ro.Get(ctx, key).Result(); err != nil || got != "after" {
		t.Fatalf("GET on the restarted node = %q, %v; want %q", got, err, "after")
	}
}

func TestWaitFailoverNotAMaster(t *testing.T) {
	t.Parallel()
	cl := SharedCluster(t)
	if _, _, err := cl.WaitFailover(context.Background(), Shared(t)); err == nil {
		t.Fatal("WaitFailover accepted a server outside the cluster")
	}
}

func TestSentinelFailover(t *testing.T) {
	t.Parallel()
	s := Sentinel(t)
	if got := len(s.SentinelAddrs()); got != sentinelCount {
		t.Fatalf("%d Sentinels, want %d", got, sentinelCount)
	}
	nodes := s.Nodes()
	c := s.Client(t, nil)
	ctx := context.Background()
	key := s.Prefix(t) + "k"
	if err := c.Set(ctx, key, "before", 0).Err(); err != nil {
		t.Fatal(err)
	}
	m, err := s.Master(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if m != nodes[0] {
		t.Fatalf("master is %s, want %s", m.Addr(), nodes[0].Addr())
	}
	if err := m.WaitReplicated(ctx); err != nil {
		t.Fatal(err)
	}

	m.Kill()
	promoted, took, err := s.WaitFailover(ctx, m)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("Sentinel failover took %s", took)
	if promoted != nodes[1] {
		t.Fatalf("promoted %s, want %s", promoted.Addr(), nodes[1].Addr())
	}
	if got, err := s.Master(ctx); err != nil || got != promoted {
		t.Fatalf("Master after failover = %v, %v; want %s", got, err, promoted.Addr())
	}
	if got, err := c.Get(ctx, key).Result(); err != nil || got != "before" {
		t.Fatalf("GET after failover = %q, %v; want %q", got, err, "before")
	}
	if err := c.Set(ctx, key, "after", 0).Err(); err != nil {
		t.Fatalf("SET after failover: %v", err)
	}

	if err := s.RestartNode(ctx, m); err != nil {
		t.Fatal(err)
	}
	if err := promoted.WaitReplicated(ctx); err != nil {
		t.Fatal(err)
	}
	if got, err := m.Client(t, nil).Get(ctx, key).Result(); err != nil || got != "after" {
		t.Fatalf("GET on the restarted node = %q, %v; want %q", got, err, "after")
	}
}

func TestClusterFailoverPaused(t *testing.T) {
	t.Parallel()
	cl := ClusterWithReplicas(t)
	ctx := context.Background()
	m, err := cl.MasterForSlot(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Pause(); err != nil {
		t.Skip(err) // no SIGSTOP here
	}
	promoted, took, err := cl.WaitFailover(ctx, m)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("cluster failover of a hung master took %s", took)
	if err := m.Resume(); err != nil {
		t.Fatal(err)
	}
	// Once it answers again, the old master learns of the new one and
	// follows it.
	var cs clients
	defer cs.close()
	err = waitUntil(ctx, syncTimeout, failoverPoll, "old master follows", func(ctx context.Context) error {
		return cs.isOnlineReplica(ctx, m.Addr(), promoted.Addr())
	})
	if err != nil {
		t.Fatal(err)
	}
}
