package regions

import (
	"context"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/redistest"
)

func TestStart(t *testing.T) {
	for _, c := range []struct{ now, w, want int64 }{
		{0, 1000, 0}, {999, 1000, 0}, {1000, 1000, 1000}, {60_001, 60_000, 60_000}, {-1, 1000, -1000},
	} {
		if got := Start(c.now, c.w); got != c.want {
			t.Errorf("Start(%d, %d) = %d, want %d", c.now, c.w, got, c.want)
		}
	}
}

func TestMergeIdempotentCommutative(t *testing.T) {
	a := map[string]int64{"us": 3, "eu": 7}
	b := map[string]int64{"us": 5, "eu": 2, "ap": 1}
	x := map[string]int64{}
	Merge(x, a)
	Merge(x, b)
	Merge(x, a) // repeat
	y := map[string]int64{}
	Merge(y, b)
	Merge(y, a)
	want := map[string]int64{"us": 5, "eu": 7, "ap": 1}
	for _, m := range []map[string]int64{x, y} {
		for k, v := range want {
			if m[k] != v {
				t.Fatalf("merge %v, want %v", m, want)
			}
		}
	}
}

func TestBoundAndShare(t *testing.T) {
	// 10 req/s, T = 250 ms, d = 120 ms: 3.7 -> 4; capped at (N-1) L.
	if got := Bound(10, 250*time.Millisecond, 120*time.Millisecond, 3, 100); got != 4 {
		t.Errorf("Bound = %d, want 4", got)
	}
	if got := Bound(1e6, time.Second, 0, 3, 100); got != 200 {
		t.Errorf("Bound = %d, want (N-1)L = 200", got)
	}
	if got := Share(100, 3); got != 34 {
		t.Errorf("Share = %d, want 34", got)
	}
}

// TestDecideMatchesTotal decides a table of instants with the script on a
// real Redis and with Total and Fits, and requires the same answers.
func TestDecideMatchesTotal(t *testing.T) {
	srv := redistest.Standalone(t)
	ctx := context.Background()
	local := srv.Client(t, nil)
	peer := srv.Client(t, nil) // a peer writing into the same Redis
	pfx := srv.Prefix(t)
	s, err := New(Config{Region: "us", Local: local}, 0)
	if err != nil {
		t.Fatal(err)
	}
	const w, limit = 1000, 10
	for _, sliding := range []bool{false, true} {
		counter := pfx + map[bool]string{false: "fixed", true: "sliding"}[sliding]
		c := Charge{Counter: counter, Limit: limit, Window: w, Sliding: sliding, Cost: 1}
		// Go's model of the hashes.
		model := map[int64]map[string]int64{}
		get := func(st int64) map[string]int64 {
			if model[st] == nil {
				model[st] = map[string]int64{}
			}
			return model[st]
		}
		steps := []struct {
			at       int64
			peerSets int64 // the peer's count of the current window, merged before deciding
			stale    []string
		}{
			{10_000, 0, nil}, {10_100, 3, nil}, {10_200, 3, nil}, {10_300, 5, nil},
			{10_400, 5, nil}, {10_500, 5, nil}, {10_600, 5, nil}, {10_700, 5, nil},
			{11_100, 1, nil}, {11_300, 1, nil}, {11_500, 2, nil}, {11_900, 2, nil},
			{12_200, 0, []string{"eu"}}, {12_300, 0, []string{"eu"}}, {12_400, 0, []string{"eu"}},
		}
		// Before these steps, the counter is reset (reset.lua): each of
		// the current and previous windows' ResetField becomes its sum.
		resets := map[int]bool{6: true, 10: true, 11: true}
		for i, st := range steps {
			start := Start(st.at, w)
			if resets[i] {
				if err := s.Reset(ctx, st.at, c); err != nil {
					t.Fatal(err)
				}
				for _, ws := range []int64{start, start - w} {
					var sum int64
					for r, n := range get(ws) {
						if r != ResetField {
							sum += n
						}
					}
					get(ws)[ResetField] = max(get(ws)[ResetField], sum)
				}
			}
			if st.peerSets > 0 {
				if err := mergeScript.Run(ctx, peer, []string{key(counter, start)}, "eu", st.peerSets, 10_000).Err(); err != nil {
					t.Fatal(err)
				}
				Merge(get(start), map[string]int64{"eu": st.peerSets})
			}
			s.mu.Lock()
			s.stale = st.stale
			s.mu.Unlock()
			// A stale peer counts as at least Share(limit, regions).
			share := Share(limit, s.n)
			if st.stale == nil {
				share = 0
			}
			total := Total(Window{Curr: get(start), Prev: get(start - w)}, start, st.at, w, sliding, st.stale, share)
			want := Fits(total, 1, limit)
			d, err := s.Decide(ctx, st.at, c)
			if err != nil {
				t.Fatal(err)
			}
			if want {
				get(start)["us"]++
				total++
			}
			if d.Allowed != want || d.Total != total || d.Own != get(start)["us"] {
				t.Fatalf("sliding=%v step %d at %d: script %+v, Go allowed=%v total=%d own=%d", sliding, i, st.at, d, want, total, get(start)["us"])
			}
		}
	}
}

// TestMergeScriptMatchesMerge applies one table of pushes, with repeats
// and out of order, through merge.lua and through Merge, and requires the
// same counts.
func TestMergeScriptMatchesMerge(t *testing.T) {
	srv := redistest.Standalone(t)
	ctx := context.Background()
	c := srv.Client(t, nil)
	k := key(srv.Prefix(t)+"m", 0)
	pushes := []struct {
		region string
		n      int64
	}{{"us", 3}, {"eu", 5}, {"us", 7}, {"us", 4}, {"ap", 1}, {"eu", 5}, {"eu", 2}, {"ap", 9}, {"us", 7}}
	model := map[string]int64{}
	for i, p := range pushes {
		got, err := mergeScript.Run(ctx, c, []string{k}, p.region, p.n, 10_000).Int64()
		if err != nil {
			t.Fatal(err)
		}
		Merge(model, map[string]int64{p.region: p.n})
		if got != model[p.region] {
			t.Fatalf("push %d (%s=%d): script %d, Merge %d", i, p.region, p.n, got, model[p.region])
		}
	}
	h, err := c.HGetAll(ctx, k).Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(h) != len(model) || h["us"] != "7" || h["eu"] != "5" || h["ap"] != "9" {
		t.Errorf("hash %v, Merge %v", h, model)
	}
}
