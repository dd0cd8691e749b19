package storetest

import (
	"context"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/window"
)

// Refunder is a Store that can take back admitted charges: the memory and
// Redis stores, for rules that count only some responses.
type Refunder interface {
	Store
	TakeAt(ctx context.Context, now time.Time, charges []window.Charge, out []window.Decision) (bool, time.Time, error)
	Refund(ctx context.Context, at time.Time, charges []window.Charge) error
}

// refundStep is a request at T0+at with one charge; if back is set, its
// charge is then taken back at once (its response is not counted), or,
// if backAt is set too, a later step takes it back: back names the step
// whose charge to take back.
type refundStep struct {
	at   time.Duration
	c    window.Charge
	want want
	// refund, when >= 0, is the step whose charge this step takes back
	// instead of taking a charge.
	refund int
}

func take(at time.Duration, c window.Charge, w want) refundStep {
	return refundStep{at: at, c: c, want: w, refund: -1}
}

func back(at time.Duration, step int) refundStep { return refundStep{at: at, refund: step} }

var refundScenarios = []struct {
	name  string
	steps []refundStep
}{
	{"SlidingCurrent", []refundStep{
		take(0, ch("a", "r", perMin(2), 1), d(true, 1)),
		take(1*sec, ch("a", "r", perMin(2), 1), d(true, 0)),
		take(2*sec, ch("a", "r", perMin(2), 1), d(false, 0)),
		back(3*sec, 1), // the response of step 1 is not counted
		take(4*sec, ch("a", "r", perMin(2), 1), d(true, 0)),
		back(5*sec, 4),
		back(5*sec, 0),
		take(6*sec, ch("a", "r", perMin(2), 1), d(true, 1)),
	}},
	{"SlidingPrevious", []refundStep{
		// The counter's window starts at 0; step 1's charge lands in the
		// current window, and is taken back after the window rolled, from
		// the previous count.
		take(0, ch("a", "r", perMin(2), 1), d(true, 1)),
		take(50*sec, ch("a", "r", perMin(2), 1), d(true, 0)),
		take(61*sec, ch("a", "r", perMin(2), 1), d(false, 0)),
		back(62*sec, 1),
		take(63*sec, ch("a", "r", perMin(2), 1), d(true, 0)),
		// A charge two windows old no longer counts: nothing changes.
		back(130*sec, 0),
		take(131*sec, ch("a", "r", perMin(2), 1), d(true, 0)),
	}},
	{"Fixed", []refundStep{
		take(10*sec, ch("a", "r", fw(2), 2), d(true, 0)),
		take(11*sec, ch("a", "r", fw(2), 1), d(false, 0)),
		back(12*sec, 0),
		take(13*sec, ch("a", "r", fw(2), 1), d(true, 1)),
		// A charge of the last window is not taken off this one's count.
		take(70*sec, ch("a", "r", fw(2), 2), d(true, 0)),
		back(71*sec, 3),
		take(72*sec, ch("a", "r", fw(2), 1), d(false, 0)),
	}},
	{"Calendar", []refundStep{
		take(0, ch("a", "r", cal(1, window.CalendarDay), 1), d(true, 0)),
		take(1*sec, ch("a", "r", cal(1, window.CalendarDay), 1), d(false, 0)),
		back(2*sec, 0),
		take(3*sec, ch("a", "r", cal(1, window.CalendarDay), 1), d(true, 0)),
	}},
	{"TokenBucket", []refundStep{
		take(0, ch("a", "r", tb(6, 2), 2), d(true, 0)),
		take(1*sec, ch("a", "r", tb(6, 2), 1), d(false, 0)),
		back(2*sec, 0),
		take(3*sec, ch("a", "r", tb(6, 2), 1), d(true, 1)),
		// Level 1 token at 3 s; 10 s refill one: taking back step 3 after
		// the refill leaves the bucket full, not fuller.
		back(20*sec, 3),
		take(21*sec, ch("a", "r", tb(6, 2), 2), d(true, 0)),
		take(22*sec, ch("a", "r", tb(6, 2), 1), d(false, 0)),
	}},
	{"SlidingLog", []refundStep{
		take(0, ch("a", "r", sl(3), 2), d(true, 1)),
		take(1*sec, ch("a", "r", sl(3), 1), d(true, 0)),
		take(2*sec, ch("a", "r", sl(3), 1), d(false, 0)),
		// Step 1's entry goes, then 2 units off step 0's.
		back(3*sec, 1),
		take(4*sec, ch("a", "r", sl(3), 1), d(true, 0)),
		back(5*sec, 0),
		take(6*sec, ch("a", "r", sl(3), 2), d(true, 0)),
		back(7*sec, 6),
		take(8*sec, ch("a", "r", sl(3), 2), d(true, 0)),
	}},
}

// RunRefund checks that s takes back charges as window.Refund does, on a
// table of instants that the model (window.Take and window.Refund) plays
// too, comparing every decision.
func RunRefund(t *testing.T, newStore func(t *testing.T) Refunder) {
	for _, sc := range refundScenarios {
		t.Run(sc.name, func(t *testing.T) {
			t.Parallel()
			s := newStore(t)
			u := unique(t)
			ctx := context.Background()
			m := model{}
			ats := make([]time.Time, len(sc.steps))
			charges := make([][]window.Charge, len(sc.steps))
			for i, st := range sc.steps {
				if st.refund >= 0 {
					c := charges[st.refund]
					if err := s.Refund(ctx, ats[st.refund], c); err != nil {
						t.Fatalf("step %d: Refund: %v", i, err)
					}
					m.refund(ats[st.refund], c)
					continue
				}
				c := st.c
				c.Key = u + c.Key
				charges[i] = []window.Charge{c}
				out := make([]window.Decision, 1)
				allowed, at, err := s.TakeAt(ctx, T0.Add(st.at), charges[i], out)
				if err != nil {
					t.Fatalf("step %d: TakeAt: %v", i, err)
				}
				if !at.Equal(T0.Add(st.at)) {
					t.Fatalf("step %d: TakeAt decided at %s, want %s", i, at, T0.Add(st.at))
				}
				ats[i] = at
				if allowed != st.want.allowed || out[0].Remaining != st.want.remaining {
					t.Fatalf("step %d (T0+%s): got %v %s, want %v", i, st.at, allowed, fmtDecisions(out), st.want)
				}
				refAllowed, ref := m.take(at, charges[i])
				if allowed != refAllowed || !equal(out, ref) {
					t.Fatalf("step %d (T0+%s): the store and the model disagree:\n  store %v %s\n model %v %s",
						i, st.at, allowed, fmtDecisions(out), refAllowed, fmtDecisions(ref))
				}
			}
		})
	}
	t.Run("Unrefundable", func(t *testing.T) {
		t.Parallel()
		s := newStore(t)
		for _, l := range []window.Limit{perMin(2).LeakyBucket(2, 0)} {
			if err := s.Refund(context.Background(), T0, []window.Charge{ch(unique(t), "r", l, 1)}); err == nil {
				t.Errorf("Refund of a %s: no error", l.Algorithm)
			}
		}
	})
}

// refund takes back charges admitted at at, as window.Refund says.
func (m model) refund(at time.Time, charges []window.Charge) {
	ms := window.Millis(at)
	for _, c := range charges {
		k := idOf(c)
		cn, ok := m[k]
		if !ok || ms >= cn.expiresAt() {
			continue
		}
		if window.Refund(&cn.st, c.Limit, ms, int64(c.Cost)) {
			m[k] = cn
		}
	}
}
