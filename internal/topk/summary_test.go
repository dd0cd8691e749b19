package topk

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"testing"
)

// event is one weighted occurrence of a key in a test stream.
type event struct {
	key   string
	units uint64
}

// stream makes a test stream of n events over keys distinct keys.
type stream func(r *rand.Rand, n, keys int) []event

var streams = []struct {
	name string
	gen  stream
}{
	// Zipf-distributed keys (s = 1.2): a few clients do most of it.
	{"skewed", func(r *rand.Rand, n, keys int) []event {
		z := rand.NewZipf(r, 1.2, 1, uint64(keys-1))
		out := make([]event, n)
		for i := range out {
			out[i] = event{key: "ip:" + strconv.FormatUint(z.Uint64(), 10), units: 1 + uint64(r.IntN(3))}
		}
		return out
	}},
	// Every key equally likely: no heavy hitter, the worst case for the
	// error.
	{"uniform", func(r *rand.Rand, n, keys int) []event {
		out := make([]event, n)
		for i := range out {
			out[i] = event{key: "ip:" + strconv.Itoa(r.IntN(keys)), units: 1}
		}
		return out
	}},
	// Distinct keys first, to fill every counter with noise, then three
	// heavy clients among fresh noise: the heavy ones must displace it.
	{"late-heavy", func(r *rand.Rand, n, keys int) []event {
		out := make([]event, 0, n)
		for i := 0; i < n/2; i++ {
			out = append(out, event{key: "noise:" + strconv.Itoa(i), units: 1})
		}
		for len(out) < n {
			switch r.IntN(4) {
			case 0:
				out = append(out, event{key: "user:heavy" + strconv.Itoa(r.IntN(3)), units: 5})
			default:
				out = append(out, event{key: "noise:" + strconv.Itoa(r.IntN(keys)), units: 1})
			}
		}
		return out
	}},
}

// exactCounts counts a stream exactly.
func exactCounts(evs []event) (map[string]uint64, uint64) {
	m := map[string]uint64{}
	var n uint64
	for _, e := range evs {
		m[e.key] += e.units
		n += e.units
	}
	return m, n
}

// checkView checks v against the exact counts of the stream it summarises:
// every listed key's true units within [Lo, Hi] and [G, G+Bound], Hi−Lo at
// most Bound, Bound at most N/k, every key over Bound listed.
func checkView(t *testing.T, v View, exact map[string]uint64, n uint64, k int) {
	t.Helper()
	if v.N != n {
		t.Errorf("N = %d, want %d", v.N, n)
	}
	if v.Bound*uint64(k) > n {
		t.Errorf("Bound %d > N/k = %d/%d", v.Bound, n, k)
	}
	if len(v.Entries) > k-1 {
		t.Errorf("%d entries, more than k-1 = %d", len(v.Entries), k-1)
	}
	listed := map[string]bool{}
	for i, e := range v.Entries {
		if listed[e.Key] {
			t.Errorf("%s listed twice", e.Key)
		}
		listed[e.Key] = true
		f := exact[e.Key]
		if f < e.Lo || f > e.Hi {
			t.Errorf("%s: true %d outside [Lo %d, Hi %d]", e.Key, f, e.Lo, e.Hi)
		}
		if f < e.G || f > e.G+v.Bound {
			t.Errorf("%s: true %d outside [G %d, G+Bound %d]", e.Key, f, e.G, e.G+v.Bound)
		}
		if e.Hi-e.Lo > v.Bound {
			t.Errorf("%s: error %d > Bound %d", e.Key, e.Hi-e.Lo, v.Bound)
		}
		if i > 0 && v.Entries[i-1].Hi < e.Hi {
			t.Errorf("entries not ordered by Hi at %d", i)
		}
	}
	for key, f := range exact {
		if f > v.Bound && !listed[key] {
			t.Errorf("%s: true %d > Bound %d, not listed", key, f, v.Bound)
		}
	}
}

// trueTop returns the n keys with the most units.
func trueTop(exact map[string]uint64, n int) []string {
	keys := make([]string, 0, len(exact))
	for k := range exact {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b string) int {
		if exact[a] != exact[b] {
			if exact[a] > exact[b] {
				return -1
			}
			return 1
		}
		return 0
	})
	return keys[:min(n, len(keys))]
}

