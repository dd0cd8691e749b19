package memstore

import (
	"context"
	"errors"
	"fmt"
	"math"
	"reflect"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/sluicehq/sluice/internal/window"
)

// The method sets of middleware.Store and middleware.Returner, restated
// here so that this package's tests do not depend on the middleware
// package.
var _ interface {
	Take(ctx context.Context, now time.Time, charges []window.Charge, out []window.Decision) (bool, error)
	GiveBack(ctx context.Context, now time.Time, charges []window.Charge) error
} = (*Store)(nil)

// t0 is aligned on the hour, so it starts a window of every length used here.
var t0 = time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)

func at(d time.Duration) time.Time { return t0.Add(d) }

func perSecond(n int) window.Limit { return window.Limit{Requests: n, Window: time.Second} }
func perMinute(n int) window.Limit { return window.Limit{Requests: n, Window: time.Minute} }
func perHour(n int) window.Limit   { return window.Limit{Requests: n, Window: time.Hour} }

func charge(key string, l window.Limit, cost int) window.Charge {
	return window.Charge{Name: "rule", Key: key, Limit: l, Cost: cost}
}

func newStore(t testing.TB, cfg Config) *Store {
	t.Helper()
	if cfg.SweepInterval == 0 {
		cfg.SweepInterval = -1
	}
	s, err := New(cfg)
	if err != nil {
		t.Fatalf("New(%+v): %v", cfg, err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// take runs one Take and fails the test on error.
func take(t testing.TB, s *Store, now time.Time, charges ...window.Charge) (bool, []window.Decision) {
	t.Helper()
	out := make([]window.Decision, len(charges))
	ok, err := s.Take(context.Background(), now, charges, out)
	if err != nil {
		t.Fatalf("Take at %v: %v", now.Sub(t0), err)
	}
	return ok, out
}

// remaining reads a counter with a Cost 0 charge.
func remaining(t testing.TB, s *Store, now time.Time, key string, l window.Limit) int {
	t.Helper()
	_, out := take(t, s, now, charge(key, l, 0))
	return out[0].Remaining
}

// identOf returns the identity of the counter for (name, key, l).
func (s *Store) identOf(name, key string, l window.Limit) (ident, *shard) {
	k1, k2 := s.keyHash(key)
	return s.ident(k1, k2, name, l.Series()), &s.shards[s.shardOf(k2)]
}

// keyShard returns the index of key's shard.
func (s *Store) keyShard(key string) uint32 {
	_, k2 := s.keyHash(key)
	return s.shardOf(k2)
}

// sliding is the sliding-window limit of window w, as far as identity
// goes.
func sliding(w time.Duration) window.Limit { return window.Limit{Requests: 1, Window: w} }

// has reports whether s holds a sliding-window counter for key and w.
func (s *Store) has(name, key string, w time.Duration) bool {
	return s.hasLimit(name, key, sliding(w))
}

// hasLimit reports whether s holds a counter for key and l.
func (s *Store) hasLimit(name, key string, l window.Limit) bool {
	id, sh := s.identOf(name, key, l)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	return sh.lookup(id) >= 0
}

// stateOf returns the state held for key and a sliding window of w, and
// whether there is one.
func (s *Store) stateOf(name, key string, w time.Duration) (window.State, bool) {
	return s.stateOfLimit(name, key, sliding(w))
}

// stateOfLimit returns a copy of the state held for key and l, and
// whether there is one.
func (s *Store) stateOfLimit(name, key string, l window.Limit) (window.State, bool) {
	id, sh := s.identOf(name, key, l)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	i := sh.lookup(id)
	if i < 0 {
		return window.State{}, false
	}
	st, _ := sh.state(i, l.Algorithm)
	st.Log = slices.Clone(st.Log)
	return st, true
}

// checkInvariants fails t unless every shard's records, chunks, index and
// wide map agree, within the shard's capacity.
func checkInvariants(t testing.TB, s *Store) {
	t.Helper()
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		checkShard(t, i, sh)
		sh.mu.Unlock()
	}
}

func checkShard(t testing.TB, i int, sh *shard) {
	t.Helper()
	if sh.n > sh.cap {
		t.Errorf("shard %d: %d records, capacity %d", i, sh.n, sh.cap)
	}
	held := 0
	for c, ch := range sh.chunks {
		held += len(ch)
		if len(ch) < chunkSize && c*chunkSize+len(ch) < sh.n {
			t.Errorf("shard %d: chunk %d holds %d records, but more follow", i, c, len(ch))
		}
		if c > 0 && cap(ch) != chunkSize {
			t.Errorf("shard %d: chunk %d has capacity %d", i, c, cap(ch))
		}
	}
	if held != sh.n {
		t.Errorf("shard %d: chunks hold %d records, n = %d", i, held, sh.n)
	}
	if spare := len(sh.chunks) - (sh.n+chunkMask)>>chunkShift; spare > 1 {
		t.Errorf("shard %d: %d empty chunks kept", i, spare)
	}
	if len(sh.slots)&(len(sh.slots)-1) != 0 || len(sh.slots) < minSlots || !fits(sh.n, len(sh.slots)) {
		t.Errorf("shard %d: %d slots for %d records", i, len(sh.slots), sh.n)
	}
	used := 0
	for _, v := range sh.slots {
		if v != 0 {
			used++
			if r := sh.numberOf(v); r < 0 || r >= sh.n {
				t.Errorf("shard %d: slot points at record %d of %d", i, r, sh.n)
				return
			}
		}
	}
	if used != sh.n {
		t.Errorf("shard %d: %d slots used, %d records", i, used, sh.n)
	}
	wide := 0
	for r := range sh.n {
		rec := sh.rec(r)
		if got := sh.lookup(rec.id); got != r {
			t.Errorf("shard %d: record %d found at %d", i, r, got)
		}
		if rec.counts == wideCounts {
			wide++
			if _, ok := sh.wide[rec.id]; !ok {
				t.Errorf("shard %d: wide record %d has no wide state", i, r)
			}
		}
	}
	if wide != len(sh.wide) {
		t.Errorf("shard %d: %d wide records, %d wide states", i, wide, len(sh.wide))
	}
	checkLogs(t, i, sh)
}

// checkLogs fails t unless the log records of sh and its log table agree:
// one live slot per log record, each log well formed within its buffer,
// and free slots holding no memory.
func checkLogs(t testing.TB, i int, sh *shard) {
	t.Helper()
	logs := 0
	used := map[uint32]bool{}
	for r := range sh.n {
		rec := sh.rec(r)
		if !rec.isLog() {
			continue
		}
		logs++
		k := uint32(rec.counts)
		if sh.logs == nil || int(k) >= len(sh.logs.slots) || used[k] {
			t.Errorf("shard %d: record %d has log slot %d, taken or out of the table", i, r, k)
			continue
		}
		used[k] = true
		sl := &sh.logs.slots[k]
		off := int(uint32(rec.meta))
		if sl.buf == nil || off >= len(sl.buf) {
			t.Errorf("shard %d: log slot %d holds entries from %d of %d (cap %d)", i, k, off, len(sl.buf), cap(sl.buf))
			continue
		}
		if off > 0 && len(sl.buf) == cap(sl.buf) {
			t.Errorf("shard %d: log slot %d ends its buffer with %d entries unused before it", i, k, off)
		}
		sum, prev := int64(0), int64(math.MinInt64)
		for _, e := range sl.buf[off:] {
			if e.N <= 0 || e.At <= prev {
				t.Errorf("shard %d: log slot %d has entry %+v after one at %d", i, k, e, prev)
			}
			sum, prev = sum+e.N, e.At
		}
		if sum != sl.curr {
			t.Errorf("shard %d: log slot %d sums to %d, curr %d", i, k, sum, sl.curr)
		}
	}
	if sh.logs == nil {
		return
	}
	if live := len(sh.logs.slots) - len(sh.logs.unused); live != logs {
		t.Errorf("shard %d: %d log slots live, %d log records", i, live, logs)
	}
	for _, k := range sh.logs.unused {
		if used[k] || sh.logs.slots[k].buf != nil {
			t.Errorf("shard %d: free log slot %d is used or holds a buffer", i, k)
		}
		used[k] = true
	}
}

// keysInShards returns n keys that live in n different shards of s.
func keysInShards(t testing.TB, s *Store, n int) []string {
	t.Helper()
	seen := map[uint32]bool{}
	var keys []string
	for i := 0; len(keys) < n; i++ {
		if i > 1e6 {
			t.Fatalf("could not find %d keys in distinct shards", n)
		}
		k := fmt.Sprintf("user:%d", i)
		if sh := s.keyShard(k); !seen[sh] {
			seen[sh] = true
			keys = append(keys, k)
		}
	}
	return keys
}

func TestNew(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name       string
		cfg        Config
		wantErr    string
		wantShards int
		wantKeys   int
	}{
		{name: "zero", cfg: Config{}, wantShards: DefaultShards, wantKeys: DefaultMaxKeys},
		{name: "explicit", cfg: Config{MaxKeys: 1000, Shards: 16}, wantShards: 16, wantKeys: 1000},
		{name: "rounded up", cfg: Config{MaxKeys: 100, Shards: 5}, wantShards: 8, wantKeys: 100},
		{name: "one shard", cfg: Config{MaxKeys: 1, Shards: 1}, wantShards: 1, wantKeys: 1},
		{name: "uneven share", cfg: Config{MaxKeys: 70, Shards: 64}, wantShards: 64, wantKeys: 70},
		{name: "negative MaxKeys", cfg: Config{MaxKeys: -1}, wantErr: "memstore: MaxKeys is -1, must not be negative"},
		{name: "negative Shards", cfg: Config{Shards: -4}, wantErr: "memstore: Shards is -4, must not be negative"},
		{name: "too many Shards", cfg: Config{Shards: 1<<16 + 1}, wantErr: "memstore: Shards is 65537, must be at most 65536"},
		{name: "MaxKeys below Shards", cfg: Config{MaxKeys: 10, Shards: 16}, wantErr: "memstore: MaxKeys is 10, must be at least Shards (16)"},
		{name: "MaxKeys below rounded Shards", cfg: Config{MaxKeys: 6, Shards: 5}, wantErr: "memstore: MaxKeys is 6, must be at least Shards (8)"},
		{name: "MaxKeys below default Shards", cfg: Config{MaxKeys: 63}, wantErr: "memstore: MaxKeys is 63, must be at least Shards (64)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			cfg := tt.cfg
			cfg.SweepInterval = -1
			s, err := New(cfg)
			if tt.wantErr != "" {
				if err == nil || err.Error() != tt.wantErr {
					t.Fatalf("New(%+v) error = %v, want %q", tt.cfg, err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("New(%+v): %v", tt.cfg, err)
			}
			defer s.Close()
			if got := len(s.shards); got != tt.wantShards {
				t.Errorf("shards = %d, want %d", got, tt.wantShards)
			}
			total := 0
			for i := range s.shards {
				c := s.shards[i].cap
				if c < 1 {
					t.Errorf("shard %d has capacity %d", i, c)
				}
				total += c
			}
			if total != tt.wantKeys {
				t.Errorf("capacities add up to %d, want %d", total, tt.wantKeys)
			}
		})
	}
}

// TestNewLargestShard checks the bound on a shard's capacity, which keeps
// a record's number within a uint32 index slot.
func TestNewLargestShard(t *testing.T) {
	t.Parallel()
	if strconv.IntSize < 64 {
		t.Skip("MaxKeys cannot exceed 2^31 with 32-bit ints")
	}
	most := int(int64(1)<<32 - 1)
	tests := []struct {
		cfg     Config
		wantErr string
	}{
		{cfg: Config{MaxKeys: most, Shards: 1}},
		{cfg: Config{MaxKeys: 2 * most, Shards: 2}},
		{cfg: Config{MaxKeys: most + 1, Shards: 1}, wantErr: "memstore: MaxKeys is 4294967296, must be at most 4294967295 per shard (1 shards)"},
		{cfg: Config{MaxKeys: 2*most + 1, Shards: 2}, wantErr: "memstore: MaxKeys is 8589934591, must be at most 4294967295 per shard (2 shards)"},
	}
	for _, tt := range tests {
		cfg := tt.cfg
		cfg.SweepInterval = -1
		s, err := New(cfg)
		if tt.wantErr != "" {
			if err == nil || err.Error() != tt.wantErr {
				t.Errorf("New(%+v) error = %v, want %q", tt.cfg, err, tt.wantErr)
			}
			continue
		}
		if err != nil {
			t.Errorf("New(%+v): %v", tt.cfg, err)
			continue
		}
		// With a capacity of 2^32-1, a slot has no room left for a tag:
		// every probe reads its record.
		if sh := &s.shards[0]; sh.idxBits != 32 {
			t.Errorf("New(%+v): idxBits = %d, want 32", tt.cfg, sh.idxBits)
		}
		for i := range 1000 {
			take(t, s, t0, charge(fmt.Sprint("k", i), perMinute(10), 1+i%3))
		}
		checkInvariants(t, s)
		for i := range 1000 {
			if got, want := remaining(t, s, t0, fmt.Sprint("k", i), perMinute(10)), 10-1-i%3; got != want {
				t.Fatalf("New(%+v): remaining on k%d = %d, want %d", tt.cfg, i, got, want)
			}
		}
		s.Close()
	}
}

func TestShardSize(t *testing.T) {
	t.Parallel()
	if got := unsafe.Sizeof(shard{}); got%64 != 0 {
		t.Errorf("sizeof(shard) = %d, want a multiple of 64", got)
	}
}

func TestTakeErrors(t *testing.T) {
	t.Parallel()
	canceled, cancel := context.WithCancel(context.Background())
	cancel()
	good := charge("k", perSecond(10), 1)
	tests := []struct {
		name    string
		ctx     context.Context
		charges []window.Charge
		nOut    int
		wantErr string
		wantIs  error
	}{
		{name: "short out", charges: []window.Charge{good, good}, nOut: 1, wantErr: "memstore: 1 decisions for 2 charges"},
		{name: "long out", charges: []window.Charge{good}, nOut: 2, wantErr: "memstore: 2 decisions for 1 charges"},
		{name: "zero requests", charges: []window.Charge{good, charge("k", window.Limit{Window: time.Second}, 1)}, nOut: 2, wantErr: `memstore: charge 1 ("rule"): limit 0/1s: requests must be > 0`},
		{name: "zero window", charges: []window.Charge{charge("k", window.Limit{Requests: 1}, 1), good}, nOut: 2, wantErr: `memstore: charge 0 ("rule"): limit 1/0s: window must be > 0`},
		{name: "sub-millisecond window", charges: []window.Charge{charge("k", window.Limit{Requests: 1, Window: 1500 * time.Microsecond}, 1)}, nOut: 1, wantErr: "whole number of milliseconds"},
		{name: "too large", charges: []window.Charge{charge("k", window.Limit{Requests: window.MaxRequests + 1, Window: time.Hour}, 1)}, nOut: 1, wantErr: "must be at most 2^50"},
		{name: "negative cost", charges: []window.Charge{good, charge("k", perHour(10), -1)}, nOut: 2, wantErr: `memstore: charge 1 ("rule"): cost -1 must not be negative`},
		{name: "canceled", ctx: canceled, charges: []window.Charge{good}, nOut: 1, wantErr: "memstore: context canceled", wantIs: context.Canceled},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			s := newStore(t, Config{})
			ctx := tt.ctx
			if ctx == nil {
				ctx = context.Background()
			}
			out := make([]window.Decision, tt.nOut)
			ok, err := s.Take(ctx, t0, tt.charges, out)
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("Take error = %v, want it to contain %q", err, tt.wantErr)
			}
			if tt.wantIs != nil && !errors.Is(err, tt.wantIs) {
				t.Errorf("errors.Is(%v, %v) = false", err, tt.wantIs)
			}
			if ok {
				t.Errorf("Take allowed = true with an error")
			}
			if n := s.Len(); n != 0 {
				t.Errorf("Len() = %d after a failed Take, want 0", n)
			}
			if got := remaining(t, s, t0, "k", perSecond(10)); got != 10 {
				t.Errorf("remaining after a failed Take = %d, want 10 (nothing counted)", got)
			}
		})
	}
}

