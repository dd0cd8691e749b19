package middleware

import (
	"context"
	"time"
)

// PublishSpare publishes l's spare capacity to its store and reads the
// fleet's at now, as the Limiter does every CapacityConfig.FleetEvery.
func PublishSpare(l *Limiter, ctx context.Context, now time.Time) error {
	return l.publishSpare(ctx, now)
}
