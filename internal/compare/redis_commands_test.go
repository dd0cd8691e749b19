package compare

import (
	"bufio"
	"context"
	"strconv"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/internal/redistest"
)

// TestRedisCommands shows, for each limiter of BenchmarkRedis, the commands
// one decision sends and the time Redis spends in each (INFO commandstats),
// to explain the throughput and server-cpu-µs figures:
//
//	SLUICE_COMPARE=1 go test -run TestRedisCommands -v
//
// Each limiter gets a redis-server of its own, makes one decision on the
// hot key, then has the statistics reset (CONFIG RESETSTAT) and makes 2,000
// more, one at a time. The log gives, per command, its calls per decision
// and its usec_per_call; commands run by a script appear both on their own
// line and inside the script's EVALSHA or EVAL time.
func TestRedisCommands(t *testing.T) {
	requireCompare(t)
	const n = 2000
	for _, l := range redisLimiters {
		t.Run(l.name, func(t *testing.T) {
			srv := redistest.Standalone(t)
			c := srv.Client(t, redisOptions())
			decide := l.new(t, c, benchRule).worker()
			ctx := context.Background()
			if err := decide(ctx, hotIP); err != nil {
				t.Fatal(err)
			}
			if err := c.ConfigResetStat(ctx).Err(); err != nil {
				t.Fatal(err)
			}
			for i := 0; i < n; i++ {
				if err := decide(ctx, hotIP); err != nil {
					t.Fatal(err)
				}
			}
			s, err := c.Info(ctx, "commandstats").Result()
			if err != nil {
				t.Fatal(err)
			}
			var cmds []string
			sc := bufio.NewScanner(strings.NewReader(s))
			for sc.Scan() {
				// cmdstat_get:calls=2000,usec=440,usec_per_call=0.22,...
				name, stats, ok := strings.Cut(strings.TrimPrefix(strings.TrimSpace(sc.Text()), "cmdstat_"), ":")
				if !ok || strings.HasPrefix(name, "config") || strings.HasPrefix(name, "info") {
					continue
				}
				var calls, perCall string
				for _, kv := range strings.Split(stats, ",") {
					k, v, _ := strings.Cut(kv, "=")
					switch k {
					case "calls":
						calls = v
					case "usec_per_call":
						perCall = v
					}
				}
				cmds = append(cmds, name+" "+calls+"/"+strconv.Itoa(n)+" calls, "+perCall+" µs each")
			}
			t.Logf("%s: %s", l.name, strings.Join(cmds, "; "))
		})
	}
}
