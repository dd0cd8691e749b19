package redisstore

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"net"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/redispipe"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/internal/schedlag"
	"github.com/sluicehq/sluice/internal/storetest"
	"github.com/sluicehq/sluice/internal/window"
)

var t0 = storetest.T0

func perMinute(n int) window.Limit { return window.Limit{Requests: n, Window: time.Minute} }
func perHour(n int) window.Limit   { return window.Limit{Requests: n, Window: time.Hour} }

// take calls s.Take with one charge and fails the test on an error.
func take(t testing.TB, s *Store, now time.Time, c window.Charge) (bool, window.Decision) {
	t.Helper()
	out := make([]window.Decision, 1)
	ok, err := s.Take(context.Background(), now, []window.Charge{c}, out)
	if err != nil {
		t.Fatalf("Take(%s/%s): %v", c.Key, c.Name, err)
	}
	return ok, out[0]
}

// countHook counts the commands a client sends, by name.
type countHook struct {
	mu sync.Mutex
	n  map[string]int
}

func newCountHook() *countHook { return &countHook{n: map[string]int{}} }

func (h *countHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *countHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.add(cmd.Name())
		return next(ctx, cmd)
	}
}

func (h *countHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, cmd := range cmds {
			h.add(cmd.Name())
		}
		return next(ctx, cmds)
	}
}

func (h *countHook) add(name string) {
	h.mu.Lock()
	h.n[name]++
	h.mu.Unlock()
}

// take returns the counts of EVALSHA and EVAL since the last call.
func (h *countHook) take() (evalsha, eval int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	evalsha, eval = h.n["evalsha"], h.n["eval"]
	clear(h.n)
	return evalsha, eval
}

func TestNew(t *testing.T) {
	t.Parallel()
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	defer c.Close()
	bad := []struct {
		name   string
		client redis.Scripter
		cfg    Config
	}{
		{"NilInterface", nil, Config{}},
		{"NilClient", (*redis.Client)(nil), Config{}},
		{"NilClusterClient", (*redis.ClusterClient)(nil), Config{}},
		{"NilRing", (*redis.Ring)(nil), Config{}},
		{"OpenBrace", c, Config{Prefix: "a{"}},
		{"CloseBrace", c, Config{Prefix: "}"}},
		{"LongPrefix", c, Config{Prefix: strings.Repeat("p", 257)}},
	}
	for _, tt := range bad {
		s, err := New(tt.client, tt.cfg)
		if err == nil || s != nil {
			t.Errorf("%s: New = %v, %v; want an error", tt.name, s, err)
		} else if !strings.HasPrefix(err.Error(), "redisstore: ") {
			t.Errorf("%s: error %q lacks the package prefix", tt.name, err)
		}
	}
	s, err := New(c, Config{})
	if err != nil {
		t.Fatal(err)
	}
	if s.prefix != DefaultPrefix || s.timeout != DefaultTimeout || s.split {
		t.Errorf("defaults: prefix %q, timeout %s, split %v", s.prefix, s.timeout, s.split)
	}
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{"127.0.0.1:1"}})
	defer cc.Close()
	if s, err := New(cc, Config{Timeout: -1}); err != nil || !s.split || s.timeout != -1 {
		t.Errorf("cluster client: %v, %v", s, err)
	}
}

// keyPattern is the form of every key the store writes under prefix
// "<p>": <p>{tag}.
func keyPattern(prefix string) *regexp.Regexp {
	return regexp.MustCompile(`^` + regexp.QuoteMeta(prefix) + `\{[A-Za-z0-9_-]{3}\}$`)
}

