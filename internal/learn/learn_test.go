package learn

import (
	"math"
	"testing"
	"time"
)

const t0 = int64(1_900_000_000_000) // an instant in Unix ms

// TestFraction: the fraction at instants after a cut from the whole
// budget (level 0.7, target 0.98): the level at the cut, concave up to
// the target at K, slow past it, never above 1; 1 before any cut.
func TestFraction(t *testing.T) {
	t.Parallel()
	tau := time.Second
	s := State{Level: 700_000, Target: 980_000, At: t0, Cuts: 1}
	k := math.Cbrt(0.28 / Fast) // 1.67 τ
	for _, tc := range []struct {
		name string
		s    State
		at   float64 // τ after the cut
		want float64
	}{
		{"never cut", State{}, 5, 1},
		{"at the cut", s, 0, 0.7},
		{"before the cut (a clock behind)", s, -1, 0.7},
		{"half way to K", s, k / 2, 0.98 - Fast*math.Pow(k/2, 3)},
		{"at K", s, k, 0.98},
		{"20 τ past K: 2% more", s, k + 20, 0.98 + 0.02},
		{"long after: at most 1", s, 1000, 1},
		{"a level at the floor", State{Level: 10_000, Target: 10_000, At: t0}, 0, Floor},
		{"a level above its target", State{Level: 900_000, Target: 800_000, At: t0}, 0, 0.8},
	} {
		got := tc.s.Fraction(t0+int64(tc.at*1000), tau)
		if math.Abs(got-tc.want) > 1e-3 {
			t.Errorf("%s: f = %.4f, want %.4f", tc.name, got, tc.want)
		}
	}
	if got := s.Recovered(tau); got < 1660*time.Millisecond || got > 1680*time.Millisecond {
		t.Errorf("Recovered = %s, want K = ∛(0.28/%v) τ ≈ 1.67 s", got, Fast)
	}
	// Fraction rises with time, from the level to 1.
	prev := 0.0
	for ms := int64(0); ms < 60_000; ms += 50 {
		f := s.Fraction(t0+ms, tau)
		if f < prev {
			t.Fatalf("f fell from %.4f to %.4f at %d ms", prev, f, ms)
		}
		prev = f
	}
}

// TestCut: a cut takes the level to Beta × what the upstream accepts,
// and the target 2% below it; the share refused lowers both.
func TestCut(t *testing.T) {
	t.Parallel()
	tau := time.Second
	for _, tc := range []struct {
		name          string
		s             State
		at            int64
		refused       float64
		level, target int64
	}{
		{"the whole budget, a stray refusal", State{}, t0, 0, 700_000, 980_000},
		{"half refused: the upstream takes half", State{}, t0, 0.5, 350_000, 490_000},
		{"a share past 0.99 counts as 0.99", State{}, t0, 5, Floor * PPM, Floor * PPM},
		{"a negative share counts as none", State{}, t0, -1, 700_000, 980_000},
		{"recovered past K", State{Level: 700_000, Target: 980_000, At: t0}, t0 + 1700, 0, 686_000, 960_400},
		{"at the level, just cut", State{Level: 700_000, Target: 980_000, At: t0}, t0, 0, 490_000, 686_000},
	} {
		p := tc.s.Cut(tc.at, tau, tc.refused, tc.at, false)
		if p.Level != tc.level || p.Target != tc.target || p.BaseAt != tc.s.At || p.Guard != 1000 {
			t.Errorf("%s: proposal %+v, want level %d, target %d, base %d, guard 1000", tc.name, p, tc.level, tc.target, tc.s.At)
		}
	}
}

// TestCommit is the table that redisstore's TestLearnScript runs on
// learn.lua too: a cut applies to the state it was computed from, once,
// and not to a request admitted within the guard of the last cut.
func TestCommit(t *testing.T) {
	t.Parallel()
	for _, tc := range CommitCases() {
		got, ok := Commit(tc.Stored, tc.P, tc.Now)
		if got != tc.Want || ok != tc.Applied {
			t.Errorf("%s: %+v, %v; want %+v, %v", tc.Name, got, ok, tc.Want, tc.Applied)
		}
	}
}

