package compare

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-chi/httprate"
	httprateredis "github.com/go-chi/httprate-redis"
	"github.com/go-redis/redis_rate/v10"
	"github.com/redis/go-redis/v9"
	golimiter "github.com/sethvargo/go-limiter"
	"github.com/sethvargo/go-limiter/httplimit"
	"github.com/sethvargo/go-limiter/memorystore"
	"github.com/throttled/throttled/v2"
	throttledredis "github.com/throttled/throttled/v2/store/goredisstore.v9"
	throttledmem "github.com/throttled/throttled/v2/store/memstore"
	"github.com/ulule/limiter/v3"
	"github.com/ulule/limiter/v3/drivers/middleware/stdlib"
	ululemem "github.com/ulule/limiter/v3/drivers/store/memory"
	ululeredis "github.com/ulule/limiter/v3/drivers/store/redis"

	"github.com/sluicehq/sluice/keyfunc"
	"github.com/sluicehq/sluice/middleware"
)

// Every limiter here is built with its own default options, keyed by the
// client address the way its documentation shows, and given a limit of
// bigLimit requests per window that no benchmark reaches, so that every
// decision is an admission that updates a counter.
const (
	bigLimit = 1_000_000_000
	// throttledMaxKeys is the LRU size of throttled's memstore, which has no
	// default (its README passes 65536). It is sluice's default MaxKeys, and
	// holds the 1,000,000 keys of TestMemoryPerKey without evicting.
	throttledMaxKeys = 1 << 20
	// hotIP is the client of the one-hot-key cases.
	hotIP = "192.0.2.1"
)

// ipv4 returns the address of client i, "10.a.b.c", distinct for i < 1<<24.
func ipv4(i int) string {
	return "10." + strconv.Itoa(i>>16&255) + "." + strconv.Itoa(i>>8&255) + "." + strconv.Itoa(i&255)
}

// errDenied is what a decision function returns when a limiter denied a
// request, which no benchmark expects.
var errDenied = errors.New("denied")

// ---------------------------------------------------------------------------
// net/http middleware over each limiter's in-memory store.

// httpLimiter is a limiter's net/http middleware over its in-memory store,
// with the limiter's default options and bigLimit requests per minute.
type httpLimiter struct {
	name string
	wrap func(tb testing.TB, next http.Handler) http.Handler
}

var httpLimiters = []httpLimiter{
	{"sluice", func(tb testing.TB, next http.Handler) http.Handler {
		// Default store (memory), default header style (five fields).
		lim, err := middleware.New(middleware.PerMinute(bigLimit), keyfunc.RemoteIP())
		if err != nil {
			tb.Fatal(err)
		}
		tb.Cleanup(func() { _ = lim.Close() })
		return lim.Handler(next)
	}},
	{"ulule", func(tb testing.TB, next http.Handler) http.Handler {
		// The memory store's cleaner goroutine cannot be stopped from
		// outside; it ends with the test binary.
		lim := limiter.New(ululemem.NewStore(), limiter.Rate{Period: time.Minute, Limit: bigLimit})
		return stdlib.NewMiddleware(lim).Handler(next)
	}},
	{"httprate", func(tb testing.TB, next http.Handler) http.Handler {
		return httprate.LimitBy(bigLimit, time.Minute, httprateKeyByIP)(next)
	}},
	{"go-limiter", func(tb testing.TB, next http.Handler) http.Handler {
		st := goLimiterStore(tb)
		m, err := httplimit.NewMiddleware(st, httplimit.IPKeyFunc())
		if err != nil {
			tb.Fatal(err)
		}
		return m.Handle(next)
	}},
	{"throttled", func(tb testing.TB, next http.Handler) http.Handler {
		rl, _ := throttledMemLimiter(tb)
		h := &throttled.HTTPRateLimiterCtx{
			RateLimiter: rl,
			VaryBy:      &throttled.VaryBy{RemoteAddr: true},
		}
		return h.RateLimit(next)
	}},
}

// httprateKeyByIP is the body of httprate.KeyByIP, which httprate v0.16
// deprecates in favour of spelling it out with CanonicalizeIP.
func httprateKeyByIP(r *http.Request) (string, error) {
	ip, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		ip = r.RemoteAddr
	}
	return httprate.CanonicalizeIP(ip), nil
}

