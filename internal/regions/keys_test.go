package regions

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/keyguard"
	"github.com/sluicehq/sluice/internal/redistest"
)

// coverCases is one table for Declared and Covers and for the scripts'
// twin of them: windows of 1 s, the windows declared around est, and the
// instant the script decides at. want is whether the declared hashes hold
// the current window's, wantPrev whether they also hold the previous
// one's (a sliding window's decision, a reset).
var coverCases = []struct {
	est, now       int64
	want, wantPrev bool
}{
	{10_500, 10_500, true, true},
	{10_500, 9_400, true, true},    // a window behind: the windows of est − w
	{10_500, 11_999, true, true},   // a window ahead: the windows of est + w
	{10_000, 9_000, true, true},    // est on an edge, a whole window behind
	{10_999, 11_998, true, true},   // est at a window's end, now at the next one's
	{10_500, 8_999, false, false},  // more than a window behind
	{10_500, 8_500, false, false},  //
	{10_999, 8_000, false, false},  //
	{10_500, 12_000, false, false}, // more than a window ahead
	{10_000, 12_000, false, false}, //
	{10_500, 70_000, false, false}, // far off, as an unknown offset may be
	{70_000, 10_500, false, false}, //
	{-500, 0, true, true},          // windows before the epoch
	{-500, 999, true, true},        //
	{-1_500, 1_000, false, false},  //
}

// TestDeclaredCovers checks Declared and Covers on the table, and that a
// script whose clock is within a window of the estimate always finds the
// hashes it needs (no second round trip).
func TestDeclaredCovers(t *testing.T) {
	const w = 1000
	for _, c := range coverCases {
		for _, prev := range []bool{false, true} {
			want := c.want
			if prev {
				want = c.wantPrev
			}
			if got := Covers(Declared(c.est, w, prev), c.now, w, prev); got != want {
				t.Errorf("est %d, now %d, prev %v: Covers = %v, want %v (declared %v)", c.est, c.now, prev, got, want, Declared(c.est, w, prev))
			}
		}
	}
	if got, want := Declared(10_500, w, false), []int64{9_000, 10_000, 11_000}; !slices.Equal(got, want) {
		t.Errorf("Declared = %v, want %v", got, want)
	}
	if got, want := Declared(10_500, w, true), []int64{8_000, 9_000, 10_000, 11_000}; !slices.Equal(got, want) {
		t.Errorf("Declared with the previous window = %v, want %v", got, want)
	}
	for _, w := range []int64{1, 7, 1000, 60_000} {
		for est := int64(-3 * w); est <= 3*w; est += max(1, w/8) {
			for now := est - w; now <= est+w; now += max(1, w/16) {
				for _, prev := range []bool{false, true} {
					if !Covers(Declared(est, w, prev), now, w, prev) {
						t.Fatalf("w %d: est %d, now %d (within a window), prev %v: not covered by %v", w, est, now, prev, Declared(est, w, prev))
					}
				}
			}
		}
	}
}

