package redispipe

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/redistest"
)

// incrBoth adds 1 to the field n of the hashes KEYS[1] and KEYS[2] (one
// hash tag, one slot) and returns their new values.
var incrBoth = redis.NewScript(`
return {redis.call('HINCRBY', KEYS[1], 'n', 1), redis.call('HINCRBY', KEYS[2], 'n', 1)}
`)

// migration is a slot being moved by hand between two masters of a
// cluster, step by step, as redis-cli --cluster reshard moves it.
type migration struct {
	t        *testing.T
	cl       *redistest.ClusterServer
	slot     int
	src, dst *redis.Client
	dstID    string
}

// startMigration puts slot in migration from its master to another: the
// source answers ASK for keys it no longer has, and TRYAGAIN for a
// command with some of its keys moved.
func startMigration(t *testing.T, cl *redistest.ClusterServer, slot int) *migration {
	t.Helper()
	ctx := context.Background()
	from, err := cl.MasterForSlot(ctx, slot)
	if err != nil {
		t.Fatal(err)
	}
	var to *redistest.Server
	for _, n := range cl.Nodes() {
		if n != from {
			to = n
			break
		}
	}
	m := &migration{t: t, cl: cl, slot: slot, src: from.Client(t, nil), dst: to.Client(t, nil)}
	srcID, err := m.src.Do(ctx, "CLUSTER", "MYID").Text()
	if err != nil {
		t.Fatal(err)
	}
	if m.dstID, err = m.dst.Do(ctx, "CLUSTER", "MYID").Text(); err != nil {
		t.Fatal(err)
	}
	if err := m.dst.Do(ctx, "CLUSTER", "SETSLOT", slot, "IMPORTING", srcID).Err(); err != nil {
		t.Fatal(err)
	}
	if err := m.src.Do(ctx, "CLUSTER", "SETSLOT", slot, "MIGRATING", m.dstID).Err(); err != nil {
		t.Fatal(err)
	}
	return m
}

// move migrates keys from the source to the target.
func (m *migration) move(keys ...string) {
	m.t.Helper()
	host, port, _ := splitAddr(m.dst.Options().Addr)
	args := []any{"MIGRATE", host, port, "", 0, 5000, "KEYS"}
	for _, k := range keys {
		args = append(args, k)
	}
	if err := m.src.Do(context.Background(), args...).Err(); err != nil {
		m.t.Errorf("migrate %v: %v", keys, err)
	}
}

// finish gives the slot to the target on every master.
func (m *migration) finish() {
	m.t.Helper()
	ctx := context.Background()
	for _, c := range []*redis.Client{m.dst, m.src} {
		if err := c.Do(ctx, "CLUSTER", "SETSLOT", m.slot, "NODE", m.dstID).Err(); err != nil {
			m.t.Errorf("setslot node: %v", err)
		}
	}
	for _, addr := range m.cl.Addrs() {
		if addr == m.dst.Options().Addr || addr == m.src.Options().Addr {
			continue
		}
		c := redis.NewClient(&redis.Options{Addr: addr})
		if err := c.Do(ctx, "CLUSTER", "SETSLOT", m.slot, "NODE", m.dstID).Err(); err != nil {
			m.t.Errorf("setslot node on %s: %v", addr, err)
		}
		_ = c.Close()
	}
}

// errors returns the error replies of kind (ASK, TRYAGAIN, ...) that the
// source and the target have sent so far.
func (m *migration) errors(kind string) (src, dst int64) {
	return redistest.ErrorStats(m.t, m.src)[kind], redistest.ErrorStats(m.t, m.dst)[kind]
}

