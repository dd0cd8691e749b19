package compare

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/ulule/limiter/v3"
	"github.com/ulule/limiter/v3/drivers/middleware/stdlib"
	ululeredis "github.com/ulule/limiter/v3/drivers/store/redis"

	"github.com/sluicehq/sluice/headers"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/keyfunc"
	"github.com/sluicehq/sluice/middleware"
)

// serveEnv names, in the environment of a child process of
// BenchmarkServerCPU, the limiter it serves behind ("baseline" for none);
// profileEnv, a file for the child's CPU profile.
const (
	serveEnv   = "SLUICE_COMPARE_SERVE"
	profileEnv = "SLUICE_COMPARE_SERVE_PROFILE"
	// serveRedisEnv is the address of the Redis server of the limiters
	// on Redis.
	serveRedisEnv = "SLUICE_COMPARE_SERVE_REDIS"
)

// redisServed are the net/http middleware on Redis of
// BenchmarkServerCPURedis, each on a go-redis client of default options.
var redisServed = map[string]func(tb testing.TB, c *redis.Client, next http.Handler) http.Handler{
	"sluice-redis":            sluiceRedisSync(middleware.SyncExact),
	"sluice-redis-lease":      sluiceRedisSync(middleware.SyncLease),
	"sluice-redis-write-back": sluiceRedisSync(middleware.SyncWriteBack),
	"ulule-redis": func(tb testing.TB, c *redis.Client, next http.Handler) http.Handler {
		st, err := ululeredis.NewStoreWithOptions(c, limiter.StoreOptions{Prefix: "ulule-cpu"})
		if err != nil {
			tb.Fatal(err)
		}
		return stdlib.NewMiddleware(limiter.New(st, limiter.Rate{Period: time.Minute, Limit: bigLimit})).Handler(next)
	},
}

// sluiceRedisSync returns sluice's middleware on Redis with its rule in the
// mode sync (for the fleet modes with their default lease, interval and
// unsynced bound).
func sluiceRedisSync(sync middleware.SyncMode) func(tb testing.TB, c *redis.Client, next http.Handler) http.Handler {
	return func(tb testing.TB, c *redis.Client, next http.Handler) http.Handler {
		st, err := middleware.NewRedisStore(c, middleware.RedisConfig{Prefix: "sluice-cpu-" + sync.String() + ":"})
		if err != nil {
			tb.Fatal(err)
		}
		tb.Cleanup(func() { _ = st.Close() })
		lim, err := middleware.NewRules([]middleware.Rule{{
			Name: middleware.DefaultRuleName, Key: keyfunc.RemoteIP(),
			Limits: []middleware.Limit{middleware.PerMinute(bigLimit)}, Sync: sync,
		}}, middleware.WithStore(st))
		if err != nil {
			tb.Fatal(err)
		}
		tb.Cleanup(func() { _ = lim.Close() })
		return lim.Handler(next)
	}
}

// styleServed are sluice's net/http middleware over its memory store with
// each header style other than the default (five fields), so that
// BenchmarkServerCPU shows what the fields cost: "legacy" sends the three
// X-RateLimit-* fields the other limiters send, "draft" RateLimit and
// RateLimit-Policy, "none" none.
var styleServed = map[string]func(tb testing.TB, next http.Handler) http.Handler{
	"sluice-legacy": sluiceStyle(headers.Legacy),
	"sluice-draft":  sluiceStyle(headers.Draft),
	"sluice-none":   sluiceStyle(headers.None),
}

// sluiceStyle returns sluice's middleware over its memory store, sending
// the fields of style.
func sluiceStyle(style headers.Style) func(tb testing.TB, next http.Handler) http.Handler {
	return func(tb testing.TB, next http.Handler) http.Handler {
		lim, err := middleware.New(middleware.PerMinute(bigLimit), keyfunc.RemoteIP(), middleware.WithHeaderStyle(style))
		if err != nil {
			tb.Fatal(err)
		}
		tb.Cleanup(func() { _ = lim.Close() })
		return lim.Handler(next)
	}
}

// serverConns is the number of keep-alive connections of
// BenchmarkServerCPU.
const serverConns = 32

