package middleware

import (
	"context"
	"log/slog"
)

// Shed logs, at Warn and at most once a second per rule, that an adaptive
// concurrency limit is shedding requests, with the priority of the last
// one and how many were not logged.
func (o *LogObserver) Shed(rule string, p Priority) {
	if n, ok := o.errs.allow("shed:" + rule); ok {
		o.log.LogAttrs(context.Background(), slog.LevelWarn, "sluice: shedding load: adaptive concurrency limit reached",
			slog.String("rule", rule), slog.String("priority", p.String()), slog.Int("not_logged", n))
	}
}