// goLimiterStore returns a go-limiter memorystore of bigLimit tokens per
// minute. go-limiter refills a bucket by (interval / tokens) per elapsed
// interval, which refills it completely only while tokens is at most the
// interval in nanoseconds: true of bigLimit per minute.
func goLimiterStore(tb testing.TB) golimiter.Store {
	st, err := memorystore.New(&memorystore.Config{Tokens: bigLimit, Interval: time.Minute})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = st.Close(context.Background()) })
	return st
}

// throttledMemLimiter returns throttled's GCRA limiter over its memstore,
// bigLimit per minute with a burst of bigLimit, and the store.
func throttledMemLimiter(tb testing.TB) (*throttled.GCRARateLimiterCtx, throttled.GCRAStoreCtx) {
	st, err := throttledmem.NewCtx(throttledMaxKeys)
	if err != nil {
		tb.Fatal(err)
	}
	rl, err := throttled.NewGCRARateLimiterCtx(st, throttled.RateQuota{
		MaxRate:  throttled.PerMin(bigLimit),
		MaxBurst: bigLimit - 1,
	})
	if err != nil {
		tb.Fatal(err)
	}
	return rl, st
}

// discardWriter is a ResponseWriter that keeps nothing but its header map.
type discardWriter struct{ h http.Header }

func (w *discardWriter) Header() http.Header         { return w.h }
func (w *discardWriter) Write(b []byte) (int, error) { return len(b), nil }
func (w *discardWriter) WriteHeader(int)             {}

// ---------------------------------------------------------------------------
// Each limiter's in-memory store, driven without HTTP.

// memCounter is a limiter's in-memory store with one decision function.
type memCounter struct {
	// take makes one decision for the client ip and returns errDenied if it
	// was denied.
	take func(ip string) error
	// counted reports whether the store holds a count of 1 for ip.
	counted func(ip string) (bool, error)
}

// memLimiter builds a limiter's in-memory store with its default options
// and bigLimit requests per minute.
type memLimiter struct {
	name string
	new  func(tb testing.TB) memCounter
}

var memLimiters = []memLimiter{
	{"sluice", func(tb testing.TB) memCounter {
		st, err := middleware.NewMemoryStore(middleware.MemoryConfig{})
		if err != nil {
			tb.Fatal(err)
		}
		tb.Cleanup(func() { _ = st.Close() })
		return sluiceMemCounter(st, middleware.PerMinute(bigLimit))
	}},
	{"ulule", func(tb testing.TB) memCounter {
		st := ululemem.NewStore()
		rate := limiter.Rate{Period: time.Minute, Limit: bigLimit}
		ctx := context.Background()
		return memCounter{
			take: func(ip string) error {
				c, err := st.Get(ctx, ip, rate)
				if err == nil && c.Reached {
					err = errDenied
				}
				return err
			},
			counted: func(ip string) (bool, error) {
				c, err := st.Peek(ctx, ip, rate)
				return c.Remaining == bigLimit-1, err
			},
		}
	}},
	{"httprate", func(tb testing.TB) memCounter {
		// RateLimiter.OnLimit is the decision under httprate's Handler: it
		// takes the key, and the writer and request only for headers and
		// context values.
		rl := httprate.NewRateLimiter(bigLimit, time.Minute)
		w := &discardWriter{h: make(http.Header)}
		r := httptest.NewRequest(http.MethodGet, "/", nil)
		return memCounter{
			take: func(ip string) error {
				if rl.OnLimit(w, r, ip) {
					return errDenied
				}
				return nil
			},
			counted: func(ip string) (bool, error) {
				_, rate, err := rl.Status(ip)
				return rate > 0, err
			},
		}
	}},
	{"go-limiter", func(tb testing.TB) memCounter {
		st := goLimiterStore(tb)
		ctx := context.Background()
		return memCounter{
			take: func(ip string) error {
				_, _, _, ok, err := st.Take(ctx, ip)
				if err == nil && !ok {
					err = errDenied
				}
				return err
			},
			counted: func(ip string) (bool, error) {
				_, remaining, err := st.Get(ctx, ip)
				return remaining == bigLimit-1, err
			},
		}
	}},
	{"throttled", func(tb testing.TB) memCounter {
		rl, st := throttledMemLimiter(tb)
		ctx := context.Background()
		return memCounter{
			// The key VaryBy{RemoteAddr: true} makes: the host and "\n".
			take: func(ip string) error {
				limited, _, err := rl.RateLimitCtx(ctx, ip+"\n", 1)
				if err == nil && limited {
					err = errDenied
				}
				return err
			},
			counted: func(ip string) (bool, error) {
				tat, _, err := st.GetWithTime(ctx, ip+"\n")
				return tat > 0, err
			},
		}
	}},
}