// TestBound: an announced quota scaled to the limit's window, less the
// margin.
func TestBound(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		q       int64
		w, span time.Duration
		margin  int64
		want    int64
	}{
		{100, time.Second, time.Second, 2, 98},
		{100, 0, time.Second, 2, 98},                // no window: per the limit's
		{10, time.Second, time.Minute, 0, 600},      // the upstream's windows fit in ours
		{5000, time.Hour, time.Second, 0, 5000},     // ours fits in the upstream's
		{3, 2 * time.Second, 3 * time.Second, 0, 4}, // 4.5, floored
		{1, time.Second, time.Second, 5, 1},         // at least 1
		{100, time.Second, time.Second, -3, 100},    // a negative margin counts as 0
		{1 << 50, time.Millisecond, time.Hour, 0, 1 << 62},
	} {
		if got := Bound(tc.q, tc.w, tc.span, tc.margin); got != tc.want {
			t.Errorf("Bound(%d, %s, %s, %d) = %d, want %d", tc.q, tc.w, tc.span, tc.margin, got, tc.want)
		}
	}
}

// TestMargin: a unit, plus what the spread moves across a window's edge;
// at most a quarter of the quota.
func TestMargin(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		q         int64
		w, spread time.Duration
		want      int64
	}{
		{100, time.Second, 0, 1},
		{100, time.Second, 5 * time.Millisecond, 2},
		{100, time.Second, 20 * time.Millisecond, 3},
		{100, time.Second, time.Second, 25}, // capped at a quarter
		{50, time.Second, 30 * time.Millisecond, 3},
		{5000, time.Hour, time.Second, 2},
		{100, time.Second, 4 * time.Millisecond, 1},
		{3, time.Second, 0, 1},
		{0, time.Second, time.Second, 0},
		{100, 0, time.Second, 1}, // no window: the unit alone
	} {
		if got := Margin(tc.q, tc.w, tc.spread); got != tc.want {
			t.Errorf("Margin(%d, %s, %s) = %d, want %d", tc.q, tc.w, tc.spread, got, tc.want)
		}
	}
}

// TestSpread: the 90th percentile of the last 128 durations less the
// least; nothing from fewer than 8.
func TestSpread(t *testing.T) {
	t.Parallel()
	var s Spread
	for i := range 7 {
		s.Add(time.Duration(i) * time.Millisecond)
	}
	if v := s.Value(); v != 0 {
		t.Errorf("7 samples: %s, want 0", v)
	}
	s = Spread{}
	for i := range 200 {
		s.Add(time.Duration(1+i%10) * time.Millisecond) // 1 to 10 ms
	}
	if v := s.Value(); v != 8*time.Millisecond && v != 9*time.Millisecond {
		t.Errorf("1 to 10 ms: %s, want the 90th percentile, 9 or 10 ms, less 1", v)
	}
	// A few late answers in 128 are left out; more are not.
	s = Spread{}
	for range 127 {
		s.Add(2 * time.Millisecond)
	}
	s.Add(time.Second)
	if v := s.Value(); v != 0 {
		t.Errorf("one late answer: %s, want 0", v)
	}
	for range 12 {
		s.Add(time.Second)
	}
	if v := s.Value(); v != time.Second-2*time.Millisecond {
		t.Errorf("13 late answers of 128: %s, want 998ms", v)
	}
	// 128 later answers push them out.
	for range 128 {
		s.Add(3 * time.Millisecond)
	}
	if v := s.Value(); v != 0 {
		t.Errorf("after 128 more: %s, want 0", v)
	}
	s.Add(-time.Second) // a clock that went back counts as 0
	if v := s.Value(); v != 3*time.Millisecond {
		t.Errorf("with a negative duration: %s, want 3ms", v)
	}
}

