package outbound_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/adapters/outbound"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/internal/schedlag"
	"github.com/sluicehq/sluice/internal/testclock"
	"github.com/sluicehq/sluice/keyfunc"
	"github.com/sluicehq/sluice/middleware"
)

func TestMain(m *testing.M) { redistest.Main(m) }

// upstream is an httptest server that records what reaches it and answers
// with serve (200 when nil).
type upstream struct {
	*httptest.Server
	mu       sync.Mutex
	arrivals []arrival
	serve    func(w http.ResponseWriter, r *http.Request, n int) // n: this request's number, from 1
}

type arrival struct {
	at     time.Time
	tag    string // the X-Tag header
	status int
}

func newUpstream(t *testing.T, serve func(w http.ResponseWriter, r *http.Request, n int)) *upstream {
	u := &upstream{serve: serve}
	u.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rec := &statusRecorder{ResponseWriter: w, status: 200}
		u.mu.Lock()
		n := len(u.arrivals) + 1
		u.arrivals = append(u.arrivals, arrival{at: time.Now(), tag: r.Header.Get("X-Tag")})
		u.mu.Unlock()
		if u.serve != nil {
			u.serve(rec, r, n)
		}
		u.mu.Lock()
		u.arrivals[n-1].status = rec.status
		u.mu.Unlock()
	}))
	t.Cleanup(u.Close)
	return u
}

type statusRecorder struct {
	http.ResponseWriter
	status int
}

func (s *statusRecorder) WriteHeader(code int) {
	s.status = code
	s.ResponseWriter.WriteHeader(code)
}

func (s *statusRecorder) Flush() { s.ResponseWriter.(http.Flusher).Flush() }

// got returns the arrivals so far.
func (u *upstream) got() []arrival {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]arrival(nil), u.arrivals...)
}

// refused counts the arrivals answered 429.
func (u *upstream) refused() int {
	n := 0
	for _, a := range u.got() {
		if a.status == http.StatusTooManyRequests {
			n++
		}
	}
	return n
}

func newLimiter(t *testing.T, rules []middleware.Rule, opts ...middleware.Option) *middleware.Limiter {
	t.Helper()
	lim, err := middleware.NewRules(rules, append([]middleware.Option{middleware.WithPauses()}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = lim.Close() })
	return lim
}

func newClient(t *testing.T, lim *middleware.Limiter, o outbound.Options) *http.Client {
	t.Helper()
	tr, err := outbound.New(lim, o)
	if err != nil {
		t.Fatal(err)
	}
	return &http.Client{Transport: tr}
}

func hostRule(limits ...middleware.Limit) []middleware.Rule {
	return []middleware.Rule{{Name: "upstream", Key: outbound.Host(), Limits: limits}}
}

