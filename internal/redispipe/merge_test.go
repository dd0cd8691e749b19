package redispipe

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/redistest"
)

// batchDecide is decide speaking the batch protocol of NewBatchScript; a
// call whose first argument is "fail" gets an error reply, and every other
// call's reply ends with its key, so that tests can tell whose reply a
// call got.
var batchDecide = NewBatchScript(`
local n = tonumber(ARGV[1])
local out = {}
local kb, ab = 0, 2
for i = 1, n do
	local nk, na = struct.unpack('<HH', ARGV[2], 4 * i - 3)
	local key = KEYS[kb + 1]
	if ARGV[ab + 1] == 'fail' then
		out[i] = {err = 'ERR asked to fail for ' .. key}
	else
		local v = redis.call('HMGET', key, 's', 'p', 'c')
		local limit, cost = tonumber(ARGV[ab + 1]), tonumber(ARGV[ab + 2])
		local c = tonumber(v[3]) or 0
		local allowed = 0
		if c + cost <= limit then
			c = c + cost
			allowed = 1
		end
		redis.call('HSET', key, 's', ARGV[ab + 3], 'p', tonumber(v[2]) or 0, 'c', c)
		redis.call('PEXPIRE', key, ARGV[ab + 4])
		out[i] = {allowed, limit - c, c, key}
	end
	kb, ab = kb + nk, ab + na
end
if n == 1 then
	return out[1]
end
return out
`)

// topology is a Redis for a test: a standalone server of its own
// (srv) or the shared Cluster, a client of it with a pool of 128
// connections, a key prefix, and the server's count of the scripts run.
type topology struct {
	client redis.Scripter
	prefix string
	srv    *redistest.Server
	admins []*redis.Client
}

func newTopology(t *testing.T, topo string) *topology {
	tp := &topology{}
	if topo == "standalone" {
		tp.srv = redistest.Standalone(t)
		tp.prefix = tp.srv.Prefix(t)
		tp.client = tp.srv.Client(t, &redis.Options{PoolSize: 128})
		tp.admins = append(tp.admins, tp.srv.Client(t, nil))
		return tp
	}
	cl := redistest.SharedCluster(t)
	tp.prefix = cl.Prefix(t)
	tp.client = cl.Client(t, &redis.ClusterOptions{PoolSize: 128})
	for _, a := range cl.Addrs() {
		tp.admins = append(tp.admins, redis.NewClient(&redis.Options{Addr: a}))
	}
	t.Cleanup(func() {
		for _, a := range tp.admins {
			a.Close()
		}
	})
	return tp
}

// scripts returns how many scripts (EVALSHA and EVAL) the servers ran.
func (tp *topology) scripts(t *testing.T) (n int) {
	for _, a := range tp.admins {
		n += commandCalls(t, a, "evalsha") + commandCalls(t, a, "eval")
	}
	return n
}

// TestBatchScript checks that concurrent calls of a batch script share
// script runs, on a standalone server and on a Cluster (one run per hash
// slot), that each call gets its own reply, and that an error reply fails
// its own call alone.
func TestBatchScript(t *testing.T) {
	t.Parallel()
	for _, topo := range []string{"standalone", "cluster"} {
		t.Run(topo, func(t *testing.T) {
			t.Parallel()
			tp := newTopology(t, topo)
			scripts := tp.scripts
			p := newPipeliner(t, tp.client, Config{StallThreshold: testStall})
			prefix := tp.prefix
			ctx := context.Background()
			const goroutines, each, keys = 64, 40, 8
			before := scripts(t)
			var wg sync.WaitGroup
			var mu sync.Mutex
			perKey := map[string]int{}
			for g := 0; g < goroutines; g++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := 0; i < each; i++ {
						key := prefix + "{k" + strconv.Itoa((g+i)%keys) + "}"
						if i%10 == 9 {
							_, err := p.Run(ctx, batchDecide, []string{key}, "fail")
							if err == nil || !strings.Contains(err.Error(), "asked to fail for "+key) || !isRedisError(err) {
								t.Errorf("a failing call got %v", err)
							}
							continue
						}
						v, err := p.Run(ctx, batchDecide, []string{key}, decideArgs...)
						if err != nil {
							t.Errorf("call: %v", err)
							return
						}
						if a, ok := v.([]any); !ok || len(a) != 4 || a[3] != key {
							t.Errorf("call for %s got %v", key, v)
							return
						}
						mu.Lock()
						perKey[key]++
						mu.Unlock()
					}
				}()
			}
			wg.Wait()
			runs := scripts(t) - before
			const total = goroutines * each
			t.Logf("%d calls in %d script runs", total, runs)
			if runs <= 0 || runs >= total/2 {
				t.Errorf("%d calls ran as %d scripts, want them merged", total, runs)
			}
			for key, n := range perKey {
				v, err := p.Run(ctx, batchDecide, []string{key}, 1<<30, 0, 1, 60000)
				if err != nil {
					t.Fatal(err)
				}
				if c := v.([]any)[2]; c != int64(n) {
					t.Errorf("%s counted %v, want the %d calls made for it", key, c, n)
				}
			}
		})
	}
}

