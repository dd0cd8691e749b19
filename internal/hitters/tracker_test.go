package hitters

import (
	"context"
	"errors"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/topk"
)

// fakeClock is a settable clock in Unix ms.
type fakeClock struct{ ms atomic.Int64 }

func (c *fakeClock) now() int64          { return c.ms.Load() }
func (c *fakeClock) add(d time.Duration) { c.ms.Add(d.Milliseconds()) }

func newTracker(t *testing.T, cfg Config) (*Tracker, *fakeClock) {
	t.Helper()
	clk := &fakeClock{}
	clk.ms.Store(1_700_000_000_000)
	cfg.Now = clk.now
	tr := New(cfg)
	t.Cleanup(tr.Close)
	return tr, clk
}

// TestTrackerTop: events noted are in the next view, by kind and period,
// exact while there are fewer clients than counters; a minute later the
// minute view has forgotten them and the hour view has not.
func TestTrackerTop(t *testing.T) {
	t.Parallel()
	tr, clk := newTracker(t, Config{K: 4})
	tr.SetRules(map[string]int{"api": 0, "site": -1})
	sh := tr.Shard()
	for range 5 {
		tr.Note(sh, "api", "user:alice", 2, Charged)
	}
	tr.Note(sh, "api", "user:bob", 1, Charged)
	tr.Note(sh, "api", "user:bob", 3, Denied)
	tr.Note(sh, "site", "ip:192.0.2.1", 1, Denied)
	tr.Note(sh, "gone", "ip:192.0.2.1", 1, Denied) // not a tracked rule

	v, ok := tr.Top("api", Charged, Minute)
	if !ok || v.N != 11 || v.Bound != 0 || len(v.Entries) != 2 ||
		v.Entries[0] != (topk.Entry{Key: "user:alice", G: 10, Hi: 10, Lo: 10, First: clk.now()}) ||
		v.Entries[1].Key != "user:bob" || v.Entries[1].Hi != 1 {
		t.Fatalf("charged: %+v %v", v, ok)
	}
	if d, _ := tr.Top("api", Denied, Hour); d.N != 3 || len(d.Entries) != 1 || d.Entries[0].Key != "user:bob" {
		t.Fatalf("denied: %+v", d)
	}
	if _, ok := tr.Top("site", Denied, Minute); ok {
		t.Error("a rule tracked for rates only has a view")
	}
	if tr.K("api") != 4 || tr.K("site") != 0 {
		t.Errorf("K: %d, %d", tr.K("api"), tr.K("site"))
	}
	rates := tr.Rates()
	last := rates["site"][RatePoints-1]
	if last.Denied != 1 || rates["api"][RatePoints-1].Allowed != 6 || rates["api"][RatePoints-1].DeniedUnits != 3 {
		t.Errorf("rates: api %+v, site %+v", rates["api"][RatePoints-1], last)
	}

	clk.add(80 * time.Second)
	if v, _ := tr.Top("api", Charged, Minute); v.N != 0 {
		t.Errorf("minute view 80 s later: N %d", v.N)
	}
	if v, _ := tr.Top("api", Charged, Hour); v.N != 11 {
		t.Errorf("hour view 80 s later: N %d", v.N)
	}
	if p := tr.Rates()["api"]; p[RatePoints-1].Allowed != 0 || p[RatePoints-9].Allowed != 6 {
		t.Errorf("rates 80 s later: %+v", p[RatePoints-9:])
	}

	// Rules replaced: a rule gone is forgotten.
	tr.SetRules(map[string]int{"site": -1})
	if _, ok := tr.Top("api", Charged, Hour); ok {
		t.Error("a removed rule still has a view")
	}
}

// TestTrackerBounds: a skewed stream through the tracker, over several
// buckets, keeps the summary's bounds against exact counts.
func TestTrackerBounds(t *testing.T) {
	t.Parallel()
	const k = 20
	tr, clk := newTracker(t, Config{K: k})
	tr.SetRules(map[string]int{"api": 0})
	r := rand.New(rand.NewPCG(7, 7))
	z := rand.NewZipf(r, 1.3, 1, 999)
	exact := map[string]uint64{}
	var n uint64
	sh := tr.Shard()
	for i := range 30_000 {
		key := "ip:" + strconv.FormatUint(z.Uint64(), 10)
		tr.Note(sh, "api", key, 1, Denied)
		exact[key]++
		n++
		if i%100 == 0 {
			clk.add(200 * time.Millisecond) // 60 s in all: within the minute
			tr.Top("api", Denied, Minute)   // drain before the ring fills
		}
	}
	v, _ := tr.Top("api", Denied, Minute)
	if v.N != n || v.Bound*k > n || v.Dropped != 0 {
		t.Fatalf("N %d (want %d), Bound %d (N/k %d), dropped %d", v.N, n, v.Bound, n/k, v.Dropped)
	}
	listed := map[string]bool{}
	for _, e := range v.Entries {
		listed[e.Key] = true
		if f := exact[e.Key]; f < e.Lo || f > e.Hi {
			t.Errorf("%s: true %d outside [%d, %d]", e.Key, f, e.Lo, e.Hi)
		}
	}
	for key, f := range exact {
		if f > v.Bound && !listed[key] {
			t.Errorf("%s: %d > bound %d, not listed", key, f, v.Bound)
		}
	}
	if !listed["ip:0"] {
		t.Error("the heaviest client is not listed")
	}
}

