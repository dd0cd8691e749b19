package memstore

import (
	"context"
	"fmt"

	"github.com/sluicehq/sluice/internal/window"
)

// Reset drops the counters the charges name (their Key, Name and limit's
// Series; Cost is ignored), as if their clients had never been seen. A
// counter that does not exist is left alone.
func (s *Store) Reset(ctx context.Context, charges []window.Charge) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("memstore: %w", err)
	}
	for i := range charges {
		c := &charges[i]
		if err := c.Limit.Validate(); err != nil {
			return fmt.Errorf("memstore: charge %d (%q): %w", i, c.Name, err)
		}
		k1, k2 := s.keyHash(c.Key)
		id, sh := s.ident(k1, k2, c.Name, series(&c.Limit)), &s.shards[s.shardOf(k2)]
		sh.mu.Lock()
		if r := sh.lookup(id); r >= 0 {
			sh.remove(r)
		}
		sh.mu.Unlock()
	}
	return nil
}
