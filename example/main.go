// Command example runs an HTTP server rate-limited by sluice, to try with
// curl:
//
//	go run ./example                                  # in-memory store on :8080
//	go run ./example -redis localhost:6379            # counters shared in Redis
//	go run ./example -config example/rules.yaml       # rules from a file, hot-reloaded
//	go run ./example -config https://rules.internal/sluice.yaml   # from a rules service, polled
//	go run ./example -config 'redis://localhost:6379/0?key=sluice:rules'   # from Redis, pushed
//	go run ./example -framework gin                   # or echo, fiber; default nethttp
//	curl -i localhost:8080/
//
// Flags: -addr (or PORT) sets the listen address; -redis (or REDIS_URL) a
// Redis server, host:port or redis:// URL, to share counters between
// instances; -config the rules: a file, reloaded when it changes and on
// SIGHUP, or a rules service (an http(s):// URL, or a Redis key as
// redis://host:port/db?key=NAME, to which config.PublishRedis writes),
// polled every -config-poll (10 s) and, for Redis, reloaded as soon as a
// new document is published, with -config-cache a file keeping the last
// good rules for restarts while the service is down;
// -framework the web framework that serves the routes, each through its
// sluice adapter, with the same limits and answers; -admin-addr (default
// 127.0.0.1:9090, loopback only, or a free port of 127.0.0.1 when another
// process listens there, as Prometheus does by default; the address is
// printed) the listener of the admin handler (rules
// in force, peek and reset a client's counters, top clients, bans,
// overrides, and an operator page at its root, whose address is printed),
// which requires the token of $SLUICE_ADMIN_TOKEN (or a random one printed
// at start); -region, -peer NAME=ADDR (repeatable) and -home put the
// server in one of several regions, each with its Redis, sharing the
// limits of rules with scope: global or global_strict (docs/regions.md).
// Logs go to stderr through log/slog.
//
// The built-in rules show a capability on each route, and the server
// prints curl commands to try them: a limit per client everywhere and per
// API key on /api/*, concurrency and a leaky bucket (docs/algorithms.md),
// an elastic limit and adaptive concurrency (docs/overload.md), failed
// logins counted by outcome and then banned (login.go, docs/logins.md),
// and an LLM-style route, POST /v1/chat, whose tokens are settled when
// its stream ends (chat.go, docs/usage.md). README.md beside this file
// lists the routes and flags.
package main

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"log"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/keyfunc"
	"github.com/sluicehq/sluice/middleware"
	"github.com/sluicehq/sluice/middleware/config"
	sluiceprom "github.com/sluicehq/sluice/middleware/metrics/prometheus"
)

func main() {
	log.SetFlags(0)
	if err := run(os.Args[1:]); err != nil {
		log.Fatal(err)
	}
}

