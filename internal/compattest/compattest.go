// Package compattest runs every capability of sluice that talks to Redis
// once, on whatever server a test gives it: the workloads behind
// TestCommandsDocumented (which records the commands each capability
// sends and checks them against docs/compatibility.md) and behind the
// miniredis module's tests (middleware/sluicetest/miniredis). Each
// workload checks what it gets back, so a server that runs the commands
// but answers wrongly fails it too.
package compattest

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/fleet"
	"github.com/sluicehq/sluice/internal/redispipe"
	"github.com/sluicehq/sluice/internal/redisstore"
	"github.com/sluicehq/sluice/internal/regions"
	"github.com/sluicehq/sluice/internal/window"
	"github.com/sluicehq/sluice/middleware"
	"github.com/sluicehq/sluice/middleware/config"
)

// Env is where a workload runs: a client of the server (standalone,
// Sentinel or Cluster) and a key prefix of its own.
type Env struct {
	Client redis.UniversalClient
	Prefix string
}

// Capability is one thing sluice does on Redis, named as the table of
// docs/compatibility.md names it, and a workload that does it.
type Capability struct {
	Name string
	Run  func(t testing.TB, e Env)
}

// Capabilities lists every capability, in the order of the table.
var Capabilities = []Capability{
	{"construction", construction},
	{"decisions", decisions},
	{"peek and reset", peekReset},
	{"settle and refund", settleRefund},
	{"concurrency", concurrency},
	{"fleet modes", fleetModes},
	{"elastic limits", elastic},
	{"top clients", topClients},
	{"bans", bans},
	{"overrides", overrides},
	{"pauses", pauses},
	{"outbound learning", outboundLearning},
	{"regions", regionsCap},
	{"rules from Redis", rulesSource},
}