// BenchmarkServerCPU measures what each limiter's net/http middleware
// (over its in-memory store, with its default options, allowing 10^9
// requests a minute) costs the server that runs it, end to end: the
// server is this test binary run again as a process of its own, a real
// net/http server on loopback, and the figure is the CPU time of that
// process (all its threads, user and system, from getrusage) per request,
// beside the bare handler's ("baseline") in the same run, and sluice's
// with each of its other header styles ("sluice-legacy", "sluice-draft",
// "sluice-none"; see styleServed):
//
//	go test -run '^$' -bench BenchmarkServerCPU -benchtime 40000x -count 5
//
// The client keeps 32 connections alive, each driven by one goroutine,
// all from 127.0.0.1 ("one-address") or each from an address of its own,
// 127.0.0.2 to 127.0.0.33 ("32-addresses"), and checks that every answer
// is a 200. The client's own work (parsing each response's header fields)
// is not in the figure.
//
// Each limiter's case runs a bare server beside the limiter's and sends
// b.N requests to each in 10 alternating slices, so that both see the
// same moments of a machine whose speed drifts within seconds (measured
// one after the other, two runs of the bare server differed by up to
// 3 µs per request).
//
// Metrics: server-cpu-µs/req; for a limiter also baseline-cpu-µs/req, the
// bare server's in the same slices, and +µs/req, the difference. With
// SLUICE_COMPARE_SERVE_PROFILE=DIR, each server writes its CPU profile to
// DIR/<case>.pprof (go tool pprof -top).
func BenchmarkServerCPU(b *testing.B) {
	names := []string{"baseline"}
	for _, l := range httpLimiters {
		names = append(names, l.name)
	}
	names = append(names, "sluice-legacy", "sluice-draft", "sluice-none")
	serveCPUCases(b, names, "")
}

// BenchmarkServerCPURedis is BenchmarkServerCPU for the limiters whose
// net/http middleware runs on Redis, sluice (exact mode, and the fleet
// modes lease and write-back with their defaults) and ulule, each
// with a go-redis client of default options of its own, on a redis-server
// of the benchmark's own:
//
//	go test -run '^$' -bench BenchmarkServerCPURedis -benchtime 20000x -count 3
func BenchmarkServerCPURedis(b *testing.B) {
	srv := redistest.Standalone(b)
	serveCPUCases(b, []string{"baseline", "sluice-redis", "sluice-redis-lease", "sluice-redis-write-back", "ulule-redis"}, srv.Addr())
}

// serveCPUCases runs the cases of BenchmarkServerCPU for the limiters names,
// with the Redis server at redisAddr, if any.
func serveCPUCases(b *testing.B, names []string, redisAddr string) {
	for _, clients := range []string{"one-address", "32-addresses"} {
		for _, name := range names {
			b.Run(clients+"/"+name, func(b *testing.B) {
				distinct := clients == "32-addresses"
				if name == "baseline" {
					b.ReportMetric(serveAndMeasure(b, distinct, redisAddr, clients, name)[0], "server-cpu-µs/req")
					return
				}
				// The limiter's server and a bare one, measured in
				// alternating slices, so that both see the same moments of
				// a machine whose speed drifts within seconds.
				per := serveAndMeasure(b, distinct, redisAddr, clients, name, "baseline")
				b.ReportMetric(per[0], "server-cpu-µs/req")
				b.ReportMetric(per[1], "baseline-cpu-µs/req")
				b.ReportMetric(per[0]-per[1], "+µs/req")
			})
		}
	}
}

// serveSlices is the number of alternating slices of a paired
// measurement.
const serveSlices = 10

// serveAndMeasure starts a server process behind each limiter of names
// ("baseline" for none), sends b.N requests to each over serverConns
// connections, in serveSlices slices that alternate between the servers
// (the order turning at every slice), and returns each server's CPU time
// per request, in microseconds.
func serveAndMeasure(b *testing.B, distinct bool, redisAddr, label string, names ...string) []float64 {
	servers := make([]*cpuServer, len(names))
	for k, name := range names {
		servers[k] = startCPUServer(b, name, label, distinct, redisAddr)
		defer servers[k].close()
	}
	for _, s := range servers {
		s.send(b, 2000) // connections open, counters exist, code paths warm
	}
	cpu := make([]time.Duration, len(servers))
	made := make([]int, len(servers))
	b.ResetTimer()
	for sl := range serveSlices {
		n := b.N / serveSlices
		if sl == serveSlices-1 {
			n = b.N - made[0]
		}
		for j := range servers {
			s := servers[(j+sl)%len(servers)]
			k := (j + sl) % len(servers)
			cpu0 := s.cpuNow(b)
			s.send(b, n)
			cpu[k] += s.cpuNow(b) - cpu0
			made[k] += n
		}
	}
	b.StopTimer()
	per := make([]float64, len(servers))
	for k := range servers {
		per[k] = float64(cpu[k]) / float64(time.Microsecond) / float64(made[k])
	}
	return per
}

// cpuServer is a server process of BenchmarkServerCPU and its clients.
type cpuServer struct {
	cmd     *exec.Cmd
	stdin   io.WriteCloser
	out     *bufio.Reader
	url     string
	clients []*http.Client
}

