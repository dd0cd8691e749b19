package redispipe

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/redistest"
)

const (
	// callerTimeout is the time limit of each call in these tests, the
	// store's default.
	callerTimeout = 100 * time.Millisecond
	// slowCall is a wait that counts as not failing fast.
	slowCall = 50 * time.Millisecond
	// hungCall is the longest a call may wait for a server that hangs:
	// the stall threshold, then a PING that goes unanswered (verifyWait
	// on a quiet machine), and some slack.
	hungCall = 100 * time.Millisecond
	// handful is how many calls may wait longer than slowCall when a
	// destination goes down: those of the batches in flight and queued,
	// and stragglers of a busy machine.
	handful = 8
	// recoveryBound is how soon a destination must be used again once its
	// server accepts connections.
	recoveryBound = 500 * time.Millisecond
	// warmup is how long the load runs before a server fails: time for
	// the adaptive stall threshold to learn the usual batch time.
	warmup = time.Second
)

// outcome is what a load generator saw of one call.
type outcome struct {
	key  string
	took time.Duration
	err  error
}

// load runs calls for keys from goroutines per key until stop is closed,
// each with callerTimeout, and returns what it saw.
func load(p *Pipeliner, keys []string, perKey int, stop <-chan struct{}) func() []outcome {
	var mu sync.Mutex
	var out []outcome
	var wg sync.WaitGroup
	for _, key := range keys {
		for g := 0; g < perKey; g++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				var mine []outcome
				for i := 0; i < 1_000_000; i++ {
					select {
					case <-stop:
						mu.Lock()
						out = append(out, mine...)
						mu.Unlock()
						return
					default:
					}
					ctx, cancel := context.WithTimeout(context.Background(), callerTimeout)
					start := time.Now()
					_, err := runDecide(ctx, p, key)
					took := time.Since(start)
					cancel()
					mine = append(mine, outcome{key, took, err})
					if err != nil {
						// A client failing open would go on; pace the
						// loop so that it does not spin.
						time.Sleep(time.Millisecond)
					}
				}
			}()
		}
	}
	return func() []outcome {
		wg.Wait()
		return out
	}
}

// summary counts outcomes.
type summary struct {
	// late counts the calls that ended at their deadline, other those
	// that failed neither for that nor with ErrUnavailable.
	calls, ok, unavailable, late, other, slow int
	firstOther                                error
	latencies                                 []time.Duration
}

func summarize(out []outcome, slowBound time.Duration, keep func(key string) bool) summary {
	var s summary
	for _, o := range out {
		if !keep(o.key) {
			continue
		}
		s.calls++
		s.latencies = append(s.latencies, o.took)
		if o.took > slowBound {
			s.slow++
		}
		switch {
		case o.err == nil:
			s.ok++
		case isUnavailable(o.err):
			s.unavailable++
		case errors.Is(o.err, context.DeadlineExceeded):
			s.late++
		default:
			s.other++
			if s.firstOther == nil {
				s.firstOther = o.err
			}
		}
	}
	return s
}

// firstSuccess calls key every 5 ms until a call succeeds, for at most
// within, and returns when it did.
func firstSuccess(p *Pipeliner, key string, within time.Duration) (time.Time, bool) {
	deadline := time.Now().Add(within)
	for time.Now().Before(deadline) {
		ctx, cancel := context.WithTimeout(context.Background(), callerTimeout)
		_, err := runDecide(ctx, p, key)
		cancel()
		if err == nil {
			return time.Now(), true
		}
		time.Sleep(5 * time.Millisecond)
	}
	return time.Time{}, false
}