// store returns a Redis store on e, closed when the test ends, with a
// timeout generous enough for a loaded machine.
func store(t testing.TB, e Env) *redisstore.Store {
	t.Helper()
	s, err := redisstore.New(e.Client, redisstore.Config{Prefix: e.Prefix, Timeout: 5 * time.Second,
		Pipeline: redispipe.Config{StallThreshold: 2 * time.Second}})
	if err != nil {
		t.Fatalf("redisstore.New: %v", err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

func check(t testing.TB, what string, err error) {
	t.Helper()
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

// at is the fixed instant the workloads decide at, where they pass one.
var at = time.Date(2030, time.January, 1, 0, 0, 30, 0, time.UTC)

// limits has a limit of each algorithm, each of 2 requests a window.
func limits() []window.Limit {
	return []window.Limit{
		{Requests: 2, Window: time.Minute},
		{Requests: 2, Window: time.Minute, Algorithm: window.FixedWindow},
		{Requests: 2, Algorithm: window.FixedWindow, Period: window.CalendarDay, Location: time.UTC},
		{Requests: 2, Window: time.Minute, Algorithm: window.TokenBucket},
		{Requests: 2, Window: time.Minute, Algorithm: window.LeakyBucket},
		{Requests: 2, Window: time.Minute, Algorithm: window.SlidingLog},
	}
}

// construction is what NewRedisStore sends before any request: the
// probe.
func construction(t testing.TB, e Env) {
	s, err := middleware.NewRedisStore(e.Client, middleware.RedisConfig{Prefix: e.Prefix})
	check(t, "NewRedisStore", err)
	_ = s.Close()
}

// decisions decides charges of every algorithm, at a given instant and on
// the server's clock, until each denies, and a request of two Keys (two
// slots on a Cluster, refunded when the second denies).
func decisions(t testing.TB, e Env) {
	ctx := context.Background()
	s := store(t, e)
	for i, l := range limits() {
		for _, now := range []time.Time{at, {}} {
			c := []window.Charge{{Key: fmt.Sprintf("k%d-%v", i, now.IsZero()), Name: "decide", Limit: l, Cost: 1}}
			out := make([]window.Decision, 1)
			capa := l.Capacity()
			for n := 1; n <= capa+1; n++ {
				ok, err := s.Take(ctx, now, c, out)
				check(t, "Take", err)
				if want := n <= capa; ok != want {
					t.Fatalf("%v at %v: request %d admitted %v, want %v", l, now, n, ok, want)
				}
			}
		}
	}
	l := window.Limit{Requests: 1, Window: time.Minute}
	two := []window.Charge{{Key: "a", Name: "two", Limit: l, Cost: 1}, {Key: "b", Name: "two", Limit: l, Cost: 1}}
	out := make([]window.Decision, 2)
	ok, err := s.Take(ctx, at, two[1:], out[1:])
	check(t, "Take b", err)
	if !ok {
		t.Fatal("the first request of b was denied")
	}
	if ok, err := s.Take(ctx, at, two, out); err != nil || ok {
		t.Fatalf("a and b with b spent: admitted %v, %v; want denied", ok, err)
	}
	if ok, err := s.Take(ctx, at, two[:1], out[:1]); err != nil || !ok {
		t.Fatalf("a after the denied pair: admitted %v, %v; want admitted (refunded)", ok, err)
	}
}

// peekReset reads a counter (cost 0) and resets it, as Limiter.Peek and
// Limiter.Reset do.
func peekReset(t testing.TB, e Env) {
	ctx := context.Background()
	s := store(t, e)
	c := []window.Charge{{Key: "peek", Name: "r", Limit: window.Limit{Requests: 1, Window: time.Minute}, Cost: 1}}
	out := make([]window.Decision, 1)
	_, err := s.Take(ctx, at, c, out)
	check(t, "Take", err)
	c[0].Cost = 0
	_, err = s.Take(ctx, at, c, out)
	check(t, "Peek", err)
	if out[0].Remaining != 0 {
		t.Fatalf("peek after one request of 1: %d remaining", out[0].Remaining)
	}
	check(t, "Reset", s.Reset(ctx, c))
	_, err = s.Take(ctx, at, c, out)
	check(t, "Peek", err)
	if out[0].Remaining != 1 {
		t.Fatalf("peek after Reset: %d remaining, want 1", out[0].Remaining)
	}
}

// settleRefund settles a usage, takes a charge back (TakeAt, Refund) and
// gives back a queued place (GiveBack).
func settleRefund(t testing.TB, e Env) {
	ctx := context.Background()
	s := store(t, e)
	for i, l := range limits() {
		c := []window.Charge{{Key: fmt.Sprintf("s%d", i), Name: "settle", Limit: l, Cost: 3}}
		out := make([]window.Decision, 1)
		check(t, "Settle", s.Settle(ctx, at, c, out))
		c[0].Cost = 1
		ok, when, err := s.TakeAt(ctx, at, c[:1], out)
		check(t, "TakeAt", err)
		if ok {
			t.Fatalf("%v: a request after a settled debt of 3 of 2 was admitted", l)
		}
		c[0].Key += "-refund"
		ok, when, err = s.TakeAt(ctx, at, c, out)
		check(t, "TakeAt", err)
		if !ok {
			t.Fatalf("%v: the first request was denied", l)
		}
		if l.Algorithm != window.LeakyBucket { // a queue gives places back instead
			check(t, "Refund", s.Refund(ctx, when, c))
		}
	}
	// A leaky bucket that queues: the third request waits its turn, and
	// gives its place back.
	l := window.Limit{Requests: 2, Window: time.Minute, Algorithm: window.LeakyBucket, MaxDelay: time.Minute}
	c := []window.Charge{{Key: "queue", Name: "queue", Limit: l, Cost: 1}}
	out := make([]window.Decision, 1)
	for n := 1; n <= 3; n++ {
		ok, err := s.Take(ctx, at, c, out)
		check(t, "Take", err)
		if !ok {
			t.Fatalf("a leaky bucket with a queue of a minute denied request %d", n)
		}
	}
	check(t, "GiveBack", s.GiveBack(ctx, at, c))
}

// concurrency holds, renews and releases a slot.
func concurrency(t testing.TB, e Env) {
	ctx := context.Background()
	s := store(t, e)
	a := &window.Slot{Key: "c", Name: "conc", Limit: 1, ID: "a", Lease: time.Minute}
	b := &window.Slot{Key: "c", Name: "conc", Limit: 1, ID: "b", Lease: time.Minute}
	if ok, _, err := s.Acquire(ctx, time.Time{}, a); err != nil || !ok {
		t.Fatalf("Acquire a: %v, %v", ok, err)
	}
	if ok, _, err := s.Acquire(ctx, time.Time{}, b); err != nil || ok {
		t.Fatalf("Acquire b with a held: %v, %v; want refused", ok, err)
	}
	check(t, "Renew", s.Renew(ctx, time.Time{}, []*window.Slot{a}))
	check(t, "Release", s.Release(ctx, a))
	if ok, _, err := s.Acquire(ctx, time.Time{}, b); err != nil || !ok {
		t.Fatalf("Acquire b after a's release: %v, %v", ok, err)
	}
}

// fleetModes takes a lease and pushes a write-back delta.
func fleetModes(t testing.TB, e Env) {
	ctx := context.Background()
	s := store(t, e)
	c := window.Charge{Key: "f", Name: "fleet", Limit: window.Limit{Requests: 10, Window: time.Minute}}
	ms := at.UnixMilli()
	rep, err := s.Fleet(ctx, time.Time{}, &fleet.Call{ID: redisstore.FleetID(&c), Limit: &c.Limit, Now: ms, Lease: true, Want: 4, Holder: 1, Until: ms + 500})
	check(t, "Fleet lease", err)
	if rep.Granted <= 0 {
		t.Fatalf("lease granted %d", rep.Granted)
	}
	_, err = s.Fleet(ctx, time.Time{}, &fleet.Call{ID: redisstore.FleetID(&c), Limit: &c.Limit, Now: -1, Delta: fleet.Delta{Start: rep.State.Start, Curr: 2}})
	check(t, "Fleet push", err)
}

// elastic publishes a server's spare capacity.
func elastic(t testing.TB, e Env) {
	s := store(t, e)
	total, servers, err := s.PublishSpare(context.Background(), time.Time{}, "server-1", 0.5, time.Minute)
	check(t, "PublishSpare", err)
	if servers != 1 || total != 0.5 {
		t.Fatalf("PublishSpare: fleet %v over %d servers, want 0.5 over 1", total, servers)
	}
}

// topClients publishes and collects top-client summaries.
func topClients(t testing.TB, e Env) {
	ctx := context.Background()
	s := store(t, e)
	check(t, "PublishTop", s.PublishTop(ctx, time.Time{}, "api", "server-1", []byte("summary"), time.Minute))
	got, err := s.CollectTop(ctx, time.Time{}, "api", time.Minute)
	check(t, "CollectTop", err)
	if len(got) != 1 {
		t.Fatalf("CollectTop: %d summaries, want 1", len(got))
	}
}

// bans bans a client, reads and lists the ban, and lifts it.
func bans(t testing.TB, e Env) {
	ctx := context.Background()
	s := store(t, e)
	until, err := s.SetBan(ctx, time.Time{}, "login", "ip:192.0.2.1", time.Minute)
	check(t, "SetBan", err)
	got, err := s.BannedUntil(ctx, time.Time{}, "login", "ip:192.0.2.1")
	check(t, "BannedUntil", err)
	if !got.Equal(until) {
		t.Fatalf("BannedUntil %v, want %v", got, until)
	}
	list, n, err := s.Bans(ctx, time.Time{}, 10)
	check(t, "Bans", err)
	if n != 1 || len(list) != 1 {
		t.Fatalf("Bans: %d of %d", len(list), n)
	}
	if ok, err := s.LiftBan(ctx, "login", "ip:192.0.2.1"); err != nil || !ok {
		t.Fatalf("LiftBan: %v, %v", ok, err)
	}
	_, err = s.AdminVersion(ctx)
	check(t, "AdminVersion", err)
}

// overrides sets, loads and removes a client's override.
func overrides(t testing.TB, e Env) {
	ctx := context.Background()
	s := store(t, e)
	check(t, "SetOverride", s.SetOverride(ctx, time.Time{}, "api", "user:alice", []byte("1000/1m"), time.Now().Add(time.Hour), 100))
	_, list, err := s.LoadOverrides(ctx)
	check(t, "LoadOverrides", err)
	if len(list) != 1 {
		t.Fatalf("LoadOverrides: %d overrides, want 1", len(list))
	}
	if ok, err := s.RemoveOverride(ctx, "api", "user:alice"); err != nil || !ok {
		t.Fatalf("RemoveOverride: %v, %v", ok, err)
	}
}

// pauses pauses a key fleet-wide and reads the pause.
func pauses(t testing.TB, e Env) {
	ctx := context.Background()
	s := store(t, e)
	until, err := s.SetPause(ctx, time.Time{}, "upstream", "api.example.com", time.Minute)
	check(t, "SetPause", err)
	got, err := s.PausedUntil(ctx, time.Time{}, "upstream", "api.example.com")
	check(t, "PausedUntil", err)
	if !got.Equal(until) {
		t.Fatalf("PausedUntil %v, want %v", got, until)
	}
}

// outboundLearning reads the fleet's learned fraction of an upstream's
// budget, commits a cut to it and reads it again.
func outboundLearning(t testing.TB, e Env) {
	ctx := context.Background()
	s := store(t, e)
	st, now, _, err := s.Learned(ctx, at, "upstream", "api.example.com", nil, 0, 0)
	check(t, "Learned (read)", err)
	p := st.Cut(now, time.Second, 0.5, now-2000, false)
	cut, _, applied, err := s.Learned(ctx, at, "upstream", "api.example.com", &p, 2*time.Second, time.Minute)
	check(t, "Learned (cut)", err)
	if !applied || cut.Cuts != 1 {
		t.Fatalf("Learned (cut): applied %v, %d cuts, want the cut applied", applied, cut.Cuts)
	}
	again, _, _, err := s.Learned(ctx, at, "upstream", "api.example.com", nil, 0, 0)
	check(t, "Learned (read)", err)
	if again != cut {
		t.Fatalf("Learned read %+v after the cut, want %+v", again, cut)
	}
}

// regionsCap decides, resets and syncs a global limit between two
// regions that share the server (each its own prefix of counters).
func regionsCap(t testing.TB, e Env) {
	ctx := context.Background()
	now := at.UnixMilli()
	clock := func() int64 { return now }
	mk := func(self, peer string) *regions.Store {
		s, err := regions.New(regions.Config{Region: self, Local: e.Client, Peers: map[string]redis.UniversalClient{peer: e.Client}, Clock: clock}, now)
		check(t, "regions.New", err)
		t.Cleanup(s.Close)
		return s
	}
	a := mk("a", "b")
	c := regions.Charge{Counter: e.Prefix + "global", Limit: 2, Window: 60_000, Sliding: true, Cost: 1}
	for n := 1; n <= 3; n++ {
		d, err := a.Decide(ctx, -1, c)
		check(t, "regions Decide", err)
		if want := n <= 2; d.Allowed != want {
			t.Fatalf("regions: request %d admitted %v, want %v", n, d.Allowed, want)
		}
	}
	check(t, "regions Sync", a.Sync(ctx, now))
	check(t, "regions Reset", a.Reset(ctx, -1, c))
	if d, err := a.Decide(ctx, -1, c); err != nil || !d.Allowed {
		t.Fatalf("regions: after Reset: %+v, %v", d, err)
	}
}

// rulesSource publishes a rules document and reads it back, as an app
// server's RedisSource does.
func rulesSource(t testing.TB, e Env) {
	ctx := context.Background()
	key := e.Prefix + "rules"
	doc := []byte("rules:\n  - name: api\n    key: ip\n    limits: [{requests: 100, window: 1m}]\n")
	version, err := config.PublishRedis(ctx, e.Client, key, doc, config.Env{})
	check(t, "PublishRedis", err)
	src := &config.RedisSource{Client: e.Client, Key: key}
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	_ = src.Changes(cctx)
	got, v, err := src.Load(ctx)
	check(t, "RedisSource.Load", err)
	if v != version || string(got) != string(doc) {
		t.Fatalf("RedisSource.Load: version %q, %d bytes; want %q, %d", v, len(got), version, len(doc))
	}
}
