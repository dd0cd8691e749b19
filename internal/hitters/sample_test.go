package hitters

import (
	"math"
	"math/rand/v2"
	"strconv"
	"testing"
	"time"
)

// TestDraw: an event of u units below the threshold z goes through with
// probability u/z and then counts z units and z/u requests; one of z units
// or more always goes through and counts as it is; one of no units never.
func TestDraw(t *testing.T) {
	g := newGates()
	g.g[Charged].Store(newThreshold(40))
	r := Rand{s: 1}
	for _, tc := range []struct {
		units         int64
		wantP         float64
		units2, reqs2 uint64
	}{
		{1, 1.0 / 40, 40, 40},
		{8, 8.0 / 40, 40, 5},
		{39, 39.0 / 40, 40, 1},
		{40, 1, 40, 1},
		{1000, 1, 1000, 1},
	} {
		const n = 200_000
		hits := 0
		for range n {
			s, ok := g.Draw(&r, Charged, tc.units)
			if !ok {
				continue
			}
			hits++
			if s.Units != tc.units2 || s.Requests != tc.reqs2 {
				t.Fatalf("units %d: sample %+v, want %d units, %d requests", tc.units, s, tc.units2, tc.reqs2)
			}
		}
		sd := math.Sqrt(n * tc.wantP * (1 - tc.wantP))
		if got := float64(hits); math.Abs(got-n*tc.wantP) > 5*sd+1 {
			t.Errorf("units %d: %d of %d sampled, want %.0f ± %.0f", tc.units, hits, n, n*tc.wantP, 5*sd)
		}
	}
	if _, ok := g.Draw(&r, Charged, 0); ok {
		t.Error("an event of no units was sampled")
	}
	// The other kind's gate is its own: every event through.
	if s, ok := g.Draw(&r, Denied, 1); !ok || s != (Sample{Units: 1, Requests: 1}) {
		t.Errorf("denied gate at threshold 1: %+v %v", s, ok)
	}
	if a := testing.AllocsPerRun(1000, func() { g.Draw(&r, Charged, 3) }); a != 0 {
		t.Errorf("%v allocations per draw", a)
	}
}

// TestNextThreshold: the threshold that would have sampled the target.
func TestNextThreshold(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		units   uint64
		elapsed int64
		target  int
		want    uint64
	}{
		{0, 1000, 1000, 1},
		{500, 1000, 1000, 1},            // fewer than the target: every event
		{1000, 1000, 1000, 1},           // exactly the target
		{1_000_000, 1000, 1000, 1000},   // 10^6 units a second
		{1_000_000, 500, 1000, 2000},    // the same units in half a second
		{250, 0, 1000, 250},             // no time passed: 1 ms
		{1 << 62, 1, 1, maxThreshold},   // capped
		{300_001, 1000, 100_000, 4},     // rounded up
		{30_000_000, 60_000, 1000, 500}, // a minute's count
		{math.MaxUint64, 1000, 1, maxThreshold},
	} {
		if got := nextThreshold(tc.units, tc.elapsed, tc.target); got != tc.want {
			t.Errorf("nextThreshold(%d, %d, %d) = %d, want %d", tc.units, tc.elapsed, tc.target, got, tc.want)
		}
	}
}

