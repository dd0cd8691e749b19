package redispipe

import (
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/redistest"
)

// TestLanesFor checks how many lanes a destination runs, and how many
// connections its warm-up keeps ready, for the sizes of its client's
// pool: no more lanes than connections, the extra lanes what the pool has
// beside the regular ones and a direct call, and warming only what the
// pool can spare beside those.
func TestLanesFor(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name                  string
		maxInFlight           int
		opt                   redis.Options
		regular, extra, warms int
	}{
		{"pool of 1", 4, redis.Options{PoolSize: 1}, 1, 0, 0},
		{"pool of 2", 4, redis.Options{PoolSize: 2}, 2, 0, 0},
		{"pool of 4", 4, redis.Options{PoolSize: 4}, 4, 0, 0},
		{"pool of 5", 4, redis.Options{PoolSize: 5}, 4, 0, 0},
		{"pool of 8", 4, redis.Options{PoolSize: 8}, 4, 3, 3},
		{"pool of 10", 4, redis.Options{PoolSize: 10}, 4, 4, 5},
		{"pool of 20", 4, redis.Options{PoolSize: 20}, 4, 4, 8},
		{"pool of 128", 4, redis.Options{PoolSize: 128}, 4, 4, 8},
		{"a Cluster node's pool of 10", 1, redis.Options{PoolSize: 10}, 1, 4, 5},
		{"MaxActiveConns below PoolSize", 4, redis.Options{PoolSize: 128, MaxActiveConns: 6}, 4, 1, 1},
		{"a pool for pipelines of its own", 4, redis.Options{PoolSize: 128, PipelineWriteBufferSize: 1 << 16, PipelinePoolSize: 3}, 3, 0, 0},
		{"a pool for pipelines of go-redis's size", 4, redis.Options{PoolSize: 128, PipelineReadBufferSize: 1 << 16}, 4, 4, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			regular, extra := lanesFor(tc.maxInFlight, &tc.opt)
			warms := warmConnsFor(regular, extra, &tc.opt)
			if regular != tc.regular || extra != tc.extra || warms != tc.warms {
				t.Errorf("%d regular lanes, %d extra, %d connections warmed; want %d, %d, %d",
					regular, extra, warms, tc.regular, tc.extra, tc.warms)
			}
		})
	}
}

// TestWarmConnections checks that a destination with servers that may be
// slow (Config.Bound) leaves a connection for each of its lanes in its
// client's pool, extra ones included, without a call being made; and that
// one whose pool cannot spare them takes none.
func TestWarmConnections(t *testing.T) {
	t.Parallel()
	srv := redistest.Standalone(t)
	for _, tc := range []struct {
		poolSize, conns int
	}{{20, DefaultMaxInFlight + extraLanes}, {DefaultMaxInFlight, 0}} {
		c := srv.Client(t, &redis.Options{PoolSize: tc.poolSize})
		p := newPipeliner(t, c, Config{Bound: 100 * time.Millisecond})
		if tc.conns == 0 {
			if p.single.warmer != nil {
				t.Errorf("PoolSize %d: warmed", tc.poolSize)
			}
			continue
		}
		deadline := time.Now().Add(5 * time.Second)
		for c.PoolStats().IdleConns < uint32(tc.conns) && time.Now().Before(deadline) {
			time.Sleep(5 * time.Millisecond)
		}
		if s := c.PoolStats(); s.IdleConns != uint32(tc.conns) || s.TotalConns != uint32(tc.conns) {
			t.Errorf("PoolSize %d: %d connections, %d idle, after the warm-up; want %d, all idle",
				tc.poolSize, s.TotalConns, s.IdleConns, tc.conns)
		}
	}
}