func TestTakeNoCharges(t *testing.T) {
	t.Parallel()
	s := newStore(t, Config{})
	ok, err := s.Take(context.Background(), t0, nil, nil)
	if !ok || err != nil {
		t.Fatalf("Take(no charges) = %v, %v; want true, nil", ok, err)
	}
}

// model is what the store must answer for one counter: window.Take on the
// counter's state, which only an admitted request that costs something
// writes.
type model struct{ s window.State }

func (m *model) take(now time.Time, c window.Charge) (bool, window.Decision) {
	st, out := []window.State{m.s}, make([]window.Decision, 1)
	ok := window.Take(st, now.UnixMilli(), []window.Charge{c}, out)
	if ok && c.Cost > 0 {
		m.s = st[0]
	}
	return ok, out[0]
}

// takeBoth charges c to the store and the model and fails t unless they
// answer alike.
func takeBoth(t *testing.T, s *Store, m *model, now time.Time, c window.Charge) (bool, window.Decision) {
	t.Helper()
	ok, out := take(t, s, now, c)
	wantOK, want := m.take(now, c)
	if ok != wantOK || out[0] != want {
		t.Fatalf("at %v, cost %d: store %v %+v, window.Take %v %+v", now.Sub(t0), c.Cost, ok, out[0], wantOK, want)
	}
	if ok != out[0].Allowed {
		t.Fatalf("at %v: Take = %v but Decision.Allowed = %v", now.Sub(t0), ok, out[0].Allowed)
	}
	return ok, out[0]
}