func TestKeyLayout(t *testing.T) {
	t.Parallel()
	s := &Store{prefix: "p:"}
	key := func(k string) string { return string(s.appendKey(nil, k)) }
	field := func(k, name string, w time.Duration) string {
		return string(appendField(nil, &window.Charge{Key: k, Name: name, Limit: window.Limit{Requests: 1, Window: w}}))
	}
	sum := sha256.Sum256([]byte("ip:192.0.2.1"))
	tag := base64.RawURLEncoding.EncodeToString(sum[:])[:3]
	if got, want := key("ip:192.0.2.1"), "p:{"+tag+"}"; got != want {
		t.Errorf("key = %q, want %q", got, want)
	}
	long := strings.Repeat("k", 1<<20)
	if got := key(long); len(got) != len("p:{abc}") || !keyPattern("p:").MatchString(got) {
		t.Errorf("1 MB key gives key %.80q", got)
	}
	if got := field(long, strings.Repeat("n", 1000), time.Hour); len(got) != fieldLen {
		t.Errorf("1 MB key gives a %d-byte field", len(got))
	}
	fields := map[string]string{}
	for _, f := range []struct {
		k, name string
		w       time.Duration
	}{
		{"a", "n", time.Minute}, {"a", "n", 2 * time.Minute}, {"a", "m", time.Minute}, {"b", "n", time.Minute},
		// Lengths are part of the hash input: moving bytes between Key
		// and Name gives another field.
		{"ab", "c", time.Minute}, {"a", "bc", time.Minute}, {"", "", time.Millisecond},
	} {
		id := fmt.Sprintf("%q/%q/%s", f.k, f.name, f.w)
		got := field(f.k, f.name, f.w)
		if other, ok := fields[got]; ok {
			t.Errorf("%s and %s share a field", id, other)
		}
		fields[got] = id
	}
	// A sliding window's field is the one it had before there were other
	// algorithms (SHA-256 of the length-prefixed Key and Name and of the
	// window in ms, as uvarints), so counters survive an upgrade; the
	// other algorithms, and calendar periods in other zones, get fields
	// of their own for the same window.
	var in []byte
	in = binary.AppendUvarint(in, 2)
	in = append(in, "ab"...)
	in = binary.AppendUvarint(in, 1)
	in = append(in, "n"...)
	in = binary.AppendUvarint(in, 60_000)
	old := sha256.Sum256(in)
	if got := field("ab", "n", time.Minute); got != string(old[:fieldLen]) {
		t.Errorf("the sliding window's field changed: %x, was %x", got, old[:fieldLen])
	}
	byLimit := map[string]window.Limit{}
	for _, l := range []window.Limit{
		{Requests: 1, Window: time.Minute},
		{Requests: 1, Window: time.Minute, Algorithm: window.FixedWindow},
		{Requests: 1, Window: time.Minute, Algorithm: window.SlidingLog},
		{Requests: 1, Window: time.Minute, Algorithm: window.TokenBucket},
		{Requests: 1, Algorithm: window.FixedWindow, Period: window.CalendarDay},
		{Requests: 1, Algorithm: window.FixedWindow, Period: window.CalendarDay, Location: time.FixedZone("X", 3600)},
		{Requests: 1, Algorithm: window.FixedWindow, Period: window.CalendarWeek},
	} {
		got := string(appendField(nil, &window.Charge{Key: "ab", Name: "n", Limit: l}))
		if other, ok := byLimit[got]; ok {
			t.Errorf("%s and %s share a field", l, other)
		}
		byLimit[got] = l
	}
}

// TestKeysInRedis writes hostile keys and names through a real server and
// checks every key it finds under the test prefix.
func TestKeysInRedis(t *testing.T) {
	t.Parallel()
	srv := redistest.Shared(t)
	c := srv.Client(t, nil)
	prefix := srv.Prefix(t)
	s := newTestStore(t, c, prefix)
	keys := []string{"a", "{a}", "a{b}c", "}", "a:b", "a\nb", "a\r\n*1\r\n$8\r\nFLUSHALL\r\n", strings.Repeat("x", 1<<20), ""}
	names := []string{"per-ip", "evil}{name", "a b", strings.Repeat("n", 100)}
	for _, k := range keys {
		for _, n := range names {
			if ok, d := take(t, s, t0, window.Charge{Key: k, Name: n, Limit: perMinute(1), Cost: 1}); !ok {
				t.Fatalf("key %.20q name %q denied on first use: %+v (collision?)", k, n, d)
			}
		}
	}
	found, err := c.Keys(context.Background(), prefix+"*").Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(found) == 0 || len(found) > len(keys) {
		t.Fatalf("%d keys under the prefix for %d client keys", len(found), len(keys))
	}
	re := keyPattern(prefix)
	counters := 0
	for _, k := range found {
		if !re.MatchString(k) {
			t.Errorf("key %q does not have the hash-tagged form", k)
		}
		if typ := c.Type(context.Background(), k).Val(); typ != "hash" {
			t.Errorf("key %q is a %s", k, typ)
		}
		counters += int(c.HLen(context.Background(), k).Val())
	}
	if want := len(keys) * len(names); counters != want {
		t.Errorf("%d counters in the buckets, want %d", counters, want)
	}
}

func TestOneRoundTrip(t *testing.T) {
	t.Parallel()
	charges := func(key string) []window.Charge {
		return []window.Charge{
			{Key: key, Name: "burst", Limit: window.Limit{Requests: 1000, Window: time.Second}, Cost: 1},
			{Key: key, Name: "quota", Limit: perHour(1000), Cost: 1},
			{Key: key, Name: "daily", Limit: window.Limit{Requests: 1000, Window: 24 * time.Hour}, Cost: 1},
		}
	}
	check := func(t *testing.T, s *Store, h *countHook, key string, fresh bool) {
		out := make([]window.Decision, 3)
		for i := 0; i < 20; i++ {
			if ok, err := s.Take(context.Background(), time.Time{}, charges(key), out); err != nil || !ok {
				t.Fatalf("Take %d: %v, %v", i, ok, err)
			}
			evalsha, eval := h.take()
			switch {
			case i == 0 && fresh && evalsha == 2 && eval == 0:
				// NOSCRIPT, then SCRIPT LOAD and EVALSHA again: the server
				// had not seen the script.
			case evalsha == 1 && eval == 0:
			default:
				t.Fatalf("Take %d sent %d EVALSHA and %d EVAL, want one round trip", i, evalsha, eval)
			}
		}
	}

	t.Run("Standalone", func(t *testing.T) {
		t.Parallel()
		// A server of its own, so that the script cache starts empty and
		// the server's own command statistics count only this test.
		srv := redistest.Standalone(t)
		h := newCountHook()
		// Calls made directly on an idle server go through clones of a
		// client without ContextTimeoutEnabled, which go-redis gives
		// none of its hooks.
		c := srv.Client(t, &redis.Options{ContextTimeoutEnabled: true})
		c.AddHook(h)
		s := newTestStore(t, c, srv.Prefix(t))
		admin := srv.Client(t, nil)
		before := redistest.ScriptCalls(t, admin)
		check(t, s, h, "k", true)
		if got := redistest.ScriptCalls(t, admin) - before; got != 21 {
			t.Errorf("the server ran %d EVALSHA and EVAL for 20 decisions, want 21 (one NOSCRIPT)", got)
		}
	})
	t.Run("Cluster", func(t *testing.T) {
		t.Parallel()
		cl := redistest.SharedCluster(t)
		h := newCountHook()
		// Count what reaches the nodes, after the cluster client's routing
		// and redirections.
		c := cl.Client(t, &redis.ClusterOptions{NewClient: func(o *redis.Options) *redis.Client {
			o.ContextTimeoutEnabled = true // see Standalone
			n := redis.NewClient(o)
			n.AddHook(h)
			return n
		}})
		s := newTestStore(t, c, cl.Prefix(t))
		check(t, s, h, "k", true)
	})
}

