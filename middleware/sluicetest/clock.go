package sluicetest

import (
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/testclock"
	"github.com/sluicehq/sluice/middleware"
)

// Epoch is the instant a Clock made by NewClock with the zero time starts
// at: a fixed instant, so that what a test prints does not depend on the
// day it runs.
var Epoch = time.Date(2030, time.January, 1, 0, 0, 0, 0, time.UTC)

// Clock is a clock that only moves when a test moves it. It is safe for
// concurrent use: a handler may read it while the test advances it.
type Clock struct{ c *testclock.Clock }

// NewClock returns a clock stopped at start, or at Epoch if start is the
// zero time.
func NewClock(start time.Time) *Clock {
	if start.IsZero() {
		start = Epoch
	}
	return &Clock{c: testclock.New(start)}
}

// Now returns the clock's instant, in UTC. It has the shape of time.Now.
func (c *Clock) Now() time.Time { return c.c.Now() }

// Advance moves the clock forward by d (back if d is negative).
func (c *Clock) Advance(d time.Duration) { c.c.Add(d) }

// Set moves the clock to t.
func (c *Clock) Set(t time.Time) { c.c.Set(t) }

// Option returns middleware.WithClock(c.Now): the Limiter decides every
// request, ban, pause and override at the clock's instant, whatever its
// store. On the Redis store the counters then follow the clock too
// (expiry stays in the server's own time).
func (c *Clock) Option() middleware.Option { return middleware.WithClock(c.Now) }

// MemoryStore returns an in-memory store whose clock is c, without the
// background sweeper (expired counters are reclaimed as new keys come),
// closed when the test ends. Give it to a Limiter with
// middleware.WithStore, beside c.Option, when the test wants the store's
// own reads of time to follow the clock too.
func (c *Clock) MemoryStore(tb testing.TB) *middleware.MemoryStore {
	tb.Helper()
	s, err := middleware.NewMemoryStore(middleware.MemoryConfig{Now: c.Now, SweepInterval: -1})
	if err != nil {
		tb.Fatalf("sluicetest: NewMemoryStore: %v", err)
	}
	tb.Cleanup(func() { _ = s.Close() })
	return s
}
