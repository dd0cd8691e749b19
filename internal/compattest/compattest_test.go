package compattest_test

import (
	"context"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/compattest"
	"github.com/sluicehq/sluice/internal/redistest"
)

func TestMain(m *testing.M) { redistest.Main(m) }

// TestCapabilities runs every workload on the shared servers: standalone,
// Sentinel and Cluster.
func TestCapabilities(t *testing.T) {
	t.Parallel()
	envs := map[string]func(t *testing.T) compattest.Env{
		"Standalone": func(t *testing.T) compattest.Env {
			srv := redistest.Shared(t)
			return compattest.Env{Client: srv.Client(t, nil), Prefix: srv.Prefix(t)}
		},
		"Cluster": func(t *testing.T) compattest.Env {
			cl := redistest.SharedCluster(t)
			return compattest.Env{Client: cl.Client(t, nil), Prefix: cl.Prefix(t)}
		},
	}
	for name, env := range envs {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			for _, c := range compattest.Capabilities {
				t.Run(c.Name, func(t *testing.T) { c.Run(t, env(t)) })
			}
		})
	}
}

// commandStats returns the commands the server of c has run since its
// statistics were last reset, by name as INFO commandstats gives it
// ("hget", "client|setinfo").
func commandStats(t testing.TB, c *redis.Client) map[string]bool {
	t.Helper()
	info, err := c.Info(context.Background(), "commandstats").Result()
	if err != nil {
		t.Fatalf("INFO commandstats: %v", err)
	}
	out := map[string]bool{}
	for _, line := range strings.Split(info, "\n") {
		name, _, ok := strings.Cut(strings.TrimPrefix(strings.TrimSpace(line), "cmdstat_"), ":")
		if ok && strings.HasPrefix(strings.TrimSpace(line), "cmdstat_") {
			out[name] = true
		}
	}
	return out
}
