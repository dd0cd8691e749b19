package memstore

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/window"
)

func TestLifeCode(t *testing.T) {
	t.Parallel()
	day := int64(24 * time.Hour / time.Millisecond)
	for _, life := range []int64{
		-5, 0, 1, 2000, 999_999, inSeconds - 1, inSeconds, inSeconds + 1,
		2 * 30 * day, 2 * 3660 * day, (inSeconds - 1) * 1000,
	} {
		code, ok := lifeCode(life)
		if !ok {
			t.Errorf("lifeCode(%d) does not fit", life)
			continue
		}
		got := lifeOf(code)
		switch {
		case life < inSeconds && got != max(life, 0):
			t.Errorf("lifeOf(lifeCode(%d)) = %d, want it exact", life, got)
		case got < life || got >= life+1000:
			t.Errorf("lifeOf(lifeCode(%d)) = %d, want within a second after", life, got)
		}
	}
	for _, life := range []int64{inSeconds*1000 - 999, 1 << 62} {
		if code, ok := lifeCode(life); ok {
			t.Errorf("lifeCode(%d) = %#x, want it not to fit", life, code)
		}
	}
}

// TestWideCounters checks counts that do not fit the records' 32-bit
// fields: they are kept exactly in the wide map, which empties again as the
// counter rolls and when it is swept.
func TestWideCounters(t *testing.T) {
	t.Parallel()
	s := newStore(t, Config{Shards: 1, MaxKeys: 100})
	sh := &s.shards[0]
	huge := window.Limit{Requests: 1 << 40, Window: time.Second}
	const cost = 1<<32 + 5
	take(t, s, t0, charge("small", perSecond(10), 1))
	for i := 1; i <= 3; i++ {
		_, out := take(t, s, t0, charge("big", huge, cost))
		if want := 1<<40 - i*cost; out[0].Remaining != want {
			t.Fatalf("request %d: Remaining = %d, want %d", i, out[0].Remaining, want)
		}
	}
	if st, _ := s.stateOf("rule", "big", time.Second); st.Curr != 3*cost {
		t.Errorf("state %+v, want Curr %d", st, 3*cost)
	}
	if len(sh.wide) != 1 {
		t.Errorf("%d wide states, want 1", len(sh.wide))
	}
	checkInvariants(t, s)

	// Two windows on the counter starts afresh, small again.
	take(t, s, at(2*time.Second), charge("big", huge, 1))
	if st, _ := s.stateOf("rule", "big", time.Second); st.Curr != 1 || st.Prev != 0 {
		t.Errorf("state after 2 windows %+v, want Curr 1", st)
	}
	if len(sh.wide) != 0 {
		t.Errorf("%d wide states after the counter shrank, want 0", len(sh.wide))
	}
	checkInvariants(t, s)

	take(t, s, at(2*time.Second), charge("big", huge, cost))
	if n := s.sweep(at(4 * time.Second)); n != 2 {
		t.Errorf("sweep dropped %d, want 2", n)
	}
	if sh.wide != nil {
		t.Errorf("wide map kept after its last entry was swept")
	}
	checkInvariants(t, s)
}

// TestLongWindow checks the expiry of a counter whose life is kept in whole
// seconds: never early, at most a second late.
func TestLongWindow(t *testing.T) {
	t.Parallel()
	s := newStore(t, Config{Shards: 1, MaxKeys: 10})
	month := window.Limit{Requests: 10, Window: 30 * 24 * time.Hour}
	take(t, s, at(1500*time.Millisecond), charge("k", month, 4))
	st, _ := s.stateOf("rule", "k", month.Window)
	end := time.UnixMilli(st.Start).Add(window.Expiry(st.Start, st.Start, month.Window.Milliseconds()))
	for _, tt := range []struct {
		at   time.Time
		want int
	}{
		{end.Add(-time.Millisecond), 1},
		{end.Add(time.Second), 0},
	} {
		s.sweep(tt.at)
		if n := s.Len(); n != tt.want {
			t.Errorf("Len() after a sweep %v after expiry = %d, want %d", tt.at.Sub(end), n, tt.want)
		}
	}
}