// TestRunDirect checks that RunDirect sends a batch script as a batch of
// one and returns that call's reply or error, and any other script as is.
func TestRunDirect(t *testing.T) {
	t.Parallel()
	srv := redistest.Shared(t)
	c := srv.Client(t, nil)
	ctx := context.Background()
	key := srv.Prefix(t) + "direct"
	v, err := RunDirect(ctx, c, batchDecide, []string{key}, decideArgs...)
	if a, ok := v.([]any); err != nil || !ok || len(a) != 4 || a[2] != int64(1) || a[3] != key {
		t.Errorf("batch script: %v, %v", v, err)
	}
	if _, err := RunDirect(ctx, c, batchDecide, []string{key}, "fail"); err == nil || !strings.Contains(err.Error(), "asked to fail") {
		t.Errorf("failing batch call: %v", err)
	}
	v, err = RunDirect(ctx, c, decide, []string{key + ":plain"}, decideArgs...)
	if a, ok := v.([]any); err != nil || !ok || fmt.Sprint(a) != "[1 1073741823 1]" {
		t.Errorf("plain script: %v, %v", v, err)
	}
}

// TestDirectCalls checks that calls to an idle server are sent by their
// callers, not handed to a lane (go-redis then sees a command on its own,
// not a pipeline), and not when the caller's deadline is too close for a
// client that ignores deadlines; the first call, which sets up a
// connection and loads the script, goes to a lane.
func TestDirectCalls(t *testing.T) {
	t.Parallel()
	srv := redistest.Shared(t)
	key := srv.Prefix(t) + "direct"
	ctx := context.Background()
	for _, tc := range []struct {
		name       string
		ctxTimeout bool
		deadline   time.Duration // 0: none
		direct     bool
	}{
		{"no deadline", false, 0, true},
		{"deadline with room for a stall", false, time.Second, true},
		{"deadline too close", false, 2*MaxStallThreshold - time.Millisecond, false},
		// The deadline the other clients find too close: a client that
		// honours deadlines goes direct with it. (It was 10 ms, which a
		// loaded machine's calls missed.)
		{"client honours deadlines", true, 2*MaxStallThreshold - time.Millisecond, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := &pipeCounter{}
			c := srv.Client(t, &redis.Options{ContextTimeoutEnabled: true})
			c.AddHook(h)
			if !tc.ctxTimeout {
				// Hooks do not reach the clones that direct calls of such
				// a client go through: count what is not a direct call.
				c = srv.Client(t, nil)
				c.AddHook(h)
			}
			p := newPipeliner(t, c, Config{})
			// Other tests may keep this process short of CPU, which
			// would turn direct calls off.
			p.busy = func(time.Time) bool { return false }
			if _, err := p.Run(ctx, batchDecide, []string{key}, decideArgs...); err != nil {
				t.Fatal(err)
			}
			if _, cmds, _ := h.stats(); h.alone != 0 || cmds == 0 {
				// (Twice in pipelines if the server lacked the script.)
				t.Fatalf("the first call: %d sent alone, %d in pipelines; want it in a pipeline", h.alone, cmds)
			}
			h.reset()
			// Direct calls are off while the server's recent round trips
			// leave one too little room, or this process was late to read
			// replies (directLocked), as on a loaded machine: count the
			// calls made then.
			const n = 20
			off := 0
			for i := 0; i < n; i++ {
				if !directsOn(p) {
					off++
				}
				cx, cancel := ctx, context.CancelFunc(func() {})
				if tc.deadline > 0 {
					cx, cancel = context.WithTimeout(ctx, tc.deadline)
				}
				_, err := p.Run(cx, batchDecide, []string{key}, decideArgs...)
				cancel()
				if err != nil {
					t.Fatal(err)
				}
			}
			_, cmds, _ := h.stats()
			h.mu.Lock()
			alone, piped := h.alone, cmds-h.alone
			h.mu.Unlock()
			if tc.direct && off > 0 && piped+alone <= off {
				// The server answered slowly, or this process read late:
				// calls go to the lanes then, by design.
				t.Logf("NOT FAILED, the machine was too busy (direct calls were off for %d calls of %d): %d sent alone, %d in pipelines", off, n, alone, piped)
				return
			}
			switch {
			case tc.direct && tc.ctxTimeout && (alone != n || piped != 0):
				t.Errorf("%d sent alone, %d in pipelines; want all %d alone", alone, piped, n)
			case tc.direct && !tc.ctxTimeout && alone+piped != 0:
				t.Errorf("%d sent alone, %d in pipelines; want all %d direct, through clones", alone, piped, n)
			case !tc.direct && piped != n:
				t.Errorf("%d sent alone, %d in pipelines; want all %d in pipelines", alone, piped, n)
			}
		})
	}
}

