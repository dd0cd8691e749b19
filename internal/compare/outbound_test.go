package compare

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"golang.org/x/time/rate"

	"github.com/sluicehq/sluice/adapters/outbound"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/keyfunc"
	"github.com/sluicehq/sluice/middleware"
)

// BenchmarkOutbound: 4 client processes × 16 goroutines, sharing one
// budget of 100 requests a second toward an upstream that is a sluice
// server (sluice's middleware, in the benchmark's process, one budget for
// all its clients, every rate-limit field). Each client goroutine sends
// requests back to back for the run; the upstream counts what it admits
// and refuses, second by second.
//
//   - sluice-<mode>: the clients' outbound Transport over one Limiter each,
//     on one Redis, in each coordination mode;
//   - xrate: each client process with golang.org/x/time/rate at 100/4 a
//     second (burst 25), the usual per-process fix, which neither shares a
//     budget nor listens to the upstream.
//
// "matched" is an upstream limited to the 100 a second the clients are
// configured for; "half", one limited to 50 a second: the clients still
// believe 100.
//
// Metrics: ok/s (upstream admissions per second over the run after its
// first 2 s), used-% (of the upstream's real budget in that time),
// refused (the upstream's 429s over the whole run), max-refused-burst (the
// most 429s within one second), pauses (the pauses the clients made).
//
//	go test -run '^$' -bench BenchmarkOutbound -benchtime 1x -count 3 -timeout 30m
//
// SLUICE_OUTBOUND_SECONDS sets each run's length (default 12).
func BenchmarkOutbound(b *testing.B) {
	secs := 12
	if v, err := strconv.Atoi(os.Getenv("SLUICE_OUTBOUND_SECONDS")); err == nil && v > 2 {
		secs = v
	}
	srv := redistest.Standalone(b)
	for _, real := range []struct {
		name  string
		limit int
	}{{"matched", 100}, {"half", 50}} {
		for _, client := range []string{"sluice-exact", "sluice-lease", "sluice-write_back", "xrate"} {
			b.Run(real.name+"/"+client, func(b *testing.B) {
				for range b.N {
					runOutbound(b, srv, client, real.limit, secs)
				}
			})
		}
	}
}

// The client processes' settings, by environment.
const (
	outboundClientEnv = "SLUICE_OUTBOUND_CLIENT" // sluice-<mode> or xrate
	outboundRedisEnv  = "SLUICE_OUTBOUND_REDIS"
	outboundURLEnv    = "SLUICE_OUTBOUND_URL"
	outboundSecsEnv   = "SLUICE_OUTBOUND_RUN_SECONDS"
	outboundPrefixEnv = "SLUICE_OUTBOUND_PREFIX"
)

const (
	outboundProcs      = 4
	outboundGoroutines = 16
	outboundConfigured = 100 // requests a second the clients are configured for
)

// clientStats is what a client process reports on stdout when its run
// ends.
type clientStats struct {
	Sent, NotSent, Refused, Pauses, Lowered int
	// FailedOpen counts the decisions the store could not make, which
	// the Limiter's default policy let through.
	FailedOpen int
	Errors     int
	FirstError string
}

// upstreamCounts counts the upstream's answers per second of the run.
type upstreamCounts struct {
	mu      sync.Mutex
	start   time.Time
	ok, ref []int
}

func (u *upstreamCounts) add(refused bool) {
	u.mu.Lock()
	defer u.mu.Unlock()
	s := int(time.Since(u.start) / time.Second)
	for len(u.ok) <= s {
		u.ok, u.ref = append(u.ok, 0), append(u.ref, 0)
	}
	if refused {
		u.ref[s]++
	} else {
		u.ok[s]++
	}
}

