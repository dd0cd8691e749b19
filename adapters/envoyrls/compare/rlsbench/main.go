// Command rlsbench measures sluice-rls beside envoyproxy/ratelimit, both
// built from their Go modules by this module, on the same redis-server,
// with the same descriptor configuration and the same gRPC load
// generator.
//
//	cd adapters/envoyrls/compare && GOWORK=off go run ./rlsbench -duration 2s
//
// It builds both servers, starts a redis-server (persistence off) on a
// free loopback port and the servers beside it: sluice-rls, and
// envoyproxy/ratelimit twice, with its defaults and with the write
// buffering its README advises for high throughput (-only keeps one),
// and the floor: a gRPC server of this program that answers every call
// with a constant response, the most any server could do on the machine
// with this load generator.
// Then, for calls of one descriptor and of three, it measures calls per
// second and latency (p50, p99) with 1, 16 and 64 calls in flight, then
// the latency of calls sent at a fixed rate (-rate, 10,000 a second by
// default, timed from when each call was due, so that a stall counts
// against the server). Each measurement gives the servers alternating
// slices (-rounds), so that a machine whose load changes weighs on them
// alike. Nothing is over its limit: what is measured is the cost of a
// decision. A call counts as decided only when it is answered OK with a
// current_limit for every descriptor; "undecided" counts the others.
// sluice-rls waits for Redis however long it takes (-timeout 30s,
// -redis-timeout and -redis-stall negative), as envoyproxy/ratelimit
// does, so that no call is answered by its failure policy. The results
// are printed as a Markdown table.
package main

import (
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// conf is the descriptor configuration both servers load. Limits are far
// above what the load reaches.
const conf = `domain: bench
descriptors:
  - key: client
    rate_limit: {unit: second, requests_per_unit: 100000000}
  - key: database
    value: users
    rate_limit: {unit: second, requests_per_unit: 100000000}
  - key: message_type
    value: marketing
    descriptors:
      - key: to_number
        rate_limit: {unit: minute, requests_per_unit: 100000000}
`

// clients is how many distinct client values the load spreads over.
const clients = 10000

var (
	duration = flag.Duration("duration", 2*time.Second, "how long each measurement lasts")
	rate     = flag.Int("rate", 10000, "calls a second of the fixed-rate measurement")
	conns    = flag.Int("conns", 4, "gRPC connections of the load generator")
	only     = flag.String("only", "", "measure sluice-rls beside this server only: ratelimit or ratelimit-window")
	rounds   = flag.Int("rounds", 4, "slices each server gets of each measurement, alternating")
	floor    = flag.String("serve-floor", "", "serve the floor (a constant answer) on this address, and nothing else")
	extra    = flag.String("sluice-args", "", "more arguments of sluice-rls, space-separated (-pprof -http-addr 127.0.0.1:6070, say)")
)

func main() {
	flag.Parse()
	if *floor != "" {
		if err := serveFloor(*floor); err != nil {
			fmt.Fprintln(os.Stderr, "rlsbench:", err)
			os.Exit(1)
		}
		return
	}
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "rlsbench:", err)
		os.Exit(1)
	}
}