func run(args []string) error {
	fs := flag.NewFlagSet("example", flag.ContinueOnError)
	addr := fs.String("addr", defaultAddr(), "listen address (default :$PORT or :8080)")
	redisAddr := fs.String("redis", os.Getenv("REDIS_URL"), "Redis host:port or redis:// URL (default $REDIS_URL); empty counts in memory")
	rulesFile := fs.String("config", "", "rules: a file (YAML or JSON), an http:// or https:// URL, or redis://host:port/db?key=NAME; empty uses the built-in rules")
	poll := fs.Duration("config-poll", config.DefaultPollInterval, "how often to poll a -config URL or Redis key")
	cache := fs.String("config-cache", "", "file that keeps the last good rules of a -config URL or Redis key, used at start when the source is down")
	framework := fs.String("framework", "nethttp", "nethttp, gin, echo or fiber")
	adminAddr := fs.String("admin-addr", "127.0.0.1:9090", "listen address of the admin handler (rules, peek, reset); empty turns it off")
	region := fs.String("region", "", "this server's region, with -redis its Redis; limits of rules with scope: global are shared with the -peer regions")
	home := fs.String("home", "", "with -region, the region whose Redis decides rules with scope: global_strict (default: this one)")
	peers := map[string]string{}
	fs.Func("peer", "a peer region, NAME=ADDR (a Redis host:port or redis:// URL); repeatable", func(v string) error {
		name, addr, ok := strings.Cut(v, "=")
		if !ok || name == "" || addr == "" {
			return fmt.Errorf("want NAME=ADDR, got %q", v)
		}
		peers[name] = addr
		return nil
	})
	if err := fs.Parse(args); err != nil {
		return err
	}
	if (*region != "" || len(peers) > 0) && (*redisAddr == "" || *region == "") {
		return errors.New("-region and -peer need -redis (the region's own Redis) and -region")
	}
	serve, ok := frameworks[*framework]
	if !ok {
		return fmt.Errorf("unknown -framework %q: want nethttp, gin, echo or fiber", *framework)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	logger := slog.New(slog.NewTextHandler(os.Stderr, nil))
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	metrics, err := sluiceprom.New(reg)
	if err != nil {
		return err
	}
	opts := []middleware.Option{middleware.WithObserver(middleware.NewLogObserver(logger)), middleware.WithObserver(metrics)}
	onReload := func(rl *config.Reloader) func(error) {
		log := rl.LogReloads(logger)
		return func(err error) {
			log(err)
			metrics.ObserveReload(err)
		}
	}
	store := "memory"
	if *redisAddr != "" {
		client, err := newRedis(*redisAddr)
		if err != nil {
			return err
		}
		defer client.Close()
		if *region != "" {
			s, err := newRegionStore(client, *region, *home, peers)
			if err != nil {
				return err
			}
			defer s.Close() // after the limiter's Close, deferred below
			opts = append(opts, middleware.WithStore(s))
			store = fmt.Sprintf("region %s, redis %s, %d peers", *region, *redisAddr, len(peers))
		} else {
			s, err := middleware.NewRedisStore(client, middleware.RedisConfig{Prefix: "sluice-example:"})
			if err != nil {
				return err
			}
			defer s.Close() // after the limiter's Close, deferred below
			opts = append(opts, middleware.WithStore(s))
			store = "redis " + *redisAddr
		}
	}

	var lim *middleware.Limiter
	source := func() (string, string) { return "built-in rules", "" }
	if *rulesFile != "" {
		rl, every, closeSource, err := openRules(ctx, *rulesFile, *poll, *cache, opts)
		if err != nil {
			return err
		}
		defer closeSource()
		lim = rl.Limiter()
		if st := rl.Status(); st.FromCache {
			logger.Warn("sluice: rules source unreadable at start; using the saved copy", slog.String("source", st.Source), slog.Any("error", st.Err))
		}
		go rl.Watch(ctx, every, onReload(rl))
		go reloadOnHUP(ctx, rl, onReload(rl))
		source = func() (string, string) { return rl.Document().File, rl.Document().Version() }
	} else {
		var err error
		if lim, err = middleware.NewRules(builtinRules(), opts...); err != nil {
			return err
		}
	}
	defer lim.Close()

	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		return err
	}
	if *adminAddr != "" {
		if _, err := serveAdmin(ctx, *adminAddr, lim, source); err != nil {
			return err
		}
	}
	printUsage(ln.Addr().String(), *framework, store, *rulesFile)
	metrics.Watch(lim)
	return serve(ctx, ln, lim, promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
}

const readHeaderTimeout = 5 * time.Second

// serveHTTP runs srv on ln until ctx is done, then shuts it down.
func serveHTTP(ctx context.Context, srv *http.Server, ln net.Listener) error {
	go func() {
		<-ctx.Done()
		shutdown, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(shutdown)
	}()
	if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// builtinRules limits every client to 30 requests a minute, /search to 5 a
// minute per client, /api/* to 10 a minute per API key, /api/slow to 2
// requests in flight per client, and smooths /api/smooth to 2 a second
// per client with a queue of 10 (waits of at most 5 s); /api/burst has 10
// a second per client with a ceiling of 50 while the server has room, and
// /api/work an adaptive concurrency limit that sheds batch requests
// (?batch=1) first; POST /login allows 5 failed attempts per 15 minutes per
// account and address, then bans that pair for an hour (login.go); POST
// /v1/chat, 60 requests and 10,000 tokens a minute per API key, settled
// when each streamed completion ends (chat.go).
func builtinRules() []middleware.Rule {
	return []middleware.Rule{
		{Name: "site", Key: keyfunc.RemoteIP(), Limits: []middleware.Limit{middleware.PerMinute(30)}},
		{Name: "search", Path: "/search", Key: keyfunc.RemoteIP(), Limits: []middleware.Limit{middleware.PerMinute(5)}},
		{Name: "api", Path: "/api/*", Key: keyfunc.APIKey("X-API-Key", []byte("example-secret")),
			Limits: []middleware.Limit{middleware.PerMinute(10)}},
		{Name: "slow", Path: "/api/slow", Methods: []string{http.MethodGet}, Key: keyfunc.RemoteIP(), Concurrency: 2},
		{Name: "smooth", Path: "/api/smooth", Key: keyfunc.RemoteIP(),
			Limits: []middleware.Limit{middleware.PerSecond(2).LeakyBucket(10, 5*time.Second)}},
		{Name: "burst", Path: "/api/burst", Key: keyfunc.RemoteIP(),
			Limits: []middleware.Limit{{Requests: 10, Window: time.Second, Ceiling: 50}}},
		{Name: "work", Path: "/api/work", AdaptiveConcurrency: &middleware.AdaptiveConcurrency{Min: 2, Max: 40}},
		{Name: "work-batch", Path: "/api/work", Query: map[string]string{"batch": "1"}, Priority: middleware.PrioritySheddable},
		loginRule(),
		chatRule(),
	}
}

// userKey is the context key of the demo's signed-in user.
type userKey struct{}

// demoAuth stands in for real authentication: it takes the user from the
// X-User header. Never do this in production.
func demoAuth(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if u := r.Header.Get("X-User"); u != "" {
			r = r.WithContext(context.WithValue(r.Context(), userKey{}, u))
		}
		next.ServeHTTP(w, r)
	})
}

