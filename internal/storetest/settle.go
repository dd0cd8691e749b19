package storetest

import (
	"context"
	mrand "math/rand/v2"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/window"
)

// Settler is a Store that settles costs after the fact, whether they fit
// or not: the memory and Redis stores, for usage limits.
type Settler interface {
	Refunder
	Settle(ctx context.Context, now time.Time, charges []window.Charge, out []window.Decision) error
}

// settleStep is a Take (settle false) or a Settle at T0+at, with what
// each charge is expected to get; the model decides alike and every field
// of every Decision is compared with it.
type settleStep struct {
	at      time.Duration
	settle  bool
	charges []window.Charge
	want    []owes
}

// owes is what a step expects of one charge: whether it is admitted (true
// for a settle), what remains and how far past its limit the counter is.
type owes struct {
	allowed   bool
	remaining int
	debt      int
}

func tk(at time.Duration, c window.Charge, allowed bool, remaining, debt int) settleStep {
	return settleStep{at: at, charges: []window.Charge{c}, want: []owes{{allowed, remaining, debt}}}
}

func st(at time.Duration, c window.Charge, remaining, debt int) settleStep {
	return settleStep{at: at, settle: true, charges: []window.Charge{c}, want: []owes{{true, remaining, debt}}}
}

// The settle scenarios: a request admitted with an estimate of 4, then
// settled 16 more (20 used of a limit of 10), and the requests after it,
// for every algorithm that usage limits take. The figures are worked out
// in the comments from the formulas of package window.
var settleScenarios = []struct {
	name  string
	steps []settleStep
}{
	{"Sliding", []settleStep{
		tk(0, ch("a", "u", perMin(10), 4), true, 6, 0),
		st(1*sec, ch("a", "u", perMin(10), 16), 0, 10),
		tk(2*sec, ch("a", "u", perMin(10), 1), false, 0, 10),
		// The next window, 45 s in: 20 * 14999/60000 = 4.9997 weighs.
		tk(105*sec, ch("a", "u", perMin(10), 1), true, 4, 0),
		// 31 now in the current window: 4.67 + 31, 26 past (rounded up).
		st(106*sec, ch("a", "u", perMin(10), 30), 0, 26),
		// The window after: 31 * 29999/60000 = 15.5, still 6 past.
		tk(150*sec, ch("a", "u", perMin(10), 1), false, 0, 6),
		// Two windows on the debt no longer weighs.
		tk(240*sec, ch("a", "u", perMin(10), 10), true, 0, 0),
	}},
	{"Fixed", []settleStep{
		tk(10*sec, ch("a", "u", fw(10), 4), true, 6, 0),
		st(11*sec, ch("a", "u", fw(10), 16), 0, 10),
		tk(59*sec, ch("a", "u", fw(10), 1), false, 0, 10),
		// The window renews whole at its boundary, debt included.
		tk(60*sec, ch("a", "u", fw(10), 10), true, 0, 0),
	}},
	{"Calendar", []settleStep{
		tk(0, ch("a", "u", cal(10, window.CalendarDay), 4), true, 6, 0),
		st(1*sec, ch("a", "u", cal(10, window.CalendarDay), 16), 0, 10),
		// T0 is 01:00 in Paris, whose next day starts 23 hours on.
		tk(22*time.Hour, ch("a", "u", cal(10, window.CalendarDay), 1), false, 0, 10),
		tk(23*time.Hour, ch("a", "u", cal(10, window.CalendarDay), 1), true, 9, 0),
	}},
	{"TokenBucket", []settleStep{
		// A token is 60000 drops, 10 refill per ms.
		tk(0, ch("a", "u", tb(10, 10), 4), true, 6, 0),
		// 240000 - 6000*10 + 16*60000 = 1140000: 19 tokens, 9 past empty.
		st(6*sec, ch("a", "u", tb(10, 10), 16), 0, 9),
		// 54 s on: 600000, the debt refilled, not yet a token.
		tk(60*sec, ch("a", "u", tb(10, 10), 1), false, 0, 0),
		tk(66*sec, ch("a", "u", tb(10, 10), 1), true, 0, 0),
		// A bucket owes at most its burst and a token: capped at 22.
		st(67*sec, ch("a", "u", tb(10, 10), 1000), 0, 12),
	}},
	{"SlidingLog", []settleStep{
		tk(0, ch("a", "u", sl(10), 4), true, 6, 0),
		st(1*sec, ch("a", "u", sl(10), 16), 0, 10),
		tk(30*sec, ch("a", "u", sl(10), 1), false, 0, 10),
		// The 4 left at 60 s; the 16 leave at 61 s.
		tk(60*sec, ch("a", "u", sl(10), 1), false, 0, 6),
		tk(61*sec, ch("a", "u", sl(10), 10), true, 0, 0),
	}},
	{"SeveralLimits", []settleStep{
		{at: 0, charges: []window.Charge{ch("a", "u", perMin(10), 4), ch("a", "u", tb(10, 10), 4)},
			want: []owes{{true, 6, 0}, {true, 6, 0}}},
		{at: 1 * sec, settle: true, charges: []window.Charge{ch("a", "u", perMin(10), 8), ch("a", "u", tb(10, 10), 8)},
			// The bucket refilled 10000 drops of 720000: 11.83 tokens.
			want: []owes{{true, 0, 2}, {true, 0, 2}}},
		{at: 2 * sec, charges: []window.Charge{ch("a", "u", perMin(10), 1), ch("a", "u", tb(10, 10), 1)},
			want: []owes{{false, 0, 2}, {false, 0, 2}}},
	}},
	{"NothingToSettle", []settleStep{
		// A settle of 0 writes nothing: the counter stays as it was.
		st(0, ch("a", "u", perMin(10), 0), 10, 0),
		tk(1*sec, ch("a", "u", perMin(10), 10), true, 0, 0),
	}},
}

