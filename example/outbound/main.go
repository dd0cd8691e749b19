// Command outbound shows two processes that share one budget toward a
// rate-limited API through sluice's outbound transport
// (adapters/outbound): an upstream limited to 10 requests a second by
// sluice's own middleware, and two client processes, each with 4
// goroutines sending 30 requests, whose Limiters share the budget in
// Redis:
//
//	go run ./example/outbound -redis localhost:6379   # the upstream and two clients; prints what each did
//	go run ./example/outbound                         # the same with a budget per process: the upstream refuses half
//
// Run apart, on other machines:
//
//	go run ./example/outbound -serve :8090                                        # the upstream alone
//	go run ./example/outbound -url http://host:8090/ -redis host:6379 -name A     # a client; start several
//
// Flags: -redis, the Redis server (host:port) the clients share; -rate, the
// upstream's limit and the clients' budget, requests a second (10); -n,
// requests per client (30); -serve, serve only the upstream on this
// address; -url, run only a client, sending to this URL; -name, the
// client's name in its report.
package main

import (
	"bufio"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/adapters/outbound"
	"github.com/sluicehq/sluice/keyfunc"
	"github.com/sluicehq/sluice/middleware"
)

func main() {
	log.SetFlags(0)
	redisAddr := flag.String("redis", "", "Redis `host:port` the clients share their budget in; empty: each its own")
	perSecond := flag.Int("rate", 10, "the upstream's limit and the clients' budget, `requests` a second")
	n := flag.Int("n", 30, "requests each client sends")
	serve := flag.String("serve", "", "serve only the upstream on this `address`")
	url := flag.String("url", "", "run only a client, sending to this `URL`")
	name := flag.String("name", "A", "the client's `name` in its report")
	flag.Parse()
	switch {
	case *serve != "":
		ln, err := net.Listen("tcp", *serve)
		if err != nil {
			log.Fatal(err)
		}
		up := newUpstream(*perSecond)
		log.Printf("upstream: %d requests a second on http://%s/", *perSecond, ln.Addr())
		srv := &http.Server{Handler: up, ReadHeaderTimeout: 10 * time.Second}
		log.Fatal(srv.Serve(ln))
	case *url != "":
		if err := client(*name, *url, *redisAddr, *perSecond, *n); err != nil {
			log.Fatal(err)
		}
	default:
		self, err := os.Executable()
		if err != nil {
			log.Fatal(err)
		}
		run := func(args ...string) *exec.Cmd { return exec.Command(self, args...) }
		if err := demo(os.Stdout, run, *redisAddr, *perSecond, *n); err != nil {
			log.Fatal(err)
		}
	}
}

// upstream is an API limited by sluice's middleware to a number of
// requests a second, for every client together, that counts its answers.
type upstream struct {
	h            http.Handler
	ok, refused  atomic.Int64
	first, final atomic.Int64 // Unix ns of the first and last admission
}

func newUpstream(perSecond int) *upstream {
	lim, err := middleware.New(middleware.PerSecond(perSecond), keyfunc.Global())
	if err != nil {
		log.Fatal(err)
	}
	u := &upstream{}
	u.h = lim.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		now := time.Now().UnixNano()
		u.first.CompareAndSwap(0, now)
		u.final.Store(now)
		u.ok.Add(1)
		fmt.Fprintln(w, "ok")
	}))
	return u
}

func (u *upstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	rec := &status{ResponseWriter: w, code: http.StatusOK}
	u.h.ServeHTTP(rec, r)
	if rec.code == http.StatusTooManyRequests {
		u.refused.Add(1)
	}
}

type status struct {
	http.ResponseWriter
	code int
}

func (s *status) WriteHeader(code int) {
	s.code = code
	s.ResponseWriter.WriteHeader(code)
}

// demo serves the upstream on a free loopback port, runs two client
// processes toward it (run makes the command of one: this program again,
// with the flags given), and reports to w.
func demo(w io.Writer, run func(args ...string) *exec.Cmd, redisAddr string, perSecond, n int) error {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	up := newUpstream(perSecond)
	srv := &http.Server{Handler: up, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	defer srv.Close()
	if redisAddr == "" {
		fmt.Fprintln(w, "no -redis: each client has a budget of its own")
	} else {
		fmt.Fprintf(w, "the clients share one budget in Redis at %s\n", redisAddr)
	}
	fmt.Fprintf(w, "upstream: %d requests a second on http://%s/\n", perSecond, ln.Addr())
	var wg sync.WaitGroup
	errs := make(chan error, 2)
	for _, name := range []string{"A", "B"} {
		cmd := run("-url", "http://"+ln.Addr().String()+"/", "-redis", redisAddr,
			"-rate", strconv.Itoa(perSecond), "-n", strconv.Itoa(n), "-name", name)
		cmd.Stderr = os.Stderr
		out, err := cmd.StdoutPipe()
		if err != nil {
			return err
		}
		if err := cmd.Start(); err != nil {
			return err
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			sc := bufio.NewScanner(out)
			for sc.Scan() {
				fmt.Fprintln(w, sc.Text())
			}
			errs <- cmd.Wait()
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			return fmt.Errorf("a client: %w", err)
		}
	}
	rate := 0.0
	if span := time.Duration(up.final.Load() - up.first.Load()); span > 0 && up.ok.Load() > 1 {
		rate = float64(up.ok.Load()-1) / span.Seconds()
	}
	fmt.Fprintf(w, "upstream: %d admitted, %d refused, %.1f a second\n", up.ok.Load(), up.refused.Load(), rate)
	return nil
}

// client sends n requests to url from 4 goroutines through the outbound
// transport, with a budget of perSecond shared in Redis when redisAddr is
// set, and reports what became of them.
func client(name, url, redisAddr string, perSecond, n int) error {
	opts := []middleware.Option{middleware.WithPauses(), middleware.WithFailurePolicy(middleware.FailClosed)}
	if redisAddr != "" {
		rdb := redis.NewClient(&redis.Options{Addr: redisAddr})
		defer rdb.Close()
		store, err := middleware.NewRedisStore(rdb, middleware.RedisConfig{Prefix: "sluice-outbound-example:"})
		if err != nil {
			return err
		}
		defer store.Close()
		opts = append(opts, middleware.WithStore(store))
	}
	lim, err := middleware.NewRules([]middleware.Rule{{
		Name:   "upstream",
		Key:    outbound.Host(),
		Limits: []middleware.Limit{middleware.PerSecond(perSecond)},
		Sync:   middleware.SyncLease,
	}}, opts...)
	if err != nil {
		return err
	}
	defer lim.Close()
	t, err := outbound.New(lim, outbound.Options{MaxWait: time.Minute})
	if err != nil {
		return err
	}
	c := &http.Client{Transport: t}

	var next, ok, refused, notSent atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for next.Add(1) <= int64(n) {
				resp, err := c.Get(url)
				var we *outbound.WaitError
				switch {
				case errors.As(err, &we):
					notSent.Add(1)
				case err != nil:
					log.Printf("client %s: %v", name, err)
					notSent.Add(1)
				default:
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					if resp.StatusCode == http.StatusTooManyRequests {
						refused.Add(1)
					} else {
						ok.Add(1)
					}
				}
			}
		}()
	}
	wg.Wait()
	fmt.Printf("client %s: %d sent in %.1fs: %d admitted by the upstream, %d refused; %d not sent\n",
		name, ok.Load()+refused.Load(), time.Since(start).Seconds(), ok.Load(), refused.Load(), notSent.Load())
	return nil
}
