package redispipe

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/delayproxy"
	"github.com/sluicehq/sluice/internal/redistest"
)

// TestSlowServer delays every byte between the client and a standalone
// Redis by 100 ms each way, a round trip of twice Config.Bound: the
// destination goes slow (ErrSlow), not down; calls with the bound's
// deadline then fail at once with an error that wraps ErrUnavailable and
// ErrSlow, while a call whose deadline leaves room for the round trip
// (a background sync's) is still served; Servers reports it slow; and
// once the link is fast again, calls succeed within a second.
func TestSlowServer(t *testing.T) {
	t.Parallel()
	srv := redistest.Standalone(t)
	proxy := delayproxy.Start(t, srv.Addr(), 0)
	c := redis.NewClient(&redis.Options{Addr: proxy.Addr()})
	t.Cleanup(func() { _ = c.Close() })
	var log stateLog
	p := newPipeliner(t, c, Config{OnStateChange: log.record, Bound: callerTimeout})
	key := srv.Prefix(t) + "slow"
	warm(t, p, key)
	lag := newLagMeter(t)
	call := func(within time.Duration) (time.Duration, error) {
		start := time.Now()
		_, err := p.RunBy(context.Background(), start.Add(within), decide, []string{key}, decideArgs...)
		return time.Since(start), err
	}

	proxy.SetDelay(100 * time.Millisecond)
	slowAt := proxy.ChangedAt()
	for {
		took, err := call(callerTimeout)
		if errors.Is(err, ErrSlow) {
			break
		}
		if err == nil {
			t.Fatalf("a call succeeded in %v with a round trip of 200 ms and a deadline of %v", took, callerTimeout)
		}
		if time.Since(slowAt) > 3*time.Second {
			t.Fatalf("not found slow within 3 s; last call: %v after %v", err, took)
		}
		if took > callerTimeout+25*time.Millisecond+lag.Max() {
			lag.timing(t, "a call took %v against a deadline of %v", took, callerTimeout)
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Logf("found slow %v after the link slowed down", time.Since(slowAt).Round(time.Millisecond))
	for _, e := range log.list() {
		t.Logf("%v after: up %v, %v", e.at.Sub(slowAt).Round(time.Millisecond), e.up, e.cause)
		if !e.up && !errors.Is(e.cause, ErrSlow) && !errors.Is(e.cause, ErrStalled) {
			t.Errorf("went down for %v, want slow (or stalled, then slow)", e.cause)
		}
	}
	st := p.Servers()
	if len(st) != 1 || st[0].Up || !st[0].Slow || !errors.Is(st[0].Cause, ErrSlow) {
		t.Errorf("Servers() = %+v, want one, slow", st)
	}
	for range 5 {
		took, err := call(callerTimeout)
		if !isUnavailable(err) || !errors.Is(err, ErrSlow) {
			t.Errorf("a call for the slow server: %v, want ErrUnavailable and ErrSlow", err)
		}
		if took > 10*time.Millisecond {
			lag.timing(t, "a call for the slow server took %v, want it to fail at once", took)
		}
	}
	if took, err := call(2 * time.Second); err != nil {
		t.Errorf("a call whose deadline leaves room for the round trip: %v after %v, want it served", err, took)
	}

	proxy.SetDelay(0)
	fastAt := proxy.ChangedAt()
	up, ok := firstSuccess(p, key, 3*time.Second)
	if !ok {
		t.Fatal("no success within 3 s of the link being fast")
	}
	t.Logf("calls succeed again %v after the link is fast", up.Sub(fastAt).Round(time.Millisecond))
	if d := up.Sub(fastAt); d > time.Second {
		lag.timing(t, "calls succeed again %v after the link is fast, want within 1 s", d)
	}
	ev := log.list()
	if last := ev[len(ev)-1]; !last.up {
		t.Errorf("last state change %+v, want up", last)
	}
}