// TestOneClock shows that stores on application servers whose clocks are
// ten minutes apart share one budget when they let Redis keep time, and do
// not when each passes its own clock.
func TestOneClock(t *testing.T) {
	t.Parallel()
	srv := redistest.Shared(t)
	prefix := srv.Prefix(t)
	type app struct {
		store *Store
		clock func() time.Time
	}
	apps := []app{
		{newTestStore(t, srv.Client(t, nil), prefix), func() time.Time { return time.Now().Add(-5 * time.Minute) }},
		{newTestStore(t, srv.Client(t, nil), prefix), func() time.Time { return time.Now().Add(5 * time.Minute) }},
	}
	admitted := func(key string, useLocalClock bool) int {
		n := 0
		for _, a := range apps {
			for i := 0; i < 6; i++ {
				var now time.Time // zero: Redis TIME
				if useLocalClock {
					now = a.clock()
				}
				if ok, _ := take(t, a.store, now, window.Charge{Key: key, Name: "r", Limit: perMinute(10), Cost: 1}); ok {
					n++
				}
			}
		}
		return n
	}
	if got := admitted("local-clocks", true); got != 12 {
		t.Errorf("with the apps' own clocks, %d admitted; want 12, the skew splitting the budget", got)
	}
	if got := admitted("redis-time", false); got != 10 {
		t.Errorf("with Redis TIME, %d admitted; want exactly the limit, 10", got)
	}
}

// TestNoRaceAdmitsExtra hammers one key from several stores and many
// goroutines at one frozen instant: exactly the limit is admitted.
func TestNoRaceAdmitsExtra(t *testing.T) {
	t.Parallel()
	run := func(t *testing.T, newClient func() redis.Scripter, prefix string) {
		const (
			stores     = 4
			goroutines = 32
			tries      = 4
			limit      = 100
		)
		var admitted, denied atomic.Int64
		var wg sync.WaitGroup
		now := t0.Add(17 * time.Minute)
		c := window.Charge{Key: "hot", Name: "r", Limit: perHour(limit), Cost: 1}
		for i := 0; i < stores; i++ {
			s := newTestStore(t, newClient(), prefix)
			for g := 0; g < goroutines; g++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					out := make([]window.Decision, 1)
					for k := 0; k < tries; k++ {
						ok, err := s.Take(context.Background(), now, []window.Charge{c}, out)
						switch {
						case err != nil:
							t.Error(err)
							return
						case ok:
							admitted.Add(1)
						default:
							denied.Add(1)
						}
					}
				}()
			}
		}
		wg.Wait()
		if a, d := admitted.Load(), denied.Load(); a != limit || a+d != stores*goroutines*tries {
			t.Fatalf("%d admitted and %d denied, want %d admitted of %d", a, d, limit, stores*goroutines*tries)
		}
	}
	t.Run("Standalone", func(t *testing.T) {
		t.Parallel()
		srv := redistest.Shared(t)
		run(t, func() redis.Scripter { return srv.Client(t, nil) }, srv.Prefix(t))
	})
	t.Run("Cluster", func(t *testing.T) {
		t.Parallel()
		cl := redistest.SharedCluster(t)
		run(t, func() redis.Scripter { return cl.Client(t, nil) }, cl.Prefix(t))
	})
}

