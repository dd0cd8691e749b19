package redispipe

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/internal/schedlag"
)

func TestMain(m *testing.M) { redistest.Main(m) }

// testStall is the stall threshold of the tests of other things than
// health: a busy machine must not make them see servers go down.
const testStall = 2 * time.Second

// lagMeter measures how late this process's goroutines get to run (see
// package schedlag) until the test ends.
type lagMeter struct{ *schedlag.Log }

func newLagMeter(t testing.TB) *lagMeter { return &lagMeter{schedlag.Start(t)} }

// timing reports a failed timing bound as an error, unless this process
// was at some point not scheduled for longer than MinStallThreshold: the
// machine was then too busy for timing to prove anything, and the failure
// is only logged. The health tests use it for their time bounds, and
// t.Error for everything else.
func (m *lagMeter) timing(t testing.TB, format string, args ...any) {
	t.Helper()
	if lag := m.Max(); lag >= MinStallThreshold {
		t.Logf("NOT FAILED, the machine was too busy (this process went unscheduled for up to %s): "+format,
			append([]any{lag.Round(time.Millisecond)}, args...)...)
		return
	}
	t.Errorf(format, args...)
}

// warm makes a first call for key, trying again for a while should a busy
// machine make it fail.
func warm(t testing.TB, p *Pipeliner, key string) {
	t.Helper()
	var err error
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if _, err = runDecide(context.Background(), p, key); err == nil {
			return
		}
	}
	t.Fatalf("first call for %s: %v", key, err)
}

// decide stands in for a rate-limit decision: it reads three fields of a
// hash, counts the cost if it fits the limit, writes the fields back, sets
// the expiry and returns {allowed, remaining, count}.
//
// KEYS[1] is the counter; ARGV is limit, cost, now in ms and TTL in ms.
var decide = redis.NewScript(`
local v = redis.call('HMGET', KEYS[1], 's', 'p', 'c')
local limit = tonumber(ARGV[1])
local cost = tonumber(ARGV[2])
local c = tonumber(v[3]) or 0
local allowed = 0
if c + cost <= limit then
	c = c + cost
	allowed = 1
end
redis.call('HSET', KEYS[1], 's', ARGV[3], 'p', tonumber(v[2]) or 0, 'c', c)
redis.call('PEXPIRE', KEYS[1], ARGV[4])
return {allowed, limit - c, c}
`)

// decideArgs are the arguments of decide for a limit no test reaches.
var decideArgs = []any{1 << 30, 1, 1700000000000, 60000}

// runDecide runs decide for key with decideArgs and checks the reply's
// shape, returning the count.
func runDecide(ctx context.Context, p *Pipeliner, key string) (int64, error) {
	v, err := p.Run(ctx, decide, []string{key}, decideArgs...)
	if err != nil {
		return 0, err
	}
	a, ok := v.([]any)
	if !ok || len(a) != 3 {
		return 0, fmt.Errorf("reply %#v, want 3 integers", v)
	}
	n, ok := a[2].(int64)
	if !ok {
		return 0, fmt.Errorf("reply %#v, want 3 integers", v)
	}
	return n, nil
}

// newPipeliner returns a Pipeliner closed when the test ends.
func newPipeliner(t testing.TB, c redis.Scripter, cfg Config) *Pipeliner {
	t.Helper()
	p, err := New(c, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	return p
}

// pipeCounter is a go-redis hook that records the number of script calls
// (EVAL or EVALSHA) of every pipeline that has some, and the number of
// other single commands sent. (go-redis sends a pipeline of its own when it
// opens a connection.) A script sent on its own (a direct call) counts as a
// pipeline of one. go-redis gives none of a client's hooks to the clones
// through which direct calls go when the client has no
// ContextTimeoutEnabled, so tests that count calls use clients that have it.
type pipeCounter struct {
	mu     sync.Mutex
	sizes  []int
	single int
	// alone counts the script calls sent on their own (also counted as
	// pipelines of one).
	alone int
	// fail, if not nil, decides whether a pipeline fails without being
	// sent, and with which error.
	fail func(cmds []redis.Cmder) error
}

func (h *pipeCounter) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *pipeCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if name := cmd.Name(); name == "evalsha" || name == "eval" {
			// A direct call: a pipeline of one.
			h.mu.Lock()
			h.alone++
			h.mu.Unlock()
			return h.ProcessPipelineHook(func(ctx context.Context, cmds []redis.Cmder) error {
				return next(ctx, cmds[0])
			})(ctx, []redis.Cmder{cmd})
		}
		h.mu.Lock()
		h.single++
		h.mu.Unlock()
		return next(ctx, cmd)
	}
}