// TestScriptsCoverMatchesGo runs decide.lua (fixed and sliding) and
// reset.lua on a real Redis with the keys Declared gives for the table's
// est and the table's now as the test clock, and requires the script to
// decide when Covers says the hashes it needs are declared, and otherwise
// to answer -1, now and leave every hash as it was.
func TestScriptsCoverMatchesGo(t *testing.T) {
	srv := redistest.Standalone(t)
	ctx := context.Background()
	c := srv.Client(t, nil)
	pfx := srv.Prefix(t)
	const w = 1000
	for i, tc := range coverCases {
		for _, script := range []string{"fixed", "sliding", "reset"} {
			prev := script != "fixed"
			counter := fmt.Sprintf("%s%d-%s", pfx, i, script)
			start := Start(tc.now, w)
			curr, before := key(counter, start), key(counter, start-w)
			// The windows the script needs already hold a peer's count.
			for _, k := range []string{curr, before} {
				if err := c.HSet(ctx, k, "eu", 1).Err(); err != nil {
					t.Fatal(err)
				}
			}
			declared := Declared(tc.est, w, prev)
			keys := windowKeys(counter, declared)
			var v []int64
			var err error
			if script == "reset" {
				v, err = resetScript.Run(ctx, c, keys, tc.now, w, base(counter)).Int64Slice()
			} else {
				v, err = decideScript.Run(ctx, c, keys, "us", 1, 10, tc.now, w, b2i(prev), 0, 1000, base(counter)).Int64Slice()
			}
			if err != nil {
				t.Fatalf("%s, est %d, now %d: %v", script, tc.est, tc.now, err)
			}
			want := Covers(declared, tc.now, w, prev)
			if wantTable := map[bool]bool{false: tc.want, true: tc.wantPrev}[prev]; want != wantTable {
				t.Fatalf("%s, est %d, now %d: Covers %v, table %v", script, tc.est, tc.now, want, wantTable)
			}
			ch, err := c.HGetAll(ctx, curr).Result()
			if err != nil {
				t.Fatal(err)
			}
			bh, err := c.HGetAll(ctx, before).Result()
			if err != nil {
				t.Fatal(err)
			}
			untouched := len(ch) == 1 && len(bh) == 1
			switch {
			case !want:
				if !slices.Equal(v, []int64{-1, tc.now}) || !untouched {
					t.Errorf("%s, est %d, now %d (declared %v): reply %v, current window %v, previous %v; want -1, now and nothing touched", script, tc.est, tc.now, declared, v, ch, bh)
				}
			case script == "reset":
				if !slices.Equal(v, []int64{start, tc.now, 1, 1}) || ch[ResetField] != "1" || bh[ResetField] != "1" {
					t.Errorf("reset, est %d, now %d: reply %v, current window %v, previous %v; want both marked", tc.est, tc.now, v, ch, bh)
				}
			default:
				// The peer's 1 in the current window, and for a sliding
				// window the previous window's 1 weighted, then this
				// request.
				total := Total(Window{Curr: map[string]int64{"eu": 1}, Prev: map[string]int64{"eu": 1}}, start, tc.now, w, prev, nil, 0) + 1
				if !slices.Equal(v, []int64{1, total, 1, start, tc.now}) || ch["us"] != "1" || len(bh) != 1 {
					t.Errorf("%s, est %d, now %d: reply %v, current window %v, previous %v; want admitted with total %d in window %d", script, tc.est, tc.now, v, ch, bh, total, start)
				}
			}
		}
	}
}

// scriptRuns records the runs of a script that a client sends (EVALSHA,
// or EVAL after NOSCRIPT) and that get an answer, with their KEYS. Runs
// after the first wait delay before they are sent.
type scriptRuns struct {
	hash  string
	delay time.Duration

	mu   sync.Mutex
	keys [][]string
}

func newScriptRuns(c *redis.Client, script *redis.Script) *scriptRuns {
	r := &scriptRuns{hash: script.Hash()}
	c.AddHook(r)
	return r
}

func (r *scriptRuns) DialHook(next redis.DialHook) redis.DialHook { return next }

func (r *scriptRuns) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

func (r *scriptRuns) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		args := cmd.Args()
		name := strings.ToLower(cmd.Name())
		if (name != "evalsha" && name != "eval") || len(args) < 3 {
			return next(ctx, cmd)
		}
		id, _ := args[1].(string)
		if name == "eval" {
			sum := sha1.Sum([]byte(id))
			id = hex.EncodeToString(sum[:])
		}
		if id != r.hash {
			return next(ctx, cmd)
		}
		r.mu.Lock()
		n := len(r.keys)
		r.mu.Unlock()
		if n > 0 && r.delay > 0 {
			time.Sleep(r.delay)
		}
		err := next(ctx, cmd)
		if err != nil && isNoScript(err) {
			return err // go-redis sends it again with EVAL
		}
		nk, _ := args[2].(int)
		keys := make([]string, 0, nk)
		for _, k := range args[3 : 3+nk] {
			keys = append(keys, fmt.Sprint(k))
		}
		r.mu.Lock()
		r.keys = append(r.keys, keys)
		r.mu.Unlock()
		return err
	}
}

