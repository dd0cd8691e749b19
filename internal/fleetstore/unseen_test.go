package fleetstore

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/fleet"
	"github.com/sluicehq/sluice/internal/redispipe"
	"github.com/sluicehq/sluice/internal/redisstore"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/internal/window"
)

// gate holds the calls of a Backend while it is shut.
type gate struct {
	Backend
	mu      sync.Mutex
	shut    chan struct{} // nil: open; else closed when the gate opens
	arrived chan struct{} // a call reached the shut gate
}

func (g *gate) close() {
	g.mu.Lock()
	g.shut = make(chan struct{})
	g.mu.Unlock()
}

func (g *gate) open() {
	g.mu.Lock()
	close(g.shut)
	g.shut = nil
	g.mu.Unlock()
}

func (g *gate) Fleet(ctx context.Context, deadline time.Time, call *fleet.Call) (fleet.Reply, error) {
	g.mu.Lock()
	shut := g.shut
	g.mu.Unlock()
	if shut != nil {
		g.arrived <- struct{}{}
		<-shut
	}
	return g.Backend.Fleet(ctx, deadline, call)
}

// TestWriteBackUnseenBound: while a push that brought a counter to
// max_unsynced is on its way, requests whose charge would reach the bound
// again wait for it before they are counted, however many come in at
// once: what a server holds that the fleet has not seen (unsynced, or on
// its way) stays below max_unsynced plus one charge, which the bounds of
// docs/fleet.md and docs/usage.md rest on. Counted first and waited for
// after, each of the 20 requests added its charge while the push was held
// (30 units unseen with max_unsynced 10, for admissions; 110 for settles
// of 5).
func TestWriteBackUnseenBound(t *testing.T) {
	t.Parallel()
	srvR := redistest.Shared(t)
	const maxUnsynced, others = 10, 20
	for _, tc := range []struct {
		name string
		cost int
		// settle: the others settle their cost, rather than ask for it.
		settle bool
	}{
		{"admissions", 1, false},
		{"settles", 5, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			rs, err := redisstore.New(srvR.Client(t, nil), redisstore.Config{Prefix: srvR.Prefix(t), Timeout: 5 * time.Second, Pipeline: redispipe.Config{StallThreshold: 2 * time.Second}})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { rs.Close() })
			g := &gate{Backend: rs, arrived: make(chan struct{}, 1)}
			fs, err := New(Config{Backend: g, Exact: rs, ID: redisstore.FleetID, Manual: true, Timeout: 5 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			fs.SetRules(map[string]Settings{"r": {Mode: fleet.WriteBack, SyncInterval: time.Second, MaxUnsynced: maxUnsynced}})
			ctx := context.Background()
			l := window.Limit{Requests: 100_000, Window: 10 * time.Second, Algorithm: window.FixedWindow}
			at := t0.Add(10 * time.Millisecond)
			charge := func(cost int, settle bool) {
				c := []window.Charge{{Key: "k", Name: "r", Limit: l, Cost: cost}}
				out := make([]window.Decision, 1)
				if settle {
					if err := fs.Settle(ctx, at, c, out); err != nil {
						t.Error(err)
					}
					return
				}
				if ok, err := fs.Take(ctx, at, c, out); err != nil || !ok {
					t.Errorf("denied far from the limit: %v", err)
				}
			}
			unseen := func() int64 {
				sh, id := fs.locate(&window.Charge{Key: "k", Name: "r", Limit: l})
				sh.mu.Lock()
				defer sh.mu.Unlock()
				e, _ := sh.lookup(id)
				if e == nil {
					t.Fatal("the counter is not in the table")
				}
				return e.up + e.uc + e.inflight
			}
			// A first request learns the fleet's count: the view is fresh
			// from then on (no decision blind).
			charge(1, false)
			fs.Sync(ctx, at, false)
			for range maxUnsynced - 1 {
				charge(1, false)
			}
			// The next request brings the counter to max_unsynced: its
			// push is held on its way.
			g.close()
			var wg sync.WaitGroup
			wg.Add(1)
			go func() { defer wg.Done(); charge(1, false) }()
			<-g.arrived
			for range others {
				wg.Add(1)
				go func() { defer wg.Done(); charge(tc.cost, tc.settle) }()
			}
			// Time for the others to come in and, counted first, add
			// their charges.
			time.Sleep(100 * time.Millisecond)
			held := unseen()
			g.open()
			done := make(chan struct{})
			go func() {
				// Later pushes go through the open gate; drain what
				// reaches it meanwhile.
				for {
					select {
					case <-g.arrived:
					case <-done:
						return
					}
				}
			}()
			wg.Wait()
			close(done)
			if most := int64(maxUnsynced - 1 + tc.cost); held > most {
				t.Errorf("%d units unseen by the fleet while a push was on its way, want at most max_unsynced − 1 + a charge = %d", held, most)
			}
			// Nothing was lost: every unit reaches the fleet's count.
			fs.Sync(ctx, at, true)
			want := int64(1 + maxUnsynced + others*tc.cost)
			rep, err := rs.Fleet(ctx, time.Now().Add(5*time.Second), &fleet.Call{ID: redisstore.FleetID(&window.Charge{Key: "k", Name: "r", Limit: l}), Limit: &l, Now: at.UnixMilli()})
			if err != nil {
				t.Fatal(err)
			}
			if got := rep.State.Curr; got != want {
				t.Errorf("the fleet counted %d, want %d", got, want)
			}
		})
	}
}
