package redisstore

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/internal/window"
)

// TestRealTime hammers one key with a limit of 100 per 1 s window for 3 s,
// from several goroutines, on the server's clock, and measures the most
// requests admitted in any 1-second interval (using the instants the script
// decided at). The sliding-window counter assumes the previous window's
// requests were spread evenly over it, so a burst at the end of one window
// followed by the full allowance of the next can admit up to twice the limit
// in one second; it can never admit less than the limit to a client that
// keeps asking.
func TestRealTime(t *testing.T) {
	if testing.Short() {
		t.Skip("runs for 3 s of real time")
	}
	t.Parallel()
	const (
		limit       = 100
		goroutines  = 8
		duration    = 3 * time.Second
		maxAttempts = 300_000 // bounds the load whatever the machine
	)
	srv := redistest.Shared(t)
	s := newTestStore(t, srv.Client(t, nil), srv.Prefix(t))
	ch := []window.Charge{{Key: "hot", Name: "r", Limit: window.Limit{Requests: limit, Window: time.Second}, Cost: 1}}

	var (
		mu       sync.Mutex
		admitted []int64
		attempts int
		wg       sync.WaitGroup
	)
	deadline := time.Now().Add(duration)
	for g := 0; g < goroutines; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out := make([]window.Decision, 1)
			for time.Now().Before(deadline) {
				mu.Lock()
				if attempts >= maxAttempts {
					mu.Unlock()
					return
				}
				attempts++
				mu.Unlock()
				ok, now, err := s.take(context.Background(), time.Time{}, ch, out)
				if err != nil {
					t.Error(err)
					return
				}
				if ok {
					mu.Lock()
					admitted = append(admitted, now)
					mu.Unlock()
				}
			}
		}()
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	slices.Sort(admitted)
	peak, at := maxInInterval(admitted, 1000)
	// Full windows seen: the first and last are partial.
	first, last := admitted[0]/1000, admitted[len(admitted)-1]/1000
	perWindow := map[int64]int{}
	for _, ms := range admitted {
		perWindow[ms/1000]++
	}
	var counts []int
	for w := first; w <= last; w++ {
		counts = append(counts, perWindow[w])
	}
	t.Logf("%d attempts, %d admitted in %s; per 1 s window: %v; most in any 1 s interval: %d, from %d ms into a window",
		attempts, len(admitted), duration, counts, peak, at%1000)
	if peak > 2*limit || peak < limit {
		t.Errorf("most admitted in a 1 s interval: %d, want between %d and %d", peak, limit, 2*limit)
	}
}

// maxInInterval returns the largest number of the sorted instants that lie
// in one half-open interval of length d, and where such an interval starts.
func maxInInterval(ts []int64, d int64) (int, int64) {
	best, at := 0, int64(0)
	j := 0
	for i := range ts {
		for j < len(ts) && ts[j] < ts[i]+d {
			j++
		}
		if j-i > best {
			best, at = j-i, ts[i]
		}
	}
	return best, at
}
