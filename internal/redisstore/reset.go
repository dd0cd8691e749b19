package redisstore

import (
	"context"
	"errors"
	"fmt"

	"github.com/sluicehq/sluice/internal/keyguard"
	"github.com/sluicehq/sluice/internal/window"
)

// resetScript deletes counters: KEYS[1] is a bucket and ARGV its fields.
var resetScript = keyguard.Script(`return redis.call('HDEL', KEYS[1], unpack(ARGV))`)

// Reset drops the counters the charges name (their Key, Name and limit's
// Series; Cost is ignored), as if their clients had never been seen: one
// HDEL per Key, in the Key's bucket. A counter that does not exist is left
// alone.
func (s *Store) Reset(ctx context.Context, charges []window.Charge) error {
	ctx, cancel := s.bounded(ctx)
	defer cancel()
	byKey := map[string][]any{}
	var order []string
	for i := range charges {
		c := &charges[i]
		if err := c.Limit.Validate(); err != nil {
			return fmt.Errorf("redisstore: charge %d: %w", i, err)
		}
		bucket := string(s.appendKey(nil, c.Key))
		if _, ok := byKey[bucket]; !ok {
			order = append(order, bucket)
		}
		byKey[bucket] = append(byKey[bucket], string(appendField(nil, c)))
	}
	var errs []error
	for _, bucket := range order {
		if _, err := s.eval(ctx, resetScript, []string{bucket}, byKey[bucket]); err != nil {
			errs = append(errs, fmt.Errorf("redisstore: reset: %w", err))
		}
	}
	return errors.Join(errs...)
}
