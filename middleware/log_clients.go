package middleware

import (
	"context"
	"log/slog"
	"time"
)

// BanStarted logs, at Info and at most once a second per rule (with how
// many were not logged), that a limit with a ban banned a client of rule.
// The client's key is not logged.
func (o *LogObserver) BanStarted(rule string, d time.Duration) {
	if n, ok := o.errs.allow("ban:" + rule); ok {
		o.log.LogAttrs(context.Background(), slog.LevelInfo, "sluice: client banned",
			slog.String("rule", rule), slog.Duration("for", d), slog.Int("not_logged", n))
	}
}