// demoEnv tells the rules file how to find the user and their plan.
var demoEnv = config.Env{
	User: func(ctx context.Context) (string, bool) {
		u, ok := ctx.Value(userKey{}).(string)
		return u, ok && u != ""
	},
	Plan: func(r keyfunc.Request, key string) string {
		if key == "user:alice" {
			return "pro"
		}
		return ""
	},
	// The key name account: the account a login is for (login.go).
	Keys: map[string]keyfunc.Func{"account": accountKey},
}

// serveAdmin serves middleware.AdminHandler on addr (loopback by default),
// for requests that carry the token of $SLUICE_ADMIN_TOKEN, or of a random
// one printed at start when it is unset.
//
// It returns the address it listens on: addr, or a free port of addr's
// host if another process listens on addr (see listenAdmin).
func serveAdmin(ctx context.Context, addr string, lim *middleware.Limiter, source func() (string, string)) (string, error) {
	token := os.Getenv("SLUICE_ADMIN_TOKEN")
	if token == "" {
		var b [16]byte
		_, _ = rand.Read(b[:])
		token = hex.EncodeToString(b[:])
	}
	ln, err := listenAdmin(addr)
	if err != nil {
		return "", err
	}
	h := middleware.AdminHandler(lim, middleware.AdminConfig{
		Authorize: func(r *http.Request) bool {
			return subtle.ConstantTimeCompare([]byte(r.Header.Get("Authorization")), []byte("Bearer "+token)) == 1
		},
		Source: source,
	})
	fmt.Printf("operator page: http://%s/ (sign in with the admin token %s): top clients, rates, bans, overrides, store health\n", ln.Addr(), token)
	fmt.Printf("admin handler on %s (Authorization: Bearer %s):\n  curl -H 'Authorization: Bearer %s' http://%s/rules\n  curl -H 'Authorization: Bearer %s' 'http://%s/limits?rule=site&key=ip:127.0.0.1'\n  curl -X POST -H 'Authorization: Bearer %s' 'http://%s/reset?key=ip:127.0.0.1'\n",
		ln.Addr(), token, token, ln.Addr(), token, ln.Addr(), token, ln.Addr())
	fmt.Printf("  curl -H 'Authorization: Bearer %[1]s' http://%[2]s/bans\n  curl -X DELETE -H 'Authorization: Bearer %[1]s' 'http://%[2]s/bans?rule=login&key=account:alice|ip:127.0.0.1'\n  curl -X PUT -H 'Authorization: Bearer %[1]s' -d '{\"limits\":[{\"requests\":100,\"window\":\"1m\"}],\"ttl\":\"1h\"}' 'http://%[2]s/overrides?rule=site&key=ip:127.0.0.1'\n\n",
		token, ln.Addr())
	go func() { _ = serveHTTP(ctx, &http.Server{Handler: h, ReadHeaderTimeout: readHeaderTimeout}, ln) }()
	return ln.Addr().String(), nil
}