// TestGatesAdapt: the drainer raises a rule's threshold so that about the
// target of events a second is sampled, within a second of a rise in
// traffic (at once on a burst), and brings it back to 1 when traffic falls
// below the target.
func TestGatesAdapt(t *testing.T) {
	t.Parallel()
	const target = 200
	tr, clk := newTracker(t, Config{K: 8, Samples: target, Every: time.Hour})
	tr.SetRules(map[string]int{"api": 0})
	g := tr.Gates("api")
	sh := tr.Shard()
	r := Rand{s: 2}
	send := func(n int, every time.Duration) (sampled int) {
		for i := range n {
			if s, ok := g.Draw(&r, Charged, 1); ok {
				tr.NoteSample(sh, "api", "ip:"+strconv.Itoa(i%50), s, Charged)
				sampled++
			}
			if every > 0 {
				clk.add(every)
			}
			if i%64 == 0 || every > 0 {
				tr.Rates() // drains, as the drainer would (every second at least)
			}
		}
		tr.Rates()
		return sampled
	}
	// 20,000 events a second for 3 s (one every 50 µs, the clock moving in
	// ms: 20 events a ms).
	var sampled int
	for range 3 {
		for range 1000 {
			sampled += send(20, 0)
			clk.add(time.Millisecond)
		}
	}
	z := g.Threshold(Charged)
	if z < 50 || z > 200 {
		t.Errorf("threshold %d at 20,000 events a second, want about 100", z)
	}
	// Over the last two seconds, about the target a second was sampled.
	sampled = 0
	for range 2 {
		for range 1000 {
			sampled += send(20, 0)
			clk.add(time.Millisecond)
		}
	}
	if sampled < target || sampled > 4*target {
		t.Errorf("%d sampled in 2 s at 20,000 events a second, want about %d", sampled, 2*target)
	}
	// Traffic falls to 10 a second: once a full second of it is counted,
	// every event counts again.
	send(30, 100*time.Millisecond)
	if z := g.Threshold(Charged); z != 1 {
		t.Errorf("threshold %d at 10 events a second, want 1", z)
	}
	// A burst while every event counts: a quarter second's samples raise
	// the threshold at the next drain.
	send(target, 0)
	if z := g.Threshold(Charged); z < 100 {
		t.Errorf("threshold %d after a burst of %d events in no time", z, target)
	}
	if z := g.Threshold(Denied); z != 1 {
		t.Errorf("the denied gate moved with the charged one: %d", z)
	}
	v, _ := tr.Top("api", Charged, Minute)
	if v.Threshold < 100 || v.Samples == 0 {
		t.Errorf("the minute's view says threshold %d, %d samples", v.Threshold, v.Samples)
	}
}

// TestBoundsCover: threshold-sampled counts of one client, over many
// trials, fall outside the interval Bounds gives no more often than its
// confidence allows, on each side.
func TestBoundsCover(t *testing.T) {
	t.Parallel()
	if lo, hi := Bounds(7, 9, 1, 0.01); lo != 7 || hi != 9 {
		t.Errorf("Bounds at threshold 1: [%d, %d], want [7, 9]", lo, hi)
	}
	g := newGates()
	r := Rand{s: 3}
	for _, tc := range []struct {
		z, events, units int
		delta            float64
	}{
		{10, 100, 1, 0.2},
		{100, 2000, 1, 0.1},
		{100, 300, 7, 0.1},
		{1000, 5000, 3, 0.02},
	} {
		g.g[Charged].Store(newThreshold(uint64(tc.z)))
		truth := uint64(tc.events * tc.units)
		const trials = 4000
		below, above := 0, 0
		for range trials {
			var x uint64
			for range tc.events {
				if s, ok := g.Draw(&r, Charged, int64(tc.units)); ok {
					x += s.Units
				}
			}
			lo, hi := Bounds(x, x, uint64(tc.z), tc.delta)
			if truth < lo {
				below++
			}
			if truth > hi {
				above++
			}
		}
		// Each side fails with probability at most delta/2: allow 4 standard
		// deviations of a binomial at that rate.
		limit := trials*tc.delta/2 + 4*math.Sqrt(trials*tc.delta/2)
		if float64(below) > limit || float64(above) > limit {
			t.Errorf("z %d, %d events of %d: truth below the interval %d, above %d times in %d (limit %.0f each)",
				tc.z, tc.events, tc.units, below, above, trials, limit)
		}
	}
}

// stream is a test stream of events: a key and its units.
type stream struct {
	name   string
	keys   []string
	units  []int64
	heavy  []string // keys that must be listed
	sample uint64   // a fixed threshold; 0 lets the tracker adapt it
}

