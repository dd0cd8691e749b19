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
	"github.com/sluicehq/sluice/internal/upstreamtest"
	"github.com/sluicehq/sluice/keyfunc"
	"github.com/sluicehq/sluice/middleware"
)

// BenchmarkOutbound: 4 client processes × 16 goroutines, sharing one
// budget of 100 requests a second toward an upstream that limits all of
// them together as an API limits one account (internal/upstreamtest, in
// the benchmark's process). Each client goroutine sends requests back to
// back for the run; the upstream records what it admits and refuses, in
// 10 ms bins.
//
// The upstreams: each counts either exactly (log: a sliding log of one
// second) or in fixed windows of a second aligned on the clock (fixed),
// and answers one family of fields: the IETF draft-10 RateLimit and
// RateLimit-Policy with a whole-second Retry-After on a refusal (draft10),
// GitHub's X-RateLimit-* with a Unix reset (github), or OpenAI's
// x-ratelimit-*-requests with reset durations (openai). The scenarios:
//
//   - matched: the upstream's limit is the clients' 100 a second;
//   - half: it is 50 a second, which the clients are not told (but by the
//     upstream's fields);
//   - change: it is 100 a second, 50 from 10 s, 100 again from 20 s;
//   - hostile: it admits 1,000 a second and announces so, and at 5 s
//     refuses once with a Retry-After of ten years; the clients' MaxPause
//     is 2 s (sluice clients only).
//
// The clients:
//
//   - sluice-<mode>: the outbound Transport over one Limiter per process,
//     on one Redis, in exact or lease mode;
//   - old-<mode>: the same, built from an earlier commit's transport
//     (SLUICE_OUTBOUND_OLD names the test binary of internal/compare built
//     at that commit; without it these cases are skipped);
//   - xrate: each process with golang.org/x/time/rate at 100/4 a second
//     (burst 25), the usual per-process fix, which neither shares a budget
//     nor reads the upstream's fields.
//
// Metrics, over the run after its first 2 s unless said: used-% (the
// upstream's admissions, of its capacity), refused/10s, refused (the
// whole run), follow-s (matched and half: how long from the start until
// the fleet sent at the upstream's rate, upstreamtest.Record.Follow),
// down-s and up-s (change: the same from 10 s and from 20 s), most/s and
// gap-s (hostile: the most the fleet sent in any second, the longest it
// sent nothing after the refusal), learned-max (hostile: the highest limit
// any client learned), pauses and not-sent (the clients' own counts).
//
//	go test -run '^$' -bench BenchmarkOutbound -benchtime 1x -count 1 -timeout 60m
//
// SLUICE_OUTBOUND_SECONDS sets the length of the matched and half runs
// (default 15); a change run lasts 30 s. SLUICE_OUTBOUND_DEBUG logs each
// refusal with what the upstream admitted in the second before it.
func BenchmarkOutbound(b *testing.B) {
	secs := 15
	if v, err := strconv.Atoi(os.Getenv("SLUICE_OUTBOUND_SECONDS")); err == nil && v > 2 {
		secs = v
	}
	srv := redistest.Standalone(b)
	clients := []string{"sluice-lease", "sluice-exact", "old-lease", "old-exact", "xrate"}
	for _, sc := range outboundScenarios(secs) {
		for _, counting := range []upstreamtest.Counting{upstreamtest.Log, upstreamtest.Fixed} {
			for _, fields := range []upstreamtest.Fields{upstreamtest.Draft10, upstreamtest.GitHub, upstreamtest.OpenAI} {
				for _, client := range clients {
					if sc.hostile && !strings.HasPrefix(client, "sluice-") {
						continue // the measure of the transport as it is
					}
					b.Run(sc.name+"/"+counting.String()+"-"+fields.String()+"/"+client, func(b *testing.B) {
						bin := os.Args[0]
						if strings.HasPrefix(client, "old-") {
							if bin = os.Getenv("SLUICE_OUTBOUND_OLD"); bin == "" {
								b.Skip("SLUICE_OUTBOUND_OLD names no earlier build")
							}
							client = "sluice-" + strings.TrimPrefix(client, "old-")
						}
						for range b.N {
							cfg := upstreamtest.Config{Counting: counting, Fields: fields, Limit: sc.limit}
							if sc.hostile {
								cfg.Announced = upstreamtest.Constant(10 * outboundConfigured)
								cfg.HostileAt, cfg.HostileRetryAfter = 5*time.Second, "315360000"
							}
							runOutbound(b, srv, bin, client, sc, cfg)
						}
					})
				}
			}
		}
	}
}