// step is one row of a scripted sequence on a single counter: n requests of
// cost 1 at an instant, of which wantAllowed are admitted.
type step struct {
	at          time.Duration
	n           int
	wantAllowed int
}

// TestSequences drives one counter through scripted sequences and checks
// every decision against window.Take on the state the counter should hold
// (the hand-worked values of each decision are in the conformance suite,
// internal/storetest), and how many requests each step admits.
func TestSequences(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		limit window.Limit
		steps []step
	}{
		{
			// The conformance suite's worked example: 80 in the first
			// window, 40 in the second; 30 s into it the estimate is
			// 80*29999/60000 + 40, just under 80, so 20 more fit.
			name:  "worked example",
			limit: perMinute(100),
			steps: []step{{at: 5 * time.Second, n: 80, wantAllowed: 80}, {at: 85 * time.Second, n: 40, wantAllowed: 40}, {at: 95 * time.Second, n: 21, wantAllowed: 20}},
		},
		{
			name:  "roll over",
			limit: perSecond(10),
			steps: []step{
				{at: 0, n: 12, wantAllowed: 10},
				// Next window, tick 0: the previous 10 weigh 9.99.
				{at: time.Second, n: 1, wantAllowed: 0},
				// Half way: they weigh 4.99.
				{at: 1500 * time.Millisecond, n: 6, wantAllowed: 5},
				// Start of the window after: the previous 5 weigh 4.995.
				{at: 2 * time.Second, n: 6, wantAllowed: 5},
				// Two windows on, nothing is left of the 10 from t0.
				{at: 4 * time.Second, n: 11, wantAllowed: 10},
			},
		},
		{
			name:  "expiry",
			limit: perMinute(3),
			steps: []step{
				{at: 59 * time.Second, n: 4, wantAllowed: 3},
				// One window later the counts still weigh.
				{at: 119 * time.Second, n: 1, wantAllowed: 0},
				// Two windows after the start of the counter's window, the
				// counter has expired and everything is available.
				{at: 179 * time.Second, n: 4, wantAllowed: 3},
			},
		},
		{
			// A clock that goes back is treated as the start of the
			// counter's window: the counts are kept.
			name:  "clock backwards",
			limit: perSecond(10),
			steps: []step{
				{at: 10*time.Second + 500*time.Millisecond, n: 6, wantAllowed: 6},
				{at: 5 * time.Second, n: 5, wantAllowed: 4},
				{at: -time.Hour, n: 1, wantAllowed: 0},
				{at: 10*time.Second + 999*time.Millisecond, n: 1, wantAllowed: 0},
				// The next window sees all 10 as its previous window.
				{at: 11*time.Second + 500*time.Millisecond, n: 6, wantAllowed: 0},
				{at: 12 * time.Second, n: 6, wantAllowed: 5},
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			s := newStore(t, Config{})
			var m model
			for i, st := range tt.steps {
				allowed := 0
				for range st.n {
					if ok, _ := takeBoth(t, s, &m, at(st.at), charge("ip:203.0.113.7", tt.limit, 1)); ok {
						allowed++
					}
				}
				if allowed != st.wantAllowed {
					t.Errorf("step %d (at %v): %d of %d allowed, want %d", i, st.at, allowed, st.n, st.wantAllowed)
				}
			}
		})
	}
}