// TestTrackerDropsCounted: events a full ring drops are reported with the
// views of the period, as what their counts may miss.
func TestTrackerDropsCounted(t *testing.T) {
	t.Parallel()
	tr, _ := newTracker(t, Config{K: 4, Every: time.Hour})
	tr.SetRules(map[string]int{"api": 0})
	// Fill one shard without draining (the drainer is woken, but takes the
	// lock Top holds... so fill it from under the lock).
	tr.mu.Lock()
	sh := tr.Shard()
	for i := range slotsPerShard + 5 {
		tr.Note(sh, "api", "k"+strconv.Itoa(i), 3, Charged)
	}
	tr.mu.Unlock()
	v, _ := tr.Top("api", Charged, Minute)
	if v.Dropped != 15 || v.N != 3*slotsPerShard {
		t.Fatalf("dropped %d units (want 15), N %d", v.Dropped, v.N)
	}
}

// TestTrackerHelpsWhenFull: a request that finds its shard full drains it
// itself when the summaries are free, so nothing is dropped however long
// the drainer takes to run.
func TestTrackerHelpsWhenFull(t *testing.T) {
	t.Parallel()
	tr, _ := newTracker(t, Config{K: 4, Every: time.Hour})
	tr.SetRules(map[string]int{"api": 0})
	tr.Close() // no drainer: only the requests themselves drain
	sh := tr.Shard()
	const n = 5*slotsPerShard + 3
	for i := range n {
		tr.Note(sh, "api", "k"+strconv.Itoa(i%2), 1, Charged)
	}
	v, _ := tr.Top("api", Charged, Minute)
	if v.N != n || v.Dropped != 0 {
		t.Fatalf("N %d, dropped %d; want %d and 0", v.N, v.Dropped, n)
	}
}

// TestTrackerMemoryBound: a flood of distinct clients on many rules keeps
// the summaries within rules × 2 kinds × 7 buckets × (2k − 1) keys.
func TestTrackerMemoryBound(t *testing.T) {
	t.Parallel()
	const k, rules = 8, 3
	tr, clk := newTracker(t, Config{K: k})
	ks := map[string]int{}
	for i := range rules {
		ks["r"+strconv.Itoa(i)] = 0
	}
	tr.SetRules(ks)
	sh := tr.Shard()
	bound := rules * 2 * (periodBuckets + 1) * (2*k - 1)
	for i := range 100_000 {
		tr.Note(sh, "r"+strconv.Itoa(i%rules), "ip:"+strconv.Itoa(i), 1, Kind(i%2))
		if i%200 == 0 {
			clk.add(5 * time.Second)
			tr.Rates() // drains
			if n := tr.Keys(); n > bound {
				t.Fatalf("%d keys held, more than %d", n, bound)
			}
		}
	}
	if n, fine := tr.Keys(), rules*2*(periodBuckets+1)*k; n < fine {
		t.Errorf("%d keys held: the flood did not fill the minute's buckets (%d)", n, fine)
	}
}

// memBackend is a Backend in memory, for the fleet's logic; the Redis
// backend is tested against real servers in package middleware.
type memBackend struct {
	mu     sync.Mutex
	m      map[string]map[string][]byte
	fail   bool
	writes int
	ages   map[string]time.Duration // by server; 1 s if not set
}

func (b *memBackend) Publish(_ context.Context, rule, server string, payload []byte, _ time.Duration) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.fail {
		return errors.New("down")
	}
	if b.m == nil {
		b.m = map[string]map[string][]byte{}
	}
	if b.m[rule] == nil {
		b.m[rule] = map[string][]byte{}
	}
	b.writes++
	b.m[rule][server] = append([]byte(nil), payload...)
	return nil
}

func (b *memBackend) Collect(_ context.Context, rule string, _ time.Duration) ([]Published, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.fail {
		return nil, errors.New("down")
	}
	var out []Published
	for s, p := range b.m[rule] {
		age, ok := b.ages[s]
		if !ok {
			age = time.Second
		}
		out = append(out, Published{Server: s, Payload: p, Age: age})
	}
	return out, nil
}

