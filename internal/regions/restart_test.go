package regions

import (
	"context"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/regiontest"
)

// TestRestartedEmpty restarts one region's Redis without persistence in
// the middle of a window of a global limit of 100, on explicit instants,
// and checks what docs/redis.md ("A Redis restarted empty") states:
//
//   - the restarted region, eu, loses the window's count of every region
//     (its own, and its copies of the others'): it admits the limit again
//     (100) as long as it hears nothing new, so the window admits up to
//     its count at the restart (50) over the limit;
//   - a peer's count comes back to eu with the peer's next push, which
//     leaves at its next sync interval after the peer admits again (the
//     syncer pushes a count only when it grew): from then, eu counts it
//     again;
//   - eu's own count before the restart never comes back to eu (a
//     region's field is written at a peer only by that region), while
//     the peers keep it (the largest value wins): they see eu's count as
//     the larger of its old and its new one.
func TestRestartedEmpty(t *testing.T) {
	t.Parallel()
	sim := regiontest.New(t, []string{"us", "eu"}, func(string, string) time.Duration { return 0 })
	ctx := context.Background()
	const T = 250 // the sync interval, ms
	newStore := func(r string) *Store {
		s, err := New(Config{Region: r, Local: sim.Local(t, r), Peers: sim.Peers(t, r)}, 0)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(s.Close)
		return s
	}
	us, eu := newStore("us"), newStore("eu")
	c := Charge{Counter: sim.Servers["us"].Prefix(t) + "c", Limit: 100, Window: 600_000, Cost: 1, Interval: T * time.Millisecond}
	const t0 = 1_800_000_000_000 // a window starts here
	admit := func(s *Store, at int64, n int) (admitted int, last Decision) {
		for range n {
			d, err := s.Decide(ctx, at, c)
			if err != nil {
				t.Fatal(err)
			}
			if d.Allowed {
				admitted++
			}
			last = d
		}
		return admitted, last
	}
	sync := func(s *Store, at int64) {
		t.Helper()
		if err := s.Sync(ctx, at); err != nil {
			t.Fatal(err)
		}
	}
	// A count is first pushed a sync interval after the window's first
	// admission on this app server; then every interval it grew.
	admit(us, t0, 30)
	admit(eu, t0, 20)
	sync(us, t0+T)
	sync(eu, t0+T)
	if _, d := admit(eu, t0+T+1, 1); d.Total != 51 {
		t.Fatalf("before the restart eu counts %d, want 51 (30 of us, 21 of its own)", d.Total)
	}

	if err := sim.Servers["eu"].Restart(); err != nil {
		t.Fatal(err)
	}
	// eu knows nothing of the window: 100 more, while us says nothing new
	// (its syncs carry nothing: its count did not grow).
	sync(us, t0+2*T)
	sync(eu, t0+2*T)
	got, d := admit(eu, t0+2*T+1, 120)
	if got != 100 || d.Own != 100 || d.Total != 100 {
		t.Errorf("after the restart eu admitted %d of 120 (own %d, total %d), want 100: the limit again", got, d.Own, d.Total)
	}
	over := 30 + 21 + got - 100
	t.Logf("the window admitted %d over its limit of 100, its count when eu's Redis restarted being 51", over)
	if over != 51 {
		t.Errorf("over the limit by %d, want 51, the count at the restart", over)
	}
	// us admits once more, and pushes its count (31) at its next sync.
	admit(us, t0+2*T+2, 1)
	sync(us, t0+3*T)
	if _, d := admit(eu, t0+3*T+1, 1); d.Allowed || d.Total != 131 {
		t.Errorf("after us's next push, eu counts %d (allowed %v), want 131: us's 31 back, and its own 100", d.Total, d.Allowed)
	}
	// us sees eu's count as the larger of the old (21) and new (100).
	sync(eu, t0+3*T)
	if _, d := admit(us, t0+3*T+2, 1); d.Allowed || d.Total != 131 {
		t.Errorf("us counts %d (allowed %v), want 131: its 31 and eu's 100", d.Total, d.Allowed)
	}
}