// outboundScenario is a run of BenchmarkOutbound: how long, the
// upstream's limit over time, and the phases whose following is
// measured.
type outboundScenario struct {
	name   string
	secs   int
	limit  func(time.Duration) int
	phases []outboundPhase
	// hostile: the upstream announces 10 times the clients' limit and, at
	// 5 s, refuses once with a Retry-After of ten years; the clients'
	// MaxPause is 2 s.
	hostile bool
}

// outboundPhase is a time during which the upstream's limit holds, and
// the metric that says how soon the fleet followed it.
type outboundPhase struct {
	metric   string
	from, to time.Duration
	limit    int
}

func outboundScenarios(secs int) []outboundScenario {
	run := time.Duration(secs) * time.Second
	return []outboundScenario{
		{"matched", secs, upstreamtest.Constant(100), []outboundPhase{{"follow-s", 0, run, 100}}, false},
		{"half", secs, upstreamtest.Constant(50), []outboundPhase{{"follow-s", 0, run, 50}}, false},
		{"change", 30, upstreamtest.Steps(100, 10*time.Second, 50, 20*time.Second, 100), []outboundPhase{
			{"down-s", 10 * time.Second, 20 * time.Second, 50},
			{"up-s", 20 * time.Second, 30 * time.Second, 100},
		}, false},
		{"hostile", secs, upstreamtest.Constant(10 * outboundConfigured), nil, true},
	}
}

// The client processes' settings, by environment.
const (
	outboundClientEnv = "SLUICE_OUTBOUND_CLIENT" // sluice-<mode> or xrate
	outboundRedisEnv  = "SLUICE_OUTBOUND_REDIS"
	outboundURLEnv    = "SLUICE_OUTBOUND_URL"
	outboundSecsEnv   = "SLUICE_OUTBOUND_RUN_SECONDS"
	outboundPrefixEnv = "SLUICE_OUTBOUND_PREFIX"
	// outboundMaxPauseEnv is the transport's MaxPause (the hostile
	// scenario's 2 s).
	outboundMaxPauseEnv = "SLUICE_OUTBOUND_MAX_PAUSE"
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
	// StoreError is the first failure the store reported, for the log.
	StoreError string
	// MaxLearned is the highest limit learned of the upstream
	// (OutboundLearned), 0 when none was.
	MaxLearned int
}

