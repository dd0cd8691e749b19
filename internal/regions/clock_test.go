package regions

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/redistest"
)

// TestOneClock has two app servers of one region whose clocks are skewed
// by more than a window (one 90 s ahead, one 90 s behind, window 60 s)
// decide on the clock of the region's Redis: they share one count, and
// the syncer of the one ahead still pushes the window to the peer.
func TestOneClock(t *testing.T) {
	srv := redistest.Standalone(t)
	peerSrv := redistest.Standalone(t)
	ctx := context.Background()
	local, peer := srv.Client(t, nil), peerSrv.Client(t, nil)
	skewed := func(d time.Duration) *Store {
		s, err := New(Config{
			Region: "us", Local: local, Peers: map[string]redis.UniversalClient{"eu": peer},
			Clock: func() int64 { return time.Now().Add(d).UnixMilli() },
		}, time.Now().Add(d).UnixMilli())
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	ahead, behind := skewed(90*time.Second), skewed(-90*time.Second)
	const w, limit = 60_000, 3
	// A window edge may fall between the decisions: then run again.
	for attempt := 0; ; attempt++ {
		c := Charge{Counter: fmt.Sprintf("%sc%d", srv.Prefix(t), attempt), Limit: limit, Window: w, Cost: 1}
		var ok int
		starts := map[int64]bool{}
		for i, s := range []*Store{ahead, behind, ahead, behind} {
			d, err := s.Decide(ctx, -1, c)
			if err != nil {
				t.Fatal(err)
			}
			starts[d.Start] = true
			if d.Allowed {
				ok++
			}
			if i == 3 && d.Allowed {
				t.Errorf("the 4th request of a limit of 3 was admitted: %+v", d)
			}
		}
		if len(starts) > 1 && attempt == 0 {
			continue
		}
		if len(starts) != 1 || ok != limit {
			t.Fatalf("%d admitted in windows %v; want %d in one window (one clock)", ok, starts, limit)
		}
		var start int64
		for s := range starts {
			start = s
		}
		// The app server ahead pushes the window when it is due on its
		// own clock, before the window ends there.
		at := min(ahead.cfg.Clock()+DefaultSyncInterval.Milliseconds(), start+w+90_000-1)
		if err := ahead.Sync(ctx, at); err != nil {
			t.Fatal(err)
		}
		got, err := peer.HGet(ctx, key(c.Counter, start), "us").Int64()
		if err != nil || got < 2 {
			t.Errorf("the peer holds %d, %v of the window; want at least the 2 admitted by the app server ahead", got, err)
		}
		return
	}
}