// RunSettle checks that s settles costs as window.SettleAll does, and
// decides the requests after a settle as window.Take does, on the table of
// settleScenarios that the model plays too, comparing every decision.
func RunSettle(t *testing.T, newStore func(t *testing.T) Settler) {
	for _, sc := range settleScenarios {
		t.Run(sc.name, func(t *testing.T) {
			t.Parallel()
			s := newStore(t)
			u := unique(t)
			ctx := context.Background()
			m := model{}
			for i, step := range sc.steps {
				charges := make([]window.Charge, len(step.charges))
				for j, c := range step.charges {
					c.Key = u + c.Key
					charges[j] = c
				}
				out := make([]window.Decision, len(charges))
				at := T0.Add(step.at)
				var allowed, refAllowed bool
				var ref []window.Decision
				if step.settle {
					if err := s.Settle(ctx, at, charges, out); err != nil {
						t.Fatalf("step %d: Settle: %v", i, err)
					}
					allowed, refAllowed, ref = true, true, m.settle(at, charges)
				} else {
					var err error
					if allowed, err = s.Take(ctx, at, charges, out); err != nil {
						t.Fatalf("step %d: Take: %v", i, err)
					}
					refAllowed, ref = m.take(at, charges)
				}
				for j, w := range step.want {
					if out[j].Allowed != w.allowed || out[j].Remaining != w.remaining || out[j].Debt != w.debt {
						t.Fatalf("step %d (T0+%s) %s:\n got %v %s\nwant %+v", i, step.at, describeCharges(charges), allowed, fmtDecisions(out), step.want)
					}
				}
				if allowed != refAllowed || !equal(out, ref) {
					t.Fatalf("step %d (T0+%s) %s: the store and the model disagree:\n  store %v %s\n model %v %s",
						i, step.at, describeCharges(charges), allowed, fmtDecisions(out), refAllowed, fmtDecisions(ref))
				}
			}
		})
	}
	t.Run("AgainstReference", func(t *testing.T) {
		t.Parallel()
		settleAgainstReference(t, newStore(t))
	})
	t.Run("Errors", func(t *testing.T) {
		t.Parallel()
		s := newStore(t)
		u := unique(t)
		ctx := context.Background()
		out := make([]window.Decision, 1)
		for _, c := range []window.Charge{
			ch(u, "u", perMin(10), -1),
			ch(u, "u", window.Limit{Requests: 0, Window: time.Minute}, 1),
		} {
			if err := s.Settle(ctx, T0, []window.Charge{c}, out); err == nil {
				t.Errorf("Settle of %s: no error", describeCharges([]window.Charge{c}))
			}
		}
		if err := s.Settle(ctx, T0, []window.Charge{ch(u, "u", perMin(10), 1)}, nil); err == nil {
			t.Error("Settle with no room for its decisions: no error")
		}
		// Nothing was counted.
		if allowed, err := s.Take(ctx, T0, []window.Charge{ch(u, "u", perMin(10), 10)}, out); err != nil || !allowed {
			t.Errorf("after refused settles: %v %v %s", allowed, err, fmtDecisions(out))
		}
	})
}