// TestStallMarksDown hangs the server (SIGSTOP) under load: calls must
// fail fast with ErrUnavailable after the first stall (a batch outstanding
// past the stall threshold and a PING unanswered), none may wait more
// than hungCall, and the server must
// be used again soon after it resumes. The client has go-redis's default
// options, whose ReadTimeout is 3 s.
func TestStallMarksDown(t *testing.T) {
	t.Parallel()
	srv := redistest.Standalone(t)
	prefix := srv.Prefix(t)
	c := srv.Client(t, &redis.Options{PoolSize: 128})
	var log stateLog
	p := newPipeliner(t, c, Config{OnStateChange: log.record})
	keys := []string{prefix + "a", prefix + "b", prefix + "c", prefix + "d"}
	warm(t, p, keys[0])

	lag := newLagMeter(t)
	stop := make(chan struct{})
	wait := load(p, keys, 16, stop)
	time.Sleep(warmup)
	if err := srv.Pause(); err != nil {
		t.Fatal(err)
	}
	pausedAt := time.Now()
	time.Sleep(400 * time.Millisecond)
	if err := srv.Resume(); err != nil {
		t.Fatal(err)
	}
	resumedAt := time.Now()
	close(stop)
	out := wait()

	var during []outcome
	for _, o := range out {
		// Calls that started while the server was paused; a call's start
		// is its end minus its duration, which the outcome lacks, so keep
		// the failures and the slow calls, which can only be those.
		if o.err != nil || o.took > hungCall {
			during = append(during, o)
		}
	}
	s := summarize(during, hungCall, func(string) bool { return true })
	t.Logf("while paused: %d calls failed fast or were slow: %d unavailable, %d at their deadline, %d other errors, %d waited more than %s (p50 %s, max %s); worst scheduling lag %s",
		s.calls, s.unavailable, s.late, s.other, s.slow, hungCall, percentile(s.latencies, 0.5), percentile(s.latencies, 1), lag.Max())
	if s.unavailable == 0 {
		t.Error("no call failed with ErrUnavailable while the server was paused")
	}
	if s.other > 0 {
		t.Errorf("%d calls failed otherwise, e.g. %v", s.other, s.firstOther)
	}
	if s.late > 0 {
		lag.timing(t, "%d calls waited for their deadline", s.late)
	}
	if s.slow > handful {
		lag.timing(t, "%d calls waited more than %s for a hung server", s.slow, hungCall)
	}

	up, ok := firstSuccess(p, keys[0], 2*time.Second)
	if !ok {
		t.Fatal("no success within 2 s of the resume")
	}
	t.Logf("first success %s after the resume", up.Sub(resumedAt).Round(time.Millisecond))
	ev := log.list()
	if len(ev) < 2 || ev[0].up || !errors.Is(ev[0].cause, ErrStalled) || !ev[len(ev)-1].up {
		t.Fatalf("state changes %+v, want down (stalled), ..., up", ev)
	}
	t.Logf("marked down %s after the pause", ev[0].at.Sub(pausedAt).Round(time.Millisecond))
	if d := ev[0].at.Sub(pausedAt); d > hungCall {
		lag.timing(t, "marked down %s after the pause", d)
	}
	// The pause may have ended a while before the last changes: a batch
	// answered on resume marks the server up.
	if d := ev[len(ev)-1].at.Sub(resumedAt); d > recoveryBound {
		lag.timing(t, "up %s after the resume, want within %s", d, recoveryBound)
	}
}

