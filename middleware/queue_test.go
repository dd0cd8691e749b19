package middleware_test

import (
	"context"
	"errors"
	"net/http/httptest"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/internal/schedlag"
	"github.com/sluicehq/sluice/internal/testclock"
	"github.com/sluicehq/sluice/keyfunc"
	"github.com/sluicehq/sluice/middleware"
)

// queueLimiter limits every request to rate a second through a leaky
// bucket with a queue of queue and waits of at most maxDelay.
func queueLimiter(t *testing.T, store middleware.Store, rate, queue int, maxDelay time.Duration, opts ...middleware.Option) *middleware.Limiter {
	t.Helper()
	if store != nil {
		opts = append(opts, middleware.WithStore(store))
	}
	lim, err := middleware.NewRules([]middleware.Rule{{Name: "smooth", Key: keyfunc.Global(),
		Limits: []middleware.Limit{middleware.PerSecond(rate).LeakyBucket(queue, maxDelay)}}}, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lim.Close() })
	return lim
}

// still is the option of a Limiter whose clock stands still, for the tests
// of a burst "at once": their decisions are all made at one instant,
// however late a loaded machine runs their goroutines (at real time,
// requests that came 50 ms apart found the queue one shorter). The waits
// for the turns they are given are real.
func still() middleware.Option {
	return middleware.WithClock(testclock.New(time.Now()).Now)
}

// burstThroughQueue sends n requests at once and returns, for each one
// admitted, when Decide returned (relative to the start, sorted), and how
// many were denied.
func burstThroughQueue(t *testing.T, lim *middleware.Limiter, n int) (released []time.Duration, denied int) {
	t.Helper()
	var mu sync.Mutex
	var wg sync.WaitGroup
	start := time.Now()
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, err := lim.Decide(keyfunc.FromHTTP(httptest.NewRequest("GET", "/", nil)))
			took := time.Since(start)
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err != nil:
				t.Error(err)
			case res.Allowed:
				released = append(released, took)
				if res.Delay > 0 && took < res.Delay {
					t.Errorf("returned after %v, before its Delay %v", took, res.Delay)
				}
			default:
				denied++
				if res.RetryAfter <= 0 {
					t.Errorf("denied with RetryAfter %v", res.RetryAfter)
				}
			}
		}()
	}
	wg.Wait()
	slices.Sort(released)
	return released, denied
}

// checkSchedule checks that released follows a schedule of one request
// every interval from the first, each within slack of its turn, and of
// how late this process ran the first and it (lags, over the run): a
// goroutine that starts late, or a timer that fires late, releases late.
func checkSchedule(t *testing.T, released []time.Duration, interval, slack time.Duration, lags *schedlag.Log) {
	t.Helper()
	slack += 2 * lags.Max()
	for i := 1; i < len(released); i++ {
		turn := released[0] + time.Duration(i)*interval
		if d := released[i] - turn; d < -slack || d > slack {
			t.Errorf("request %d released at %v, its turn is %v (±%v, with scheduling lag); all: %v", i, released[i], turn, slack, released)
		}
	}
}

// TestQueueReleasesAtTheRate: 10 requests at once on 20 a second with a
// queue of 6: one at once, six waiting and released 50 ms apart, three
// denied because the queue is full.
func TestQueueReleasesAtTheRate(t *testing.T) {
	t.Parallel()
	lim := queueLimiter(t, nil, 20, 6, 0, still())
	lags := schedlag.Start(t)
	released, denied := burstThroughQueue(t, lim, 10)
	if len(released) != 7 || denied != 3 {
		t.Fatalf("%d released, %d denied; want 7 and 3 (one served, a queue of 6)", len(released), denied)
	}
	checkSchedule(t, released, 50*time.Millisecond, 25*time.Millisecond, lags)
}

// TestQueueMaxDelay: waits beyond MaxDelay are refused even if the queue
// has room.
func TestQueueMaxDelay(t *testing.T) {
	t.Parallel()
	lim := queueLimiter(t, nil, 20, 100, 120*time.Millisecond, still())
	released, denied := burstThroughQueue(t, lim, 10)
	// Turns at 0, 50 and 100 ms; 150 ms is beyond 120 ms.
	if len(released) != 3 || denied != 7 {
		t.Fatalf("%d released, %d denied; want 3 and 7", len(released), denied)
	}
}

