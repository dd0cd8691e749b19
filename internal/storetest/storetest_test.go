package storetest

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/window"
)

// refStore is the smallest store that follows the contract: a map of
// states decided by window.Take. Running the suite against it checks the
// hand-computed tables against window.Take.
type refStore struct {
	mu sync.Mutex
	m  map[refID]window.State
}

type refID struct {
	key, name string
	w         time.Duration
}

func (s *refStore) Take(ctx context.Context, now time.Time, charges []window.Charge, out []window.Decision) (bool, error) {
	if len(out) != len(charges) {
		return false, errors.New("ref: length mismatch")
	}
	for _, c := range charges {
		if err := c.Limit.Validate(); err != nil {
			return false, err
		}
		if c.Cost < 0 {
			return false, errors.New("ref: negative cost")
		}
	}
	if now.IsZero() {
		now = time.Now()
	}
	ms := window.Millis(now)
	s.mu.Lock()
	defer s.mu.Unlock()
	states := make([]window.State, len(charges))
	for i, c := range charges {
		states[i] = s.m[refID{c.Key, c.Name, c.Limit.Window}]
	}
	allowed := window.Take(states, ms, charges, out)
	if allowed {
		for _, c := range charges {
			if c.Cost == 0 {
				continue
			}
			id := refID{c.Key, c.Name, c.Limit.Window}
			st, _ := window.Roll(s.m[id], ms, c.Limit.Window.Milliseconds())
			st.Curr += int64(c.Cost)
			s.m[id] = st
		}
	}
	return allowed, nil
}

func TestReference(t *testing.T) {
	Run(t, func(t *testing.T) Store { return &refStore{m: map[refID]window.State{}} })
}