// listenAdmin listens on addr or, if something else already listens
// there (Prometheus's default port is 9090 too, and so is a second
// example's), on a free port of the same host, saying so on stderr.
func listenAdmin(addr string) (net.Listener, error) {
	ln, err := net.Listen("tcp", addr)
	if err == nil || !errors.Is(err, syscall.EADDRINUSE) {
		if err != nil {
			err = fmt.Errorf("admin listener: %w", err)
		}
		return ln, err
	}
	host, _, serr := net.SplitHostPort(addr)
	if serr != nil {
		return nil, fmt.Errorf("admin listener: %w", err)
	}
	ln, err2 := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err2 != nil {
		return nil, fmt.Errorf("admin listener: %w (and on a free port: %v)", err, err2)
	}
	log.Printf("admin listener: %s is in use; listening on %s instead (set -admin-addr to choose)", addr, ln.Addr())
	return ln, nil
}

func reloadOnHUP(ctx context.Context, rl *config.Reloader, logReload func(error)) {
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	for {
		select {
		case <-ctx.Done():
			return
		case <-hup:
			logReload(rl.Reload())
		}
	}
}

// newRedis connects to addr, a host:port or a redis:// URL, with
// ContextTimeoutEnabled so that the store's timeout ends a hung call at once.
func newRedis(addr string) (*redis.Client, error) {
	return redis.NewClient(redisOptions(addr)), nil
}

func redisOptions(addr string) *redis.Options {
	opts, err := redis.ParseURL(addr)
	if err != nil {
		opts = &redis.Options{Addr: addr}
	}
	opts.ContextTimeoutEnabled = true
	return opts
}

// newPeerRedis connects to a peer region's Redis as docs/regions.md
// advises: no CLIENT SETINFO on a new connection, one cross-region round
// trip less after a partition heals.
func newPeerRedis(addr string) *redis.Client {
	opts := redisOptions(addr)
	opts.DisableIdentity = true
	return redis.NewClient(opts)
}

// newRegionStore makes the store of a server in region, on its own Redis
// client, with a client of each peer region's Redis.
func newRegionStore(client *redis.Client, region, home string, peers map[string]string) (*middleware.RegionStore, error) {
	pc := map[string]redis.UniversalClient{}
	for name, addr := range peers {
		pc[name] = newPeerRedis(addr)
	}
	if home == "" {
		home = region
	}
	return middleware.NewRegionStore(middleware.RegionConfig{
		Region: region, Redis: client, Peers: pc, Home: home,
		Prefix: "sluice-example:rg:", RedisConfig: middleware.RedisConfig{Prefix: "sluice-example:"},
	})
}

func defaultAddr() string {
	if p := os.Getenv("PORT"); p != "" {
		return ":" + p
	}
	return ":8080"
}