// TestMigratingSlot runs scripts on a slot while it is being migrated: a
// key already moved is followed to the target with ASKING; a script whose
// keys are split between the two nodes, or that the target is asked for
// while it has none of its keys, is sent again after growing waits until
// the migration has moved on, within its deadline, and only then counted,
// once; one whose deadline comes first fails then, with TRYAGAIN, having
// been tried a handful of times, not in a storm.
func TestMigratingSlot(t *testing.T) {
	t.Parallel()
	cl := redistest.Cluster(t)
	prefix := cl.Prefix(t)
	cc := cl.Client(t, &redis.ClusterOptions{PoolSize: 16})
	p := newPipeliner(t, cc, Config{StallThreshold: testStall})
	ctx := context.Background()
	lag := newLagMeter(t)

	tag := prefix + "{migrating}:"
	a, b, c, d := tag+"a", tag+"b", tag+"c", tag+"d"
	for _, keys := range [][]string{{a, b}} {
		if _, err := p.Run(ctx, incrBoth, keys); err != nil {
			t.Fatal(err)
		}
	}
	m := startMigration(t, cl, Slot(a))

	// a moves: a call for it alone is asked to the target.
	m.move(a)
	askSrc, _ := m.errors("ASK")
	if n, err := runDecide(ctx, p, a+"x"); err != nil || n != 1 {
		t.Errorf("a new key of the migrating slot: count %d, %v; want 1", n, err)
	}
	if got, _ := m.errors("ASK"); got == askSrc {
		t.Error("the source sent no ASK for a key it does not have")
	}

	// a and b split: TRYAGAIN until b moves too, 100 ms on; and c and d
	// exist on neither node: the target answers TRYAGAIN to ASKING until
	// the slot is its own.
	_, tryBefore := m.errors("TRYAGAIN")
	tryBeforeSrc, _ := m.errors("TRYAGAIN")
	var wg sync.WaitGroup
	results := make([][]any, 2)
	errs := make([]error, 2)
	for i, keys := range [][]string{{a, b}, {c, d}} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			v, err := p.RunBy(ctx, time.Now().Add(time.Second), incrBoth, keys)
			results[i], _ = v.([]any)
			errs[i] = err
		}()
	}
	time.Sleep(100 * time.Millisecond)
	m.move(b)
	m.finish()
	wg.Wait()
	for i, want := range [][]any{{int64(2), int64(2)}, {int64(1), int64(1)}} {
		if errs[i] != nil || len(results[i]) != 2 || results[i][0] != want[0] || results[i][1] != want[1] {
			t.Errorf("call %d across the migration: %v, %v; want %v (counted once)", i, results[i], errs[i], want)
		}
	}
	trySrc, tryDst := m.errors("TRYAGAIN")
	tries := trySrc - tryBeforeSrc + tryDst - tryBefore
	t.Logf("TRYAGAIN sent %d times to 2 calls over 100 ms", tries)
	// Waits of at least 1, 2, 4, 8, 16, 25, 25 ms: tries at 0, 1, 3, 7,
	// 15, 31, 56, 81 and 106 ms at the soonest, at most 9 each in the
	// 100 ms (and a few) the keys stay split, whatever the machine.
	if tries < 2 || tries > 2*9 {
		t.Errorf("TRYAGAIN sent %d times to 2 calls over 100 ms, want 2 to 18", tries)
	}
	for _, k := range []string{a, b, c, d} {
		if n, err := m.dst.HGet(ctx, k, "n").Int(); err != nil || n != map[string]int{a: 2, b: 2, c: 1, d: 1}[k] {
			t.Errorf("%s on the target: %d, %v", k, n, err)
		}
	}

	// A slot that stays split past the call's deadline.
	e, f := prefix+"{stuck}:e", prefix+"{stuck}:f"
	if _, err := p.Run(ctx, incrBoth, []string{e, f}); err != nil {
		t.Fatal(err)
	}
	m2 := startMigration(t, cl, Slot(e))
	m2.move(e)
	before, _ := m2.errors("TRYAGAIN")
	start := time.Now()
	const bound = 80 * time.Millisecond
	_, err := p.RunBy(ctx, start.Add(bound), incrBoth, []string{e, f})
	took := time.Since(start)
	after, _ := m2.errors("TRYAGAIN")
	t.Logf("a call split past its deadline: %v after %v, %d TRYAGAIN", err, took, after-before)
	if err == nil || !strings.Contains(err.Error(), "TRYAGAIN") {
		t.Errorf("a call whose keys stay split: %v, want TRYAGAIN", err)
	}
	// Tries at 0, 1, 3, 7, 15, 31 and 56 ms at the soonest; the next, at
	// 81 ms, would come after the deadline.
	if after-before > 7 {
		t.Errorf("TRYAGAIN sent %d times over %v, want at most 7", after-before, bound)
	}
	if took > bound+overrunSlack {
		lag.timing(t, "a call whose keys stay split took %v, want at most its deadline (%v) and %v", took, bound, overrunSlack)
	}
	m2.move(f)
	m2.finish()
}

// TestTryAgainFirstInBatch sends, in one batch to one node, a call that the
// node answers TRYAGAIN (its keys split by a migration) ahead of one it
// runs: the second must run once, not again with every retry of the
// batch that go-redis makes when a pipeline's first reply is an error it
// retries.
func TestTryAgainFirstInBatch(t *testing.T) {
	t.Parallel()
	cl := redistest.Cluster(t)
	prefix := cl.Prefix(t)
	// A client that retries (ClusterOptions leave its nodes' MaxRetries
	// at -1 by default).
	cc := cl.Client(t, &redis.ClusterOptions{PoolSize: 16, MaxRetries: 3})
	p := newPipeliner(t, cc, Config{StallThreshold: testStall})
	ctx := context.Background()
	split := []string{prefix + "{split}:a", prefix + "{split}:b"}
	if _, err := p.Run(ctx, incrBoth, split); err != nil {
		t.Fatal(err)
	}
	// Two keys of another tag on the same master.
	from, err := cl.MasterForSlot(ctx, Slot(split[0]))
	if err != nil {
		t.Fatal(err)
	}
	var other []string
	for i := 0; other == nil; i++ {
		tag := prefix + "{other" + strconv.Itoa(i) + "}:"
		if m, err := cl.MasterForSlot(ctx, Slot(tag)); err == nil && m == from && Slot(tag) != Slot(split[0]) {
			other = []string{tag + "a", tag + "b"}
		}
	}
	m := startMigration(t, cl, Slot(split[0]))
	m.move(split[0])
	calls := []Call{{Keys: split}, {Keys: other}}
	done := make(chan struct{})
	go func() {
		defer close(done)
		p.RunAll(ctx, time.Now().Add(time.Second), incrBoth, calls)
	}()
	time.Sleep(50 * time.Millisecond)
	m.move(split[1])
	m.finish()
	<-done
	for i, c := range calls {
		if c.Err != nil {
			t.Errorf("call %d: %v", i, c.Err)
		}
	}
	src := m.src
	n, err := src.HGet(ctx, other[0], "n").Int()
	if err != nil || n != 1 {
		t.Errorf("the call after the one turned away ran %d times (%v), want once", n, err)
	}
}