// TestSummaryBounds: one Space-Saving summary on skewed, uniform and
// adversarial streams, against exact counts.
func TestSummaryBounds(t *testing.T) {
	t.Parallel()
	for _, st := range streams {
		for _, k := range []int{10, 100} {
			t.Run(fmt.Sprintf("%s/k=%d", st.name, k), func(t *testing.T) {
				t.Parallel()
				r := rand.New(rand.NewPCG(1, uint64(k)))
				evs := st.gen(r, 50_000, 5_000)
				exact, n := exactCounts(evs)
				s := NewSummary(k)
				for i, e := range evs {
					s.Add([]byte(e.key), e.units, int64(i))
				}
				if s.Len() > k {
					t.Fatalf("%d counters, more than k = %d", s.Len(), k)
				}
				v := s.View()
				checkView(t, v, exact, n, k)
				if st.name != "uniform" && k == 100 {
					// The heaviest clients stand out: the bound is small
					// enough to be of use.
					for _, key := range trueTop(exact, 3) {
						if exact[key] <= v.Bound {
							t.Errorf("top key %s: true %d within the bound %d", key, exact[key], v.Bound)
						}
					}
				}
			})
		}
	}
}

// TestSummaryExactWhenRoomy: with fewer keys than counters, counts are
// exact and the bound is 0.
func TestSummaryExactWhenRoomy(t *testing.T) {
	t.Parallel()
	s := NewSummary(10)
	for i := range 100 {
		s.Add([]byte("k"+strconv.Itoa(i%5)), uint64(i%5+1), int64(i))
	}
	v := s.View()
	if v.Bound != 0 || len(v.Entries) != 5 {
		t.Fatalf("Bound %d, %d entries; want 0 and 5", v.Bound, len(v.Entries))
	}
	for _, e := range v.Entries {
		i, _ := strconv.Atoi(e.Key[1:])
		if want := uint64(20 * (i + 1)); e.Hi != want || e.Lo != want || e.First != int64(i) {
			t.Errorf("%s: Hi %d Lo %d First %d, want %d, %d, %d", e.Key, e.Hi, e.Lo, e.First, want, want, i)
		}
	}
	if v.Entries[0].Key != "k4" {
		t.Errorf("first %s, want k4", v.Entries[0].Key)
	}
}

// TestSummaryReusesKeyBuffer: Add copies a key it keeps, so a caller may
// reuse its buffer.
func TestSummaryReusesKeyBuffer(t *testing.T) {
	t.Parallel()
	s := NewSummary(4)
	buf := []byte("alice")
	s.Add(buf, 3, 0)
	copy(buf, "bobby")
	s.Add(buf, 1, 0)
	v := s.View()
	if len(v.Entries) != 2 || v.Entries[0].Key != "alice" || v.Entries[1].Key != "bobby" {
		t.Fatalf("entries %+v", v.Entries)
	}
}

// TestViewKeysStay: a view's keys are its own: counters reused for other
// keys afterwards (their bytes rewritten in place) do not change them.
func TestViewKeysStay(t *testing.T) {
	t.Parallel()
	s := NewSummary(4)
	for _, k := range []string{"alpha", "beta", "gamma"} {
		s.Add([]byte(k), 10, 0)
	}
	v := s.View()
	s.Reset()
	for i := range 100 {
		s.Add([]byte("zz"+strconv.Itoa(i)), 1, 0)
	}
	var got []string
	for _, e := range v.Entries {
		got = append(got, e.Key)
	}
	if !slices.Equal(got, []string{"alpha", "beta", "gamma"}) {
		t.Fatalf("view keys after reuse: %q", got)
	}
}

// TestMergeBounds: a stream split between several summaries (servers, or
// periods), their views merged all at once or in a tree of pairs, keeps
// the bounds against the exact counts of the whole stream.
func TestMergeBounds(t *testing.T) {
	t.Parallel()
	for _, st := range streams {
		for _, parts := range []int{2, 7, 20} {
			t.Run(fmt.Sprintf("%s/parts=%d", st.name, parts), func(t *testing.T) {
				t.Parallel()
				const k = 50
				r := rand.New(rand.NewPCG(2, uint64(parts)))
				evs := st.gen(r, 60_000, 4_000)
				exact, n := exactCounts(evs)
				sums := make([]*Summary, parts)
				for i := range sums {
					sums[i] = NewSummary(k)
				}
				for i, e := range evs {
					// Contiguous runs (periods) for half the stream,
					// random servers for the rest.
					p := i * parts / len(evs)
					if i%2 == 1 {
						p = r.IntN(parts)
					}
					sums[p].Add([]byte(e.key), e.units, int64(i))
				}
				views := make([]View, parts)
				for i, s := range sums {
					views[i] = s.View()
				}
				checkView(t, Merge(k, views...), exact, n, k)
				// Pairwise, as a tree: merges of merges.
				for len(views) > 1 {
					var next []View
					for i := 0; i < len(views); i += 2 {
						if i+1 < len(views) {
							next = append(next, Merge(k, views[i], views[i+1]))
						} else {
							next = append(next, views[i])
						}
					}
					views = next
				}
				checkView(t, views[0], exact, n, k)
			})
		}
	}
}