func run() error {
	dir, err := os.MkdirTemp("", "rlsbench")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	fmt.Fprintln(os.Stderr, "building the servers")
	for _, b := range [][2]string{
		{"sluice-rls", "github.com/sluicehq/sluice/adapters/envoyrls/cmd/sluice-rls"},
		{"ratelimit", "github.com/envoyproxy/ratelimit/src/service_cmd"},
	} {
		cmd := exec.Command("go", "build", "-o", filepath.Join(dir, b[0]), b[1])
		cmd.Env = append(os.Environ(), "GOWORK=off") // this module is not in the workspace
		cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
		if err := cmd.Run(); err != nil {
			return fmt.Errorf("go build %s: %w", b[1], err)
		}
	}
	cfgDir := filepath.Join(dir, "runtime", "ratelimit", "config")
	if err := os.MkdirAll(cfgDir, 0o755); err != nil {
		return err
	}
	cfgPath := filepath.Join(cfgDir, "bench.yaml")
	if err := os.WriteFile(cfgPath, []byte(conf), 0o644); err != nil {
		return err
	}

	redisPort := freePort()
	redis := exec.Command("redis-server", "--port", strconv.Itoa(redisPort), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--dir", dir)
	if err := redis.Start(); err != nil {
		return fmt.Errorf("redis-server: %w", err)
	}
	defer func() { _ = redis.Process.Kill(); _ = redis.Wait() }()
	redisAddr := "127.0.0.1:" + strconv.Itoa(redisPort)
	if err := waitPort(redisAddr); err != nil {
		return err
	}

	type server struct {
		name string
		cmd  func(grpcPort int) *exec.Cmd
	}
	ratelimit := func(window string) func(int) *exec.Cmd {
		return func(port int) *exec.Cmd {
			c := exec.Command(filepath.Join(dir, "ratelimit"))
			c.Env = append(os.Environ(),
				"USE_STATSD=false", "LOG_LEVEL=error", "REDIS_SOCKET_TYPE=tcp", "REDIS_URL="+redisAddr,
				"RUNTIME_ROOT="+filepath.Join(dir, "runtime"), "RUNTIME_SUBDIRECTORY=ratelimit", "RUNTIME_WATCH_ROOT=false",
				"GRPC_HOST=127.0.0.1", "GRPC_PORT="+strconv.Itoa(port),
				"HOST=127.0.0.1", "PORT="+strconv.Itoa(freePort()), "DEBUG_HOST=127.0.0.1", "DEBUG_PORT="+strconv.Itoa(freePort()),
				"REDIS_PIPELINE_WINDOW="+window)
			return c
		}
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	servers := []server{
		// The floor: a gRPC server that answers every call with a
		// constant response, without deciding anything.
		{"floor", func(port int) *exec.Cmd {
			return exec.Command(self, "-serve-floor", "127.0.0.1:"+strconv.Itoa(port))
		}},
		{"sluice-rls", func(port int) *exec.Cmd {
			// Never answered by the failure policy: every call is
			// decided by Redis, however slowly, as with the others.
			args := []string{"-config", cfgPath, "-redis", redisAddr,
				"-grpc-addr", "127.0.0.1:" + strconv.Itoa(port), "-http-addr", "127.0.0.1:0", "-timeout", "30s", "-redis-timeout", "-1ms", "-redis-stall", "-1ms"}
			return exec.Command(filepath.Join(dir, "sluice-rls"), append(args, strings.Fields(*extra)...)...)
		}},
		// Its defaults: each call's commands written at once on a pooled
		// connection (REDIS_POOL_SIZE 10).
		{"ratelimit", ratelimit("0")},
		// Write buffering, as its README advises for high throughput.
		{"ratelimit-window", ratelimit("150us")},
	}
	fmt.Printf("redis-server %s; each server a process of its own, all running, measured in alternating slices\n\n", redisVersion())
	var ts []*target
	for _, s := range servers {
		if *only != "" && s.name != *only && s.name != "sluice-rls" && s.name != "floor" {
			continue
		}
		t, stop, err := start(s.name, s.cmd)
		if err != nil {
			return err
		}
		defer stop()
		ts = append(ts, t)
	}
	compare(ts)
	return nil
}

// target is a running server and the load generator's clients of it.
type target struct {
	name string
	cs   []rlsv3.RateLimitServiceClient
}

// start starts a server and connects to it.
func start(name string, mk func(int) *exec.Cmd) (*target, func(), error) {
	port := freePort()
	cmd := mk(port)
	cmd.Stdout, cmd.Stderr = nil, nil
	if err := cmd.Start(); err != nil {
		return nil, nil, err
	}
	var closers []func()
	stop := func() {
		for _, c := range closers {
			c()
		}
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	}
	addr := "127.0.0.1:" + strconv.Itoa(port)
	if err := waitPort(addr); err != nil {
		stop()
		return nil, nil, err
	}
	t := &target{name: name}
	for range *conns {
		conn, err := grpc.NewClient("passthrough:///"+addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			stop()
			return nil, nil, err
		}
		closers = append(closers, func() { _ = conn.Close() })
		t.cs = append(t.cs, rlsv3.NewRateLimitServiceClient(conn))
	}
	// Warm up, and check that the server decides.
	for i := 0; ; i++ {
		resp, err := t.cs[0].ShouldRateLimit(context.Background(), request(3, 1))
		if err == nil && resp.OverallCode == rlsv3.RateLimitResponse_OK && resp.Statuses[0].CurrentLimit != nil {
			break
		}
		if i > 200 {
			stop()
			return nil, nil, fmt.Errorf("%s: no decision: %v %v", name, resp, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	closedLoop(t.cs, 3, 16, *duration/4)
	return t, stop, nil
}

// compare measures the targets in alternating slices, so that they share
// the machine's changing load alike: -rounds rounds, each giving every
// target a slice of -duration / -rounds, in an order that rotates.
func compare(ts []*target) {
	fmt.Printf("| descriptors | in flight |")
	for _, t := range ts {
		fmt.Printf(" %s calls/s | p50 | p99 | undecided |", t.name)
	}
	fmt.Printf("\n|---|---|")
	for range ts {
		fmt.Printf("---|---|---|---|")
	}
	fmt.Println()
	type point struct {
		nd, inflight int // inflight 0: the fixed rate
	}
	var points []point
	for _, nd := range []int{1, 3} {
		for _, inflight := range []int{1, 16, 64} {
			points = append(points, point{nd, inflight})
		}
	}
	points = append(points, point{1, 0}, point{3, 0})
	slice := *duration / time.Duration(*rounds)
	for _, p := range points {
		lats := make([][]time.Duration, len(ts))
		took := make([]time.Duration, len(ts))
		errs := make([]int64, len(ts))
		for r := range *rounds {
			for k := range ts {
				i := (k + r) % len(ts)
				var l []time.Duration
				var d time.Duration
				var e int64
				if p.inflight == 0 {
					l, d, e = openLoop(ts[i].cs, p.nd, *rate, slice)
				} else {
					l, d, e = closedLoop(ts[i].cs, p.nd, p.inflight, slice)
				}
				lats[i] = append(lats[i], l...)
				took[i] += d
				errs[i] += e
			}
		}
		flight := strconv.Itoa(p.inflight)
		if p.inflight == 0 {
			flight = "fixed " + strconv.Itoa(*rate) + "/s"
		}
		fmt.Printf("| %d | %s |", p.nd, flight)
		for i := range ts {
			r := summarize(lats[i], took[i])
			fmt.Printf(" %.0f | %s | %s | %d |", r.rate, ms(r.p50), ms(r.p99), errs[i])
		}
		fmt.Println()
	}
	fmt.Println()
}

// request is a call of nd descriptors (1 or 3) for client c.
func request(nd, c int) *rlsv3.RateLimitRequest {
	v := "c" + strconv.Itoa(c)
	ds := []*commonv3.RateLimitDescriptor{{Entries: []*commonv3.RateLimitDescriptor_Entry{{Key: "client", Value: v}}}}
	if nd == 3 {
		ds = append(ds,
			&commonv3.RateLimitDescriptor{Entries: []*commonv3.RateLimitDescriptor_Entry{{Key: "database", Value: "users"}}},
			&commonv3.RateLimitDescriptor{Entries: []*commonv3.RateLimitDescriptor_Entry{{Key: "message_type", Value: "marketing"}, {Key: "to_number", Value: v}}})
	}
	return &rlsv3.RateLimitRequest{Domain: "bench", Descriptors: ds}
}

type result struct {
	rate     float64
	p50, p99 time.Duration
}

// closedLoop keeps inflight calls in flight for d.
func closedLoop(cs []rlsv3.RateLimitServiceClient, nd, inflight int, d time.Duration) ([]time.Duration, time.Duration, int64) {
	var wg sync.WaitGroup
	var errs atomic.Int64
	lats := make([][]time.Duration, inflight)
	stop := time.Now().Add(d)
	for w := range inflight {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := cs[w%len(cs)]
			rng := rand.New(rand.NewPCG(uint64(w), 1))
			var own []time.Duration
			for {
				begin := time.Now()
				if begin.After(stop) {
					break
				}
				resp, err := c.ShouldRateLimit(context.Background(), request(nd, rng.IntN(clients)))
				own = append(own, time.Since(begin))
				if !decided(resp, err) {
					errs.Add(1)
				}
			}
			lats[w] = own
		}()
	}
	wg.Wait()
	return slices.Concat(lats...), d, errs.Load()
}

// openLoop sends perSec calls a second for d, each timed from when it was
// due.
func openLoop(cs []rlsv3.RateLimitServiceClient, nd, perSec int, d time.Duration) ([]time.Duration, time.Duration, int64) {
	n := int(d.Seconds() * float64(perSec))
	interval := time.Second / time.Duration(perSec)
	lats := make([]time.Duration, n)
	var errs atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	rng := rand.New(rand.NewPCG(7, 7))
	for i := range n {
		due := start.Add(time.Duration(i) * interval)
		if w := time.Until(due); w > 0 {
			time.Sleep(w)
		}
		c, req := cs[i%len(cs)], request(nd, rng.IntN(clients))
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, err := c.ShouldRateLimit(context.Background(), req)
			lats[i] = time.Since(due)
			if !decided(resp, err) {
				errs.Add(1)
			}
		}()
	}
	wg.Wait()
	return lats, time.Since(start), errs.Load()
}

func summarize(lats []time.Duration, d time.Duration) result {
	slices.Sort(lats)
	r := result{rate: float64(len(lats)) / d.Seconds()}
	if len(lats) > 0 {
		r.p50 = lats[len(lats)/2]
		r.p99 = lats[min(len(lats)-1, len(lats)*99/100)]
	}
	return r
}

func ms(d time.Duration) string { return strconv.FormatFloat(float64(d)/1e6, 'f', 2, 64) + " ms" }

func freePort() int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

func waitPort(addr string) error {
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		c, err := net.DialTimeout("tcp", addr, 100*time.Millisecond)
		if err == nil {
			c.Close()
			return nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	return fmt.Errorf("%s not listening after 20s", addr)
}

func redisVersion() string {
	out, err := exec.Command("redis-server", "--version").Output()
	if err != nil {
		return "?"
	}
	for _, f := range strings.Fields(string(out)) {
		if v, ok := strings.CutPrefix(f, "v="); ok {
			return v
		}
	}
	return strings.TrimSpace(string(out))
}

// floorServer answers every call OK with one status per descriptor and a
// current_limit, as a server that decided would, without deciding.
type floorServer struct {
	rlsv3.UnimplementedRateLimitServiceServer
}

func (floorServer) ShouldRateLimit(_ context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	resp := &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK}
	for range req.Descriptors {
		resp.Statuses = append(resp.Statuses, &rlsv3.RateLimitResponse_DescriptorStatus{
			Code:           rlsv3.RateLimitResponse_OK,
			CurrentLimit:   &rlsv3.RateLimitResponse_RateLimit{RequestsPerUnit: 100000000, Unit: rlsv3.RateLimitResponse_RateLimit_SECOND},
			LimitRemaining: 99999999,
		})
	}
	return resp, nil
}

func serveFloor(addr string) error {
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	g := grpc.NewServer()
	rlsv3.RegisterRateLimitServiceServer(g, floorServer{})
	return g.Serve(lis)
}

// decided reports whether a call was answered OK with a limit for every
// descriptor: a call answered without one (by a failure policy) counts as
// an error.
func decided(resp *rlsv3.RateLimitResponse, err error) bool {
	if err != nil || resp.OverallCode != rlsv3.RateLimitResponse_OK {
		return false
	}
	for _, st := range resp.Statuses {
		if st.CurrentLimit == nil {
			return false
		}
	}
	return true
}
