// Command sluice-rls is Envoy's rate limit service
// (envoy.service.ratelimit.v3.RateLimitService) backed by sluice: it
// answers ShouldRateLimit from Envoy/Lyft descriptor files, counted in
// memory or in Redis (standalone or Cluster), and reloads the files while
// it runs.
//
//	sluice-rls -config ratelimit.yaml                       # memory, :8081
//	sluice-rls -config ratelimit.yaml -redis 127.0.0.1:6379
//	sluice-rls -config https://rules.internal/rl.yaml -redis 10.0.0.1:7000,10.0.0.2:7000
//	sluice-rls -config redis:///sluice:rls:edge -redis 127.0.0.1:6379
//
// -config may be given once per domain: a file path, an http(s) URL
// (polled with conditional requests) or redis:///KEY (the hash at KEY on
// the -redis server, reloaded as soon as config.PublishRedis announces a
// new document). Files are checked for changes every -poll, and every
// source is read again on SIGHUP. A document that does not load leaves
// the rules in force.
//
// The gRPC listener (-grpc-addr) serves the rate limit service, gRPC
// health checking (grpc.health.v1, SERVING once the files are loaded) and
// server reflection, so that grpcurl needs no proto files. The HTTP
// listener (-http-addr) serves /metrics (Prometheus) and /healthz.
//
// -failure says what a call gets while the store fails: open (OK, the
// default), closed (Unavailable) or local (counted in memory on this
// server until the store is back). Every call is answered within -timeout
// (10ms by default), inside the 20 ms Envoy's rate_limit filter waits.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"os/signal"
	"runtime"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/reflection"

	"github.com/sluicehq/sluice/adapters/envoyrls"
	"github.com/sluicehq/sluice/middleware"
	"github.com/sluicehq/sluice/middleware/config"
	sluiceprom "github.com/sluicehq/sluice/middleware/metrics/prometheus"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stderr, nil); err != nil {
		fmt.Fprintln(os.Stderr, "sluice-rls:", err)
		os.Exit(1)
	}
}

// listValue is a flag that may be given several times.
type listValue []string

func (l *listValue) String() string     { return strings.Join(*l, ",") }
func (l *listValue) Set(s string) error { *l = append(*l, s); return nil }

// flags are the command's settings.
type flags struct {
	grpcAddr, httpAddr string
	configs            listValue
	redisAddrs         string
	redisPrefix        string
	redisStall         time.Duration
	redisTimeout       time.Duration
	failure            string
	timeout, poll      time.Duration
	shadow             bool
	cacheDir           string
	pprof              bool
}

