package fleetstore

import (
	"sync"
	"sync/atomic"
	"time"
)

// storeClock follows the shared store's clock (Redis TIME), which a Store
// decides by in memory when the store keeps time: the offset between it
// and this process's clock, from the instants the store's replies say
// they were decided at.
//
// A reply was decided somewhere between the call's sending and its
// answer: the offset is taken at the midpoint, and is then wrong by half
// the round trip at most. A call's round trip can grow far beyond the
// usual (a slow or redirected call, a Cluster slot on the move, a process
// short of CPU), and a slice used with a clock that lags would be spent
// past the end of the window it was counted in, and one with a clock that
// leads, counted in the next window before it starts: so a sample whose
// round trip is more than twice the shortest kept in the last second (and
// more than 2 ms) is not used.
type storeClock struct {
	// offset is the store's clock minus this one, in ms.
	offset atomic.Int64

	mu sync.Mutex
	// trip is the round trip of the sample the offset was last taken
	// from, at.
	trip time.Duration
	at   time.Time
}

// clockFresh is how long a sample's round trip sets the bar for the
// samples that follow.
const clockFresh = time.Second

// sample takes the store's instant now (Unix ms) of a call sent at sent
// and answered at answered into account.
func (c *storeClock) sample(now int64, sent, answered time.Time) {
	trip := answered.Sub(sent)
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.at.IsZero() && answered.Sub(c.at) < clockFresh && trip > max(2*c.trip, 2*time.Millisecond) {
		return
	}
	if c.at.IsZero() || answered.Sub(c.at) >= clockFresh || trip <= c.trip {
		c.trip, c.at = trip, answered
	}
	mid := sent.Add(trip / 2)
	c.offset.Store(now - mid.UnixMilli())
}