// sluiceMemCounter drives a sluice Store through Store.Take with one charge
// of cost 1, the key keyfunc.RemoteIP makes and the rule name New gives.
func sluiceMemCounter(st middleware.Store, lim middleware.Limit) memCounter {
	ctx := context.Background()
	ch, out := make([]middleware.Charge, 1), make([]middleware.Decision, 1)
	return memCounter{
		take: func(ip string) error {
			ch[0] = middleware.Charge{Key: "ip:" + ip, Name: middleware.DefaultRuleName, Limit: lim, Cost: 1}
			ok, err := st.Take(ctx, time.Time{}, ch, out)
			if err == nil && !ok {
				err = errDenied
			}
			return err
		},
		counted: func(ip string) (bool, error) {
			// Cost 0 reads without creating or changing a counter.
			ch[0] = middleware.Charge{Key: "ip:" + ip, Name: middleware.DefaultRuleName, Limit: lim}
			_, err := st.Take(ctx, time.Time{}, ch, out)
			return out[0].Remaining == lim.Requests-1, err
		},
	}
}

// ---------------------------------------------------------------------------
// Redis: one decision per call, as each library's users make it.

// decideFunc makes one decision for the client ip. It returns errDenied if
// the request was denied, or the limiter's error.
type decideFunc func(ctx context.Context, ip string) error

// redisImpl is a limiter set up on one Redis client.
type redisImpl struct {
	// worker returns a decideFunc for the use of one goroutine.
	worker func() decideFunc
	// counted, when set, reports whether the limiter holds a count of 1 for
	// ip, without counting anything.
	counted func(ctx context.Context, ip string) (bool, error)
	// silentErrors, when set, counts errors that the limiter absorbed
	// without returning them (httprate-redis falls back to a local counter).
	silentErrors func() int64
}

// rule is a limit of requests per window.
type rule struct {
	requests int
	window   time.Duration
}

// benchRule is the rule of the benchmarks, never reached.
var benchRule = rule{bigLimit, time.Minute}

// redisLimiter builds a limiter on a client, for one rule.
type redisLimiter struct {
	name string
	new  func(tb testing.TB, c *redis.Client, r rule) redisImpl
}

// sluiceRedis drives sluice's Redis store through Store.Take, the call
// under Limiter.Decide and the counterpart of the others' Get or Allow,
// with the store's configuration cfg.
func sluiceRedis(cfg middleware.RedisConfig) func(testing.TB, *redis.Client, rule) redisImpl {
	return func(tb testing.TB, c *redis.Client, r rule) redisImpl {
		st, err := middleware.NewRedisStore(c, cfg)
		if err != nil {
			tb.Fatal(err)
		}
		tb.Cleanup(func() { _ = st.Close() })
		lim := middleware.Limit{Requests: r.requests, Window: r.window}
		return redisImpl{
			worker: func() decideFunc {
				ch, out := make([]middleware.Charge, 1), make([]middleware.Decision, 1)
				return func(ctx context.Context, ip string) error {
					ch[0] = middleware.Charge{Key: "ip:" + ip, Name: middleware.DefaultRuleName, Limit: lim, Cost: 1}
					ok, err := st.Take(ctx, time.Time{}, ch, out)
					if err == nil && !ok {
						err = errDenied
					}
					return err
				}
			},
			counted: func(ctx context.Context, ip string) (bool, error) {
				// Cost 0 reads without writing.
				ch := []middleware.Charge{{Key: "ip:" + ip, Name: middleware.DefaultRuleName, Limit: lim}}
				out := make([]middleware.Decision, 1)
				_, err := st.Take(ctx, time.Time{}, ch, out)
				return out[0].Remaining == lim.Requests-1, err
			},
		}
	}
}