// TestDirectCallStall hangs the server (SIGSTOP) and makes one call at a
// time with a client at go-redis's default options (ReadTimeout 3 s), as
// direct calls: the first must give up after the stall threshold and an
// unanswered PING, not after ReadTimeout or its own deadline, and mark the
// server down; those
// after it fail at once; once the server resumes, calls succeed again.
func TestDirectCallStall(t *testing.T) {
	t.Parallel()
	srv := redistest.Standalone(t)
	key := srv.Prefix(t) + "stall"
	c := srv.Client(t, nil)
	var log stateLog
	p := newPipeliner(t, c, Config{OnStateChange: log.record})
	ctx := context.Background()
	hangAfterOneCall(t, srv, p, key)
	for i := 0; i < 2; i++ {
		cx, cancel := context.WithTimeout(ctx, 2*time.Second)
		start := time.Now()
		_, err := p.Run(cx, batchDecide, []string{key}, decideArgs...)
		took := time.Since(start)
		cancel()
		if !errors.Is(err, ErrUnavailable) || !errors.Is(err, ErrStalled) {
			t.Fatalf("call %d on a hung server: %v, want ErrUnavailable (ErrStalled)", i, err)
		}
		if limit := MaxStallThreshold + verifyWait + slowCall; took > limit {
			t.Errorf("call %d on a hung server took %s, more than %s", i, took, limit)
		}
	}
	if err := srv.Resume(); err != nil {
		t.Fatal(err)
	}
	if _, ok := firstSuccess(p, key, 2*time.Second); !ok {
		t.Fatal("no success within 2 s of the resume")
	}
	ev := log.list()
	if len(ev) < 2 || ev[0].up || !errors.Is(ev[0].cause, ErrStalled) || !ev[len(ev)-1].up {
		t.Fatalf("state changes %s, want down (stalled), ..., up", describe(ev))
	}
}