// TestReadsAndDenialsDoNotRoll checks that only admitted costs write a
// counter: a read or a denial in a later window leaves it in its own
// window, which shows when the clock goes back to that window.
func TestReadsAndDenialsDoNotRoll(t *testing.T) {
	t.Parallel()
	s := newStore(t, Config{Shards: 1, MaxKeys: 10})
	var m model
	l := perMinute(10)
	takeBoth(t, s, &m, at(10*time.Second), charge("k", l, 4))
	written, ok := s.stateOf("rule", "k", time.Minute)
	if !ok || written.Curr != 4 {
		t.Fatalf("state after the first request = %+v, %v; want Curr 4", written, ok)
	}
	steps := []struct {
		at          time.Duration
		cost        int
		wantAllowed bool
	}{
		{at: 70 * time.Second, cost: 0, wantAllowed: true},
		{at: 70 * time.Second, cost: 9, wantAllowed: false},
		// Back in the counter's own window: Curr 4 as written, not rolled
		// to the window of the read and the denial.
		{at: 20 * time.Second, cost: 0, wantAllowed: true},
	}
	for i, st := range steps {
		if ok, _ := takeBoth(t, s, &m, at(st.at), charge("k", l, st.cost)); ok != st.wantAllowed {
			t.Errorf("step %d: allowed %v, want %v", i, ok, st.wantAllowed)
		}
	}
	if got, _ := s.stateOf("rule", "k", time.Minute); !reflect.DeepEqual(got, written) {
		t.Errorf("stored state %+v, want %+v as the first request wrote it", got, written)
	}
}

func TestZeroNowUsesClock(t *testing.T) {
	t.Parallel()
	var now atomic.Int64
	now.Store(t0.UnixMilli())
	s := newStore(t, Config{Now: func() time.Time { return time.UnixMilli(now.Load()) }})
	l := perSecond(2)
	for i, want := range []bool{true, true, false} {
		if ok, _ := take(t, s, time.Time{}, charge("k", l, 1)); ok != want {
			t.Fatalf("request %d: allowed = %v, want %v", i, ok, want)
		}
	}
	now.Store(at(2 * time.Second).UnixMilli())
	if ok, _ := take(t, s, time.Time{}, charge("k", l, 1)); !ok {
		t.Fatalf("request after the clock moved 2s: denied, want allowed")
	}
}