// settle settles charges at now as window.SettleAll does, each charge
// described against the counter as it was before the request; like every
// store, it writes only the counters of charges with a cost, and a counter
// named twice gets every cost, in turn.
func (m model) settle(now time.Time, charges []window.Charge) []window.Decision {
	ms := window.Millis(now)
	states := make([]window.State, len(charges))
	for i, c := range charges {
		states[i] = m.state(idOf(c), ms)
	}
	out := make([]window.Decision, len(charges))
	window.SettleAll(states, ms, charges, out)
	for _, c := range charges {
		if c.Cost > 0 {
			k := idOf(c)
			st, at := c.Limit.Roll(m.state(k, ms), ms)
			window.Settle(&st, at, c.Limit, int64(c.Cost))
			m[k] = counter{st: st, l: c.Limit, at: at, set: true}
		}
	}
	return out
}

// settleAgainstReference replays a pseudo-random sequence of requests and
// settles, often far past the limits and up to the caps of
// window.Settle, on every algorithm a usage limit takes, against the
// model, comparing every decision: the store's debts, and what it decides
// while they last, are window's.
func settleAgainstReference(t *testing.T, s Settler) {
	u := unique(t)
	m := model{}
	keys := []string{"a", "b"}
	rng := mrand.New(mrand.NewPCG(3, 4))
	ctx := context.Background()
	now := T0
	limits := []window.Limit{
		perMin(10), perHour(1e9), {Requests: 1e12, Window: time.Hour}, fw(10), cal(10, window.CalendarDay), tb(10, 20), tb(1e9, 0), sl(10),
	}
	for step := range 400 {
		now = now.Add(time.Duration([]int{0, 1, 997, 5_000, 31_000, 59_999}[rng.IntN(6)]) * time.Millisecond)
		n := 1 + rng.IntN(2)
		charges := make([]window.Charge, 0, n)
		settle := rng.IntN(3) == 0
		for len(charges) < n {
			l := limits[rng.IntN(len(limits))]
			capa := int64(l.Capacity())
			cost := []int64{0, 1, 2, capa / 2, capa}[rng.IntN(5)]
			if settle {
				cost = []int64{1, capa, 3 * capa, 1e6, 1e15, window.MaxCount}[rng.IntN(6)]
			}
			charges = append(charges, window.Charge{Key: u + keys[rng.IntN(len(keys))], Name: "u", Limit: l, Cost: int(cost)})
		}
		got := make([]window.Decision, n)
		if settle {
			if err := s.Settle(ctx, now, charges, got); err != nil {
				t.Fatalf("step %d: Settle: %v", step, err)
			}
			if want := m.settle(now, charges); !equal(got, want) {
				t.Fatalf("step %d at T0+%s, settle %s:\n got %s\nwant %s", step, now.Sub(T0), describeCharges(charges), fmtDecisions(got), fmtDecisions(want))
			}
			continue
		}
		wantAllowed, want := m.take(now, charges)
		allowed, err := s.Take(ctx, now, charges, got)
		if err != nil {
			t.Fatalf("step %d: Take: %v", step, err)
		}
		if allowed != wantAllowed || !equal(got, want) {
			t.Fatalf("step %d at T0+%s, %s:\n got %v %s\nwant %v %s", step, now.Sub(T0), describeCharges(charges),
				allowed, fmtDecisions(got), wantAllowed, fmtDecisions(want))
		}
	}
}
