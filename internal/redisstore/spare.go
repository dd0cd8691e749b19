package redisstore

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"time"

	"github.com/sluicehq/sluice/internal/keyguard"
)

//go:embed spare.lua
var spareSrc string

var spareScript = keyguard.Script(spareSrc)

// PublishSpare records that server has spare capacity spare (in [0, 1])
// for ttl, and returns the fleet's spare capacity: the minimum over the
// servers whose entries have not expired, this one included, and how many
// they are. The entries live in two sorted sets, by spare and by expiry,
// at "<prefix>{capacity}:spare" and "<prefix>{capacity}:expiry", so that a
// call costs O(log servers) (spare.lua); the zero now means the Redis
// server's clock, so that expiries agree across app servers.
func (s *Store) PublishSpare(ctx context.Context, now time.Time, server string, spare float64, ttl time.Duration) (fleet float64, servers int, err error) {
	if server == "" {
		return 0, 0, errors.New("redisstore: empty server name")
	}
	if ttl < time.Millisecond {
		return 0, 0, fmt.Errorf("redisstore: spare ttl %s is under 1ms", ttl)
	}
	at, err := nowArg(now)
	if err != nil {
		return 0, 0, err
	}
	permille := int64(min(max(spare, 0), 1)*1000 + 0.5)
	ctx, cancel := s.bounded(ctx)
	defer cancel()
	keys := []string{s.prefix + "{capacity}:spare", s.prefix + "{capacity}:expiry"}
	v, err := spareScript.Run(ctx, s.client, keys, at, server, permille, ttl.Milliseconds()).Int64Slice()
	if err != nil {
		return 0, 0, err
	}
	if len(v) != 2 {
		return 0, 0, fmt.Errorf("redisstore: spare script replied %v", v)
	}
	return float64(v[0]) / 1000, int(v[1]), nil
}