// TestRunByDeadline hangs the server with stall detection off, so that
// only the deadline given to RunBy can end the wait (the context has
// none, and go-redis would wait for its ReadTimeout of 3 s): each call
// must return at its deadline, and the timers it used must not end later
// calls early.
func TestRunByDeadline(t *testing.T) {
	t.Parallel()
	srv := redistest.Standalone(t)
	key := srv.Prefix(t) + "deadline"
	p := newPipeliner(t, srv.Client(t, nil), Config{StallThreshold: -1})
	ctx := context.Background()
	hangAfterOneCall(t, srv, p, key)
	for _, wait := range []time.Duration{50 * time.Millisecond, 100 * time.Millisecond} {
		start := time.Now()
		_, err := p.RunBy(ctx, start.Add(wait), batchDecide, []string{key}, decideArgs...)
		took := time.Since(start)
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("RunBy on a hung server: %v, want a deadline error", err)
		}
		if took < wait || took > wait+slowCall {
			t.Errorf("RunBy with %s to wait returned after %s", wait, took)
		}
	}
	if err := srv.Resume(); err != nil {
		t.Fatal(err)
	}
	// Calls answered before their deadline are not ended by it.
	for i := 0; i < 50; i++ {
		if _, err := p.RunBy(ctx, time.Now().Add(2*time.Second), batchDecide, []string{key}, decideArgs...); err != nil {
			t.Fatalf("call %d after the resume: %v", i, err)
		}
	}
}

// TestDirectCallDeadline checks, with a client that honours context
// deadlines, that a direct call to a hung server ending at its caller's own
// deadline (shorter than the stall threshold) fails that call without
// marking the server down, and that one with a longer deadline marks it
// down at the stall threshold, once a PING went unanswered too.
func TestDirectCallDeadline(t *testing.T) {
	t.Parallel()
	srv := redistest.Standalone(t)
	key := srv.Prefix(t) + "deadline"
	var log stateLog
	p := newPipeliner(t, srv.Client(t, &redis.Options{ContextTimeoutEnabled: true}), Config{OnStateChange: log.record})
	// Other tests may keep this process short of CPU, which would turn
	// direct calls off: the call would then wait in a lane's batch, which
	// a stall on the hung server rightly marks down.
	p.busy = func(time.Time) bool { return false }
	ctx := context.Background()
	hangAfterOneCall(t, srv, p, key)
	start := time.Now()
	_, err := p.RunBy(ctx, start.Add(10*time.Millisecond), batchDecide, []string{key}, decideArgs...)
	if took := time.Since(start); err == nil || errors.Is(err, ErrUnavailable) || took > 10*time.Millisecond+slowCall {
		t.Errorf("call with 10 ms to wait: %v after %s, want its deadline's error", err, took)
	}
	if ev := log.list(); len(ev) != 0 {
		t.Fatalf("state changes %s after a call's own deadline, want none", describe(ev))
	}
	start = time.Now()
	_, err = p.RunBy(ctx, start.Add(time.Second), batchDecide, []string{key}, decideArgs...)
	if took := time.Since(start); !errors.Is(err, ErrStalled) || took > MaxStallThreshold+verifyWait+slowCall {
		t.Errorf("call with 1 s to wait: %v after %s, want a stall at %s and no answer to a PING within %s",
			err, took, MaxStallThreshold, verifyWait)
	}
	if ev := log.list(); len(ev) != 1 || ev[0].up || !errors.Is(ev[0].cause, ErrStalled) {
		t.Errorf("state changes %s, want down (stalled)", describe(ev))
	}
}

// TestReloadConnectionError breaks the connection (an injected network
// error) while a script missing from the server's cache is loaded and sent
// again: the call must fail as unavailable, as for a batch that breaks,
// not with the connection's own error, both for a call sent directly and
// for one sent by a lane.
func TestReloadConnectionError(t *testing.T) {
	t.Parallel()
	for _, direct := range []bool{true, false} {
		srv := redistest.Standalone(t) // an empty script cache
		h := &pipeCounter{}
		broken := &net.OpError{Op: "write", Net: "tcp", Err: errors.New("injected")}
		h.fail = func(cmds []redis.Cmder) error {
			for _, c := range cmds {
				if c.Name() == "script" {
					return broken
				}
			}
			return nil
		}
		c := srv.Client(t, &redis.Options{ContextTimeoutEnabled: true, MaxRetries: -1})
		c.AddHook(h)
		p := newPipeliner(t, c, Config{StallThreshold: testStall})
		p.noDirect = !direct
		_, err := p.Run(context.Background(), batchDecide, []string{srv.Prefix(t) + "k"}, decideArgs...)
		if !errors.Is(err, ErrUnavailable) {
			t.Errorf("direct %v: %v, want ErrUnavailable", direct, err)
		}
	}
}

