// Package testclock is a fake clock for tests: frozen at an instant that
// tests move by hand, safe for concurrent use.
package testclock

import (
	"sync/atomic"
	"time"
)

// Clock is a fake clock. Its Now method has the shape of time.Now, so it
// can be passed wherever a clock function is taken.
type Clock struct{ ns atomic.Int64 }

// New returns a clock frozen at t.
func New(t time.Time) *Clock {
	c := &Clock{}
	c.Set(t)
	return c
}

// Now returns the clock's instant, in UTC.
func (c *Clock) Now() time.Time { return time.Unix(0, c.ns.Load()).UTC() }

// Add moves the clock by d.
func (c *Clock) Add(d time.Duration) { c.ns.Add(int64(d)) }

// Set moves the clock to t.
func (c *Clock) Set(t time.Time) { c.ns.Store(t.UnixNano()) }