// TestSampledListing: streams run through the gates and the tracker, at a
// fixed or adapted threshold, against exact counts: the sampled total is
// within its bound of the true one, every client with a share of at least
// 3/K of the units is listed (the probability of missing one, from
// TopConfig's bound, is below 10^-6 at these sizes), and Bounds at 99 %
// holds each listed client's true units.
func TestSampledListing(t *testing.T) {
	t.Parallel()
	const k = 20
	rng := rand.New(rand.NewPCG(11, 11))
	var streams []stream
	{ // skewed: Zipf over 5,000 clients, 200,000 events of one unit
		z := rand.NewZipf(rng, 1.2, 1, 4999)
		s := stream{name: "skewed", sample: 50}
		for range 200_000 {
			s.keys = append(s.keys, "ip:"+strconv.FormatUint(z.Uint64(), 10))
			s.units = append(s.units, 1)
		}
		streams = append(streams, s)
	}
	{ // uniform with three heavy clients of 5 % each, adapted threshold
		s := stream{name: "uniform", heavy: []string{"h1", "h2", "h3"}}
		for i := range 200_000 {
			key := "ip:" + strconv.Itoa(rng.IntN(10_000))
			if i%20 < 3 {
				key = s.heavy[i%20]
			}
			s.keys = append(s.keys, key)
			s.units = append(s.units, 1)
		}
		streams = append(streams, s)
	}
	{ // adversarial: a flood of clients never seen twice, the heavy one
		// hiding in it with 6 % of the events, in bursts of 100
		s := stream{name: "flood", heavy: []string{"heavy"}, sample: 100}
		for i := range 300_000 {
			key := "flood:" + strconv.Itoa(i)
			if i%1700 < 100 {
				key = "heavy"
			}
			s.keys = append(s.keys, key)
			s.units = append(s.units, 1)
		}
		streams = append(streams, s)
	}
	{ // adversarial: costs from 1 to 1,000 units, the heavy client's
		// always small (1 unit) so that few of its events are sampled
		s := stream{name: "costs", heavy: []string{"small"}, sample: 400}
		for i := range 100_000 {
			if i%4 == 0 {
				s.keys = append(s.keys, "small")
				s.units = append(s.units, 1)
				continue
			}
			s.keys = append(s.keys, "big:"+strconv.Itoa(rng.IntN(50_000)))
			s.units = append(s.units, 1+rng.Int64N(3))
		}
		for i := range 60 { // a few clients of very costly events
			s.keys = append(s.keys, "whale:"+strconv.Itoa(i))
			s.units = append(s.units, 1000)
		}
		streams = append(streams, s)
	}
	for _, st := range streams {
		t.Run(st.name, func(t *testing.T) {
			t.Parallel()
			samples := -1
			if st.sample == 0 {
				samples = 500
			}
			tr, clk := newTracker(t, Config{K: k, Samples: samples, Every: time.Hour})
			tr.SetRules(map[string]int{"api": 0})
			g := tr.Gates("api")
			if st.sample > 0 {
				g.g[Charged].Store(newThreshold(st.sample))
			}
			exact := map[string]uint64{}
			var n uint64
			r := Rand{s: 4}
			sh := tr.Shard()
			for i, key := range st.keys {
				u := st.units[i]
				exact[key] += uint64(u)
				n += uint64(u)
				if s, ok := g.Draw(&r, Charged, u); ok {
					tr.NoteSample(sh, "api", key, s, Charged)
				}
				if i%128 == 0 {
					clk.add(time.Millisecond) // ~128,000 events a second, within the minute
					tr.Rates()
				}
			}
			v, _ := tr.Top("api", Charged, Minute)
			z := v.Threshold
			if v.Dropped != 0 {
				t.Fatalf("dropped %d", v.Dropped)
			}
			if st.sample > 0 && z != st.sample || st.sample == 0 && z < 10 {
				t.Fatalf("threshold %d (fixed %d)", z, st.sample)
			}
			if lo, hi := Bounds(v.N, v.N, z, 1e-6); n < lo || n > hi {
				t.Errorf("total %d, sampled %d, interval [%d, %d]", n, v.N, lo, hi)
			}
			listed := map[string]bool{}
			for _, e := range v.Entries {
				listed[e.Key] = true
				lo, hi := Bounds(e.Lo, e.Hi, z, 0.01)
				if f := exact[e.Key]; f < lo || f > hi {
					t.Errorf("%s: true %d outside [%d, %d] (count %d, lo %d, z %d)", e.Key, f, lo, hi, e.Hi, e.Lo, z)
				}
			}
			for key, f := range exact {
				eps := float64(f) / float64(n)
				if eps < 3.0/k {
					continue
				}
				miss := math.Exp(-eps*float64(n)/(8*float64(z))) + math.Exp(-3*float64(n)/(28*float64(z)))
				if miss > 1e-6 {
					t.Fatalf("%s: the stream is too short for the test (miss bound %g)", key, miss)
				}
				if !listed[key] {
					t.Errorf("%s: share %.3f ≥ 3/K, not listed", key, eps)
				}
			}
			for _, key := range st.heavy {
				if !listed[key] {
					t.Errorf("heavy client %s not listed", key)
				}
			}
		})
	}
}