func printUsage(host, framework, store, rulesFile string) {
	if h, port, err := net.SplitHostPort(host); err == nil && (h == "::" || h == "0.0.0.0" || h == "") {
		host = "localhost:" + port
	}
	rules := "built-in rules"
	if rulesFile != "" {
		rules = "rules from " + rulesFile + " (edit it, or send SIGHUP, to reload)"
	}
	fmt.Printf("sluice example (%s) listening on %s (store: %s; %s)\n\nTry:\n", framework, host, store, rules)
	if rulesFile != "" {
		fmt.Printf(`  curl -i http://%[1]s/api/data                          # 100/min per address
  curl -i -H 'X-User: alice' http://%[1]s/api/data       # alice is on the pro plan: 1000/min
  for i in $(seq 6); do curl -s -o /dev/null -w '%%{http_code}\n' -X POST http://%[1]s/api/login; done   # sliding log, 5 per 5 min: the 6th is 429
  for i in $(seq 9); do curl -s -o /dev/null -w '%%{http_code}\n' http://%[1]s/api/quote; done   # token bucket, 4/s with bursts of 8: the 9th is 429
  for i in $(seq 4); do curl -s -o /dev/null -w '%%{http_code}\n' -X POST http://%[1]s/api/export; done  # 3 a calendar day in Paris: the 4th is 429
  for i in 1 2 3; do curl -s -o /dev/null -w '%%{http_code}\n' 'http://%[1]s/api/slow?ms=3000' & done; wait   # 2 in flight per client: one 429
  for i in $(seq 5); do curl -s -o /dev/null -w '%%{http_code} %%{time_total}s\n' http://%[1]s/api/smooth & done; wait   # leaky bucket: served 500 ms apart
  curl -i http://%[1]s/api/feed                          # sync: lease (with -redis): decided in memory from leased slices
  curl -i -X POST http://%[1]s/api/events                # sync: write_back (with -redis): counted in memory, pushed every 200 ms
  for i in $(seq 30); do curl -s -o /dev/null -w '%%{http_code} ' http://%[1]s/api/burst; done; echo   # 10/s, up to 50/s while the server is idle: all 200
  (for i in $(seq 60); do curl -s -o /dev/null -w '%%{http_code}\n' 'http://%[1]s/api/work?ms=2000&batch=1' & done; wait) | sort | uniq -c   # adaptive limit: batch requests shed first (503)
`, host)
		printLogin(host)
		return
	}
	fmt.Printf(`  curl -i http://%[1]s/                                  # 30/min per client
  for i in $(seq 6); do curl -s -o /dev/null -w '%%{http_code}\n' http://%[1]s/search; done   # 5/min: the 6th is 429
  curl -i -H 'X-API-Key: demo' http://%[1]s/api/data     # 10/min per API key
  curl -i http://%[1]s/api/data                          # no API key: 400
  for i in 1 2 3; do curl -s -o /dev/null -w '%%{http_code}\n' -H 'X-API-Key: demo' 'http://%[1]s/api/slow?ms=3000' & done; wait   # 2 in flight per client: one 429
  for i in $(seq 5); do curl -s -o /dev/null -w '%%{http_code} %%{time_total}s\n' -H 'X-API-Key: demo2' http://%[1]s/api/smooth & done; wait   # leaky bucket: served 500 ms apart
`, host)
	printLogin(host)
	printChat(host)
}

// printChat prints the curl lines of the LLM-style route (chat.go).
func printChat(host string) {
	fmt.Printf(`  curl -N -X POST -H 'X-API-Key: demo' -d 'Tell me a story' 'http://%[1]s/v1/chat?tokens=20'   # streams 20 tokens; RateLimit shows requests and tokens
  for i in $(seq 6); do curl -s -o /dev/null -D - -X POST -H 'X-API-Key: demo' 'http://%[1]s/v1/chat?tokens=2000' | grep -iE '^(HTTP|ratelimit:|retry-after)'; done   # the 6th is 429: 10,000 tokens a minute spent
`, host)
}

// printLogin prints the curl lines of the login scenario (login.go).
func printLogin(host string) {
	fmt.Printf(`  for i in $(seq 6); do curl -s -o /dev/null -w '%%{http_code}\n' -d password=guess 'http://%[1]s/login?user=alice'; done   # 5 failures (401), then 429 and a 1 h ban
  curl -i -d 'password=correct horse' 'http://%[1]s/login?user=alice'   # banned: 429, Retry-After the ban's end
  curl -i -d 'password=correct horse' 'http://%[1]s/login?user=bob'     # another account: 200, successes are free
`, host)
}