// take returns the KEYS of the runs recorded since the last take.
func (r *scriptRuns) take() [][]string {
	r.mu.Lock()
	defer r.mu.Unlock()
	k := r.keys
	r.keys = nil
	return k
}

// TestDecideRetriesOnce gives a store an estimate of the Redis clock
// off by five windows either way before each decision on the Redis clock
// (TIME), as an app server's first decision is when its clock is skewed
// by that much: each decision takes exactly two runs of the script, the
// first declaring windows that do not hold the one decided in and the
// second declaring it, and the decisions are those of one count. The
// hashes that exist afterwards are the ones declared. Once the store has
// learned the offset, a decision takes one run. With SLUICE_KEYGUARD=1
// (make test) the guard also fails any run that touches, even reads, a key
// not in KEYS.
func TestDecideRetriesOnce(t *testing.T) {
	if !keyguard.Enabled {
		t.Logf("%s is not 1: the scripts run unguarded, and only their writes are checked here", keyguard.Env)
	}
	srv := redistest.Standalone(t)
	ctx := context.Background()
	const w, limit = 60_000, 3
	for _, sliding := range []bool{false, true} {
		for _, off := range []int64{5 * w, -5 * w} {
			t.Run(fmt.Sprintf("sliding=%v,off=%d", sliding, off), func(t *testing.T) {
				local := srv.Client(t, nil)
				runs := newScriptRuns(local, decideScript)
				s, err := New(Config{Region: "us", Local: local}, 0)
				if err != nil {
					t.Fatal(err)
				}
				// A window edge may fall between the decisions: then run
				// again, with another counter.
				for attempt := 0; ; attempt++ {
					c := Charge{Counter: fmt.Sprintf("%sc%d", srv.Prefix(t), attempt), Limit: limit, Window: w, Sliding: sliding, Cost: 1}
					var ds []Decision
					var declared []string
					for i := 0; i <= limit; i++ {
						s.offset.Store(off)
						d, err := s.Decide(ctx, -1, c)
						if err != nil {
							t.Fatal(err)
						}
						ds = append(ds, d)
						got := runs.take()
						if len(got) != 2 {
							t.Fatalf("decision %d took %d runs of the script, want 2 (the estimate was %d ms off)", i, len(got), off)
						}
						curr := key(c.Counter, d.Start)
						if slices.Contains(got[0], curr) || !slices.Contains(got[1], curr) {
							t.Fatalf("decision %d in window %d: KEYS of the first run %v, of the second %v; want it only in the second", i, d.Start, got[0], got[1])
						}
						declared = append(declared, got[1]...)
					}
					if ds[0].Start != ds[limit].Start && attempt == 0 {
						continue
					}
					for i, d := range ds {
						want := Decision{Allowed: i < limit, Total: min(int64(i+1), limit), Own: min(int64(i+1), limit), Start: d.Start, Now: d.Now}
						if d != want || d.Start != Start(d.Now, w) {
							t.Errorf("decision %d: %+v, want %+v", i, d, want)
						}
					}
					// Only declared hashes were written.
					for _, st := range []int64{ds[0].Start - 2*w, ds[0].Start - w, ds[0].Start, ds[0].Start + w} {
						if n, _ := local.Exists(ctx, key(c.Counter, st)).Result(); n > 0 && !slices.Contains(declared, key(c.Counter, st)) {
							t.Errorf("hash of window %d written, and never declared", st)
						}
					}
					break
				}
				// The store learned the offset: the next decision takes
				// one run.
				if _, err := s.Decide(ctx, -1, Charge{Counter: srv.Prefix(t) + "learned", Limit: limit, Window: w, Sliding: sliding, Cost: 1}); err != nil {
					t.Fatal(err)
				}
				if got := runs.take(); len(got) != 1 {
					t.Errorf("a decision after the offset was learned took %d runs, want 1: %v (offset %d)", len(got), got, s.offset.Load())
				}
			})
		}
	}
}

