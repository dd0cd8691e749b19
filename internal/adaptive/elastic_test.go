package adaptive

import (
	"math/rand/v2"
	"testing"
	"time"
)

func TestElasticFollowsSpare(t *testing.T) {
	t.Parallel()
	e := &Elastic{FullAt: 0.5, CoolOff: 2 * time.Second, Rise: 4 * time.Second}
	// One table of instants: spare in, factor and effective limit of a
	// limit of 10 with a ceiling of 50 out.
	for _, st := range []struct {
		at     time.Duration
		spare  float64
		factor float64
		eff    int
	}{
		{0, 1, 1, 50},                           // idle: at the ceiling
		{100 * time.Millisecond, 0.25, 0.5, 30}, // half the room: down at once
		{200 * time.Millisecond, 0, 0, 10},      // saturated: the limit
		{time.Second, 1, 0, 10},                 // spare again, but cooling off
		{2200 * time.Millisecond, 1, 0, 10},     // cool-off ends at 2.2s
		{3200 * time.Millisecond, 1, 0.25, 20},  // rising 1/4 per second
		{4200 * time.Millisecond, 0.3, 0.5, 30}, // rising, capped by what spare asks
		{4300 * time.Millisecond, 0.1, 0.2, 18}, // down at once
		{6300 * time.Millisecond, 1, 0.2, 18},   // cool-off from 4.3s
		{8300 * time.Millisecond, 1, 0.7, 38},
		{20 * time.Second, 1, 1, 50},
	} {
		f := e.Update(t0.Add(st.at), st.spare)
		if d := f - st.factor; d > 1e-9 || d < -1e-9 {
			t.Fatalf("at %v spare %.2f: factor %.3f, want %.3f", st.at, st.spare, f, st.factor)
		}
		if got := Effective(10, 50, f); got != st.eff {
			t.Fatalf("at %v: effective %d, want %d", st.at, got, st.eff)
		}
	}
}

func TestEffective(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		limit, ceiling int
		f              float64
		want           int
	}{
		{10, 50, 0, 10}, {10, 50, 1, 50}, {10, 50, 0.5, 30}, {10, 50, 2, 50},
		{10, 50, -1, 10}, {10, 10, 1, 10}, {10, 0, 1, 10}, {100, 300, 0.29, 158},
	} {
		if got := Effective(tc.limit, tc.ceiling, tc.f); got != tc.want {
			t.Errorf("Effective(%d, %d, %g) = %d, want %d", tc.limit, tc.ceiling, tc.f, got, tc.want)
		}
	}
}

func TestThresholdsOrdered(t *testing.T) {
	t.Parallel()
	for limit := 1; limit <= 40; limit++ {
		for _, hard := range []int{limit, limit + 1, 2 * limit, 100} {
			prev := 0
			for p := Sheddable; p < NumPriorities; p++ {
				th := Threshold(p, limit, hard)
				if th < prev || th < 1 {
					t.Fatalf("limit %d hard %d: threshold of %d is %d, below %d", limit, hard, p, th, prev)
				}
				prev = th
			}
			if Threshold(Critical, limit, hard) != hard || Threshold(Normal, limit, hard) != limit {
				t.Fatalf("limit %d hard %d: critical at %d, normal at %d", limit, hard, Threshold(Critical, limit, hard), Threshold(Normal, limit, hard))
			}
		}
	}
}

// TestShedderInvariant drives a Shedder with random arrivals of every
// priority against a limit that moves, and checks the invariant: no
// request of lower priority is admitted within Hold after a critical one
// was refused, and a critical one is refused only at the hard limit.
func TestShedderInvariant(t *testing.T) {
	t.Parallel()
	const hold = 500 * time.Millisecond
	s := &Shedder{Hold: hold}
	rng := rand.New(rand.NewPCG(1, 2))
	type ev struct {
		at    time.Time
		p     Priority
		admit bool
	}
	var evs []ev
	var ends []time.Time // of admitted requests
	now := t0
	critRefused := 0
	for i := range 200_000 {
		now = now.Add(time.Duration(rng.IntN(400)) * time.Microsecond)
		kept := ends[:0]
		for _, e := range ends {
			if e.After(now) {
				kept = append(kept, e)
			}
		}
		ends = kept
		limit := 8 + 4*((i/20_000)%3) // the adaptive limit moves
		hard := 24
		p := Priority(rng.IntN(int(NumPriorities)))
		ok := s.Admit(now, p, len(ends), limit, hard)
		if !ok && p == Critical {
			critRefused++
			if len(ends) < hard {
				t.Fatalf("critical refused with %d in flight, below the hard limit %d", len(ends), hard)
			}
		}
		if ok {
			ends = append(ends, now.Add(time.Duration(5+rng.IntN(40))*time.Millisecond))
		}
		evs = append(evs, ev{now, p, ok})
	}
	if critRefused == 0 {
		t.Fatal("no critical request was refused: the load does not test the invariant")
	}
	var lastCrit time.Time
	admittedLow := 0
	for _, e := range evs {
		if e.p == Critical && !e.admit {
			lastCrit = e.at
			continue
		}
		if e.p < Critical && e.admit {
			admittedLow++
			if !lastCrit.IsZero() && e.at.Sub(lastCrit) < hold {
				t.Fatalf("priority %d admitted at %v, %v after a critical refusal", e.p, e.at.Sub(t0), e.at.Sub(lastCrit))
			}
		}
	}
	if admittedLow == 0 {
		t.Fatal("no lower-priority request was admitted")
	}
}

func TestShedderOrder(t *testing.T) {
	t.Parallel()
	// limit 8, hard 16: sheddable below 4 in flight, normal below 8,
	// high below 12, critical below 16.
	for _, tc := range []struct {
		inflight int
		want     [NumPriorities]bool
	}{
		{0, [NumPriorities]bool{true, true, true, true}},
		{3, [NumPriorities]bool{true, true, true, true}},
		{4, [NumPriorities]bool{false, true, true, true}},
		{8, [NumPriorities]bool{false, false, true, true}},
		{12, [NumPriorities]bool{false, false, false, true}},
		{16, [NumPriorities]bool{false, false, false, false}},
	} {
		for p := Sheddable; p < NumPriorities; p++ {
			s := &Shedder{} // fresh: no hold from an earlier refusal
			if got := s.Admit(t0, p, tc.inflight, 8, 16); got != tc.want[p] {
				t.Errorf("%d in flight, priority %d: admitted %v, want %v", tc.inflight, p, got, tc.want[p])
			}
		}
	}
	// A refusal of high shuts normal and sheddable for Hold, not critical.
	s := &Shedder{Hold: time.Second}
	if s.Admit(t0, High, 12, 8, 16) {
		t.Fatal("high admitted at its threshold")
	}
	for p, want := range [NumPriorities]bool{false, false, true, true} {
		if got := s.Admit(t0.Add(999*time.Millisecond), Priority(p), 0, 8, 16); got != want {
			t.Errorf("priority %d within the hold: admitted %v, want %v", p, got, want)
		}
	}
	if !s.Admit(t0.Add(time.Second), Sheddable, 0, 8, 16) {
		t.Error("sheddable refused after the hold")
	}
}