func parseFlags(args []string, out io.Writer) (*flags, error) {
	f := &flags{}
	fs := flag.NewFlagSet("sluice-rls", flag.ContinueOnError)
	fs.SetOutput(out)
	fs.StringVar(&f.grpcAddr, "grpc-addr", ":8081", "address of the gRPC listener (rate limit service, health, reflection)")
	fs.StringVar(&f.httpAddr, "http-addr", ":6070", "address of the HTTP listener (/metrics, /healthz); empty for none")
	fs.Var(&f.configs, "config", "descriptor file: a path, an http(s) URL or redis:///KEY; once per domain (required)")
	fs.StringVar(&f.redisAddrs, "redis", "", "Redis address, or several comma-separated for a Redis Cluster; empty counts in memory")
	fs.StringVar(&f.redisPrefix, "redis-prefix", "sluice:rls:", "prefix of the counters' keys in Redis")
	fs.DurationVar(&f.redisStall, "redis-stall", 0, "how long a Redis server may take to answer before it is taken as down and calls get the failure policy at once: 0 adapts to its round trips (20ms to 35ms), a negative value takes it as down only when it cannot be reached")
	fs.DurationVar(&f.redisTimeout, "redis-timeout", 0, "bound of each decision in Redis, on top of -timeout: 0 means 100ms, a negative value none")
	fs.StringVar(&f.failure, "failure", "open", "what a call gets while the store fails: open, closed or local")
	fs.DurationVar(&f.timeout, "timeout", envoyrls.DefaultTimeout, "bound of each call")
	fs.DurationVar(&f.poll, "poll", 5*time.Second, "how often descriptor files and URLs are checked for changes")
	fs.BoolVar(&f.shadow, "shadow", false, "shadow mode: count and report, never answer OVER_LIMIT")
	fs.StringVar(&f.cacheDir, "cache-dir", "", "directory where the last good document of each URL or Redis source is kept, to start from during an outage of the source")
	fs.BoolVar(&f.pprof, "pprof", false, "serve net/http/pprof under /debug/pprof/ on the HTTP listener")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if len(f.configs) == 0 {
		return nil, errors.New("-config is required")
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	return f, nil
}

// ready, when not nil, is told the listeners' addresses once serving.
type ready func(grpcAddr, httpAddr string)

func run(ctx context.Context, args []string, logOut io.Writer, onReady ready) error {
	f, err := parseFlags(args, logOut)
	if err != nil {
		return err
	}
	log := slog.New(slog.NewTextHandler(logOut, nil))
	var policy middleware.FailurePolicy
	switch f.failure {
	case "open":
		policy = middleware.FailOpen
	case "closed":
		policy = middleware.FailClosed
	case "local":
		policy = middleware.FailLocal
	default:
		return fmt.Errorf("-failure %q: want open, closed or local", f.failure)
	}

	reg := prometheus.NewRegistry()
	reg.MustRegister(prometheus.NewGoCollector(), prometheus.NewProcessCollector(prometheus.ProcessCollectorOpts{}))
	metrics, err := sluiceprom.New(reg)
	if err != nil {
		return err
	}

	var client redis.UniversalClient
	var store middleware.Store
	if f.redisAddrs != "" {
		addrs := strings.Split(f.redisAddrs, ",")
		if len(addrs) == 1 {
			client = redis.NewClient(&redis.Options{Addr: addrs[0]})
		} else {
			client = redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs})
		}
		defer client.Close()
		store, err = middleware.NewRedisStore(client, middleware.RedisConfig{Prefix: f.redisPrefix, StallThreshold: f.redisStall, Timeout: f.redisTimeout})
	} else {
		store, err = middleware.NewMemoryStore(middleware.MemoryConfig{})
	}
	if err != nil {
		return err
	}
	if c, ok := store.(io.Closer); ok {
		defer c.Close()
	}

	opts := []middleware.Option{middleware.WithStore(store), middleware.WithFailurePolicy(policy),
		middleware.WithObserver(metrics), middleware.WithObserver(middleware.NewLogObserver(log))}
	if f.shadow {
		opts = append(opts, middleware.WithShadowMode())
	}
	env := config.Env{RateLimitService: true}
	var reloaders []*config.Reloader
	defer func() {
		for _, rl := range reloaders {
			rl.Limiter().Close()
		}
	}()
	for i, c := range f.configs {
		rl, err := open(ctx, c, i, f, client, env, opts)
		if err != nil {
			return err
		}
		reloaders = append(reloaders, rl)
		metrics.Watch(rl.Limiter())
		log.Info("sluice-rls: serving domain", slog.String("domain", rl.Document().Domain),
			slog.String("source", rl.Document().File), slog.Int("rules", len(rl.Document().Rules)))
	}
	if client != nil {
		warmUp(ctx, reloaders[0].Limiter(), log)
	}
	domains := make([]envoyrls.Domain, len(reloaders))
	for i, rl := range reloaders {
		domains[i] = rl
	}
	srv, err := envoyrls.NewServer(envoyrls.Options{Timeout: f.timeout}, domains...)
	if err != nil {
		return err
	}

	// Workers that live on serve the calls: a goroutine per call would
	// grow its stack anew each time.
	g := grpc.NewServer(grpc.NumStreamWorkers(uint32(runtime.GOMAXPROCS(0))))
	srv.Register(g)
	hs := health.NewServer()
	healthpb.RegisterHealthServer(g, hs)
	reflection.Register(g)
	hs.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	hs.SetServingStatus("envoy.service.ratelimit.v3.RateLimitService", healthpb.HealthCheckResponse_SERVING)

	glis, err := net.Listen("tcp", f.grpcAddr)
	if err != nil {
		return err
	}
	errc := make(chan error, 2)
	go func() { errc <- g.Serve(glis) }()
	defer g.Stop()

	httpAddr := ""
	if f.httpAddr != "" {
		mux := http.NewServeMux()
		mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
		mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok\n") })
		if f.pprof {
			mux.HandleFunc("/debug/pprof/", pprof.Index)
			mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		}
		hlis, err := net.Listen("tcp", f.httpAddr)
		if err != nil {
			return err
		}
		hsrv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
		go func() { errc <- hsrv.Serve(hlis) }()
		defer hsrv.Close()
		httpAddr = hlis.Addr().String()
	}

	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	for _, rl := range reloaders {
		onReload := func(err error) {
			metrics.ObserveReload(err)
			rl.LogReloads(log)(err)
		}
		go rl.Watch(wctx, f.poll, onReload)
	}
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	go func() {
		for {
			select {
			case <-wctx.Done():
				return
			case <-hup:
				for _, rl := range reloaders {
					err := rl.Reload()
					metrics.ObserveReload(err)
					rl.LogReloads(log)(err)
				}
			}
		}
	}()

	log.Info("sluice-rls: listening", slog.String("grpc", glis.Addr().String()), slog.String("http", httpAddr),
		slog.String("store", storeName(f.redisAddrs)), slog.String("failure", policy.String()))
	if onReady != nil {
		onReady(glis.Addr().String(), httpAddr)
	}
	select {
	case <-ctx.Done():
		hs.Shutdown()
		stopped := make(chan struct{})
		go func() { g.GracefulStop(); close(stopped) }()
		select {
		case <-stopped:
		case <-time.After(5 * time.Second):
		}
		return nil
	case err := <-errc:
		return err
	}
}

