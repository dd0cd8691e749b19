package redispipe

import (
	"context"
	"errors"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/redistest"
)

func TestNewRejects(t *testing.T) {
	t.Parallel()
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	defer c.Close()
	for name, tc := range map[string]struct {
		client redis.Scripter
		cfg    Config
	}{
		"nil":              {nil, Config{}},
		"nil client":       {(*redis.Client)(nil), Config{}},
		"nil cluster":      {(*redis.ClusterClient)(nil), Config{}},
		"pipeline":         {c.Pipeline(), Config{}},
		"negative batch":   {c, Config{MaxBatch: -1}},
		"negative flight":  {c, Config{MaxInFlight: -1}},
		"probe cap < base": {c, Config{ProbeInterval: time.Second, MaxProbeInterval: time.Millisecond}},
	} {
		if p, err := New(tc.client, tc.cfg); err == nil {
			_ = p.Close()
			t.Errorf("%s: New succeeded", name)
		}
	}
}

func TestRunReplies(t *testing.T) {
	t.Parallel()
	srv := redistest.Shared(t)
	prefix := srv.Prefix(t)
	p := newPipeliner(t, srv.Client(t, nil), Config{StallThreshold: testStall})
	ctx := context.Background()

	for want := int64(1); want <= 3; want++ {
		got, err := runDecide(ctx, p, prefix+"k")
		if err != nil || got != want {
			t.Fatalf("decide #%d = %d, %v; want %d", want, got, err, want)
		}
	}

	errScript := redis.NewScript(`return redis.error_reply('ERR no ' .. ARGV[1])`)
	if _, err := p.Run(ctx, errScript, []string{prefix + "e"}, "way"); err == nil || !strings.Contains(err.Error(), "no way") {
		t.Errorf("error reply: got %v, want an error with 'no way'", err)
	}
	nilScript := redis.NewScript(`return false`)
	if v, err := p.Run(ctx, nilScript, nil); err != redis.Nil {
		t.Errorf("false reply: got %v, %v; want redis.Nil", v, err)
	}
	echo := redis.NewScript(`return {KEYS[1], ARGV[1], ARGV[2]}`)
	buf := []byte("bytes")
	v, err := p.Run(ctx, echo, []string{prefix + "x"}, buf, 42)
	copy(buf, "XXXXX")
	if err != nil {
		t.Fatal(err)
	}
	if a, _ := v.([]any); len(a) != 3 || a[0] != prefix+"x" || a[1] != "bytes" || a[2] != "42" {
		t.Errorf("echo = %#v", v)
	}
	// A *[]byte is sent as the bytes it points to, copied likewise.
	pointed := []byte("pointed")
	v, err = p.Run(ctx, echo, []string{prefix + "y"}, &pointed, pointed[:3])
	copy(pointed, "XXXXXXX")
	if err != nil {
		t.Fatal(err)
	}
	if a, _ := v.([]any); len(a) != 3 || a[0] != prefix+"y" || a[1] != "pointed" || a[2] != "poi" {
		t.Errorf("echo of *[]byte = %#v", v)
	}
}