// TestEvictPrefersExpired checks that a full shard evicts an expired
// counter, even a recently used one, before the least recently used live
// one.
func TestEvictPrefersExpired(t *testing.T) {
	t.Parallel()
	t.Run("searched whole", func(t *testing.T) {
		t.Parallel()
		s := newStore(t, Config{Shards: 1, MaxKeys: samples})
		for i := range samples - 1 {
			take(t, s, t0, charge(fmt.Sprint("live", i), perHour(5), 1))
		}
		take(t, s, t0, charge("short", perSecond(5), 1)) // the most recent
		s.shards[0].hand = 0                             // away from "short"
		take(t, s, at(2*time.Second), charge("new", perHour(5), 1))
		checkInvariants(t, s)
		if s.has("rule", "short", time.Second) || !s.has("rule", "live0", time.Hour) {
			t.Errorf("kept the expired counter, or evicted the least recently used live one")
		}
		if n := s.Len(); n != samples {
			t.Errorf("Len() = %d, want %d", n, samples)
		}
	})
	t.Run("sampled", func(t *testing.T) {
		t.Parallel()
		// Half the counters have expired; no eviction may take a live one
		// while a sample holds an expired one, so few live ones go.
		const n = 4096
		s := newStore(t, Config{Shards: 1, MaxKeys: n})
		for i := range n {
			l := perHour(5)
			if i%2 == 1 {
				l = perSecond(5)
			}
			take(t, s, t0, charge(fmt.Sprint(i), l, 1))
		}
		sh := &s.shards[0]
		sh.mu.Lock()
		for range n / 8 {
			sh.evict(at(2 * time.Second).UnixMilli())
		}
		sh.mu.Unlock()
		live := 0
		for i := 0; i < n; i += 2 {
			if s.has("rule", fmt.Sprint(i), time.Hour) {
				live++
			}
		}
		// A sample of 8 holds no expired counter once in 256 at first,
		// once in 88 by the end: about 3 live counters go.
		if lost := n/2 - live; lost > 20 {
			t.Errorf("%d live counters evicted out of %d evictions, with expired ones left", lost, n/8)
		}
		checkInvariants(t, s)
	})
}

// TestEvictionApproximatesLRU fills a shard, reads a tenth of its counters,
// then inserts half as many new counters as it holds. Exact LRU would evict
// the oldest unread counters; sampling evicts mostly those.
func TestEvictionApproximatesLRU(t *testing.T) {
	t.Parallel()
	const n, read, fresh = 4000, 400, 2000
	s := newStore(t, Config{Shards: 1, MaxKeys: n})
	for i := range n {
		take(t, s, t0, charge(fmt.Sprint(i), perHour(5), 1))
	}
	for i := range read {
		remaining(t, s, t0, fmt.Sprint(i), perHour(5))
	}
	for i := range fresh {
		take(t, s, t0, charge(fmt.Sprint("new", i), perHour(5), 1))
	}
	checkInvariants(t, s)
	keptRead, keptNew, keptOld, keptYoung := 0, 0, 0, 0
	for i := range n {
		if !s.has("rule", fmt.Sprint(i), time.Hour) {
			continue
		}
		switch {
		case i < read:
			keptRead++
		case i < read+fresh:
			keptOld++ // exact LRU evicts these
		default:
			keptYoung++
		}
	}
	for i := range fresh {
		if s.has("rule", fmt.Sprint("new", i), time.Hour) {
			keptNew++
		}
	}
	t.Logf("kept %d/%d read, %d/%d new, %d/%d oldest unread, %d/%d younger unread",
		keptRead, read, keptNew, fresh, keptOld, fresh, keptYoung, n-read-fresh)
	if keptRead < read*95/100 || keptNew < fresh*95/100 || keptOld > fresh/2 || keptYoung < keptOld {
		t.Errorf("eviction is far from LRU")
	}
}