func runOutbound(b *testing.B, srv *redistest.Server, client string, realLimit, secs int) {
	b.StopTimer()
	up, err := middleware.New(middleware.PerSecond(realLimit), keyfunc.Global())
	if err != nil {
		b.Fatal(err)
	}
	defer up.Close()
	counts := &upstreamCounts{}
	h := up.Handler(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	hs := &http.Server{ReadHeaderTimeout: 10 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rec := &codeRecorder{ResponseWriter: w, code: 200}
		h.ServeHTTP(rec, r)
		counts.add(rec.code == http.StatusTooManyRequests)
	})}
	go func() { _ = hs.Serve(ln) }()
	defer hs.Close()

	prefix := fmt.Sprintf("outbound-bench-%d:", time.Now().UnixNano())
	var procs []*exec.Cmd
	var outs []io.Reader
	for range outboundProcs {
		cmd := exec.Command(os.Args[0], "-test.run=^TestOutboundClient$", "-test.count=1")
		cmd.Env = append(os.Environ(), outboundClientEnv+"="+client, outboundRedisEnv+"="+srv.Addr(),
			outboundURLEnv+"=http://"+ln.Addr().String(), outboundSecsEnv+"="+strconv.Itoa(secs), outboundPrefixEnv+"="+prefix)
		cmd.Stderr = os.Stderr
		out, err := cmd.StdoutPipe()
		if err != nil {
			b.Fatal(err)
		}
		procs, outs = append(procs, cmd), append(outs, out)
	}
	counts.start = time.Now()
	b.StartTimer()
	for _, cmd := range procs {
		if err := cmd.Start(); err != nil {
			b.Fatal(err)
		}
	}
	var total clientStats
	for i, cmd := range procs {
		var st clientStats
		sc := bufio.NewScanner(outs[i])
		for sc.Scan() {
			if line, ok := strings.CutPrefix(sc.Text(), "stats "); ok {
				if err := json.Unmarshal([]byte(line), &st); err != nil {
					b.Fatal(err)
				}
			}
		}
		if err := cmd.Wait(); err != nil {
			b.Fatalf("client process: %v", err)
		}
		total.Sent += st.Sent
		total.NotSent += st.NotSent
		total.Refused += st.Refused
		total.Pauses += st.Pauses
		total.Lowered += st.Lowered
		total.Errors += st.Errors
		total.FailedOpen += st.FailedOpen
		if total.FirstError == "" {
			total.FirstError = st.FirstError
		}
	}
	b.StopTimer()
	if total.Errors > 0 {
		b.Errorf("%d requests failed otherwise than by the limiter: %s", total.Errors, total.FirstError)
	}
	counts.mu.Lock()
	defer counts.mu.Unlock()
	ok, refused, burst := 0, 0, 0
	for s := range counts.ok {
		refused += counts.ref[s]
		burst = max(burst, counts.ref[s])
		if s >= 2 && s < secs {
			ok += counts.ok[s]
		}
	}
	steady := float64(secs - 2)
	b.ReportMetric(float64(ok)/steady, "ok/s")
	b.ReportMetric(100*float64(ok)/(steady*float64(realLimit)), "used-%")
	b.ReportMetric(float64(refused), "refused")
	b.ReportMetric(float64(burst), "max-refused/s")
	b.ReportMetric(float64(total.Pauses), "pauses")
	b.ReportMetric(float64(total.NotSent), "not-sent")
	b.Logf("%s, upstream at %d/s: per second ok %v, refused %v; clients sent %d, not sent %d, saw %d refused, %d pauses, %d lowered, %d failed open (%s)",
		client, realLimit, counts.ok, counts.ref, total.Sent, total.NotSent, total.Refused, total.Pauses, total.Lowered, total.FailedOpen, total.FirstError)
}

type codeRecorder struct {
	http.ResponseWriter
	code int
}

func (c *codeRecorder) WriteHeader(code int) {
	c.code = code
	c.ResponseWriter.WriteHeader(code)
}