// TestBatching checks that a call on an idle destination goes out alone at
// once, that concurrent calls share pipelines, and that no pipeline holds
// more than MaxBatch calls.
func TestBatching(t *testing.T) {
	t.Parallel()
	srv := redistest.Standalone(t)
	prefix := srv.Prefix(t)
	c := srv.Client(t, &redis.Options{PoolSize: 128, ContextTimeoutEnabled: true})
	h := &pipeCounter{}
	c.AddHook(h)
	const maxBatch = 16
	p := newPipeliner(t, c, Config{MaxBatch: maxBatch, StallThreshold: testStall})
	ctx := context.Background()
	if err := decide.Load(ctx, c).Err(); err != nil {
		t.Fatal(err)
	}

	t.Run("idle", func(t *testing.T) {
		h.reset()
		before := commandCalls(t, c, "evalsha")
		const n = 20
		for i := 0; i < n; i++ {
			start := time.Now()
			if _, err := runDecide(ctx, p, prefix+"idle"); err != nil {
				t.Fatal(err)
			}
			if took := time.Since(start); took > 50*time.Millisecond {
				t.Logf("call %d took %s (busy machine?)", i, took)
			}
		}
		pipes, cmds, largest := h.stats()
		if pipes != n || cmds != n || largest != 1 {
			t.Errorf("%d sequential calls went in %d pipelines of %d commands, largest %d; want one each", n, pipes, cmds, largest)
		}
		if got := commandCalls(t, c, "evalsha") - before; got != n {
			t.Errorf("server ran EVALSHA %d times, want %d", got, n)
		}
	})

	t.Run("concurrent", func(t *testing.T) {
		h.reset()
		before := commandCalls(t, c, "evalsha")
		const goroutines, each = 64, 50
		var wg sync.WaitGroup
		var failed atomic.Int64
		for g := 0; g < goroutines; g++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; i < each; i++ {
					if _, err := runDecide(ctx, p, prefix+"c:"+strconv.Itoa(g)); err != nil {
						if failed.Add(1) == 1 {
							t.Errorf("call: %v", err)
						}
					}
				}
			}()
		}
		wg.Wait()
		if n := failed.Load(); n > 0 {
			t.Fatalf("%d calls failed", n)
		}
		pipes, cmds, largest := h.stats()
		const total = goroutines * each
		t.Logf("%d calls in %d pipelines: %.1f per round trip, largest %d", cmds, pipes, float64(cmds)/float64(pipes), largest)
		if cmds != total {
			t.Errorf("pipelines held %d commands, want %d", cmds, total)
		}
		if largest > maxBatch {
			t.Errorf("a pipeline held %d calls, more than MaxBatch %d", largest, maxBatch)
		}
		if pipes*2 > total {
			t.Errorf("%d calls took %d round trips: hardly batched", total, pipes)
		}
		if got := commandCalls(t, c, "evalsha") - before; got != total {
			t.Errorf("server ran EVALSHA %d times, want %d", got, total)
		}
		for g := 0; g < goroutines; g++ {
			n, err := c.HGet(ctx, prefix+"c:"+strconv.Itoa(g), "c").Int()
			if err != nil || n != each {
				t.Fatalf("counter %d = %d, %v; want %d", g, n, err, each)
			}
		}
	})
}

// TestDeadlinePausedServer checks that callers return at their deadline
// from a server that stopped answering, with a client that does not honour
// context deadlines on reads, and that no goroutine is left behind.
//
// It counts goroutines, so it does not run in parallel with other tests.
func TestDeadlinePausedServer(t *testing.T) {
	srv := redistest.Standalone(t)
	prefix := srv.Prefix(t)
	c := srv.Client(t, &redis.Options{PoolSize: 128}) // ContextTimeoutEnabled off
	ctx := context.Background()
	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	before := runtime.NumGoroutine()
	// Stall detection off: this tests the callers' own deadlines.
	p, err := New(c, Config{StallThreshold: -1, MaxInFlight: 2})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := runDecide(ctx, p, prefix+"warm"); err != nil {
		t.Fatal(err)
	}
	if err := srv.Pause(); err != nil {
		t.Fatal(err)
	}
	resumed := false
	defer func() {
		if !resumed {
			_ = srv.Resume()
		}
	}()

	lag := newLagMeter(t)
	const callers, rounds, timeout = 64, 3, 50 * time.Millisecond
	var during int
	over := deadlineLateness(ctx, callers, rounds, timeout, func(cctx context.Context, g int) {
		_, err := runDecide(cctx, p, prefix+"k"+strconv.Itoa(g))
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("call on a paused server: %v, want a deadline error", err)
		}
	}, func() {
		// Halfway through the first round every caller is waiting.
		time.Sleep(timeout / 2)
		during = runtime.NumGoroutine()
	})
	p99 := percentile(over, 0.99)
	// The same callers waiting for nothing but their deadline: how late
	// this machine wakes 64 goroutines at once, which a loaded machine
	// (a second test run, the race detector) makes tens of ms.
	ref := plainDeadlineLateness(ctx, callers, rounds, timeout)
	t.Logf("lateness past the deadline: p50 %s, p99 %s, max %s (callers that only wait for their deadline: p99 %s); %d goroutines while %d callers waited (%d before New)",
		percentile(over, 0.5), p99, over[len(over)-1], ref, during, callers, before)
	if p99 > ref+25*time.Millisecond {
		lag.timing(t, "callers returned up to %s after their deadline (p99), %s more than callers that only wait for it", p99, p99-ref)
	}
	// The callers and a few lanes, never one per call.
	if extra := during - before - callers; extra > 10 {
		buf := make([]byte, 1<<20)
		t.Errorf("%d goroutines beyond the callers' own during the pause:\n%s", extra, buf[:runtime.Stack(buf, true)])
	}

	if err := srv.Resume(); err != nil {
		t.Fatal(err)
	}
	resumed = true
	if _, err := runDecide(ctx, p, prefix+"after"); err != nil {
		t.Fatalf("after resume: %v", err)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	lag.Stop()
	if got := waitGoroutines(before, 5*time.Second); got > before {
		t.Errorf("%d goroutines after Close, %d before New", got, before)
	}
}