func TestMultiCharge(t *testing.T) {
	t.Parallel()
	sec, hour := perSecond(10), perHour(100)
	both := func(key string, cost int) []window.Charge {
		return []window.Charge{
			{Name: "burst", Key: key, Limit: sec, Cost: cost},
			{Name: "quota", Key: key, Limit: hour, Cost: cost},
		}
	}
	read := func(t *testing.T, s *Store, now time.Time, key string) (int, int) {
		t.Helper()
		_, out := take(t, s, now, both(key, 0)...)
		return out[0].Remaining, out[1].Remaining
	}

	t.Run("denied by the short limit", func(t *testing.T) {
		t.Parallel()
		s := newStore(t, Config{})
		for i := range 10 {
			if ok, _ := take(t, s, t0, both("k", 1)...); !ok {
				t.Fatalf("request %d denied", i)
			}
		}
		ok, out := take(t, s, t0, both("k", 1)...)
		if ok || out[0].Allowed || !out[1].Allowed {
			t.Fatalf("11th request: allowed %v, per-second %v, per-hour %v; want false, false, true", ok, out[0].Allowed, out[1].Allowed)
		}
		if out[1].Remaining != 90 {
			t.Errorf("per-hour Remaining on the denied request = %d, want 90", out[1].Remaining)
		}
		if sr, hr := read(t, s, t0, "k"); sr != 0 || hr != 90 {
			t.Errorf("after the denial: remaining %d/s, %d/h; want 0, 90", sr, hr)
		}
	})

	t.Run("denied by the long limit", func(t *testing.T) {
		t.Parallel()
		s := newStore(t, Config{})
		// 10 requests every 2 s, so the per-second counter is empty again
		// each time, until the hour's 100 are used.
		for i := range 10 {
			now := at(time.Duration(2*i) * time.Second)
			for j := range 10 {
				if ok, _ := take(t, s, now, both("k", 1)...); !ok {
					t.Fatalf("request %d.%d denied", i, j)
				}
			}
		}
		now := at(30 * time.Second)
		ok, out := take(t, s, now, both("k", 3)...)
		if ok || !out[0].Allowed || out[1].Allowed {
			t.Fatalf("request at 30s: allowed %v, per-second %v, per-hour %v; want false, true, false", ok, out[0].Allowed, out[1].Allowed)
		}
		if sr, hr := read(t, s, now, "k"); sr != 10 || hr != 0 {
			t.Errorf("after the denial: remaining %d/s, %d/h; want 10, 0", sr, hr)
		}
	})

	t.Run("across shards", func(t *testing.T) {
		t.Parallel()
		s := newStore(t, Config{})
		keys := keysInShards(t, s, 2)
		charges := []window.Charge{charge(keys[0], perMinute(5), 1), charge(keys[1], perMinute(3), 1)}
		for i := range 3 {
			if ok, _ := take(t, s, t0, charges...); !ok {
				t.Fatalf("request %d denied", i)
			}
		}
		if ok, _ := take(t, s, t0, charges...); ok {
			t.Fatalf("4th request allowed, want denied by the limit of 3")
		}
		if got := remaining(t, s, t0, keys[0], perMinute(5)); got != 2 {
			t.Errorf("remaining on %s = %d, want 2", keys[0], got)
		}
	})

	t.Run("same counter twice", func(t *testing.T) {
		t.Parallel()
		s := newStore(t, Config{})
		c := charge("k", perMinute(10), 2)
		if ok, _ := take(t, s, t0, c, c); !ok {
			t.Fatalf("denied")
		}
		if got := remaining(t, s, t0, "k", perMinute(10)); got != 6 {
			t.Errorf("remaining = %d, want 6 (both costs counted)", got)
		}
		if n := s.Len(); n != 1 {
			t.Errorf("Len() = %d, want 1", n)
		}
		// A read and a charge of the same new counter create it.
		read, c1 := charge("k2", perMinute(10), 0), charge("k2", perMinute(10), 3)
		if ok, _ := take(t, s, t0, read, c1); !ok {
			t.Fatalf("denied")
		}
		if got := remaining(t, s, t0, "k2", perMinute(10)); got != 7 {
			t.Errorf("remaining on k2 = %d, want 7", got)
		}
	})

	t.Run("many charges", func(t *testing.T) {
		t.Parallel()
		s := newStore(t, Config{})
		var charges []window.Charge
		for i := range 3 * inlineCharges {
			charges = append(charges, window.Charge{Name: fmt.Sprint("r", i), Key: fmt.Sprint("k", i%5), Limit: perMinute(2 + i), Cost: 1})
		}
		for i := range 2 {
			if ok, _ := take(t, s, t0, charges...); !ok {
				t.Fatalf("request %d denied", i)
			}
		}
		ok, out := take(t, s, t0, charges...)
		if ok || out[0].Allowed || !out[1].Allowed {
			t.Fatalf("3rd request: allowed %v, first %v, second %v; want false, false, true", ok, out[0].Allowed, out[1].Allowed)
		}
		if n := s.Len(); n != len(charges) {
			t.Errorf("Len() = %d, want %d", n, len(charges))
		}
	})
}

func TestNoStateNoEntry(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		charges []window.Charge
		want    bool
	}{
		{name: "read", charges: []window.Charge{charge("new", perSecond(5), 0)}, want: true},
		{name: "cost above limit", charges: []window.Charge{charge("new", perSecond(5), 6)}, want: false},
		{name: "huge cost", charges: []window.Charge{charge("new", perSecond(5), 1<<50)}, want: false},
		{name: "largest cost", charges: []window.Charge{charge("new", perSecond(5), math.MaxInt)}, want: false},
		{name: "denied by another charge", charges: []window.Charge{charge("new", perSecond(5), 1), charge("full", perSecond(5), 1)}, want: false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			s := newStore(t, Config{})
			for range 5 {
				take(t, s, t0, charge("full", perSecond(5), 1))
			}
			ok, out := take(t, s, t0, tt.charges...)
			if ok != tt.want {
				t.Fatalf("allowed = %v, want %v", ok, tt.want)
			}
			if n := s.Len(); n != 1 {
				t.Errorf("Len() = %d, want 1 (no entry for %q)", n, "new")
			}
			if s.has("rule", "new", time.Second) {
				t.Errorf("entry created for %q", "new")
			}
			if tt.name != "read" && tt.charges[0].Cost > 5 && out[0].RetryAfter != -1 {
				t.Errorf("RetryAfter = %v, want -1ns", out[0].RetryAfter)
			}
		})
	}
}