// TestWindows: the window of fixed windows and of a sliding log, from
// their resets.
func TestWindows(t *testing.T) {
	t.Parallel()
	base := time.Unix(t0/1000, 0)
	// Fixed windows of a second, first seen in the middle of one, answers
	// every 10 ms: the longest reset grows to almost a second, the jump at
	// each window's start is a second.
	var fixed Windows
	for ms := 500; ms < 3000; ms += 10 {
		now := base.Add(time.Duration(ms) * time.Millisecond)
		fixed.Observe(now, now.Truncate(time.Second).Add(time.Second).Sub(now))
	}
	if w := fixed.Window(); w != time.Second {
		t.Errorf("fixed windows of 1s: %s", w)
	}
	// A sliding log of a minute, full: each reset is when its oldest
	// request leaves, a moment away; its first answer said a minute.
	var log Windows
	log.Observe(base, time.Minute)
	for ms := 100; ms < 5000; ms += 100 {
		log.Observe(base.Add(time.Duration(ms)*time.Millisecond), 30*time.Millisecond)
	}
	if w := log.Window(); w != time.Minute {
		t.Errorf("a log of a minute: %s", w)
	}
	// A pause of the traffic moves the instant of the reset by the pause:
	// not a window.
	var paused Windows
	paused.Observe(base, 200*time.Millisecond)
	paused.Observe(base.Add(10*time.Second), 200*time.Millisecond)
	if w := paused.Window(); w != time.Second {
		t.Errorf("after a pause: %s, want 1s (200ms, rounded up)", w)
	}
	var none Windows
	none.Observe(base, 0)
	if w := none.Window(); w != 0 {
		t.Errorf("no reset: %s", w)
	}
}

// TestLimit: the ceiling at the fraction, floored, at least 1.
func TestLimit(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		ceiling int64
		f       float64
		want    int64
	}{{98, 1, 98}, {98, 0.7, 68}, {100, 0.001, 1}, {1, 0.5, 1}} {
		if got := Limit(tc.ceiling, tc.f); got != tc.want {
			t.Errorf("Limit(%d, %v) = %d, want %d", tc.ceiling, tc.f, got, tc.want)
		}
	}
}

// TestConverge runs the learning against an upstream that admits a
// fraction r of the ceiling per τ, the fleet sending at its learned limit
// with a fake clock, one step a 20th of τ; it checks the convergence the
// package documentation states: below r after the first counted
// refusal, back at 0.98 r within K ≤ 1.7 τ, and the next episode no
// sooner than the probing time ∛(0.02 r / Slow) τ after that.
func TestConverge(t *testing.T) {
	t.Parallel()
	tau := time.Second
	for _, r := range []float64{0.5, 0.9, 0.25} {
		const ceiling = 1000
		var s State
		step := tau.Milliseconds() / 20
		var cuts []int64
		var first State
		sentAbove := 0.0
		for now := t0; now < t0+120*tau.Milliseconds(); now += step {
			f := s.Fraction(now, tau)
			sent := float64(Limit(ceiling, f)) / 20
			if f <= r {
				continue
			}
			// The upstream refuses what is above r: a refusal of a
			// request admitted now, with the share refused this step.
			sentAbove += sent - r*ceiling/20
			p := s.Cut(now, tau, 1-r/f, now, false)
			if next, ok := Commit(s, p, now); ok {
				s = next
				if len(cuts) == 0 {
					first = next
				}
				cuts = append(cuts, now)
			}
		}
		if len(cuts) == 0 {
			t.Fatalf("r = %v: never cut", r)
		}
		if f := first.Fraction(cuts[0], tau); f > r {
			t.Errorf("r = %v: after the first cut f = %.3f, above r", r, f)
		}
		if got := first.Recovered(tau); got > 1700*time.Millisecond {
			t.Errorf("r = %v: back at the target after %s, want at most 1.7 τ", r, got)
		}
		k := math.Cbrt((1 - Back - Beta) * r / Fast)
		if k > 1.7 {
			t.Errorf("r = %v: K = %.2f τ, want at most 1.7", r, k)
		}
		probe := math.Cbrt(Back * r / Slow)
		for i := 1; i < len(cuts); i++ {
			if gap := float64(cuts[i]-cuts[i-1]) / float64(tau.Milliseconds()); gap < probe {
				t.Errorf("r = %v: cuts %.1f τ apart, want at least the probing time %.1f τ", r, gap, probe)
			}
		}
		if most := 120 / (k + probe); float64(len(cuts)) > most+1 {
			t.Errorf("r = %v: %d cuts in 120 τ, want at most %.0f", r, len(cuts), most+1)
		}
		t.Logf("r = %v: %d cuts in 120 τ (K = %.2f τ, probing %.1f τ), %.0f units sent above r", r, len(cuts), k, probe, sentAbove)
	}
}
