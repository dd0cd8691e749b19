package middleware

import (
	"context"
	"log/slog"
)

// Region logs, at Warn, that a peer region became unreachable (it now
// counts as its share of every global limit) and, at Info, that it is
// reachable again; and, at most once a second per peer (with how many
// were not logged), failed syncs at Debug and dropped counters at Warn.
func (o *LogObserver) Region(e RegionEvent) {
	ctx := context.Background()
	switch e.Kind {
	case RegionPeerUnreachable:
		o.log.LogAttrs(ctx, slog.LevelWarn, "sluice: peer region unreachable: it counts as its share of global limits", slog.String("peer", e.Peer))
	case RegionPeerReachable:
		o.log.LogAttrs(ctx, slog.LevelInfo, "sluice: peer region reachable again", slog.String("peer", e.Peer))
	case RegionSyncFailed:
		if n, ok := o.errs.allow("region-sync:" + e.Peer); ok {
			o.log.LogAttrs(ctx, slog.LevelDebug, "sluice: sync to peer region failed", slog.String("peer", e.Peer), slog.Any("error", e.Err), slog.Int("not_logged", n))
		}
	case RegionDropped:
		if n, ok := o.errs.allow("region-dropped"); ok {
			o.log.LogAttrs(ctx, slog.LevelWarn, "sluice: global counter not synced: too many", slog.Int("not_logged", n))
		}
	}
}
