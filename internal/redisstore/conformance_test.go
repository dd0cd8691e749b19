package redisstore

import (
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/redispipe"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/internal/storetest"
)

func TestMain(m *testing.M) { redistest.Main(m) }

func TestConformanceStandalone(t *testing.T) {
	t.Parallel()
	srv := redistest.Shared(t)
	storetest.Run(t, func(t *testing.T) storetest.Store {
		return newTestStore(t, srv.Client(t, nil), srv.Prefix(t))
	})
}

func TestConformanceCluster(t *testing.T) {
	t.Parallel()
	cl := redistest.SharedCluster(t)
	storetest.Run(t, func(t *testing.T) storetest.Store {
		return newTestStore(t, cl.Client(t, nil), cl.Prefix(t))
	})
}

// TestConformanceRing runs the suite on a Ring of two shards, which routes
// each script run by its first key's hash tag, as a cluster does.
func TestConformanceRing(t *testing.T) {
	t.Parallel()
	a, b := redistest.Standalone(t), redistest.Standalone(t)
	storetest.Run(t, func(t *testing.T) storetest.Store {
		ring := redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"a": a.Addr(), "b": b.Addr()}})
		t.Cleanup(func() { _ = ring.Close() })
		return newTestStore(t, ring, a.Prefix(t))
	})
}

// newTestStore returns a store for client with keys under prefix and a
// timeout generous enough for the race detector.
func newTestStore(t testing.TB, client redis.Scripter, prefix string) *Store {
	t.Helper()
	// A machine loaded by parallel tests can take tens of ms to answer;
	// only the outage tests mark servers down that quickly.
	s, err := New(client, Config{Prefix: prefix, Timeout: 5 * time.Second, Pipeline: redispipe.Config{StallThreshold: 2 * time.Second}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// TestTakeBack checks takeback.lua against window.Refund on the suite's
// table, standalone and on a cluster.
func TestTakeBack(t *testing.T) {
	t.Parallel()
	onEachServer(t, func(t *testing.T, newStore func(t *testing.T) *Store) {
		storetest.RunRefund(t, func(t *testing.T) storetest.Refunder { return newStore(t) })
	})
}

// TestSettle checks Settle (decide.lua's settle mode) against
// window.SettleAll, and the decisions after a debt against window.Take, on
// the suite's table, standalone and on a cluster.
func TestSettle(t *testing.T) {
	t.Parallel()
	onEachServer(t, func(t *testing.T, newStore func(t *testing.T) *Store) {
		storetest.RunSettle(t, func(t *testing.T) storetest.Settler { return newStore(t) })
	})
}

// onEachServer runs run in parallel subtests on the shared standalone
// server and on the shared cluster, with a function that makes stores on
// it.
func onEachServer(t *testing.T, run func(t *testing.T, newStore func(t *testing.T) *Store)) {
	t.Run("Standalone", func(t *testing.T) {
		t.Parallel()
		srv := redistest.Shared(t)
		run(t, func(t *testing.T) *Store { return newTestStore(t, srv.Client(t, nil), srv.Prefix(t)) })
	})
	t.Run("Cluster", func(t *testing.T) {
		t.Parallel()
		cl := redistest.SharedCluster(t)
		run(t, func(t *testing.T) *Store { return newTestStore(t, cl.Client(t, nil), cl.Prefix(t)) })
	})
}

// TestSettleSentinel checks Settle through a Sentinel-managed client
// (redis.NewFailoverClient), whose scripts reach the master as a
// standalone client's do.
func TestSettleSentinel(t *testing.T) {
	t.Parallel()
	sen := redistest.Sentinel(t)
	storetest.RunSettle(t, func(t *testing.T) storetest.Settler {
		return newTestStore(t, sen.Client(t, nil), sen.Prefix(t))
	})
}