func TestKeys(t *testing.T) {
	t.Parallel()
	l := perMinute(10)
	long := strings.Repeat("x", 1000)

	t.Run("counter identity", func(t *testing.T) {
		t.Parallel()
		s := newStore(t, Config{})
		take(t, s, t0, window.Charge{Name: "a", Key: "k", Limit: l, Cost: 4})
		tests := []struct {
			name string
			c    window.Charge
			want int
		}{
			{name: "same", c: window.Charge{Name: "a", Key: "k", Limit: l}, want: 6},
			{name: "other requests, same counter", c: window.Charge{Name: "a", Key: "k", Limit: perMinute(20)}, want: 16},
			{name: "other name", c: window.Charge{Name: "b", Key: "k", Limit: l}, want: 10},
			{name: "other key", c: window.Charge{Name: "a", Key: "k2", Limit: l}, want: 10},
			{name: "other window", c: window.Charge{Name: "a", Key: "k", Limit: perSecond(10)}, want: 10},
		}
		for _, tt := range tests {
			_, out := take(t, s, t0, tt.c)
			if out[0].Remaining != tt.want {
				t.Errorf("%s: Remaining = %d, want %d", tt.name, out[0].Remaining, tt.want)
			}
		}
	})

	t.Run("long keys", func(t *testing.T) {
		t.Parallel()
		s := newStore(t, Config{})
		k1, k2 := long+"1", long+"2"
		take(t, s, t0, charge(k1, l, 3))
		take(t, s, t0, charge(k2, l, 1))
		if got := remaining(t, s, t0, k1, l); got != 7 {
			t.Errorf("remaining on k1 = %d, want 7", got)
		}
		if got := remaining(t, s, t0, k2, l); got != 9 {
			t.Errorf("remaining on k2 = %d, want 9", got)
		}
		if got := remaining(t, s, t0, long, l); got != 10 {
			t.Errorf("remaining on a prefix of k1 = %d, want 10", got)
		}
	})

	t.Run("name and key do not run together", func(t *testing.T) {
		t.Parallel()
		s := newStore(t, Config{})
		take(t, s, t0, window.Charge{Name: "ab", Key: "c", Limit: l, Cost: 5})
		for _, c := range []window.Charge{
			{Name: "a", Key: "bc", Limit: l},
			{Name: "abc", Key: "", Limit: l},
			{Name: "", Key: "abc", Limit: l},
			{Name: "c", Key: "ab", Limit: l},
		} {
			if _, out := take(t, s, t0, c); out[0].Remaining != 10 {
				t.Errorf("Name %q, Key %q: Remaining = %d, want 10", c.Name, c.Key, out[0].Remaining)
			}
		}
	})

	t.Run("identities are distinct", func(t *testing.T) {
		t.Parallel()
		// The identities of many (Name, Window, Key) triples, including
		// windows that differ by one millisecond, are all different.
		s := newStore(t, Config{})
		seen := map[ident]string{}
		for k := range 2000 {
			k1, k2 := s.keyHash(fmt.Sprint("ip:", k))
			for _, name := range []string{"", "a", "b"} {
				for _, w := range []int64{1, 2, 1000, 1001, 60000} {
					id := s.ident(k1, k2, name, uint64(w))
					what := fmt.Sprintf("%q/%d/%d", name, w, k)
					if prev, ok := seen[id]; ok {
						t.Fatalf("%s and %s share identity %x", prev, what, id)
					}
					seen[id] = what
				}
			}
		}
	})

	t.Run("caller reuses key memory", func(t *testing.T) {
		t.Parallel()
		s := newStore(t, Config{})
		for _, key := range []string{"ip:192.0.2.1", long} {
			buf := []byte(key)
			reused := unsafe.String(&buf[0], len(buf))
			take(t, s, t0, charge(reused, l, 2))
			for i := range buf {
				buf[i] = '#'
			}
			if got := remaining(t, s, t0, key, l); got != 8 {
				t.Errorf("%.12s...: remaining = %d after the caller reused the key's memory, want 8", key, got)
			}
		}
	})
}

func TestConcurrentExact(t *testing.T) {
	t.Parallel()
	const (
		goroutines = 64
		attempts   = 200
	)
	t.Run("one key", func(t *testing.T) {
		t.Parallel()
		const limit = 1000
		s := newStore(t, Config{Now: func() time.Time { return t0 }})
		var admitted atomic.Int64
		var wg sync.WaitGroup
		for range goroutines {
			wg.Go(func() {
				c := []window.Charge{charge("hot", perMinute(limit), 1)}
				out := make([]window.Decision, 1)
				for range attempts {
					ok, err := s.Take(context.Background(), time.Time{}, c, out)
					if err != nil {
						t.Error(err)
						return
					}
					if ok {
						admitted.Add(1)
					}
				}
			})
		}
		wg.Wait()
		if got := admitted.Load(); got != limit {
			t.Fatalf("%d admitted, want exactly %d", got, limit)
		}
	})

	t.Run("across shards", func(t *testing.T) {
		t.Parallel()
		const limitA, limitB, limitC = 700, 300, 1 << 20
		s := newStore(t, Config{Shards: 8, MaxKeys: 64})
		keys := keysInShards(t, s, 3)
		a := window.Charge{Name: "a", Key: keys[0], Limit: perMinute(limitA), Cost: 1}
		b := window.Charge{Name: "b", Key: keys[1], Limit: perMinute(limitB), Cost: 1}
		c := window.Charge{Name: "c", Key: keys[2], Limit: perHour(limitC), Cost: 1}
		// Every goroutine charges a; three in four also charge b and c, in
		// different orders, so that calls lock three shards in any order.
		// The a-only goroutines alone make more than limitA attempts, so a
		// ends exactly full whatever the interleaving.
		shapes := [][]window.Charge{{a}, {a, b, c}, {c, b, a}, {b, c, a}}
		var admitted, admittedMulti atomic.Int64
		var wg sync.WaitGroup
		for g := range goroutines {
			wg.Go(func() {
				charges := shapes[g%len(shapes)]
				out := make([]window.Decision, len(charges))
				for range attempts {
					ok, err := s.Take(context.Background(), t0, charges, out)
					if err != nil {
						t.Error(err)
						return
					}
					if ok {
						admitted.Add(1)
						if len(charges) > 1 {
							admittedMulti.Add(1)
						}
					}
				}
			})
		}
		wg.Wait()
		_, out := take(t, s, t0,
			window.Charge{Name: "a", Key: keys[0], Limit: perMinute(limitA)},
			window.Charge{Name: "b", Key: keys[1], Limit: perMinute(limitB)},
			window.Charge{Name: "c", Key: keys[2], Limit: perHour(limitC)})
		if n := admitted.Load(); n != limitA || out[0].Remaining != 0 {
			t.Errorf("%d admitted with %d remaining on a, want exactly %d and 0", n, out[0].Remaining, limitA)
		}
		nm := admittedMulti.Load()
		if nm > limitB {
			t.Errorf("%d admitted on b, limit %d", nm, limitB)
		}
		if used := int64(limitB - out[1].Remaining); used != nm {
			t.Errorf("b counted %d, want %d, the number of admitted requests that charged it", used, nm)
		}
		if used := int64(limitC - out[2].Remaining); used != nm {
			t.Errorf("c counted %d, want %d, the number of admitted requests that charged it", used, nm)
		}
	})
}