// TestOutboundClient is a client process of BenchmarkOutbound: run with
// SLUICE_OUTBOUND_CLIENT set, it sends requests from 16 goroutines for the
// run and prints its counts. Without it, it is skipped.
func TestOutboundClient(t *testing.T) {
	client := os.Getenv(outboundClientEnv)
	if client == "" {
		t.Skip("a client process of BenchmarkOutbound")
	}
	secs, _ := strconv.Atoi(os.Getenv(outboundSecsEnv))
	url := os.Getenv(outboundURLEnv)
	var st clientStats
	var mu sync.Mutex
	var pauses, lowered, failedOpen atomic.Int64
	var send func(ctx context.Context) (*http.Response, error)
	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: outboundGoroutines}}
	if client == "xrate" {
		lim := rate.NewLimiter(rate.Limit(outboundConfigured/outboundProcs), outboundConfigured/outboundProcs)
		send = func(ctx context.Context) (*http.Response, error) {
			if err := lim.Wait(ctx); err != nil {
				return nil, err
			}
			req, _ := http.NewRequestWithContext(ctx, "GET", url, nil)
			return hc.Do(req)
		}
	} else {
		mode, err := middleware.ParseSyncMode(strings.TrimPrefix(client, "sluice-"))
		if err != nil {
			t.Fatal(err)
		}
		rdb := redis.NewClient(&redis.Options{Addr: os.Getenv(outboundRedisEnv)})
		defer rdb.Close()
		store, err := middleware.NewRedisStore(rdb, middleware.RedisConfig{Prefix: os.Getenv(outboundPrefixEnv)})
		if err != nil {
			t.Fatal(err)
		}
		defer store.Close()
		configured := outboundConfigured
		if v, err := strconv.Atoi(os.Getenv("SLUICE_OUTBOUND_CONFIGURED")); err == nil {
			configured = v
		}
		lim, err := middleware.NewRules([]middleware.Rule{{Name: "upstream", Key: outbound.Host(),
			Limits: []middleware.Limit{middleware.PerSecond(configured)}, Sync: mode}},
			middleware.WithStore(store), middleware.WithPauses(), middleware.WithFailurePolicy(middleware.FailClosed), middleware.WithObserver(&middleware.Hooks{
				OnOutbound: func(e middleware.OutboundEvent) {
					switch e.Kind {
					case middleware.OutboundPaused:
						pauses.Add(1)
					case middleware.OutboundLowered:
						lowered.Add(1)
					}
				},
				OnDecided: func(_ keyfunc.Request, res *middleware.Result) {
					if res.Outcome == middleware.OutcomeFailedOpen {
						failedOpen.Add(1)
					}
				},
				OnStoreFailed: func(_ keyfunc.Request, err error) {
					mu.Lock()
					if st.FirstError == "" {
						st.FirstError = "store: " + err.Error()
					}
					mu.Unlock()
				}}))
		if err != nil {
			t.Fatal(err)
		}
		defer lim.Close()
		tr, err := outbound.New(lim, outbound.Options{Base: hc.Transport, MaxWait: 5 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		oc := &http.Client{Transport: tr}
		send = func(ctx context.Context) (*http.Response, error) {
			req, _ := http.NewRequestWithContext(ctx, "GET", url, nil)
			return oc.Do(req)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Duration(secs)*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	for range outboundGoroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				var we *outbound.WaitError
				resp, err := send(ctx)
				mu.Lock()
				switch {
				case err == nil:
					st.Sent++
					if resp.StatusCode == http.StatusTooManyRequests {
						st.Refused++
					}
				case ctx.Err() != nil, errors.Is(err, context.DeadlineExceeded), strings.Contains(err.Error(), "would exceed context deadline"):
					// The run is over (x/time/rate says so before the
					// deadline, when the wait would pass it).
					<-ctx.Done()
				case errors.As(err, &we):
					st.NotSent++
				default:
					st.Errors++
					if st.FirstError == "" {
						st.FirstError = err.Error()
					}
				}
				mu.Unlock()
				if err == nil {
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				} else if we != nil {
					// Not sent: its turn would come too late. Wait
					// for it, or for the end of the run.
					t := time.NewTimer(max(we.RetryAfter, time.Millisecond))
					select {
					case <-t.C:
					case <-ctx.Done():
					}
					t.Stop()
				}
			}
		}()
	}
	wg.Wait()
	st.Pauses, st.Lowered, st.FailedOpen = int(pauses.Load()), int(lowered.Load()), int(failedOpen.Load())
	out, _ := json.Marshal(st)
	fmt.Printf("stats %s\n", out)
}