// get sends a GET of url tagged tag with ctx; it returns the status, or
// the error.
func get(ctx context.Context, c *http.Client, url, tag string) (int, error) {
	req, err := http.NewRequestWithContext(ctx, "GET", url, nil)
	if err != nil {
		return 0, err
	}
	req.Header.Set("X-Tag", tag)
	resp, err := c.Do(req)
	if err != nil {
		return 0, err
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode, nil
}

// TestWaitInOrder: requests of one key that the limit holds back go out
// in the order they came, each at its turn, none before. Each request is
// sent once the one before it waits in the queue (or has gone), and the
// order is the Limiter's: its admissions, each made while the request is
// first in the queue and so before the next can be admitted. (The order
// of arrival at the upstream is the network's: on a loaded machine a
// request sent 50 ms after another may overtake it.)
func TestWaitInOrder(t *testing.T) {
	t.Parallel()
	up := newUpstream(t, nil)
	var waits atomic.Int64
	var mu sync.Mutex
	var admitted []admission
	denied := map[string]bool{}
	lim := newLimiter(t, hostRule(middleware.PerSecond(20).TokenBucket(1)), middleware.WithObserver(&middleware.Hooks{
		OnOutbound: func(e middleware.OutboundEvent) {
			if e.Kind == middleware.OutboundWaited && e.Rule == "upstream" {
				waits.Add(1)
			}
		},
		OnDecided: func(r keyfunc.Request, res *middleware.Result) {
			mu.Lock()
			defer mu.Unlock()
			if res.Allowed {
				admitted = append(admitted, admission{time.Now(), r.Header("X-Tag")})
			} else {
				denied[r.Header("X-Tag")] = true
			}
		},
	}))
	c := newClient(t, lim, outbound.Options{})
	tr := c.Transport.(*outbound.Transport)
	const n = 6
	var wg sync.WaitGroup
	errs := make(chan error, n)
	start := time.Now()
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := get(context.Background(), c, up.URL, strconv.Itoa(i)); err != nil {
				errs <- err
			}
		}()
		// Request i came once it waits in the queue or was admitted.
		for {
			mu.Lock()
			came := tr.Waiting()+len(admitted) > i
			mu.Unlock()
			if came || time.Since(start) > 10*time.Second {
				break
			}
			time.Sleep(time.Millisecond)
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if got := up.got(); len(got) != n {
		t.Fatalf("%d requests arrived, want %d", len(got), n)
	}
	mu.Lock()
	defer mu.Unlock()
	for i, a := range admitted {
		if a.tag != strconv.Itoa(i) {
			t.Fatalf("admission %d is request %s: order %v", i, a.tag, admitted)
		}
		// One every 50ms: request i no sooner than i × 50ms after the
		// first (less a little for the clocks' grain).
		if early := start.Add(time.Duration(i) * 45 * time.Millisecond); a.at.Before(early) {
			t.Errorf("request %d admitted %v after the start, before its turn", i, a.at.Sub(start))
		}
	}
	// Every request that was denied waited; one that came while others
	// waited waited behind them, and one that came to a full bucket with
	// nobody waiting (after a stall of this goroutine) did not.
	if w := waits.Load(); w < int64(max(len(denied), 1)) || w > n-1 {
		t.Errorf("%d waits reported, want %d to %d (%d requests denied once or more)", w, max(len(denied), 1), n-1, len(denied))
	}
}

func tags(as []arrival) []string {
	var out []string
	for _, a := range as {
		out = append(out, a.tag)
	}
	return out
}

// admission is a request the Limiter admitted, when, by its X-Tag.
type admission struct {
	at  time.Time
	tag string
}

// TestWaitBounded: a request whose turn would come after its deadline, or
// after MaxWait, fails at once with a WaitError and is not sent; one whose
// caller gives up while it waits fails with the context's error; a
// request that costs more than the limit fails at once.
func TestWaitBounded(t *testing.T) {
	t.Parallel()
	up := newUpstream(t, nil)
	var gaveUp atomic.Int64
	// The Limiter's clock stands still: the bucket emptied by the burst
	// does not refill however late the requests after it come (at real
	// time, 50 ms of delay brought the next turn within MaxWait).
	clock := testclock.New(time.Now())
	lags := schedlag.Start(t)
	lim := newLimiter(t, []middleware.Rule{{Name: "slow", Key: outbound.Host(), CostFunc: outbound.Cost,
		Limits: []middleware.Limit{middleware.PerSecond(5).TokenBucket(2)}}},
		middleware.WithClock(clock.Now),
		middleware.WithObserver(&middleware.Hooks{OnOutbound: func(e middleware.OutboundEvent) {
			if e.Kind == middleware.OutboundGaveUp {
				gaveUp.Add(1)
			}
		}}))
	c := newClient(t, lim, outbound.Options{MaxWait: 150 * time.Millisecond})
	ctx := context.Background()
	for i := range 2 {
		if _, err := get(ctx, c, up.URL, fmt.Sprint("burst", i)); err != nil {
			t.Fatal(err)
		}
	}
	// The bucket is empty: the next turn is 200ms away, past MaxWait.
	began := time.Now()
	_, err := get(ctx, c, up.URL, "late")
	var we *outbound.WaitError
	if !errors.As(err, &we) || !errors.Is(err, outbound.ErrTooLong) || we.Rule != "slow" {
		t.Fatalf("past MaxWait: %v, want a WaitError of rule slow with ErrTooLong", err)
	}
	if took, lag := time.Since(began), lags.Worst(began, time.Now()); took > 100*time.Millisecond+lag {
		t.Errorf("a request that could not fit took %v to fail (scheduling lag up to %v); want at once", took, lag)
	}
	if we.RetryAfter <= 150*time.Millisecond || !we.Timeout() {
		t.Errorf("WaitError %+v: want RetryAfter past MaxWait and Timeout()", we)
	}
	var ue *url.Error
	if !errors.As(err, &ue) || !ue.Timeout() {
		t.Errorf("the client's error %v: want a url.Error that reports a timeout", err)
	}
	// A deadline shorter than MaxWait binds too.
	dctx, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
	defer cancel()
	if _, err := get(dctx, c, up.URL, "deadline"); !errors.Is(err, outbound.ErrTooLong) {
		t.Errorf("past the deadline: %v, want ErrTooLong", err)
	}
	// The caller gives up while its request waits (its turn is 200ms
	// away: make it wait with a longer MaxWait).
	patient := newClient(t, lim, outbound.Options{MaxWait: time.Second})
	cctx, cancelWait := context.WithCancel(ctx)
	time.AfterFunc(30*time.Millisecond, cancelWait)
	if _, err := get(cctx, patient, up.URL, "canceled"); !errors.Is(err, context.Canceled) || !errors.As(err, &we) {
		t.Errorf("canceled while waiting: %v, want a WaitError with context.Canceled", err)
	}
	// Costlier than the bucket holds: no wait would help.
	if _, err := get(outbound.WithCost(ctx, 3), patient, up.URL, "costly"); !errors.Is(err, outbound.ErrTooCostly) || !errors.As(err, &we) || we.RetryAfter != -1 {
		t.Errorf("cost over the limit: %v, want ErrTooCostly with RetryAfter -1", err)
	}
	// A transport that never waits.
	never := newClient(t, lim, outbound.Options{MaxWait: -1})
	if _, err := get(ctx, never, up.URL, "never"); !errors.Is(err, outbound.ErrTooLong) {
		t.Errorf("MaxWait < 0 with the budget spent: %v, want ErrTooLong", err)
	}
	for _, a := range up.got() {
		if a.tag != "burst0" && a.tag != "burst1" {
			t.Errorf("request %s was sent", a.tag)
		}
	}
	if n := gaveUp.Load(); n != 4 {
		t.Errorf("%d requests reported as given up, want 4 (late, deadline, canceled, never)", n)
	}
}

// TestMaxWaiting: past MaxWaiting requests waiting, one more fails at
// once.
func TestMaxWaiting(t *testing.T) {
	t.Parallel()
	up := newUpstream(t, nil)
	lim := newLimiter(t, hostRule(middleware.PerMinute(1)))
	tr, err := outbound.New(lim, outbound.Options{MaxWait: time.Hour, MaxWaiting: 2})
	if err != nil {
		t.Fatal(err)
	}
	c := &http.Client{Transport: tr}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if _, err := get(ctx, c, up.URL, "first"); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for i := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := get(ctx, c, up.URL, fmt.Sprint("waiter", i)); !errors.Is(err, context.Canceled) {
				t.Errorf("waiter: %v, want context.Canceled", err)
			}
		}()
	}
	for deadline := time.Now().Add(5 * time.Second); tr.Waiting() < 2; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d requests waiting, want 2", tr.Waiting())
		}
	}
	if _, err := get(ctx, c, up.URL, "third"); !errors.Is(err, outbound.ErrTooManyWaiting) {
		t.Errorf("a third waiter: %v, want ErrTooManyWaiting", err)
	}
	cancel()
	wg.Wait()
	if n := tr.Waiting(); n != 0 {
		t.Errorf("%d requests still waiting after they gave up", n)
	}
	if n := len(up.got()); n != 1 {
		t.Errorf("%d requests sent, want 1", n)
	}
}