// TestFleetMerge: three trackers publishing to one backend; each one's
// fleet view merges all three, its own taken fresh.
func TestFleetMerge(t *testing.T) {
	t.Parallel()
	be := &memBackend{}
	var trs []*Tracker
	for i := range 3 {
		tr, _ := newTracker(t, Config{K: 10, Fleet: &FleetConfig{Backend: be, Server: "s" + strconv.Itoa(i), Every: time.Hour}})
		tr.SetRules(map[string]int{"api": 0, "idle": 0})
		trs = append(trs, tr)
	}
	for i, tr := range trs {
		sh := tr.Shard()
		tr.Note(sh, "api", "user:everywhere", 10, Denied)
		tr.Note(sh, "api", "user:only"+strconv.Itoa(i), int64(i+1), Denied)
		if err := tr.Publish(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	trs[0].Note(trs[0].Shard(), "api", "user:everywhere", 5, Denied) // after publishing: seen fresh
	f, ok, err := trs[0].Fleet(context.Background(), "api", Denied, Minute)
	if err != nil || !ok {
		t.Fatal(ok, err)
	}
	if f.Servers != 3 || len(f.Names) != 3 || f.N != 41 || f.Bound != 0 || f.Lag != time.Second {
		t.Fatalf("fleet: %+v", f)
	}
	if e := f.Entries[0]; e.Key != "user:everywhere" || e.Hi != 35 || e.Lo != 35 {
		t.Errorf("first entry %+v", e)
	}
	if last, err := trs[0].PublishState(); last.IsZero() || err != nil {
		t.Errorf("publish state %v %v", last, err)
	}
	// One write per rule with clients: none for the idle rule, none again
	// while nothing changed.
	be.mu.Lock()
	writes := be.writes
	be.mu.Unlock()
	if err := trs[2].Publish(context.Background()); err != nil || writes != 3 {
		t.Fatalf("%d writes for 3 servers and one busy rule (want 3); %v", writes, err)
	}
	be.mu.Lock()
	if be.writes != writes {
		t.Errorf("a publish of unchanged summaries wrote %d", be.writes-writes)
	}
	be.mu.Unlock()
	// A server whose last write is 2 minutes old: in the hour, not in
	// the minute.
	be.mu.Lock()
	be.ages = map[string]time.Duration{"s2": 2 * time.Minute}
	be.mu.Unlock()
	if f, _, _ := trs[0].Fleet(context.Background(), "api", Denied, Minute); f.Servers != 2 || f.N != 41-13 {
		t.Errorf("minute with s2 idle for 2 min: %d servers, N %d; want 2 and %d", f.Servers, f.N, 41-13)
	}
	if f, _, _ := trs[0].Fleet(context.Background(), "api", Denied, Hour); f.Servers != 3 || f.N != 41 || f.Lag != 2*time.Minute {
		t.Errorf("hour with s2 idle for 2 min: %d servers, N %d, lag %s; want 3, 41, 2m", f.Servers, f.N, f.Lag)
	}

	// The backend down: the local view, and the error.
	be.mu.Lock()
	be.fail = true
	be.mu.Unlock()
	trs[1].Note(trs[1].Shard(), "api", "user:late", 1, Charged) // something to publish
	f, _, err = trs[1].Fleet(context.Background(), "api", Denied, Minute)
	if err == nil || f.Servers != 1 || f.N != 12 { // the denied view: the late event was charged
		t.Errorf("fleet with the backend down: %+v, %v", f, err)
	}
	if trs[1].Publish(context.Background()) == nil {
		t.Error("publish to a backend that is down: no error")
	}
	if _, err := trs[1].PublishState(); err == nil {
		t.Error("PublishState after a failed round: no error")
	}
}

// BenchmarkTrackerDrain: what the drainer spends per event (off the
// request path) for a rule of k = 100: skewed clients (Zipf over 10,000),
// and a new client at every event (100,000 cycled), where each event
// takes a counter.
func BenchmarkTrackerDrain(b *testing.B) {
	r := rand.New(rand.NewPCG(8, 8))
	z := rand.NewZipf(r, 1.2, 1, 9_999)
	skewed := make([]string, 4096)
	for i := range skewed {
		skewed[i] = "ip:" + strconv.FormatUint(z.Uint64(), 10)
	}
	distinct := make([]string, 100_000)
	for i := range distinct {
		distinct[i] = "ip:10." + strconv.Itoa(i>>16) + "." + strconv.Itoa(i>>8&255) + "." + strconv.Itoa(i&255)
	}
	for _, c := range []struct {
		name string
		keys []string
	}{{"skewed", skewed}, {"distinct", distinct}} {
		b.Run(c.name, func(b *testing.B) {
			tr := New(Config{Every: time.Hour})
			defer tr.Close()
			tr.SetRules(map[string]int{"api": 0})
			sh := tr.Shard()
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				tr.Note(sh, "api", c.keys[i%len(c.keys)], 1, Charged)
				if i%128 == 127 {
					tr.mu.Lock()
					tr.drainLocked()
					tr.mu.Unlock()
				}
			}
		})
	}
}