// TestMergeSmallerK: views merged to a smaller k keep k−1 entries and the
// bound N/k.
func TestMergeSmallerK(t *testing.T) {
	t.Parallel()
	r := rand.New(rand.NewPCG(3, 3))
	evs := streams[0].gen(r, 20_000, 2_000)
	exact, n := exactCounts(evs)
	a, b := NewSummary(100), NewSummary(100)
	for i, e := range evs {
		[]*Summary{a, b}[i%2].Add([]byte(e.key), e.units, 0)
	}
	checkView(t, Merge(20, a.View(), b.View()), exact, n, 20)
}

// TestMergeFirstAndEmpty: the first sight is the earliest among the
// views; merging nothing gives an empty view.
func TestMergeFirstAndEmpty(t *testing.T) {
	t.Parallel()
	a, b := NewSummary(4), NewSummary(4)
	a.Add([]byte("x"), 1, 500)
	b.Add([]byte("x"), 2, 100)
	v := Merge(4, a.View(), b.View())
	if len(v.Entries) != 1 || v.Entries[0].First != 100 || v.Entries[0].Hi != 3 {
		t.Fatalf("merged %+v", v)
	}
	if e := Merge(4); e.N != 0 || len(e.Entries) != 0 || e.Bound != 0 {
		t.Fatalf("empty merge %+v", e)
	}
}

// TestSummaryMemoryBound: a flood of distinct keys never makes a summary
// hold more than k of them, nor a window more than (buckets+1)·(2k−1);
// Trim frees the buckets of a quiet stream.
func TestSummaryMemoryBound(t *testing.T) {
	t.Parallel()
	const k, buckets = 16, 6
	w := NewWindow(k, buckets, 1000, 60)
	bound := (buckets + 1) * (2*k - 1)
	var key []byte
	for i := range 600_000 {
		key = strconv.AppendInt(key[:0], int64(i), 10)
		w.Add(key, 1, int64(i))
		if i%10_000 == 0 && w.Len() > bound {
			t.Fatalf("window holds %d keys, more than %d", w.Len(), bound)
		}
	}
	if w.Len() < (buckets+1)*k {
		// Distinct keys make no heavy hitter: the coarse buckets keep few,
		// but every fine bucket is full.
		t.Errorf("window holds %d keys: the flood did not fill its fine buckets (%d)", w.Len(), (buckets+1)*k)
	}
	w.Trim(600_000 + 10*60*1000)
	if w.Len() != 0 {
		t.Errorf("after Trim of a quiet window: %d keys", w.Len())
	}
}

// TestWindowSlides: a window's short and long views count their last
// buckets only, against exact counts of the events in them.
func TestWindowSlides(t *testing.T) {
	t.Parallel()
	const span, ratio, buckets, k = 1000, 4, 3, 8
	w := NewWindow(k, buckets, span, ratio)
	r := rand.New(rand.NewPCG(4, 4))
	type timed struct {
		event
		at int64
	}
	var all []timed
	check := func(at int64, long bool) {
		t.Helper()
		// A view at 'at' covers the buckets that start after
		// at − (buckets+1)·length, rounded to a bucket.
		length := int64(span)
		if long {
			length *= ratio
		}
		from := at - at%length - buckets*length
		var in []event
		for _, x := range all {
			if x.at >= from {
				in = append(in, x.event)
			}
		}
		exact, n := exactCounts(in)
		checkView(t, w.View(at, long), exact, n, k)
	}
	for at := int64(0); at < 40*span; at += 7 {
		e := timed{event{key: "c" + strconv.Itoa(r.IntN(20)), units: 1 + uint64(r.IntN(2))}, at}
		if r.IntN(3) == 0 {
			e.key = "heavy"
		}
		all = append(all, e)
		w.Add([]byte(e.key), e.units, e.at)
		if at%(span/2) < 7 {
			check(at, false)
			check(at, true)
		}
	}
	end := int64(40 * span)
	check(end+2*span, true) // quiet for a while: complete buckets merged by the view itself
	if v := w.View(100*span, false); v.N != 0 {
		t.Errorf("a short view long after the last event: N %d", v.N)
	}
	if v := w.View(100*span*ratio, true); v.N != 0 {
		t.Errorf("a long view long after the last event: N %d", v.N)
	}
}