// TestConcurrencySlot: a concurrency limit holds a request until the
// response of the one before it is closed, and lets it go then, without
// waiting out ConcurrencyRetryAfter.
func TestConcurrencySlot(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request, n int) {
		if n == 1 {
			w.(http.Flusher).Flush()
			<-release
		}
	})
	lim := newLimiter(t, []middleware.Rule{{Name: "one", Key: outbound.Host(), Concurrency: 1}})
	c := newClient(t, lim, outbound.Options{})
	resp, err := c.Get(up.URL)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan time.Time)
	go func() {
		if _, err := get(context.Background(), c, up.URL, "second"); err != nil {
			t.Error(err)
		}
		done <- time.Now()
	}()
	time.Sleep(50 * time.Millisecond)
	if n := len(up.got()); n != 1 {
		t.Fatalf("%d requests reached the upstream while the first held the slot", n)
	}
	close(release)
	_, _ = io.Copy(io.Discard, resp.Body)
	closed := time.Now()
	resp.Body.Close()
	if at := <-done; at.Sub(closed) > middleware.ConcurrencyRetryAfter/2 {
		t.Errorf("the second request went %v after the slot came back", at.Sub(closed))
	}
}

// TestNew: construction errors say what is wrong.
func TestNew(t *testing.T) {
	t.Parallel()
	plain, err := middleware.NewRules(hostRule(middleware.PerSecond(1)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = plain.Close() })
	paused := newLimiter(t, hostRule(middleware.PerSecond(1)))
	for _, tc := range []struct {
		lim *middleware.Limiter
		o   outbound.Options
		ok  bool
	}{
		{nil, outbound.Options{}, false},
		{plain, outbound.Options{}, false},
		{plain, outbound.Options{IgnoreUpstream: true}, true},
		{paused, outbound.Options{}, true},
		{paused, outbound.Options{MaxPause: -1}, false},
		{paused, outbound.Options{MaxWaiting: -1}, false},
	} {
		if _, err := outbound.New(tc.lim, tc.o); (err == nil) != tc.ok {
			t.Errorf("New(%v, %+v): %v, want ok %v", tc.lim != nil, tc.o, err, tc.ok)
		}
	}
}

