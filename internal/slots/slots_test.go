package slots

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/window"
)

func TestTable(t *testing.T) {
	t.Parallel()
	tb := New()
	ctx := context.Background()
	s := &window.Slot{Key: "ip:192.0.2.1", Name: "r", Limit: 2}
	other := &window.Slot{Key: "ip:192.0.2.1", Name: "other", Limit: 2}
	for i, want := range []bool{true, true, false} {
		ok, held, err := tb.Acquire(ctx, time.Time{}, s)
		if err != nil || ok != want || held != 2 && i > 0 || i == 0 && held != 1 {
			t.Fatalf("acquire %d: %v %d %v", i, ok, held, err)
		}
	}
	if ok, _, _ := tb.Acquire(ctx, time.Time{}, other); !ok {
		t.Fatal("another rule's slots are counted apart")
	}
	tb.Release(ctx, s)
	if tb.Held("r", "ip:192.0.2.1") != 1 {
		t.Fatal("release did not free a slot")
	}
	tb.Release(ctx, s)
	tb.Release(ctx, s) // not held: nothing happens
	tb.Release(ctx, other)
	if tb.Len() != 0 {
		t.Fatalf("%d counters left after every release; want none kept", tb.Len())
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, _, err := tb.Acquire(cctx, time.Time{}, s); err == nil {
		t.Error("acquire with a done context succeeded")
	}
}

// TestTableConcurrent: many goroutines never hold more than the limit.
func TestTableConcurrent(t *testing.T) {
	t.Parallel()
	tb := New()
	s := &window.Slot{Key: "k", Name: "r", Limit: 3}
	var mu sync.Mutex
	in, peak := 0, 0
	var wg sync.WaitGroup
	for range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 200 {
				ok, _, _ := tb.Acquire(context.Background(), time.Time{}, s)
				if !ok {
					continue
				}
				mu.Lock()
				in++
				peak = max(peak, in)
				mu.Unlock()
				mu.Lock()
				in--
				mu.Unlock()
				tb.Release(context.Background(), s)
			}
		}()
	}
	wg.Wait()
	if peak > 3 || tb.Len() != 0 {
		t.Errorf("peak %d, %d left; want at most 3 and none", peak, tb.Len())
	}
}