func runOutbound(b *testing.B, srv *redistest.Server, bin, client string, sc outboundScenario, cfg upstreamtest.Config) {
	b.StopTimer()
	up := upstreamtest.New(cfg)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	hs := &http.Server{ReadHeaderTimeout: 10 * time.Second, Handler: up}
	go func() { _ = hs.Serve(ln) }()
	defer hs.Close()

	prefix := fmt.Sprintf("outbound-bench-%d:", time.Now().UnixNano())
	var procs []*exec.Cmd
	var outs []io.Reader
	for range outboundProcs {
		cmd := exec.Command(bin, "-test.run=^TestOutboundClient$", "-test.count=1")
		cmd.Env = append(os.Environ(), outboundClientEnv+"="+client, outboundRedisEnv+"="+srv.Addr(),
			outboundURLEnv+"=http://"+ln.Addr().String(), outboundSecsEnv+"="+strconv.Itoa(sc.secs), outboundPrefixEnv+"="+prefix)
		if sc.hostile {
			cmd.Env = append(cmd.Env, outboundMaxPauseEnv+"=2s")
		}
		cmd.Stderr = os.Stderr
		out, err := cmd.StdoutPipe()
		if err != nil {
			b.Fatal(err)
		}
		procs, outs = append(procs, cmd), append(outs, out)
	}
	up.Start(time.Now())
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
		if total.StoreError == "" {
			total.StoreError = st.StoreError
		}
		total.MaxLearned = max(total.MaxLearned, st.MaxLearned)
	}
	b.StopTimer()
	if total.Errors > 0 {
		b.Errorf("%d requests failed otherwise than by the limiter: %s", total.Errors, total.FirstError)
	}
	rec := up.Record()
	run := time.Duration(sc.secs) * time.Second
	if sc.hostile {
		// The most the fleet sent in any second (its limit is 100, the
		// upstream announced 1,000), and the longest it sent nothing after
		// the refusal that asked for ten years.
		b.ReportMetric(float64(rec.MostWithin(0, run)), "most/s")
		b.ReportMetric(rec.LongestGap(5*time.Second, run).Seconds(), "gap-s")
		b.ReportMetric(float64(total.MaxLearned), "learned-max")
	}
	if os.Getenv("SLUICE_OUTBOUND_DEBUG") != "" {
		for i, n := range rec.Ref {
			if n == 0 {
				continue
			}
			at := time.Duration(i) * upstreamtest.BinWidth
			var prev []int
			for u := at - time.Second; u < at; u += 100 * time.Millisecond {
				prev = append(prev, rec.Admitted(u, u+100*time.Millisecond))
			}
			b.Logf("refused %d at %v; admitted in the second before, per 100ms: %v (sum %d)", n, at, prev, rec.Admitted(at-time.Second+upstreamtest.BinWidth, at+upstreamtest.BinWidth))
		}
	}
	late := rec.Refused(2*time.Second, run)
	b.ReportMetric(100*rec.Used(2*time.Second, run), "used-%")
	b.ReportMetric(float64(late)*10/float64(sc.secs-2), "refused/10s")
	b.ReportMetric(float64(rec.Refused(0, run+time.Second)), "refused")
	for _, p := range sc.phases {
		d, _ := rec.Follow(p.from, p.to, p.limit)
		b.ReportMetric(d.Seconds(), p.metric)
	}
	b.ReportMetric(float64(total.Pauses), "pauses")
	b.ReportMetric(float64(total.NotSent), "not-sent")
	var perSec []string
	for s := 0; s < sc.secs; s++ {
		from, to := time.Duration(s)*time.Second, time.Duration(s+1)*time.Second
		perSec = append(perSec, fmt.Sprintf("%d/%d", rec.Admitted(from, to), rec.Refused(from, to)))
	}
	b.Logf("%s: per second admitted/refused %v; clients sent %d, not sent %d, saw %d refused, %d pauses, %d lowered, %d failed open (the store's first failure: %s)",
		client, perSec, total.Sent, total.NotSent, total.Refused, total.Pauses, total.Lowered, total.FailedOpen, total.StoreError)
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
	var pauses, lowered, failedOpen, maxLearned atomic.Int64
	var send func(ctx context.Context) (*http.Response, error)
	var learned func() []middleware.Learned
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
		limits := []middleware.Limit{middleware.PerSecond(configured)}
		lim, err := middleware.NewRules([]middleware.Rule{{Name: "upstream", Key: outbound.Host(),
			Limits: limits, Sync: mode}},
			middleware.WithStore(store), middleware.WithPauses(), middleware.WithFailurePolicy(middleware.FailClosed), middleware.WithObserver(&middleware.Hooks{
				OnOutbound: func(e middleware.OutboundEvent) {
					switch e.Kind {
					case middleware.OutboundPaused:
						pauses.Add(1)
					case middleware.OutboundLowered:
						lowered.Add(1)
					case middleware.OutboundLearned:
						for n := maxLearned.Load(); int64(e.Units) > n && !maxLearned.CompareAndSwap(n, int64(e.Units)); n = maxLearned.Load() {
						}
					}
				},
				OnDecided: func(_ keyfunc.Request, res *middleware.Result) {
					if res.Outcome == middleware.OutcomeFailedOpen {
						failedOpen.Add(1)
					}
				},
				OnStoreFailed: func(_ keyfunc.Request, err error) {
					mu.Lock()
					if st.StoreError == "" {
						st.StoreError = err.Error()
					}
					mu.Unlock()
				}}))
		if err != nil {
			t.Fatal(err)
		}
		defer lim.Close()
		learned = lim.Learned
		maxPause, _ := time.ParseDuration(os.Getenv(outboundMaxPauseEnv))
		tr, err := outbound.New(lim, outbound.Options{Base: hc.Transport, MaxWait: 5 * time.Second, MaxPause: maxPause})
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
	if os.Getenv("SLUICE_OUTBOUND_DEBUG") != "" && learned != nil {
		for _, l := range learned() {
			fmt.Fprintf(os.Stderr, "learned %+v\n", l)
		}
	}
	st.Pauses, st.Lowered, st.FailedOpen, st.MaxLearned = int(pauses.Load()), int(lowered.Load()), int(failedOpen.Load()), int(maxLearned.Load())
	out, _ := json.Marshal(st)
	fmt.Printf("stats %s\n", out)
}