// TestWindowClockBack: an event stamped before the latest bucket counts
// in the latest one, in both periods.
func TestWindowClockBack(t *testing.T) {
	t.Parallel()
	w := NewWindow(4, 2, 1000, 2)
	w.Add([]byte("a"), 1, 5000)
	w.Add([]byte("a"), 1, 1000)
	if s, l := w.View(5000, false), w.View(5000, true); s.N != 2 || l.N != 2 {
		t.Fatalf("short N %d, long N %d; want 2", s.N, l.N)
	}
}

// TestEncodeRoundTrip: a view reads back as written, twice in a row.
func TestEncodeRoundTrip(t *testing.T) {
	t.Parallel()
	s := NewSummary(8)
	for i := range 100 {
		s.Add([]byte("key-"+strconv.Itoa(i%13)), uint64(i%4+1), int64(1_700_000_000_000+i))
	}
	v := s.View()
	b := AppendView(AppendView(nil, v), Merge(8))
	got, rest, err := ReadView(b)
	if err != nil {
		t.Fatal(err)
	}
	empty, rest, err := ReadView(rest)
	if err != nil || len(rest) != 0 || empty.N != 0 {
		t.Fatalf("second view: %+v, rest %d, %v", empty, len(rest), err)
	}
	if got.K != v.K || got.N != v.N || got.Bound != v.Bound || !slices.Equal(got.Entries, v.Entries) {
		t.Fatalf("read %+v\nwant %+v", got, v)
	}
	for i := range b {
		if _, _, err := ReadView(b[:i]); err == nil && i < len(AppendView(nil, v)) {
			t.Fatalf("a view cut at %d read without error", i)
		}
	}
}

// FuzzReadView: bytes from Redis never panic the reader, and what it
// accepts writes back the same.
func FuzzReadView(f *testing.F) {
	s := NewSummary(4)
	s.Add([]byte("a"), 3, 1)
	s.Add([]byte("b"), 1, 2)
	f.Add(AppendView(nil, s.View()))
	f.Add([]byte{2, 0, 0, 1, 200})
	f.Fuzz(func(t *testing.T, b []byte) {
		v, rest, err := ReadView(b)
		if err != nil {
			return
		}
		again := AppendView(nil, v)
		if w, _, err := ReadView(again); err != nil || !slices.Equal(w.Entries, v.Entries) {
			t.Fatalf("round trip of %x: %v", b[:len(b)-len(rest)], err)
		}
	})
}

// BenchmarkSummaryAdd: the cost of one update of a summary of 100
// counters (off the request path), on skewed and uniform keys.
func BenchmarkSummaryAdd(b *testing.B) {
	for _, st := range streams[:2] {
		b.Run(st.name, func(b *testing.B) {
			evs := st.gen(rand.New(rand.NewPCG(5, 5)), 1<<16, 10_000)
			keys := make([][]byte, len(evs))
			for i, e := range evs {
				keys[i] = []byte(e.key)
			}
			s := NewSummary(100)
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; b.Loop(); i++ {
				s.Add(keys[i&(1<<16-1)], 1, int64(i))
			}
		})
	}
}

// BenchmarkWindowView: merging the buckets of a minute (7 summaries of
// 100 counters), as a read of the admin API does.
func BenchmarkWindowView(b *testing.B) {
	evs := streams[0].gen(rand.New(rand.NewPCG(6, 6)), 70_000, 10_000)
	w := NewWindow(100, 6, 10_000, 60)
	for i, e := range evs {
		w.Add([]byte(e.key), e.units, int64(i))
	}
	b.ReportAllocs()
	for b.Loop() {
		w.View(69_999, false)
	}
}