// TestCrossSlot checks, on Redis Cluster, a request whose two Keys live on
// different masters: a deny by the second gives back the first's charge.
func TestCrossSlot(t *testing.T) {
	t.Parallel()
	cl := redistest.SharedCluster(t)
	h := newCountHook()
	// Count what reaches the nodes.
	c := cl.Client(t, &redis.ClusterOptions{NewClient: func(o *redis.Options) *redis.Client {
		o.ContextTimeoutEnabled = true // hooks see direct calls
		n := redis.NewClient(o)
		n.AddHook(h)
		return n
	}})
	prefix := cl.Prefix(t)
	s := newTestStore(t, c, prefix)
	ctx := context.Background()

	// Two Keys whose counters fall in the slot ranges of different masters.
	slotOf := func(k string) int64 {
		var b []byte
		b = s.appendKey(b, k)
		slot, err := c.ClusterKeySlot(ctx, string(b)).Result()
		if err != nil {
			t.Fatal(err)
		}
		return slot
	}
	k1 := "user:1"
	k2 := ""
	for i := 0; k2 == ""; i++ {
		if k := "user:" + strconv.Itoa(i+2); slotOf(k)/5462 != slotOf(k1)/5462 {
			k2 = k
		}
	}
	a := window.Charge{Key: k1, Name: "a", Limit: perMinute(10), Cost: 4}
	b := window.Charge{Key: k2, Name: "b", Limit: perMinute(5), Cost: 4}
	read := func(c window.Charge) window.Decision {
		c.Cost = 0
		_, d := take(t, s, t0, c)
		return d
	}
	out := make([]window.Decision, 2)
	h.take()
	if ok, err := s.Take(ctx, t0, []window.Charge{a, b}, out); err != nil || !ok {
		t.Fatalf("first request: %v, %v", ok, err)
	}
	// One run per Key; a node that had not seen the script yet answers
	// NOSCRIPT and gets it again after SCRIPT LOAD.
	if evalsha, eval := h.take(); evalsha < 2 || evalsha > 4 || eval != 0 {
		t.Errorf("first request: %d EVALSHA, %d EVAL; want one run per Key", evalsha, eval)
	}
	// b: 8 > 5 denies (retry in the next window, when
	// 4*(59999-y) + 4*60000 <= 5*60000: y = 44999 ms in); a, charged
	// first, must be given back and described as not charged (its 7th
	// unit comes back y = 59999 - 3*60000/4 = 14999 ms into the next
	// window).
	ok, err := s.Take(ctx, t0, []window.Charge{a, b}, out)
	if err != nil || ok {
		t.Fatalf("second request: %v, %v; want a deny", ok, err)
	}
	if want := []window.Decision{{Allowed: true, Remaining: 6, ResetAfter: 119999 * time.Millisecond, NextAfter: 74999 * time.Millisecond},
		{Remaining: 1, ResetAfter: 119999 * time.Millisecond, RetryAfter: 104999 * time.Millisecond}}; !slices.Equal(out, want) {
		t.Errorf("second request decided %+v, want %+v", out, want)
	}
	if d := read(a); d.Remaining != 6 {
		t.Errorf("after the deny, a has %d remaining, want 6: the charge was not given back", d.Remaining)
	}
	// Denied by the first Key: the second is only read.
	if ok, err := s.Take(ctx, t0, []window.Charge{b, a}, out); err != nil || ok {
		t.Fatalf("third request: %v, %v; want a deny", ok, err)
	}
	if d := read(a); d.Remaining != 6 {
		t.Errorf("after a deny by the first Key, a has %d remaining, want 6", d.Remaining)
	}
}

// TestRefund exercises each case of refund.lua directly.
func TestRefund(t *testing.T) {
	t.Parallel()
	srv := redistest.Shared(t)
	c := srv.Client(t, nil)
	s := newTestStore(t, c, srv.Prefix(t))
	ctx := context.Background()
	const w = int64(60_000)
	start := window.Millis(t0)
	// charge counts cost at now through the script and returns what a
	// refund needs.
	charge := func(key string, now time.Time, cost int) (*scratch, []window.Charge) {
		t.Helper()
		cs := []window.Charge{{Key: key, Name: "r", Limit: perMinute(100), Cost: cost}}
		sc := &scratch{keys: []string{string(s.appendKey(nil, key))}, fields: appendField(nil, &cs[0]), info: make([]counter, 1)}
		if ok, _, err := s.run(ctx, sc, window.Millis(now), true, cs, []int{0}, make([]window.Decision, 1)); err != nil || !ok {
			t.Fatalf("charge: %v, %v", ok, err)
		}
		return sc, cs
	}
	ms := func(v int64) string { return strconv.FormatInt(v, 10) }
	fields := func(sc *scratch) []string {
		t.Helper()
		v, err := c.HGet(ctx, sc.keys[0], string(sc.field(0))).Result()
		if err != nil {
			t.Fatal(err)
		}
		f, ok := decodeCounter(v)
		if !ok || f[3] != w {
			t.Fatalf("counter %x, want start, prev, curr and window", v)
		}
		return []string{ms(f[0]), ms(f[1]), ms(f[2])}
	}

	// Untouched since the charge: the key did not exist, so it goes.
	sc, cs := charge("fresh", t0, 3)
	s.refund(ctx, sc, start, cs, []int{0})
	if n := c.HExists(ctx, sc.keys[0], string(sc.field(0))).Val(); n {
		t.Errorf("untouched new counter: still exists after the refund")
	}

	// Untouched, but it existed and the charge rolled it: put back as it
	// was.
	charge("rolled", t0.Add(10*time.Second), 5)
	sc, cs = charge("rolled", t0.Add(70*time.Second), 2)
	s.refund(ctx, sc, start+70_000, cs, []int{0})
	if got, want := fields(sc), []string{ms(start + 10_000), "0", "5"}; !slices.Equal(got, want) {
		t.Errorf("untouched rolled counter: %v after the refund, want %v", got, want)
	}

	// Touched since, same window: the current count goes down.
	sc, cs = charge("same", t0, 3)
	charge("same", t0, 2)
	s.refund(ctx, sc, start, cs, []int{0})
	if got, want := fields(sc), []string{ms(start), "0", "2"}; !slices.Equal(got, want) {
		t.Errorf("touched counter: %v after the refund, want %v", got, want)
	}

	// Rolled one window since: the previous count goes down.
	sc, cs = charge("next", t0, 3)
	charge("next", t0.Add(time.Minute), 1)
	s.refund(ctx, sc, start, cs, []int{0})
	if got, want := fields(sc), []string{ms(start + w), "0", "1"}; !slices.Equal(got, want) {
		t.Errorf("counter rolled once: %v after the refund, want %v", got, want)
	}

	// Never below zero.
	sc, cs = charge("floor", t0, 3)
	if err := c.HSet(ctx, sc.keys[0], string(sc.field(0)), encodeCounter(start, 0, 1, w)).Err(); err != nil {
		t.Fatal(err)
	}
	s.refund(ctx, sc, start, cs, []int{0})
	if got, want := fields(sc), []string{ms(start), "0", "0"}; !slices.Equal(got, want) {
		t.Errorf("counter below the cost: %v after the refund, want %v", got, want)
	}

	// Rolled further (here, afresh): left alone.
	sc, cs = charge("far", t0, 3)
	charge("far", t0.Add(2*time.Minute), 1)
	s.refund(ctx, sc, start, cs, []int{0})
	if got, want := fields(sc), []string{ms(start + 2*w), "0", "1"}; !slices.Equal(got, want) {
		t.Errorf("counter rolled twice: %v after the refund, want %v", got, want)
	}
}