// TestDecideSecondMissFails has the Redis clock move by more than a
// window between the two runs of a decision (windows of 1 ms, the second
// run sent 5 ms after the first answered): the decision fails with
// ErrWindowMoved after exactly two runs, having written nothing.
func TestDecideSecondMissFails(t *testing.T) {
	srv := redistest.Standalone(t)
	ctx := context.Background()
	local := srv.Client(t, nil)
	runs := newScriptRuns(local, decideScript)
	runs.delay = 5 * time.Millisecond
	s, err := New(Config{Region: "us", Local: local}, 0)
	if err != nil {
		t.Fatal(err)
	}
	s.offset.Store(1_000_000)
	c := Charge{Counter: srv.Prefix(t) + "c", Limit: 3, Window: 1, Cost: 1}
	d, err := s.Decide(ctx, -1, c)
	if !errors.Is(err, ErrWindowMoved) {
		t.Fatalf("Decide = %+v, %v; want ErrWindowMoved", d, err)
	}
	got := runs.take()
	if len(got) != 2 {
		t.Fatalf("%d runs of the script, want 2", len(got))
	}
	for _, keys := range got {
		for _, k := range keys {
			if n, _ := local.Exists(ctx, k).Result(); n > 0 {
				t.Errorf("%s was written by a run that found no window of its own", k)
			}
		}
	}
}

// TestResetRetriesOnce resets a counter with the store's estimate of the
// Redis clock off by five windows: the reset takes exactly two runs of
// reset.lua, the second declaring the current and previous windows, and
// marks the count, so that the limit is whole again.
func TestResetRetriesOnce(t *testing.T) {
	srv := redistest.Standalone(t)
	ctx := context.Background()
	local := srv.Client(t, nil)
	runs := newScriptRuns(local, resetScript)
	s, err := New(Config{Region: "us", Local: local}, 0)
	if err != nil {
		t.Fatal(err)
	}
	const w, limit = 60_000, 2
	for _, off := range []int64{5 * w, -5 * w} {
		for attempt := 0; ; attempt++ {
			c := Charge{Counter: fmt.Sprintf("%s%d-%d", srv.Prefix(t), off, attempt), Limit: limit, Window: w, Sliding: true, Cost: 1}
			var starts []int64
			decide := func(want bool) {
				d, err := s.Decide(ctx, -1, c)
				if err != nil {
					t.Fatal(err)
				}
				if d.Allowed != want {
					t.Fatalf("off %d: %+v, want allowed %v", off, d, want)
				}
				starts = append(starts, d.Start)
			}
			decide(true)
			decide(true)
			decide(false)
			s.offset.Store(off)
			if err := s.Reset(ctx, -1, c); err != nil {
				t.Fatal(err)
			}
			got := runs.take()
			decide(true)
			decide(true)
			decide(false)
			if starts[0] != starts[len(starts)-1] {
				if attempt == 0 {
					continue // a window edge fell between the decisions
				}
				t.Fatalf("windows %v", starts)
			}
			curr, prev := key(c.Counter, starts[0]), key(c.Counter, starts[0]-w)
			if len(got) != 2 || slices.Contains(got[0], curr) || !slices.Contains(got[1], curr) || !slices.Contains(got[1], prev) {
				t.Fatalf("off %d: runs of reset.lua with KEYS %v; want two, the second declaring %s and %s", off, got, curr, prev)
			}
			if mark, err := local.HGet(ctx, curr, ResetField).Int64(); err != nil || mark != 2 {
				t.Errorf("off %d: the window's mark is %d, %v; want 2", off, mark, err)
			}
			break
		}
	}
}

// TestNoWindow: a charge without a window is refused with an error before
// any key is picked (Start would divide by zero).
func TestNoWindow(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	defer c.Close()
	s, err := New(Config{Region: "us", Local: c}, 0)
	if err != nil {
		t.Fatal(err)
	}
	ch := Charge{Counter: "c", Limit: 1, Cost: 1}
	if _, err := s.Decide(context.Background(), 1_000, ch); err == nil || !strings.Contains(err.Error(), "no window") {
		t.Errorf("Decide without a window: %v", err)
	}
	if err := s.Reset(context.Background(), 1_000, ch); err == nil || !strings.Contains(err.Error(), "no window") {
		t.Errorf("Reset without a window: %v", err)
	}
}