// TestQueueCancelGivesBack: a waiting request whose client goes away
// returns ErrGaveUp at once and gives its place back: the next request
// takes it instead of queueing behind it.
func TestQueueCancelGivesBack(t *testing.T) {
	t.Parallel()
	// 2 a second: turns 500 ms apart.
	lim := queueLimiter(t, nil, 2, 3, 0)
	first, err := lim.Decide(keyfunc.FromHTTP(httptest.NewRequest("GET", "/", nil)))
	if err != nil || !first.Allowed || first.Delay != 0 {
		t.Fatalf("first: %+v %v", first, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	start := time.Now()
	go func() {
		_, err := lim.Decide(keyfunc.FromHTTP(httptest.NewRequest("GET", "/", nil).WithContext(ctx)))
		done <- err
	}()
	time.Sleep(50 * time.Millisecond)
	cancel()
	if err := <-done; !errors.Is(err, middleware.ErrGaveUp) || time.Since(start) > 300*time.Millisecond {
		t.Fatalf("canceled waiter: %v after %v; want ErrGaveUp at once", err, time.Since(start))
	}
	// Its place (the turn at 500 ms) is free again: the next request gets
	// it, not the turn at 1 s.
	res, err := lim.Decide(keyfunc.FromHTTP(httptest.NewRequest("GET", "/", nil)))
	if err != nil || !res.Allowed {
		t.Fatalf("after the give-back: %+v %v", res, err)
	}
	if res.Delay > 500*time.Millisecond {
		t.Errorf("next request waited %v; want the place given back (at most 500 ms)", res.Delay)
	}
}

// TestQueueMaxWaiting: beyond WithMaxWaiting requests waiting in the whole
// limiter, a request is denied at once and its place given back.
func TestQueueMaxWaiting(t *testing.T) {
	t.Parallel()
	lim := queueLimiter(t, nil, 10, 50, 0, middleware.WithMaxWaiting(3), still())
	lags := schedlag.Start(t)
	released, denied := burstThroughQueue(t, lim, 8)
	// One served at once, three waiting; the other four refused.
	if len(released) != 4 || denied != 4 {
		t.Fatalf("%d released, %d denied; want 4 and 4", len(released), denied)
	}
	checkSchedule(t, released, 100*time.Millisecond, 50*time.Millisecond, lags)
}

// TestQueueOnRedis: four app servers share one queue per key on a real
// Redis: ten requests at once spread over them are released at the rate,
// with the queue's bound, and a canceled waiter gives its place back.
func TestQueueOnRedis(t *testing.T) {
	t.Parallel()
	srv := redistest.Shared(t)
	prefix := srv.Prefix(t)
	// One clock, standing still, for the four app servers: the burst is
	// decided at one instant.
	opt := still()
	lags := schedlag.Start(t)
	var lims []*middleware.Limiter
	for range 4 {
		s, err := middleware.NewRedisStore(srv.Client(t, nil), middleware.RedisConfig{Prefix: prefix, StallThreshold: 2 * time.Second, Timeout: 5 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		closeStore(t, s)
		lims = append(lims, queueLimiter(t, s, 20, 6, 0, opt))
	}
	var mu sync.Mutex
	var released []time.Duration
	denied := 0
	var wg sync.WaitGroup
	start := time.Now()
	for i := range 10 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, err := lims[i%4].Decide(keyfunc.FromHTTP(httptest.NewRequest("GET", "/", nil)))
			took := time.Since(start)
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err != nil:
				t.Error(err)
			case res.Allowed:
				released = append(released, took)
			default:
				denied++
			}
		}()
	}
	wg.Wait()
	slices.Sort(released)
	if len(released) != 7 || denied != 3 {
		t.Fatalf("%d released, %d denied; want 7 and 3", len(released), denied)
	}
	checkSchedule(t, released, 50*time.Millisecond, 30*time.Millisecond, lags)

	// Give-back, on counters of their own (a new prefix), at 2 a second.
	s, err := middleware.NewRedisStore(srv.Client(t, nil), middleware.RedisConfig{Prefix: srv.Prefix(t), StallThreshold: 2 * time.Second, Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	closeStore(t, s)
	lim := queueLimiter(t, s, 2, 3, 0)
	if res, err := lim.Decide(keyfunc.FromHTTP(httptest.NewRequest("GET", "/", nil))); err != nil || res.Delay != 0 {
		t.Fatalf("first: %+v %v", res, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := lim.Decide(keyfunc.FromHTTP(httptest.NewRequest("GET", "/", nil).WithContext(ctx)))
		done <- err
	}()
	time.Sleep(50 * time.Millisecond)
	cancel()
	if err := <-done; !errors.Is(err, middleware.ErrGaveUp) {
		t.Fatalf("canceled waiter: %v", err)
	}
	res, err := lim.Decide(keyfunc.FromHTTP(httptest.NewRequest("GET", "/", nil)))
	if err != nil || !res.Allowed || res.Delay > 500*time.Millisecond {
		t.Fatalf("after the give-back: %+v %v; want the place given back (a wait of at most 500 ms)", res, err)
	}
}