func storeName(addrs string) string {
	if addrs == "" {
		return "memory"
	}
	return "redis " + addrs
}

// open loads the descriptor file of -config c, the i-th.
func open(ctx context.Context, c string, i int, f *flags, client redis.UniversalClient, env config.Env, opts []middleware.Option) (*config.Reloader, error) {
	var src config.Source
	switch {
	case strings.HasPrefix(c, "http://") || strings.HasPrefix(c, "https://"):
		src = &config.HTTPSource{URL: c}
	case strings.HasPrefix(c, "redis://"):
		key, ok := strings.CutPrefix(c, "redis:///")
		if !ok || key == "" {
			return nil, fmt.Errorf("-config %q: want redis:///KEY, read from the -redis server", c)
		}
		if client == nil {
			return nil, fmt.Errorf("-config %q needs -redis", c)
		}
		src = &config.RedisSource{Client: client, Key: key}
	default:
		// A file: the Reloader of Open reads it by modification time.
		cfg, err := config.Load(c, env)
		if err != nil {
			return nil, err
		}
		lim, err := middleware.NewRules(cfg.Rules, append(cfg.Options(), opts...)...)
		if err != nil {
			return nil, err
		}
		return config.NewReloader(lim, cfg, env), nil
	}
	so := config.SourceOptions{Interval: f.poll}
	if f.cacheDir != "" {
		so.CachePath = fmt.Sprintf("%s/source-%d.yaml", f.cacheDir, i)
	}
	return config.OpenSource(ctx, src, env, so, opts...)
}

// warmUp reads a counter of lim once, without counting, so that the first
// calls find the connection to Redis open and the script loaded: they
// have only -timeout to be decided in. A failure is logged; the failure
// policy answers calls until Redis answers.
func warmUp(ctx context.Context, lim *middleware.Limiter, log *slog.Logger) {
	for _, r := range lim.Rules() {
		if len(r.Limits) == 0 {
			continue
		}
		wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		_, err := lim.Peek(wctx, r.Name, "sluice-rls:warm-up")
		cancel()
		if err != nil {
			log.Warn("sluice-rls: store not ready; calls get the failure policy until it is", slog.Any("error", err))
			return
		}
		log.Info("sluice-rls: store ready")
		return
	}
}