var (
	redisSluice = redisLimiter{"sluice", sluiceRedis(middleware.RedisConfig{})}
	// The other limiters have no timeout of their own, so sluice is also
	// shown without its store's default Timeout (100ms).
	redisSluiceNoTimeout = redisLimiter{"sluice-no-timeout", sluiceRedis(middleware.RedisConfig{Timeout: -1})}
	redisUlule           = redisLimiter{"ulule", func(tb testing.TB, c *redis.Client, r rule) redisImpl {
		st, err := ululeredis.NewStore(c)
		if err != nil {
			tb.Fatal(err)
		}
		lim := limiter.New(st, limiter.Rate{Period: r.window, Limit: int64(r.requests)})
		return redisImpl{
			worker: func() decideFunc {
				return func(ctx context.Context, ip string) error {
					res, err := lim.Get(ctx, ip)
					if err == nil && res.Reached {
						err = errDenied
					}
					return err
				}
			},
			counted: func(ctx context.Context, ip string) (bool, error) {
				res, err := lim.Peek(ctx, ip)
				return res.Remaining == int64(r.requests)-1, err
			},
		}
	}}
	// redis_rate keeps a key only until its theoretical arrival time has
	// passed (at least 1 s): after one request, period/rate.
	redisRedisRate = redisLimiter{"redis_rate", func(tb testing.TB, c *redis.Client, r rule) redisImpl {
		rl := redis_rate.NewLimiter(c)
		lim := redis_rate.Limit{Rate: r.requests, Burst: r.requests, Period: r.window}
		return redisImpl{
			worker: func() decideFunc {
				return func(ctx context.Context, ip string) error {
					res, err := rl.Allow(ctx, ip, lim)
					if err == nil && res.Allowed != 1 {
						err = errDenied
					}
					return err
				}
			},
			counted: func(ctx context.Context, ip string) (bool, error) {
				// The key under redis_rate's fixed prefix "rate:".
				n, err := c.Exists(ctx, "rate:"+ip).Result()
				return n == 1, err
			},
		}
	}}
)

// redisLimiters are the limiters of BenchmarkRedis and BenchmarkRedisSerial.
var redisLimiters = []redisLimiter{
	redisSluice,
	redisSluiceNoTimeout,
	redisUlule,
	{"httprate-redis", func(tb testing.TB, c *redis.Client, r rule) redisImpl {
		var errs atomic.Int64
		counter := httprateredis.NewCounter(&httprateredis.Config{
			Client: c,
			OnError: func(err error) {
				if errs.Add(1) == 1 {
					tb.Logf("httprate-redis: first error (it then decides locally for a while): %v", err)
				}
			},
		})
		rl := httprate.NewRateLimiter(r.requests, r.window, httprate.WithLimitCounter(counter))
		return redisImpl{
			worker: func() decideFunc {
				// OnLimit is the decision under httprate's Handler (MGET of two
				// windows, then MULTI INCRBY EXPIRE EXEC, under one mutex per
				// limiter); it needs a writer for headers and a request for
				// its context values.
				rw := &discardWriter{h: make(http.Header)}
				req := httptest.NewRequest(http.MethodGet, "/", nil)
				return func(ctx context.Context, ip string) error {
					if rl.OnLimit(rw, req, ip) {
						return errDenied
					}
					return nil
				}
			},
			silentErrors: errs.Load,
		}
	}},
	{"throttled", func(tb testing.TB, c *redis.Client, r rule) redisImpl {
		st, err := throttledredis.NewCtx(c, "throttled:")
		if err != nil {
			tb.Fatal(err)
		}
		rl, err := throttled.NewGCRARateLimiterCtx(st, throttled.RateQuota{
			MaxRate:  throttled.PerDuration(r.requests, r.window),
			MaxBurst: r.requests - 1,
		})
		if err != nil {
			tb.Fatal(err)
		}
		return redisImpl{worker: func() decideFunc {
			return func(ctx context.Context, ip string) error {
				limited, _, err := rl.RateLimitCtx(ctx, ip+"\n", 1)
				if err == nil && limited {
					err = errDenied
				}
				return err
			}
		}}
	}},
	redisRedisRate,
}

// incrPExpire is the baseline: the cheapest fixed-window counter, one
// pipelined INCR and PEXPIRE (no MULTI).
func incrPExpire(c *redis.Client) redisImpl {
	return redisImpl{worker: func() decideFunc {
		return func(ctx context.Context, ip string) error {
			key := "incr:" + ip
			pipe := c.Pipeline()
			incr := pipe.Incr(ctx, key)
			pipe.PExpire(ctx, key, time.Minute)
			if _, err := pipe.Exec(ctx); err != nil {
				return err
			}
			if incr.Val() < 1 {
				return fmt.Errorf("INCR %s = %d", key, incr.Val())
			}
			return nil
		}
	}}
}
