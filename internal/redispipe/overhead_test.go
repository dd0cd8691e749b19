package redispipe

import (
	"context"
	"runtime"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/redistest"
)

// overheadConfig is the Config of BenchmarkOverhead: the Redis store's
// (redisstore gives the pipeline its Timeout as Bound).
var overheadConfig = Config{Bound: 100 * time.Millisecond}

// BenchmarkOverhead measures what the pipeline itself costs a call, with
// the server taken out: every batch is answered in process as soon as a
// lane takes it (Pipeliner.send), so that what is timed is the pipeline's
// own work for a call, as the Redis store makes it (RunBy with a
// deadline): routing, queueing, the lanes and their timers, the stamps
// and waking the callers; direct calls are off, as with any send. "c=1"
// is one caller, one call after the other; "c=64", 64 callers at once:
//
//	go test -run '^$' -bench BenchmarkOverhead -count 6 ./internal/redispipe/
//
// What the gray-failure machinery costs a healthy server's calls shows
// here undiluted by round trips. Beside the time per call, cpu-ns/op is
// the CPU time this process spent per call, its background goroutines
// included: on a machine shared with other work, the steadier figure.
func BenchmarkOverhead(b *testing.B) {
	srv := redistest.Standalone(b)
	c := srv.Client(b, &redis.Options{PoolSize: 128})
	reply := []any{int64(1)}
	keys := []string{"overhead"}
	for _, conc := range []int{1, 64} {
		name := "c=1"
		if conc > 1 {
			name = "c=64"
		}
		b.Run(name, func(b *testing.B) {
			p := newPipeliner(b, c, overheadConfig)
			p.send = func(_ *dest, _ context.Context, sent []*call) bool {
				for _, cl := range sent {
					cl.complete(reply, nil)
				}
				return true
			}
			ctx := context.Background()
			run := func() {
				if _, err := p.RunBy(ctx, time.Now().Add(100*time.Millisecond), batchDecide, keys, decideArgs...); err != nil {
					b.Error(err)
				}
			}
			b.ReportAllocs()
			b.ResetTimer()
			cpu := redistest.ProcessCPU(b)
			if conc == 1 {
				for range b.N {
					run()
				}
			} else {
				b.SetParallelism(max(conc/runtime.GOMAXPROCS(0), 1))
				b.RunParallel(func(pb *testing.PB) {
					for pb.Next() {
						run()
					}
				})
			}
			b.ReportMetric(float64(redistest.ProcessCPU(b)-cpu)/float64(b.N), "cpu-ns/op")
		})
	}
}