// TestRequest: what rules and key functions see of an outgoing request.
func TestRequest(t *testing.T) {
	t.Parallel()
	var seen []string
	probe := func(r keyfunc.Request) (string, error) {
		req, ok := outbound.HTTPRequest(r)
		q, _ := r.(keyfunc.QueryRequest)
		seen = append(seen, r.Method(), r.Path(), r.Route(), r.RemoteAddr(), r.Header("Host"), r.Header("X-Tenant"),
			fmt.Sprint(r.Values("host")), q.Query("page"), fmt.Sprint(ok && req.URL.Path == r.Path()))
		return "k", nil
	}
	up := newUpstream(t, nil)
	lim := newLimiter(t, []middleware.Rule{{Name: "probe", Path: "/repos/{owner}/*", Methods: []string{"POST"},
		Headers: map[string]string{"Host": "ignored.example"}, Key: probe, Limits: []middleware.Limit{middleware.PerSecond(1)}},
		{Name: "probe2", Path: "/repos/{owner}/*", Methods: []string{"POST"}, Key: probe, Limits: []middleware.Limit{middleware.PerSecond(100)}}})
	c := newClient(t, lim, outbound.Options{})
	req, _ := http.NewRequest("POST", up.URL+"/repos/acme/app?page=2", nil)
	req.Header.Set("X-Tenant", "t1")
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	host := up.Listener.Addr().String()
	want := []string{"POST", "/repos/acme/app", "", "", host, "t1", "[" + host + "]", "2", "true"}
	if fmt.Sprint(seen) != fmt.Sprint(want) {
		t.Errorf("the rule saw %q\nwant %q", seen, want)
	}

	for _, tc := range []struct {
		fn   keyfunc.Func
		ctx  context.Context
		url  string
		want string
		err  bool
	}{
		{outbound.Host(), context.Background(), "https://API.GitHub.com/repos", "host:api.github.com", false},
		{outbound.Host(), context.Background(), "http://127.0.0.1:8080/", "host:127.0.0.1:8080", false},
		{outbound.FromContext(), outbound.WithKey(context.Background(), "tenant|42"), "http://x/", "ctx:tenant%7C42", false},
		{outbound.FromContext(), outbound.WithKey(context.Background(), string(make([]byte, 200))), "http://x/", "ctx#", false},
		{outbound.FromContext(), context.Background(), "http://x/", "", true},
		{keyfunc.Join(outbound.Host(), outbound.FromContext()), outbound.WithKey(context.Background(), "t"), "http://a.example/", "host:a.example|ctx:t", false},
	} {
		var got string
		var gotErr error
		capture := newLimiter(t, []middleware.Rule{{Name: "k", Key: func(r keyfunc.Request) (string, error) {
			got, gotErr = tc.fn(r)
			return "x", nil
		}, Limits: []middleware.Limit{middleware.PerSecond(100)}}})
		req, _ := http.NewRequestWithContext(tc.ctx, "GET", tc.url, nil)
		tr, _ := outbound.New(capture, outbound.Options{Base: roundTripFunc(func(*http.Request) (*http.Response, error) {
			return &http.Response{StatusCode: 200, Body: http.NoBody, Header: http.Header{}}, nil
		})})
		if _, err := tr.RoundTrip(req); err != nil {
			t.Fatal(err)
		}
		if (gotErr != nil) != tc.err || !errors.Is(gotErr, keyfunc.ErrNoKey) && tc.err || len(got) < len(tc.want) || got[:len(tc.want)] != tc.want {
			t.Errorf("%s: key %q, %v; want %q (error %v)", tc.url, got, gotErr, tc.want, tc.err)
		}
	}
	if _, ok := outbound.HTTPRequest(keyfunc.FromHTTP(httptest.NewRequest("GET", "/", nil))); ok {
		t.Error("HTTPRequest of an incoming request reported ok")
	}
	if n := outbound.Cost(keyfunc.FromHTTP(httptest.NewRequest("GET", "/", nil))); n != 1 {
		t.Errorf("Cost without WithCost = %d, want 1", n)
	}
}