// TestNoscriptRecovery flushes the script cache while calls run: none may
// fail.
func TestNoscriptRecovery(t *testing.T) {
	t.Parallel()
	srv := redistest.Standalone(t)
	prefix := srv.Prefix(t)
	c := srv.Client(t, &redis.Options{PoolSize: 128})
	p := newPipeliner(t, c, Config{StallThreshold: testStall})
	ctx := context.Background()

	// A cold cache from the start.
	if _, err := runDecide(ctx, p, prefix+"cold"); err != nil {
		t.Fatalf("first call, script not loaded: %v", err)
	}

	stop := make(chan struct{})
	var wg sync.WaitGroup
	var calls, failed atomic.Int64
	for g := 0; g < 32; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 100000; i++ {
				select {
				case <-stop:
					return
				default:
				}
				calls.Add(1)
				if _, err := runDecide(ctx, p, prefix+"k"+strconv.Itoa(g)); err != nil {
					failed.Add(1)
					t.Errorf("call: %v", err)
					return
				}
			}
		}()
	}
	flushes := 0
	for i := 0; i < 10; i++ {
		time.Sleep(20 * time.Millisecond)
		if err := c.ScriptFlush(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		flushes++
	}
	close(stop)
	wg.Wait()
	loads := commandCalls(t, c, "script|load")
	t.Logf("%d calls, %d failed, across %d SCRIPT FLUSH; %d SCRIPT LOAD", calls.Load(), failed.Load(), flushes, loads)
	if loads == 0 {
		t.Error("no SCRIPT LOAD: the flushes were not noticed")
	}
}

// TestFailedBatch fails the pipelines that carry a poisoned key before they
// are sent, with an error of the client's own (an exhausted pool), and
// checks that exactly the calls of those pipelines fail while the
// destination stays up.
func TestFailedBatch(t *testing.T) {
	t.Parallel()
	srv := redistest.Standalone(t)
	prefix := srv.Prefix(t)
	c := srv.Client(t, &redis.Options{PoolSize: 128, ContextTimeoutEnabled: true})
	h := &pipeCounter{}
	var mu sync.Mutex
	doomed := map[string]bool{} // keys of failed pipelines
	injected := errors.New("injected")
	h.fail = func(cmds []redis.Cmder) error {
		poisoned := false
		for _, cmd := range cmds {
			if strings.Contains(firstKey(cmd), ":poison") {
				poisoned = true
			}
		}
		if !poisoned {
			return nil
		}
		mu.Lock()
		for _, cmd := range cmds {
			doomed[firstKey(cmd)] = true
		}
		mu.Unlock()
		return errors.Join(injected, redis.ErrPoolTimeout)
	}
	c.AddHook(h)
	var log stateLog
	p := newPipeliner(t, c, Config{OnStateChange: log.record, StallThreshold: testStall})
	ctx := context.Background()

	const goroutines, each = 32, 40
	var wg sync.WaitGroup
	var fmu sync.Mutex
	failedKeys := map[string]error{}
	for g := 0; g < goroutines; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < each; i++ {
				key := prefix + strconv.Itoa(g) + ":" + strconv.Itoa(i)
				if g == 0 && i%10 == 5 {
					key += ":poison"
				}
				if _, err := runDecide(ctx, p, key); err != nil {
					fmu.Lock()
					failedKeys[key] = err
					fmu.Unlock()
				}
			}
		}()
	}
	wg.Wait()
	for key, err := range failedKeys {
		if !doomed[key] {
			t.Errorf("%s failed (%v) but its pipeline was not failed", key, err)
		} else if !errors.Is(err, injected) {
			t.Errorf("%s failed with %v, want the pipeline's error", key, err)
		}
	}
	for key := range doomed {
		if _, ok := failedKeys[key]; !ok {
			t.Errorf("%s succeeded although its pipeline failed", key)
		}
	}
	t.Logf("%d of %d calls were in failed pipelines", len(doomed), goroutines*each)
	if len(doomed) == 0 || len(doomed) > goroutines*each/2 {
		t.Errorf("%d calls in failed pipelines", len(doomed))
	}
	if ev := log.list(); len(ev) != 0 {
		t.Errorf("state changes %v; a failed batch that is no connection error must not mark the server down", ev)
	}
}