// TestKilledServerRecovers kills the server under load and starts it
// again on the same port: calls fail fast meanwhile and succeed again
// within recoveryBound of the restart.
func TestKilledServerRecovers(t *testing.T) {
	t.Parallel()
	srv := redistest.Standalone(t)
	prefix := srv.Prefix(t)
	c := srv.Client(t, &redis.Options{PoolSize: 128})
	var log stateLog
	p := newPipeliner(t, c, Config{OnStateChange: log.record})
	keys := []string{prefix + "a", prefix + "b"}
	warm(t, p, keys[0])

	lag := newLagMeter(t)
	stop := make(chan struct{})
	wait := load(p, keys, 16, stop)
	time.Sleep(warmup)
	srv.Stop()
	time.Sleep(500 * time.Millisecond)
	close(stop)
	out := wait()
	s := summarize(out, slowCall, func(string) bool { return true })
	t.Logf("%d calls: %d ok, %d unavailable, %d at their deadline, %d other errors, %d waited more than %s; worst scheduling lag %s",
		s.calls, s.ok, s.unavailable, s.late, s.other, s.slow, slowCall, lag.Max())
	if s.unavailable == 0 {
		t.Error("no call failed with ErrUnavailable while the server was down")
	}
	if s.slow > handful {
		lag.timing(t, "%d calls waited more than %s for a dead server", s.slow, slowCall)
	}
	if s.late > handful {
		lag.timing(t, "%d calls waited for their deadline", s.late)
	}
	if s.other > handful {
		// The calls in flight when the server died may fail with its
		// connection error.
		t.Errorf("%d calls failed otherwise, e.g. %v", s.other, s.firstOther)
	}

	// Several probes have failed by now: the interval has grown to its
	// cap.
	if err := srv.Restart(); err != nil {
		t.Fatal(err)
	}
	restarted := time.Now()
	up, ok := firstSuccess(p, keys[0], 3*time.Second)
	if !ok {
		t.Fatal("no success within 3 s of the restart")
	}
	took := up.Sub(restarted)
	t.Logf("first success %s after the restart; state changes: %s", took.Round(time.Millisecond), describe(log.list()))
	if took > recoveryBound {
		lag.timing(t, "first success %s after the restart, want within %s", took, recoveryBound)
	}
}

