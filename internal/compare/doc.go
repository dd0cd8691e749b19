// Package compare benchmarks sluice beside the Go rate limiters its users
// would otherwise pick: ulule/limiter v3, go-chi/httprate and
// go-chi/httprate-redis, sethvargo/go-limiter, throttled/throttled v2 and
// go-redis/redis_rate v10.
//
// It is a module of its own (see go.mod), so that none of those limiters
// ever enters sluice's dependency graph; sluice itself comes in through a
// replace directive pointing at the repository root. The package holds no
// code: everything is in its _test.go files, and README.md says how to run
// them and what one run measured.
//
//   - BenchmarkMiddleware: net/http middleware with each limiter's in-memory
//     store, one hot key and 100,000 client addresses, beside a bare handler.
//   - BenchmarkRedis: Redis decisions per second and latency from 64
//     goroutines, beside a pipelined INCR + PEXPIRE on the same server.
//   - BenchmarkRedisSerial: the latency of one decision at a time, beside
//     EVALSHA of "return 1" and the INCR + PEXPIRE pipeline.
//   - TestMemoryPerKey (SLUICE_COMPARE=1): live heap per counter of each
//     in-memory store with 1,000,000 keys, and whether sluice's store gives
//     the memory back once its counters expire.
//   - TestRedisMemoryPerKey and TestRedisExpiry (SLUICE_COMPARE=1): Redis
//     used_memory per counter with 1,000,000 keys, and how soon sluice's
//     counters leave Redis after their last use.
//   - TestRedisCommands (SLUICE_COMPARE=1): the commands each limiter sends
//     to Redis per decision, with Redis's time per command.
package compare