func TestExpiry(t *testing.T) {
	t.Parallel()
	srv := redistest.Shared(t)
	c := srv.Client(t, nil)
	s := newTestStore(t, c, srv.Prefix(t))
	ctx := context.Background()
	for _, tt := range []struct {
		name string
		now  time.Time
		w    time.Duration
	}{
		{"RedisTime", time.Time{}, time.Minute},
		{"LocalTime", time.Now(), time.Minute},
		{"FakeTime", t0.Add(59 * time.Second), time.Minute},
		{"Hour", time.Time{}, time.Hour},
	} {
		ch := window.Charge{Key: tt.name, Name: "r", Limit: window.Limit{Requests: 10, Window: tt.w}, Cost: 1}
		take(t, s, tt.now, ch)
		key := string(s.appendKey(nil, ch.Key))
		ttl, err := c.PTTL(ctx, key).Result()
		if err != nil {
			t.Fatal(err)
		}
		// The counter's windows start at this request: two whole windows.
		if ttl <= 2*tt.w-time.Second || ttl > 2*tt.w {
			t.Errorf("%s: PTTL %s, want about %s", tt.name, ttl, 2*tt.w)
		}
		// A read writes nothing, expiry included.
		ch.Cost = 0
		take(t, s, tt.now, ch)
		if ttl2 := c.PTTL(ctx, key).Val(); ttl2 > ttl {
			t.Errorf("%s: a read raised PTTL from %s to %s", tt.name, ttl, ttl2)
		}
	}

	// A key really goes: 100 ms windows expire within 200 ms of the write.
	ch := window.Charge{Key: "short", Name: "r", Limit: window.Limit{Requests: 10, Window: 100 * time.Millisecond}, Cost: 1}
	take(t, s, time.Time{}, ch)
	key := string(s.appendKey(nil, ch.Key))
	deadline := time.Now().Add(2 * time.Second)
	for c.Exists(ctx, key).Val() == 1 {
		if time.Now().After(deadline) {
			t.Fatal("a counter of 100 ms windows still exists after 2 s")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestExpiryExtended moves existing sliding-window counters into a later
// window, alone in a request (the script's quick path) and beside another
// charge (its general path): each time the bucket must live on to two
// windows after the new window's start. The bucket's TTL is first cut to
// 1 s, as though the fake clock's minutes had passed in Redis too.
func TestExpiryExtended(t *testing.T) {
	t.Parallel()
	srv := redistest.Shared(t)
	c := srv.Client(t, nil)
	s := newTestStore(t, c, srv.Prefix(t))
	ctx := context.Background()
	lim := window.Limit{Requests: 10, Window: time.Minute}
	for _, tt := range []struct {
		name  string
		other bool // a second charge in the request, on another bucket
		later time.Duration
		want  time.Duration // the TTL the bucket must have after the move
		// Remaining after the move: half the previous window's two
		// requests still weigh 30 s into the next window.
		remaining int
	}{
		{"alone/next-window", false, 90 * time.Second, 90 * time.Second, 8},
		{"alone/windows-later", false, 5 * time.Minute, 2 * time.Minute, 9},
		{"with-other/next-window", true, 90 * time.Second, 90 * time.Second, 8},
		{"with-other/windows-later", true, 5 * time.Minute, 2 * time.Minute, 9},
	} {
		t.Run(tt.name, func(t *testing.T) {
			chs := []window.Charge{{Key: "ext:" + tt.name, Name: "r", Limit: lim, Cost: 1}}
			if tt.other {
				chs = append(chs, window.Charge{Key: "ext-other:" + tt.name, Name: "r", Limit: lim, Cost: 1})
			}
			out := make([]window.Decision, len(chs))
			for _, at := range []time.Time{t0, t0.Add(time.Second)} {
				if ok, err := s.Take(ctx, at, chs, out); err != nil || !ok {
					t.Fatalf("Take at %s: %v, %v", at, ok, err)
				}
			}
			key := string(s.appendKey(nil, chs[0].Key))
			if err := c.PExpire(ctx, key, time.Second).Err(); err != nil {
				t.Fatal(err)
			}
			if ok, err := s.Take(ctx, t0.Add(tt.later), chs, out); err != nil || !ok {
				t.Fatalf("Take %s later: %v, %v", tt.later, ok, err)
			}
			if out[0].Remaining != tt.remaining {
				t.Errorf("Remaining %d after the move, want %d", out[0].Remaining, tt.remaining)
			}
			ttl := c.PTTL(ctx, key).Val()
			if ttl <= tt.want-time.Second || ttl > tt.want {
				t.Errorf("PTTL %s after the move, want about %s", ttl, tt.want)
			}
		})
	}
}

// TestRedisDown stops and pauses a server under a store: Take fails fast,
// with a wrapped error, and recovers when the server is back.
func TestRedisDown(t *testing.T) {
	t.Parallel()
	ch := window.Charge{Key: "k", Name: "r", Limit: perMinute(1000), Cost: 1}
	const timeout = 200 * time.Millisecond
	// timed runs Take and checks that it fails within limit, and the
	// scheduling lag this process met meanwhile (a deadline's timer, or
	// the reader of a reply, may run that late).
	timed := func(t *testing.T, s *Store, limit time.Duration) error {
		t.Helper()
		lags := schedlag.Start(t)
		start := time.Now()
		out := make([]window.Decision, 1)
		ok, err := s.Take(context.Background(), time.Time{}, []window.Charge{ch}, out)
		lags.Stop()
		if took, lag := time.Since(start), lags.Max(); took > limit+lag {
			t.Errorf("Take took %s, want at most %s and the scheduling lag met, %s", took, limit, lag)
		}
		if err == nil || ok {
			t.Fatalf("Take = %v, %v; want an error", ok, err)
		}
		if !strings.HasPrefix(err.Error(), "redisstore: ") {
			t.Errorf("error %q lacks the package prefix", err)
		}
		return err
	}
	// ok waits until a Take succeeds: a server that was down is probed
	// again within a few hundred ms.
	ok := func(t *testing.T, s *Store) {
		t.Helper()
		out := make([]window.Decision, 1)
		deadline := time.Now().Add(2 * time.Second)
		for {
			ok, err := s.Take(context.Background(), time.Time{}, []window.Charge{ch}, out)
			if err == nil && ok {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("Take = %v, %v", ok, err)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}

	t.Run("Stopped", func(t *testing.T) {
		t.Parallel()
		srv := redistest.Standalone(t)
		s := newStoreTimeout(t, srv.Client(t, nil), timeout)
		ok(t, s)
		srv.Stop()
		err := timed(t, s, timeout+300*time.Millisecond)
		// The server is marked down (its connection broke, or the batch
		// stalled while go-redis retried the dial), or the deadline came
		// first.
		var ne net.Error
		if !errors.Is(err, redispipe.ErrUnavailable) && !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, syscall.ECONNREFUSED) && !errors.As(err, &ne) {
			t.Errorf("error %v is neither unavailable, a deadline nor a network error", err)
		}
		t.Logf("stopped: %v", err)
		if err := srv.Restart(); err != nil {
			t.Fatal(err)
		}
		ok(t, s)
	})
	t.Run("HungContextTimeout", func(t *testing.T) {
		t.Parallel()
		srv := redistest.Standalone(t)
		s := newStoreTimeout(t, srv.Client(t, &redis.Options{ContextTimeoutEnabled: true}), timeout)
		ok(t, s)
		if err := srv.Pause(); err != nil {
			t.Fatal(err)
		}
		err := timed(t, s, timeout+300*time.Millisecond)
		if !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, redispipe.ErrStalled) {
			var ne net.Error
			if !errors.As(err, &ne) || !ne.Timeout() {
				t.Errorf("error %v is not a timeout or a stall", err)
			}
		}
		t.Logf("hung, ContextTimeoutEnabled: %v", err)
		if err := srv.Resume(); err != nil {
			t.Fatal(err)
		}
		ok(t, s)
	})
	t.Run("HungWithoutContextTimeout", func(t *testing.T) {
		t.Parallel()
		// Without ContextTimeoutEnabled, go-redis ignores the deadline on
		// the socket and would wait for its ReadTimeout (30 s here): the
		// store stops waiting at its own deadline instead.
		srv := redistest.Standalone(t)
		s := newStoreTimeout(t, srv.Client(t, &redis.Options{ReadTimeout: 30 * time.Second}), timeout)
		if s.pipe == nil {
			t.Fatal("store does not pipeline the calls of a *redis.Client")
		}
		ok(t, s)
		if err := srv.Pause(); err != nil {
			t.Fatal(err)
		}
		// The batch stalls: the server is marked down long before the
		// deadline, or the call gives up at it, within the store's slack
		// past it (docs/redis.md: 25 ms); a call sent alone gives up when
		// its connection's read times out at the stall threshold.
		err := timed(t, s, timeout+25*time.Millisecond)
		var ne net.Error
		if !errors.Is(err, redispipe.ErrStalled) && !errors.Is(err, context.DeadlineExceeded) && !(errors.As(err, &ne) && ne.Timeout()) {
			t.Errorf("error %v is not a stall, a deadline or a read's timeout", err)
		}
		t.Logf("hung, no ContextTimeoutEnabled: %v", err)
		if err := srv.Resume(); err != nil {
			t.Fatal(err)
		}
		// The call left behind completes; the store goes on working.
		ok(t, s)
	})
	t.Run("HungUnknownClient", func(t *testing.T) {
		t.Parallel()
		// A client of a type the store does not know is not pipelined:
		// its script runs on a goroutine of its own, and Take and TakeAt
		// stop waiting for it at the deadline.
		srv := redistest.Standalone(t)
		s := newStoreTimeout(t, unknownClient{srv.Client(t, &redis.Options{ReadTimeout: 30 * time.Second})}, timeout)
		if !s.detach {
			t.Fatal("store does not detach the calls of a client of unknown type")
		}
		ok(t, s)
		out := make([]window.Decision, 1)
		allowed, at, err := s.TakeAt(context.Background(), time.Time{}, []window.Charge{ch}, out)
		if err != nil || !allowed || at.IsZero() {
			t.Fatalf("TakeAt = %v, %v, %v; want admitted at the server's clock", allowed, at, err)
		}
		if err := srv.Pause(); err != nil {
			t.Fatal(err)
		}
		err = timed(t, s, timeout+300*time.Millisecond)
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("Take: error %v is not the deadline", err)
		}
		start := time.Now()
		allowed, at, err = s.TakeAt(context.Background(), time.Time{}, []window.Charge{ch}, out)
		if took := time.Since(start); took > timeout+300*time.Millisecond {
			t.Errorf("TakeAt took %s, want at most %s", took, timeout+300*time.Millisecond)
		}
		if !errors.Is(err, context.DeadlineExceeded) || allowed || !at.IsZero() {
			t.Errorf("TakeAt = %v, %v, %v; want the deadline and the zero time", allowed, at, err)
		}
		if err := srv.Resume(); err != nil {
			t.Fatal(err)
		}
		ok(t, s)
	})
}

// unknownClient hides the type of its client from the store.
type unknownClient struct{ redis.Scripter }

func newStoreTimeout(t *testing.T, c redis.Scripter, timeout time.Duration) *Store {
	s, err := New(c, Config{Prefix: redistest.Prefix(t), Timeout: timeout})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func TestTakeErrors(t *testing.T) {
	t.Parallel()
	srv := redistest.Shared(t)
	c := srv.Client(t, nil)
	s := newTestStore(t, c, srv.Prefix(t))
	ctx := context.Background()
	ch := window.Charge{Key: "k", Name: "r", Limit: perMinute(10), Cost: 1}

	// A key of another type where a counter should be.
	if err := c.Set(ctx, string(s.appendKey(nil, ch.Key)), "x", time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	_, err := s.Take(ctx, t0, []window.Charge{ch}, make([]window.Decision, 1))
	if err == nil || !strings.Contains(err.Error(), "WRONGTYPE") {
		t.Errorf("Take on a string key: %v, want a WRONGTYPE error", err)
	}
	// A counter that is not one of ours (corrupt, or written by hand) is
	// taken as absent and replaced, never a script error.
	ch.Key = "garbage"
	if err := c.HSet(ctx, string(s.appendKey(nil, ch.Key)), string(appendField(nil, &ch)), "12 x").Err(); err != nil {
		t.Fatal(err)
	}
	if ok, d := take(t, s, t0, ch); !ok || d.Remaining != 9 {
		t.Errorf("Take over a corrupt counter: %v %+v, want a fresh counter", ok, d)
	}
	// Before the Unix epoch.
	ch.Key = "k2"
	if _, err := s.Take(ctx, time.Unix(-1, 0), []window.Charge{ch}, make([]window.Decision, 1)); err == nil {
		t.Error("Take before 1970: no error")
	}
	// After the year 6419: the scripts store instants in 6 bytes.
	if _, err := s.Take(ctx, time.Date(6420, 1, 1, 0, 0, 0, 0, time.UTC), []window.Charge{ch}, make([]window.Decision, 1)); err == nil {
		t.Error("Take in the year 6420: no error")
	}
	// A cancelled context.
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := s.Take(cctx, t0, []window.Charge{ch}, make([]window.Decision, 1)); !errors.Is(err, context.Canceled) {
		t.Errorf("Take with a cancelled context: %v", err)
	}
}

func TestParseReply(t *testing.T) {
	t.Parallel()
	// Two charges of 10/min, each counter at start 1000 with 4 in its
	// current window before this request, which costs 1 and is admitted.
	good := func() []int64 {
		r := []int64{1, 1_000}
		for i := 0; i < 2; i++ {
			r = append(r, 1, 1000, 0, 4, -1, 0, 0)
		}
		return r
	}
	charges := []window.Charge{{Key: "a", Limit: perMinute(10), Cost: 1}, {Key: "b", Limit: perMinute(10), Cost: 1}}
	out := make([]window.Decision, 2)
	info := make([]counter, 2)
	ok, now, err := parseReply(good(), true, charges, []int{0, 1}, out, info)
	want := window.Describe(window.State{Start: 1000, Curr: 5}, 1000, perMinute(10), 1, true)
	if err != nil || !ok || now != 1000 || out[1] != want || want.Remaining != 5 ||
		info[0].rolled.Curr != 4 || info[0].stored.Start != -1 || info[0].at != 1000 {
		t.Fatalf("good reply: %v %d %v %+v %+v", ok, now, err, out, info)
	}
	// A dry run describes the counter as it was.
	if _, _, err := parseReply(good(), false, charges, []int{0, 1}, out, info); err != nil || out[0].Remaining != 6 {
		t.Errorf("dry run: %v %+v", err, out[0])
	}
	bad := map[string]func(r []int64) []int64{
		"Short":         func(r []int64) []int64 { return r[:len(r)-1] },
		"Long":          func(r []int64) []int64 { return append(r, 0) },
		"Empty":         func(r []int64) []int64 { return nil },
		"AllowedTwo":    func(r []int64) []int64 { r[0] = 2; return r },
		"ChargeAllowed": func(r []int64) []int64 { r[2] = -1; return r },
		"NegStart":      func(r []int64) []int64 { r[3] = -1; return r },
		"NegPrev":       func(r []int64) []int64 { r[4] = -5; return r },
		"NegCurr":       func(r []int64) []int64 { r[5] = -2; return r },
		"StoredStart":   func(r []int64) []int64 { r[6] = -2; return r },
		"NegStoredCurr": func(r []int64) []int64 { r[8] = -1; return r },
	}
	for name, f := range bad {
		if _, _, err := parseReply(f(good()), true, charges, []int{0, 1}, out, info); err == nil {
			t.Errorf("%s: no error", name)
		}
	}

	// A sliding log's summary (two entries, 1 at 500 and 2 at 900, of
	// 3/min) and a token bucket's level (6/min: 60000 drops a token),
	// with its stored expiry in place of the tick.
	log := window.Limit{Requests: 3, Window: time.Minute, Algorithm: window.SlidingLog}
	tb := window.Limit{Requests: 6, Window: time.Minute, Algorithm: window.TokenBucket}
	charges = []window.Charge{{Key: "a", Limit: log, Cost: 1}, {Key: "a", Limit: tb, Cost: 1}}
	reply := func() []int64 {
		return []int64{0, 1_000,
			0, 3, 500, 900, 500, 500, 1_000,
			1, 1_000, 20_000, 60_000, 990, 1, 66_000}
	}
	ok, _, err = parseReply(reply(), true, charges, []int{0, 1}, out, info)
	wantLog := window.DescribeLog(log, window.LogSummary{Count: 3, Oldest: 500, Newest: 900, RetryC: 500, Retry1: 500}, 1000, 1, false)
	wantTB := window.Describe(window.State{Start: 1000, Prev: 1, Curr: 60_000}, 1000, tb, 1, true)
	if err != nil || ok || out[0] != wantLog || out[1] != wantTB || info[1].storedExp != 20_000 || info[1].rolled.Prev != 1 || info[0].at != 1000 {
		t.Errorf("log and token bucket: %v %v %+v %+v", ok, err, out, info)
	}
	for name, f := range map[string]func(r []int64) []int64{
		"NegCount":    func(r []int64) []int64 { r[3] = -1; return r },
		"NewestFirst": func(r []int64) []int64 { r[5] = 400; return r },
		"RetryC":      func(r []int64) []int64 { r[6] = -2; return r },
		"AtBeforeNow": func(r []int64) []int64 { r[8] = 999; return r },
		"Expiry":      func(r []int64) []int64 { r[11] = -2; return r },
	} {
		if _, _, err := parseReply(f(reply()), true, charges, []int{0, 1}, out, info); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}

// TestNowFromScript checks the instant the script reports: the one given,
// or the server's clock.
func TestNowFromScript(t *testing.T) {
	t.Parallel()
	srv := redistest.Shared(t)
	s := newTestStore(t, srv.Client(t, nil), srv.Prefix(t))
	ch := []window.Charge{{Key: "k", Name: "r", Limit: perMinute(10), Cost: 1}}
	out := make([]window.Decision, 1)
	_, now, err := s.take(context.Background(), t0.Add(1234*time.Millisecond), ch, out)
	if err != nil || now != window.Millis(t0)+1234 {
		t.Errorf("fake clock: now %d, %v; want %d", now, err, window.Millis(t0)+1234)
	}
	before := time.Now().UnixMilli()
	_, now, err = s.take(context.Background(), time.Time{}, ch, out)
	after := time.Now().UnixMilli()
	// The server runs on this machine: same clock.
	if err != nil || now < before-5 || now > after+5 {
		t.Errorf("server clock: now %d, %v; want within [%d, %d]", now, err, before, after)
	}
}

// encodeCounter packs a counter as the scripts do: four little-endian
// doubles.
func encodeCounter(v ...int64) string {
	b := make([]byte, 0, 32)
	for _, x := range v {
		b = binary.LittleEndian.AppendUint64(b, math.Float64bits(float64(x)))
	}
	return string(b)
}

// decodeCounter unpacks what encodeCounter packs.
func decodeCounter(s string) ([4]int64, bool) {
	var f [4]int64
	if len(s) != 32 {
		return f, false
	}
	for i := range f {
		f[i] = int64(math.Float64frombits(binary.LittleEndian.Uint64([]byte(s[8*i:]))))
	}
	return f, true
}