// TestClusterNodeDown kills one master of a Cluster under load: its calls
// fail fast while the other masters' calls carry on, and it is used again
// soon after it comes back.
func TestClusterNodeDown(t *testing.T) {
	t.Parallel()
	cl := redistest.Cluster(t)
	prefix := cl.Prefix(t)
	ctx := context.Background()
	// Keep the other masters serving while one is down; by default a
	// Cluster refuses every command once it has agreed a node failed.
	for _, addr := range cl.Addrs() {
		n := redis.NewClient(&redis.Options{Addr: addr})
		err := n.ConfigSet(ctx, "cluster-require-full-coverage", "no").Err()
		_ = n.Close()
		if err != nil {
			t.Fatal(err)
		}
	}
	cc := cl.Client(t, &redis.ClusterOptions{PoolSize: 128})
	var log stateLog
	p := newPipeliner(t, cc, Config{OnStateChange: log.record})
	byNode := keysOnNodes(t, cc, prefix, 4)
	var victim *redistest.Server
	for _, n := range cl.Nodes() {
		if _, ok := byNode[n.Addr()]; ok {
			victim = n
			break
		}
	}
	var keys []string
	for _, ks := range byNode {
		keys = append(keys, ks...)
	}
	for _, k := range keys {
		warm(t, p, k)
	}
	onVictim := func(key string) bool {
		for _, k := range byNode[victim.Addr()] {
			if k == key {
				return true
			}
		}
		return false
	}

	lag := newLagMeter(t)
	stop := make(chan struct{})
	wait := load(p, keys, 4, stop)
	time.Sleep(warmup)
	victim.Stop()
	time.Sleep(time.Second)
	close(stop)
	out := wait()
	worstLag := lag.Max()

	dead := summarize(out, slowCall, onVictim)
	alive := summarize(out, slowCall, func(k string) bool { return !onVictim(k) })
	t.Logf("killed master %s: %d calls, %d ok, %d unavailable, %d at their deadline, %d other errors, %d waited more than %s; worst scheduling lag %s",
		victim.Addr(), dead.calls, dead.ok, dead.unavailable, dead.late, dead.other, dead.slow, slowCall, worstLag)
	t.Logf("other masters: %d calls, %d ok, %d failed, p50 %s, p99 %s",
		alive.calls, alive.ok, alive.calls-alive.ok, percentile(alive.latencies, 0.5), percentile(alive.latencies, 0.99))
	if dead.unavailable == 0 {
		t.Error("no call for the killed master failed with ErrUnavailable")
	}
	if dead.slow > handful {
		lag.timing(t, "%d calls for the killed master waited more than %s", dead.slow, slowCall)
	}
	if dead.other > handful {
		t.Errorf("%d calls for the killed master failed otherwise, e.g. %v", dead.other, dead.firstOther)
	}
	// A machine so busy that this process was not scheduled for longer
	// than the stall threshold makes live servers look hung too: then
	// only a few false stalls are tolerated.
	starved := worstLag >= MinStallThreshold
	falseStalls := 0
	for _, ev := range log.list() {
		if ev.dest == victim.Addr() {
			continue
		}
		if !ev.up {
			falseStalls++
		}
		if !starved || (!ev.up && !errors.Is(ev.cause, ErrStalled)) {
			t.Errorf("state change for %s, which was not killed: up %v, %v", ev.dest, ev.up, ev.cause)
		}
	}
	if alive.other > 0 {
		t.Errorf("%d calls for the other masters failed, e.g. %v", alive.other, alive.firstOther)
	}
	if alive.late > 0 {
		lag.timing(t, "%d calls for the other masters waited for their deadline", alive.late)
	}
	if alive.unavailable > 0 && (!starved || alive.unavailable > alive.calls/20) {
		t.Errorf("%d calls for the other masters failed with ErrUnavailable", alive.unavailable)
	}
	if starved {
		t.Logf("this process was not scheduled for up to %s: %d false stalls of live masters", worstLag, falseStalls)
	}

	if err := victim.Restart(); err != nil {
		t.Fatal(err)
	}
	restarted := time.Now()
	up, ok := firstSuccess(p, byNode[victim.Addr()][0], 5*time.Second)
	if !ok {
		t.Fatalf("no success within 5 s of the restart; state changes: %s", describe(log.list()))
	}
	time.Sleep(200 * time.Millisecond) // time to flap, if it would
	ev := log.list()
	t.Logf("state changes: %s", describe(ev))
	var upAt time.Time
	flaps := 0
	for _, e := range ev {
		if e.at.Before(restarted) {
			continue
		}
		if e.up && upAt.IsZero() {
			upAt = e.at
		} else if !e.up {
			flaps++
		}
	}
	if upAt.IsZero() && ev[len(ev)-1].up {
		upAt = ev[len(ev)-1].at // up before Restart returned
	}
	t.Logf("after the restart: marked up in %s, first success in %s (which also waits for the node to rejoin the Cluster)",
		upAt.Sub(restarted).Round(time.Millisecond), up.Sub(restarted).Round(time.Millisecond))
	if upAt.IsZero() || upAt.Sub(restarted) > recoveryBound {
		lag.timing(t, "not marked up within %s of the restart", recoveryBound)
	}
	if flaps > 0 || !ev[len(ev)-1].up {
		lag.timing(t, "down again %d times after the restart", flaps)
	}
}