// TestSweepShrinks checks that a sweep that leaves a shard mostly empty
// frees its chunks and rebuilds its index to fit.
func TestSweepShrinks(t *testing.T) {
	t.Parallel()
	s := newStore(t, Config{Shards: 1, MaxKeys: 10000})
	sh := &s.shards[0]
	for i := range 5000 {
		l := perSecond(5)
		if i%500 == 0 {
			l = perHour(5)
		}
		take(t, s, t0, charge(fmt.Sprint(i), l, 1))
	}
	if len(sh.slots) != 8192 || len(sh.chunks) != 20 {
		t.Fatalf("%d slots, %d chunks for 5000 counters, want 8192 and 20", len(sh.slots), len(sh.chunks))
	}
	if n := s.sweep(at(2 * time.Second)); n != 4990 {
		t.Fatalf("sweep dropped %d, want 4990", n)
	}
	checkInvariants(t, s)
	if len(sh.slots) != 16 || len(sh.chunks) != 1 || cap(sh.chunks) > 8 {
		t.Errorf("%d slots, %d chunks (capacity %d) for 10 counters, want 16 and 1", len(sh.slots), len(sh.chunks), cap(sh.chunks))
	}
	for i := 0; i < 5000; i += 500 {
		if got := remaining(t, s, at(2*time.Second), fmt.Sprint(i), perHour(5)); got != 4 {
			t.Errorf("remaining on %d = %d after the sweep, want 4", i, got)
		}
	}
	s.sweep(at(2 * time.Hour))
	if sh.n != 0 || len(sh.slots) > 16 || sh.chunks != nil {
		t.Errorf("empty shard: %d records, %d slots, %d chunks; want 0, at most 16, nil", sh.n, len(sh.slots), len(sh.chunks))
	}
}

// perMinuteLimit is a sliding-window limit for the tests that call a
// shard's methods directly.
var perMinuteLimit = window.Limit{Requests: 10, Window: time.Minute}

// TestShardAgainstModel drives a shard's index with identities crafted to
// crowd a few home slots, share tags and wrap around the end of the index,
// and checks every lookup against a map after each step.
func TestShardAgainstModel(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(1, 2))
	var sh shard
	sh.init(1000, 3)
	model := map[ident]int64{} // identity -> Curr
	var ids []ident
	never := int64(1) << 62
	for step := range 20000 {
		// h1: one of 8 homes in an index of 8 to 64 slots, one of two tags.
		id := ident{h1: rng.Uint64N(8) + 56 | rng.Uint64N(2)<<63, h2: rng.Uint64N(4)}
		i := sh.lookup(id)
		curr, ok := model[id]
		if (i >= 0) != ok {
			t.Fatalf("step %d: lookup(%x) = %d, model has it: %v", step, id, i, ok)
		}
		switch {
		case ok && rng.IntN(2) == 0:
			sh.remove(i)
			delete(model, id)
		case ok:
			if st, _ := sh.state(i, window.SlidingWindow); st.Curr != curr {
				t.Fatalf("step %d: Curr = %d, want %d", step, st.Curr, curr)
			}
			sh.set(i, &window.State{Curr: curr + 1}, never, &perMinuteLimit)
			model[id]++
		case len(model) < 40:
			sh.insert(id, &window.State{Curr: 1}, never, 0, &perMinuteLimit)
			model[id] = 1
			ids = append(ids, id)
		}
		if step%100 == 0 {
			sh.compact(0)
		}
		checkShard(t, 0, &sh)
		if t.Failed() {
			t.Fatalf("step %d", step)
		}
	}
	for _, id := range ids {
		if _, ok := model[id]; ok != (sh.lookup(id) >= 0) {
			t.Errorf("lookup(%x) disagrees with the model", id)
		}
	}
}