// hangAfterOneCall makes one call of batchDecide for key through p, which
// opens a connection and loads the script, then hangs srv (SIGSTOP) until
// the test ends or resumes it.
func hangAfterOneCall(t *testing.T, srv *redistest.Server, p *Pipeliner, key string) {
	t.Helper()
	if _, err := p.Run(context.Background(), batchDecide, []string{key}, decideArgs...); err != nil {
		t.Fatal(err)
	}
	if err := srv.Pause(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Resume() })
}

// TestRunAll checks that the calls of RunAll, on a standalone server and
// on a Cluster, each get their own reply (an error reply failing its own
// call alone), in few script runs on a server of its own (a batch takes up
// to MaxBatch calls, merged per hash slot on a Cluster), that they are not
// counted in OnBatch, and that every call fails at once when its server is
// down.
func TestRunAll(t *testing.T) {
	t.Parallel()
	for _, topo := range []string{"standalone", "cluster"} {
		t.Run(topo, func(t *testing.T) {
			t.Parallel()
			tp := newTopology(t, topo)
			scripts, prefix, srv := tp.scripts, tp.prefix, tp.srv
			var counted atomic.Int64
			p := newPipeliner(t, tp.client, Config{StallThreshold: testStall, OnBatch: func(n int) { counted.Add(int64(n)) }})
			ctx := context.Background()
			const n = 600
			calls := make([]Call, n)
			for i := range calls {
				// One hash slot on a Cluster for the first half.
				key := prefix + "{k}" + strconv.Itoa(i)
				if i >= n/2 {
					key = prefix + "{k" + strconv.Itoa(i) + "}"
				}
				calls[i] = Call{Keys: []string{key}, Args: decideArgs}
				if i%100 == 7 {
					calls[i].Args = []any{"fail"}
				}
			}
			// Once to load the script on every server (the calls that miss
			// it are sent again one by one), then counted.
			p.RunAll(ctx, time.Time{}, batchDecide, calls)
			counted.Store(0)
			before := scripts(t)
			p.RunAll(ctx, time.Time{}, batchDecide, calls)
			runs := scripts(t) - before
			for i, c := range calls {
				if i%100 == 7 {
					if c.Err == nil || !isRedisError(c.Err) {
						t.Errorf("call %d: a failing call got %v, %v", i, c.Val, c.Err)
					}
					continue
				}
				if a, ok := c.Val.([]any); c.Err != nil || !ok || len(a) != 4 || a[3] != c.Keys[0] {
					t.Fatalf("call %d for %s got %v, %v", i, c.Keys[0], c.Val, c.Err)
				}
			}
			t.Logf("%d calls in %d script runs", n, runs)
			if topo == "standalone" && (runs < n/DefaultMaxBatch || runs > 2*n/DefaultMaxBatch+2) {
				t.Errorf("%d calls ran as %d scripts, want batches of up to %d", n, runs, DefaultMaxBatch)
			}
			// On the shared Cluster, other tests run scripts meanwhile: the
			// count is only logged (one run per slot for the second half, a
			// few for the first, when nothing else runs).
			if counted.Load() != 0 {
				t.Errorf("OnBatch counted %d calls of RunAll", counted.Load())
			}
			if srv == nil {
				return
			}
			srv.Kill()
			if _, err := p.Run(ctx, batchDecide, []string{prefix + "{k}"}, decideArgs...); err == nil {
				t.Fatal("a call succeeded with the server killed")
			}
			p.RunAll(ctx, time.Now().Add(5*time.Second), batchDecide, calls[:10])
			for i, c := range calls[:10] {
				if c.Err == nil {
					t.Errorf("call %d succeeded with the server killed", i)
				}
			}
		})
	}
}

// directsOn reports whether p's server would let a call go direct now:
// directLocked's conditions, but for the process being short of CPU
// (which the test turns off).
func directsOn(p *Pipeliner) bool {
	d := p.single
	if d == nil {
		return false
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, l := range d.lanes {
		if l.busy {
			return false // still finishing the batch before
		}
	}
	return d.served && d.state == up && len(d.queue) == 0 &&
		!(p.directTimeout > 0 && 2*d.peak > p.directTimeout) && time.Since(d.lateAt) >= lateFor
}