// TestClusterFailover kills a master whose replica takes over: calls for
// its slots must move to the promoted replica soon after the promotion,
// long before go-redis's periodic reload of the slot map (60 s).
func TestClusterFailover(t *testing.T) {
	t.Parallel()
	cl := redistest.ClusterWithReplicas(t)
	prefix := cl.Prefix(t)
	ctx := context.Background()
	cc := cl.Client(t, &redis.ClusterOptions{PoolSize: 128})
	var log stateLog
	p := newPipeliner(t, cc, Config{OnStateChange: log.record})
	key := prefix + "{failover}:c"
	warm(t, p, key)
	lag := newLagMeter(t)
	master, err := cl.MasterForKey(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	if err := master.WaitReplicated(ctx); err != nil {
		t.Fatal(err)
	}

	var success atomic.Int64 // Unix ns of the latest success
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 1_000_000; i++ {
				select {
				case <-stop:
					return
				default:
				}
				cctx, cancel := context.WithTimeout(ctx, callerTimeout)
				_, err := runDecide(cctx, p, key)
				cancel()
				if err == nil {
					success.Store(time.Now().UnixNano())
				} else {
					time.Sleep(2 * time.Millisecond)
				}
			}
		}()
	}
	defer func() {
		close(stop)
		wg.Wait()
	}()
	time.Sleep(100 * time.Millisecond)
	master.Kill()
	killed := time.Now()
	promoted, took, err := cl.WaitFailover(ctx, master)
	if err != nil {
		t.Fatal(err)
	}
	agreed := time.Now()
	ok := waitFor(5*time.Second, func() bool { return success.Load() > agreed.UnixNano() })
	back := time.Since(agreed)
	t.Logf("failover to %s agreed %s after the kill; calls succeed again %s after that; state changes: %s",
		promoted.Addr(), took.Round(time.Millisecond), back.Round(time.Millisecond), describe(log.list()))
	if !ok {
		t.Fatal("no success within 5 s of the failover")
	}
	if back > time.Second {
		lag.timing(t, "calls succeeded again %s after the failover, want within 1 s", back)
	}
	_ = killed
}

// TestSentinelFailover kills the master of a Sentinel setup: calls must
// fail fast, then succeed on the promoted replica soon after the failover.
func TestSentinelFailover(t *testing.T) {
	t.Parallel()
	s := redistest.Sentinel(t)
	prefix := s.Prefix(t)
	ctx := context.Background()
	c := s.Client(t, &redis.FailoverOptions{PoolSize: 128})
	var log stateLog
	p := newPipeliner(t, c, Config{OnStateChange: log.record})
	keys := []string{prefix + "a", prefix + "b"}
	warm(t, p, keys[0])
	master, err := s.Master(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := master.WaitReplicated(ctx); err != nil {
		t.Fatal(err)
	}

	lag := newLagMeter(t)
	stop := make(chan struct{})
	wait := load(p, keys, 8, stop)
	time.Sleep(100 * time.Millisecond)
	master.Kill()
	promoted, took, err := s.WaitFailover(ctx, master)
	if err != nil {
		close(stop)
		wait()
		t.Fatal(err)
	}
	agreed := time.Now()
	up, ok := firstSuccess(p, keys[0], 5*time.Second)
	close(stop)
	out := wait()
	sum := summarize(out, slowCall, func(string) bool { return true })
	t.Logf("failover to %s agreed %s after the kill; first success %s after that", promoted.Addr(), took.Round(time.Millisecond), up.Sub(agreed).Round(time.Millisecond))
	t.Logf("%d calls: %d ok, %d unavailable, %d at their deadline, %d other errors, %d waited more than %s; state changes: %s; worst scheduling lag %s",
		sum.calls, sum.ok, sum.unavailable, sum.late, sum.other, sum.slow, slowCall, describe(log.list()), lag.Max())
	if !ok {
		t.Fatal("no success within 5 s of the failover")
	}
	if d := up.Sub(agreed); d > time.Second {
		lag.timing(t, "first success %s after the failover, want within 1 s", d)
	}
	if sum.slow > handful {
		lag.timing(t, "%d calls waited more than %s", sum.slow, slowCall)
	}
}

// describe formats state changes for logs.
func describe(ev []stateEvent) string {
	if len(ev) == 0 {
		return "none"
	}
	s := ""
	t0 := ev[0].at
	for i, e := range ev {
		if i > 0 {
			s += ", "
		}
		state := "down"
		if e.up {
			state = "up"
		}
		s += e.dest + " " + state + " +" + strconv.FormatInt(e.at.Sub(t0).Milliseconds(), 10) + "ms"
		if e.cause != nil && i == 0 {
			s += " (" + e.cause.Error() + ")"
		}
	}
	return s
}