func TestLRU(t *testing.T) {
	t.Parallel()
	l := perHour(10)
	tests := []struct {
		name    string
		maxKeys int
		ops     []string // keys charged in order, at t0
		want    []string // keys held afterwards
		gone    []string
	}{
		{name: "evicts the oldest", maxKeys: 3, ops: []string{"a", "b", "c", "d"}, want: []string{"b", "c", "d"}, gone: []string{"a"}},
		{name: "touching protects", maxKeys: 3, ops: []string{"a", "b", "c", "a", "d"}, want: []string{"a", "c", "d"}, gone: []string{"b"}},
		{name: "touching twice", maxKeys: 3, ops: []string{"a", "b", "c", "b", "a", "d", "e"}, want: []string{"a", "d", "e"}, gone: []string{"b", "c"}},
		{name: "capacity one", maxKeys: 1, ops: []string{"a", "b"}, want: []string{"b"}, gone: []string{"a"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			s := newStore(t, Config{Shards: 1, MaxKeys: tt.maxKeys})
			for _, k := range tt.ops {
				take(t, s, t0, charge(k, l, 1))
			}
			checkInvariants(t, s)
			if n := s.Len(); n != len(tt.want) {
				t.Errorf("Len() = %d, want %d", n, len(tt.want))
			}
			for _, k := range tt.want {
				if !s.has("rule", k, time.Hour) {
					t.Errorf("%q evicted, want kept", k)
				}
			}
			for _, k := range tt.gone {
				if s.has("rule", k, time.Hour) {
					t.Errorf("%q kept, want evicted", k)
				}
			}
		})
	}
}

func TestLRUReadTouches(t *testing.T) {
	t.Parallel()
	s := newStore(t, Config{Shards: 1, MaxKeys: 2})
	take(t, s, t0, charge("a", perHour(10), 1))
	take(t, s, t0, charge("b", perHour(10), 1))
	remaining(t, s, t0, "a", perHour(10))
	take(t, s, t0, charge("c", perHour(10), 1))
	if !s.has("rule", "a", time.Hour) || s.has("rule", "b", time.Hour) {
		t.Errorf("after reading a: has(a) = %v, has(b) = %v; want true, false", s.has("rule", "a", time.Hour), s.has("rule", "b", time.Hour))
	}
}

func TestInsertReclaimsExpired(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		old     []string      // charged at t0 with a 1 s window
		insert  time.Duration // when "new" is charged
		wantLen int
	}{
		{name: "not yet expired", old: []string{"a", "b"}, insert: 1999 * time.Millisecond, wantLen: 3},
		{name: "expired", old: []string{"a", "b"}, insert: 2 * time.Second, wantLen: 1},
		{name: "at most two", old: []string{"a", "b", "c", "d"}, insert: time.Hour, wantLen: 3},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			s := newStore(t, Config{Shards: 1, MaxKeys: 100})
			for _, k := range tt.old {
				take(t, s, t0, charge(k, perSecond(1), 1))
			}
			take(t, s, at(tt.insert), charge("new", perSecond(1), 1))
			if n := s.Len(); n != tt.wantLen {
				t.Errorf("Len() = %d, want %d", n, tt.wantLen)
			}
		})
	}
}

func TestExpiredEntryIsReset(t *testing.T) {
	t.Parallel()
	s := newStore(t, Config{Shards: 1, MaxKeys: 10})
	take(t, s, t0, charge("k", perSecond(5), 5))
	// Whatever an expired entry holds, it must not count.
	sh := &s.shards[0]
	_, until := sh.state(0, window.SlidingWindow)
	sh.set(0, &window.State{Start: t0.UnixMilli(), Prev: 1 << 40, Curr: 1 << 40}, until, &window.Limit{Requests: 5, Window: time.Second})
	if got := remaining(t, s, at(2*time.Second), "k", perSecond(5)); got != 5 {
		t.Errorf("remaining on an expired entry = %d, want 5", got)
	}
}

func TestSweep(t *testing.T) {
	t.Parallel()
	s := newStore(t, Config{Shards: 4, MaxKeys: 1000})
	for i := range 30 {
		take(t, s, t0, charge(fmt.Sprint("s", i), perSecond(5), 1))
		take(t, s, t0, charge(fmt.Sprint("m", i), perMinute(5), 1))
	}
	tests := []struct {
		at          time.Duration
		wantDropped int
		wantLen     int
	}{
		{at: 1999 * time.Millisecond, wantDropped: 0, wantLen: 60},
		{at: 2 * time.Second, wantDropped: 30, wantLen: 30},
		{at: 119 * time.Second, wantDropped: 0, wantLen: 30},
		{at: 2 * time.Minute, wantDropped: 30, wantLen: 0},
		{at: time.Hour, wantDropped: 0, wantLen: 0},
	}
	for _, tt := range tests {
		if got := s.sweep(at(tt.at)); got != tt.wantDropped {
			t.Errorf("sweep(%v) dropped %d, want %d", tt.at, got, tt.wantDropped)
		}
		if n := s.Len(); n != tt.wantLen {
			t.Errorf("after sweep(%v): Len() = %d, want %d", tt.at, n, tt.wantLen)
		}
	}
	// The store still works after a sweep emptied it.
	if ok, _ := take(t, s, at(time.Hour), charge("s1", perSecond(5), 1)); !ok {
		t.Errorf("denied after sweep")
	}
}

// TestSweepConcurrent sweeps while other goroutines insert, touch and evict
// counters, so that sweeps resume after entries moved or were removed.
func TestSweepConcurrent(t *testing.T) {
	t.Parallel()
	const workers, perWorker = 4, 3000
	s := newStore(t, Config{Shards: 2, MaxKeys: 4 * sweepBatch})
	var clock atomic.Int64 // milliseconds after t0, moved by the workers
	var wg sync.WaitGroup
	for g := range workers {
		wg.Go(func() {
			for i := range perWorker {
				now := at(time.Duration(clock.Add(1)) * time.Millisecond)
				// Short windows expire during the run, long ones don't;
				// every third request touches an older key.
				k, l := fmt.Sprint(g, ":", i), perSecond(5)
				if i%2 == 0 {
					l = perHour(5)
				}
				if i%3 == 0 && i > 0 {
					k = fmt.Sprint(g, ":", i/2)
				}
				take(t, s, now, charge(k, l, 1))
			}
		})
	}
	swept := 0
	done := make(chan struct{})
	go func() {
		defer close(done)
		for clock.Load() < workers*perWorker {
			swept += s.sweep(at(time.Duration(clock.Load()) * time.Millisecond))
		}
	}()
	wg.Wait()
	<-done
	checkInvariants(t, s)
	t.Logf("%d swept, %d left", swept, s.Len())
	final := at(time.Duration(clock.Load()) * time.Millisecond)
	s.sweep(final)
	checkInvariants(t, s)
	for i := range s.shards {
		sh := &s.shards[i]
		for r := range sh.n {
			if sh.expired(r, final.UnixMilli()) {
				t.Errorf("shard %d: record %d expired but kept after a quiet sweep", i, r)
			}
		}
	}
}

