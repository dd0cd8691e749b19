package middleware

import (
	"errors"
	"log/slog"
	"strings"
	"testing"
)

func TestLogObserverRegion(t *testing.T) {
	t.Parallel()
	var buf strings.Builder
	o := NewLogObserver(slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug})))
	o.Region(RegionEvent{Kind: RegionSynced, Peer: "eu-west-1"})
	o.Region(RegionEvent{Kind: RegionSyncFailed, Peer: "ap-southeast-1", Err: errors.New("EOF")})
	o.Region(RegionEvent{Kind: RegionSyncFailed, Peer: "ap-southeast-1", Err: errors.New("EOF")})
	o.Region(RegionEvent{Kind: RegionPeerUnreachable, Peer: "ap-southeast-1"})
	o.Region(RegionEvent{Kind: RegionPeerReachable, Peer: "ap-southeast-1"})
	out := buf.String()
	for want, n := range map[string]int{
		"sluice: sync to peer region failed":                                         1,
		"level=WARN msg=\"sluice: peer region unreachable":                           1,
		"level=INFO msg=\"sluice: peer region reachable again\" peer=ap-southeast-1": 1,
		"eu-west-1": 0,
	} {
		if got := strings.Count(out, want); got != n {
			t.Errorf("%q logged %d times, want %d:\n%s", want, got, n, out)
		}
	}
}