// TestCloseIdleConnections: the client's CloseIdleConnections reaches the
// base transport.
func TestCloseIdleConnections(t *testing.T) {
	t.Parallel()
	base := &idleCloser{}
	tr, err := outbound.New(newLimiter(t, hostRule(middleware.PerSecond(1))), outbound.Options{Base: base})
	if err != nil {
		t.Fatal(err)
	}
	(&http.Client{Transport: tr}).CloseIdleConnections()
	if !base.closed.Load() {
		t.Error("the base transport's idle connections were not closed")
	}
}

type idleCloser struct {
	http.Transport
	closed atomic.Bool
}

func (c *idleCloser) CloseIdleConnections() { c.closed.Store(true) }

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// TestNotSentOnError: a request the Limiter cannot decide is not sent, and
// its body is closed.
func TestNotSentOnError(t *testing.T) {
	t.Parallel()
	up := newUpstream(t, nil)
	lim := newLimiter(t, []middleware.Rule{{Name: "tenant", Key: outbound.FromContext(), Limits: []middleware.Limit{middleware.PerSecond(10)}}})
	c := newClient(t, lim, outbound.Options{})
	b := &closeRecorder{}
	req, _ := http.NewRequest("POST", up.URL, b)
	if _, err := c.Do(req); !errors.Is(err, keyfunc.ErrNoKey) {
		t.Fatalf("no key: %v, want ErrNoKey", err)
	}
	if !b.closed.Load() {
		t.Error("the body of a request not sent was not closed")
	}
	if n := len(up.got()); n != 0 {
		t.Errorf("%d requests sent", n)
	}
}

type closeRecorder struct{ closed atomic.Bool }

func (c *closeRecorder) Read([]byte) (int, error) { return 0, io.EOF }
func (c *closeRecorder) Close() error             { c.closed.Store(true); return nil }