// startCPUServer starts the server process behind the limiter name.
func startCPUServer(b *testing.B, name, label string, distinct bool, redisAddr string) *cpuServer {
	cmd := exec.Command(os.Args[0], "-test.run=^TestServeForCPU$", "-test.count=1")
	cmd.Env = append(os.Environ(), serveEnv+"="+name, serveRedisEnv+"="+redisAddr)
	if dir := os.Getenv(profileEnv); dir != "" {
		cmd.Env = append(cmd.Env, profileEnv+"="+dir+"/"+label+"-"+name+".pprof")
	} else {
		cmd.Env = append(cmd.Env, profileEnv+"=")
	}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		b.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	s := &cpuServer{cmd: cmd, stdin: stdin, out: bufio.NewReader(stdout)}
	line, err := s.out.ReadString('\n')
	if err != nil {
		s.close()
		b.Fatalf("server: %v", err)
	}
	addr, ok := strings.CutPrefix(strings.TrimSpace(line), "listening on ")
	if !ok {
		s.close()
		b.Fatalf("server said %q", line)
	}
	s.url = "http://" + addr + "/"
	s.clients = make([]*http.Client, serverConns)
	for i := range s.clients {
		d := &net.Dialer{}
		if distinct {
			d.LocalAddr = &net.TCPAddr{IP: net.IPv4(127, 0, 0, byte(2+i))}
		}
		s.clients[i] = &http.Client{Transport: &http.Transport{
			DialContext:         d.DialContext,
			MaxIdleConnsPerHost: 1,
			MaxConnsPerHost:     1,
			DisableCompression:  true,
		}}
	}
	return s
}

// cpuNow asks the server for its CPU time so far (getrusage, in
// microseconds), which /proc gives only in ticks of 10 ms.
func (s *cpuServer) cpuNow(b *testing.B) time.Duration {
	if _, err := io.WriteString(s.stdin, "cpu\n"); err != nil {
		b.Fatal(err)
	}
	l, err := s.out.ReadString('\n')
	if err != nil {
		b.Fatalf("server: %v", err)
	}
	ns, err := strconv.ParseInt(strings.TrimSpace(l), 10, 64)
	if err != nil {
		b.Fatalf("server said %q", l)
	}
	return time.Duration(ns)
}

// send makes n requests over the server's connections, and fails b if any
// fails or is not answered 200.
func (s *cpuServer) send(b *testing.B, n int) {
	var next, bad atomic.Int64
	var wg sync.WaitGroup
	for _, c := range s.clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for next.Add(1) <= int64(n) {
				res, err := c.Get(s.url)
				if err != nil {
					bad.Add(1)
					continue
				}
				_, _ = io.Copy(io.Discard, res.Body)
				res.Body.Close()
				if res.StatusCode != http.StatusOK {
					bad.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	if k := bad.Load(); k > 0 {
		b.Fatalf("%d of %d requests failed or were not 200", k, n)
	}
}

// close closes the server's connections, then its stdin, which stops it.
func (s *cpuServer) close() {
	for _, c := range s.clients {
		c.CloseIdleConnections()
	}
	s.stdin.Close()
	_ = s.cmd.Wait()
}

// TestServeForCPU is the server process of BenchmarkServerCPU: run with
// SLUICE_COMPARE_SERVE set to a limiter's name, it serves the bare handler
// behind that limiter on a loopback port, says where on stdout, and stops
// when stdin closes. Without it, it is skipped.
func TestServeForCPU(t *testing.T) {
	name := os.Getenv(serveEnv)
	if name == "" {
		t.Skip("the server process of BenchmarkServerCPU")
	}
	h := http.Handler(bare)
	if wrap, ok := redisServed[name]; ok {
		c := redis.NewClient(&redis.Options{Addr: os.Getenv(serveRedisEnv)})
		t.Cleanup(func() { c.Close() })
		h = wrap(t, c, bare)
	} else if wrap, ok := styleServed[name]; ok {
		h = wrap(t, bare)
	} else if name != "baseline" {
		found := false
		for _, l := range httpLimiters {
			if l.name == name {
				h, found = l.wrap(t, bare), true
			}
		}
		if !found {
			t.Fatalf("no limiter %q", name)
		}
	}
	if path := os.Getenv(profileEnv); path != "" {
		f, err := os.Create(path)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			t.Fatal(err)
		}
		defer pprof.StopCPUProfile()
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	fmt.Printf("listening on %s\n", ln.Addr())
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() { // "cpu": the process's CPU time so far, in ns
		fmt.Println(int64(processCPU(t)))
	}
	_ = srv.Shutdown(context.Background())
}