func TestClose(t *testing.T) {
	srv := redistest.Shared(t)
	prefix := srv.Prefix(t)
	c := srv.Client(t, nil)
	before := runtime.NumGoroutine()
	p, err := New(c, Config{MaxInFlight: 3})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := runDecide(ctx, p, prefix+"k"); err != nil {
		t.Fatal(err)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := runDecide(ctx, p, prefix+"k"); !errors.Is(err, ErrClosed) {
		t.Errorf("Run after Close: %v, want ErrClosed", err)
	}
	if got := waitGoroutines(before, 2*time.Second); got > before {
		t.Errorf("%d goroutines after Close, %d before New", got, before)
	}
}

func TestRunAllocs(t *testing.T) {
	srv := redistest.Shared(t)
	prefix := srv.Prefix(t)
	c := srv.Client(t, nil)
	p := newPipeliner(t, c, Config{StallThreshold: testStall})
	ctx := context.Background()
	keys := []string{prefix + "a"}
	run := func() {
		if _, err := p.Run(ctx, decide, keys, decideArgs...); err != nil {
			t.Fatal(err)
		}
	}
	run()
	viaPipe := testing.AllocsPerRun(200, run)
	viaRun := testing.AllocsPerRun(200, func() {
		if err := decide.Run(ctx, c, keys, decideArgs...).Err(); err != nil {
			t.Fatal(err)
		}
	})
	t.Logf("allocations per call: %.0f through the Pipeliner, %.0f with Script.Run", viaPipe, viaRun)
	if viaPipe > viaRun+12 {
		t.Errorf("%.0f allocations per call, %.0f with Script.Run", viaPipe, viaRun)
	}
}

// firstKey returns the first key of an EVAL or EVALSHA command, or "".
func firstKey(cmd redis.Cmder) string {
	args := cmd.Args()
	if len(args) < 4 {
		return ""
	}
	k, _ := args[3].(string)
	return k
}

// TestRepliesMatchCalls runs many calls with a stall threshold so short
// that the destination keeps going down and up, which completes calls from
// several goroutines at once, while callers give up at short deadlines:
// every reply must still be its own call's, whatever the pooling of calls.
func TestRepliesMatchCalls(t *testing.T) {
	t.Parallel()
	srv := redistest.Shared(t)
	prefix := srv.Prefix(t)
	c := srv.Client(t, &redis.Options{PoolSize: 128})
	var flips atomic.Int64
	p := newPipeliner(t, c, Config{
		MaxInFlight:    2,
		StallThreshold: time.Millisecond,
		ProbeInterval:  time.Millisecond,
		OnStateChange:  func(string, bool, error) { flips.Add(1) },
	})
	echo := redis.NewScript(`return {KEYS[1], ARGV[1]}`)
	var wg sync.WaitGroup
	var ok, unavailable, late atomic.Int64
	for g := 0; g < 32; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 300; i++ {
				key, arg := prefix+strconv.Itoa(g), strconv.Itoa(i)
				timeout := time.Duration(1+i%5) * time.Millisecond
				ctx, cancel := context.WithTimeout(context.Background(), timeout)
				v, err := p.Run(ctx, echo, []string{key}, arg)
				cancel()
				switch {
				case err == nil:
					ok.Add(1)
					if a, _ := v.([]any); len(a) != 2 || a[0] != key || a[1] != arg {
						t.Errorf("call %s %s got reply %#v", key, arg, v)
						return
					}
				case errors.Is(err, ErrUnavailable):
					unavailable.Add(1)
					time.Sleep(500 * time.Microsecond) // let the server be probed
				case errors.Is(err, context.DeadlineExceeded):
					late.Add(1)
				default:
					t.Errorf("call %s %s: %v", key, arg, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	t.Logf("%d answered, %d unavailable, %d past their deadline; %d state changes", ok.Load(), unavailable.Load(), late.Load(), flips.Load())
	if ok.Load() == 0 {
		t.Error("no call was answered")
	}
}

// plainDeadlineLateness returns the 99th percentile of how late callers
// goroutines, each waiting rounds times for a deadline of timeout and for
// nothing else, return past it.
func plainDeadlineLateness(ctx context.Context, callers, rounds int, timeout time.Duration) time.Duration {
	return percentile(deadlineLateness(ctx, callers, rounds, timeout, func(cctx context.Context, _ int) { <-cctx.Done() }, func() {}), 0.99)
}

// deadlineLateness runs callers goroutines that each call call rounds
// times with a deadline of timeout, runs meanwhile once they started, and
// returns how late past its deadline each call returned.
func deadlineLateness(ctx context.Context, callers, rounds int, timeout time.Duration, call func(ctx context.Context, g int), meanwhile func()) []time.Duration {
	var wg sync.WaitGroup
	late := make(chan time.Duration, rounds*callers)
	for g := 0; g < callers; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < rounds; i++ {
				cctx, cancel := context.WithTimeout(ctx, timeout)
				start := time.Now()
				call(cctx, g)
				late <- time.Since(start) - timeout
				cancel()
			}
		}()
	}
	meanwhile()
	wg.Wait()
	close(late)
	var over []time.Duration
	for d := range late {
		over = append(over, d)
	}
	return over
}