func TestSweepKeepsLRUConsistent(t *testing.T) {
	t.Parallel()
	s := newStore(t, Config{Shards: 1, MaxKeys: 3})
	take(t, s, t0, charge("a", perHour(5), 1))
	take(t, s, t0, charge("b", perSecond(5), 1))
	take(t, s, t0, charge("c", perHour(5), 1))
	s.sweep(at(time.Minute)) // drops b from the middle of the list
	take(t, s, at(time.Minute), charge("d", perHour(5), 1))
	take(t, s, at(time.Minute), charge("e", perHour(5), 1)) // evicts a
	checkInvariants(t, s)
	for k, want := range map[string]bool{"a": false, "c": true, "d": true, "e": true} {
		if got := s.has("rule", k, time.Hour); got != want {
			t.Errorf("has(%q) = %v, want %v", k, got, want)
		}
	}
}

func TestClose(t *testing.T) {
	t.Parallel()
	for _, every := range []time.Duration{-1, 0, time.Millisecond} {
		t.Run(fmt.Sprint(every), func(t *testing.T) {
			t.Parallel()
			s, err := New(Config{SweepInterval: every})
			if err != nil {
				t.Fatal(err)
			}
			if (s.stop != nil) != (every >= 0) {
				t.Errorf("sweeper running = %v, want %v", s.stop != nil, every >= 0)
			}
			for i := range 3 {
				if err := s.Close(); err != nil {
					t.Errorf("Close #%d: %v", i+1, err)
				}
			}
			if s.stop != nil {
				select {
				case <-s.stop.done:
				default:
					t.Errorf("sweeper still running after Close")
				}
			}
			if ok, _ := take(t, s, t0, charge("k", perSecond(1), 1)); !ok {
				t.Errorf("Take after Close denied")
			}
		})
	}
}

func TestSweeperLoop(t *testing.T) {
	t.Parallel()
	var now atomic.Int64
	now.Store(t0.UnixMilli())
	clock := func() time.Time { return time.UnixMilli(now.Load()) }
	s := newStore(t, Config{Now: clock})
	for i := range 10 {
		take(t, s, time.Time{}, charge(fmt.Sprint(i), perSecond(5), 1))
	}
	tick := make(chan time.Time) // unbuffered: a send waits for the previous sweep
	st := &stopper{stop: make(chan struct{}), done: make(chan struct{})}
	go sweepLoop(s.shards, clock, tick, st)

	tick <- time.Time{}
	tick <- time.Time{}
	if n := s.Len(); n != 10 {
		t.Errorf("Len() = %d after sweeping before expiry, want 10", n)
	}
	now.Store(at(2 * time.Second).UnixMilli())
	tick <- time.Time{}
	tick <- time.Time{}
	if n := s.Len(); n != 0 {
		t.Errorf("Len() = %d after sweeping at expiry, want 0", n)
	}
	st.signal()
	<-st.done
}

// TestSweeperStopsWithStore checks that a Store dropped without Close does
// not leak its sweeper.
func TestSweeperStopsWithStore(t *testing.T) {
	t.Parallel()
	s, err := New(Config{SweepInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	done := s.stop.done
	s = nil
	deadline := time.After(10 * time.Second)
	for {
		runtime.GC()
		select {
		case <-done:
			return
		case <-deadline:
			t.Fatal("sweeper still running 10s after its Store became unreachable")
		case <-time.After(10 * time.Millisecond):
		}
	}
}

func TestCloseConcurrent(t *testing.T) {
	t.Parallel()
	s, err := New(Config{SweepInterval: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() { s.Close() })
	}
	wg.Wait()
}

// TestAllocs is not parallel: AllocsPerRun refuses to run in parallel tests.
func TestAllocs(t *testing.T) {
	s := newStore(t, Config{})
	keys := keysInShards(t, s, 2)
	long := strings.Repeat("k", 200)
	tests := []struct {
		name    string
		charges []window.Charge
	}{
		{name: "one charge", charges: []window.Charge{charge(keys[0], perHour(1000), 1)}},
		{name: "two charges, one key", charges: []window.Charge{charge(keys[0], perSecond(1000), 1), charge(keys[0], perHour(1000), 1)}},
		{name: "two charges, two shards", charges: []window.Charge{charge(keys[0], perMinute(1000), 1), charge(keys[1], perMinute(1000), 1)}},
		{name: "long key", charges: []window.Charge{charge(long, perHour(1000), 1)}},
		{name: "denied", charges: []window.Charge{charge(keys[1], perHour(1), 1)}},
		{name: "cost above limit", charges: []window.Charge{charge(keys[0], perHour(1000), 1), charge(keys[1], perHour(1), 1<<62)}},
		{name: "eight charges", charges: func() []window.Charge {
			var cs []window.Charge
			for i := range inlineCharges {
				cs = append(cs, window.Charge{Name: fmt.Sprint(i), Key: keys[i%2], Limit: perHour(1000), Cost: 1})
			}
			return cs
		}()},
	}
	for _, tt := range tests {
		out := make([]window.Decision, len(tt.charges))
		ctx := context.Background()
		if _, err := s.Take(ctx, t0, tt.charges, out); err != nil {
			t.Fatal(err)
		}
		allocs := testing.AllocsPerRun(100, func() {
			s.Take(ctx, t0, tt.charges, out)
		})
		if allocs != 0 {
			t.Errorf("%s: %v allocations per Take, want 0", tt.name, allocs)
		}
	}

	// A new counter in a full store evicts one and takes its place: no
	// allocation either, since the key is not copied.
	full := newStore(t, Config{Shards: 4, MaxKeys: 1024})
	keys = make([]string, 4096)
	for i := range keys {
		keys[i] = fmt.Sprint("ip:", i)
	}
	c := []window.Charge{charge("", perHour(1000), 1)}
	out := make([]window.Decision, 1)
	next := 0
	newKey := func() {
		c[0].Key = keys[next%len(keys)]
		next++
		if ok, err := full.Take(context.Background(), t0, c, out); !ok || err != nil {
			t.Fatalf("Take(%s) = %v, %v", c[0].Key, ok, err)
		}
	}
	for range 2048 {
		newKey()
	}
	if allocs := testing.AllocsPerRun(1000, newKey); allocs != 0 {
		t.Errorf("new key at the key cap: %v allocations per Take, want 0", allocs)
	}
}