func (h *pipeCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		scripts := 0
		for _, c := range cmds {
			if name := c.Name(); name == "evalsha" || name == "eval" {
				scripts++
			}
		}
		h.mu.Lock()
		if scripts > 0 {
			h.sizes = append(h.sizes, scripts)
		}
		fail := h.fail
		h.mu.Unlock()
		if fail != nil {
			if err := fail(cmds); err != nil {
				for _, c := range cmds {
					c.SetErr(err)
				}
				return err
			}
		}
		return next(ctx, cmds)
	}
}

// stats returns the number of pipelines, the number of commands they held
// and the largest.
func (h *pipeCounter) stats() (pipes, cmds, largest int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, n := range h.sizes {
		cmds += n
		largest = max(largest, n)
	}
	return len(h.sizes), cmds, largest
}

// reset forgets the pipelines and commands counted so far.
func (h *pipeCounter) reset() {
	h.mu.Lock()
	h.sizes, h.single, h.alone = nil, 0, 0
	h.mu.Unlock()
}

// commandCalls returns the number of calls of command on the server, from
// INFO commandstats.
func commandCalls(t testing.TB, c *redis.Client, command string) int {
	t.Helper()
	info, err := c.Info(context.Background(), "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(info, "\r\n") {
		rest, ok := strings.CutPrefix(line, "cmdstat_"+command+":calls=")
		if !ok {
			continue
		}
		n, err := strconv.Atoi(rest[:strings.IndexByte(rest, ',')])
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	return 0
}

// stateLog records OnStateChange calls.
type stateLog struct {
	mu     sync.Mutex
	events []stateEvent
}

type stateEvent struct {
	dest  string
	up    bool
	cause error
	at    time.Time
}

func (l *stateLog) record(dest string, up bool, cause error) {
	l.mu.Lock()
	l.events = append(l.events, stateEvent{dest, up, cause, time.Now()})
	l.mu.Unlock()
}

func (l *stateLog) list() []stateEvent {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]stateEvent(nil), l.events...)
}

// percentile returns the p-th percentile of ds, which it sorts.
func percentile(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	sort.Slice(ds, func(i, j int) bool { return ds[i] < ds[j] })
	i := int(float64(len(ds)-1) * p)
	return ds[i]
}

// waitGoroutines waits, bounded, until at most n goroutines run, and
// returns how many do.
func waitGoroutines(n int, within time.Duration) int {
	deadline := time.Now().Add(within)
	for {
		got := runtime.NumGoroutine()
		if got <= n || time.Now().After(deadline) {
			return got
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// waitFor calls ok every 5 ms until it returns true or within passes, and
// reports whether it did.
func waitFor(within time.Duration, ok func() bool) bool {
	deadline := time.Now().Add(within)
	for {
		if ok() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// keysOnNodes returns, for each master of cl, n keys with prefix whose
// slots it serves, by address.
func keysOnNodes(t testing.TB, cc *redis.ClusterClient, prefix string, n int) map[string][]string {
	t.Helper()
	ctx := context.Background()
	out := make(map[string][]string)
	for i := 0; len(out) < 3 || minLen(out) < n; i++ {
		if i > 100000 {
			t.Fatal("could not spread keys over the masters")
		}
		key := prefix + "{" + strconv.Itoa(i) + "}:c"
		m, err := cc.MasterForKey(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		addr := m.Options().Addr
		if len(out[addr]) < n {
			out[addr] = append(out[addr], key)
		}
	}
	return out
}

func minLen(m map[string][]string) int {
	n := -1
	for _, v := range m {
		if n < 0 || len(v) < n {
			n = len(v)
		}
	}
	return n
}

// isUnavailable reports whether err says the destination is down.
func isUnavailable(err error) bool { return errors.Is(err, ErrUnavailable) }
