package redisstore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/sluicehq/sluice/internal/keyguard"
	"github.com/sluicehq/sluice/internal/window"
)

// giveBackScript takes cost * w drops off the level of a token or leaky
// bucket (value "T", see decide.lua), never below empty, and moves the
// instant it is full (empty) again accordingly. A field that is absent, of
// another kind, or past its expiry is left alone.
//
// KEYS[1] is the bucket; ARGV[1] the field, ARGV[2] the cost, ARGV[3] the
// window in ms (a token is window / tick drops, in the stored tick),
// ARGV[4] the rate (Requests, the drops refilled per tick) and ARGV[5] now
// in Unix ms, or "" for the server's clock (TIME).
var giveBackScript = keyguard.Script(`
local v = redis.call('HGET', KEYS[1], ARGV[1])
if not v or #v ~= 27 or string.byte(v, 1) ~= 84 then return 0 end
local now
if ARGV[5] == '' then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
else
  now = tonumber(ARGV[5])
end
local _, e, s, r, level = struct.unpack('<Bi6i6i6d', v)
if e <= now then return 0 end
local w = math.floor(tonumber(ARGV[3]) / r)
level = math.max(0, level - tonumber(ARGV[2]) * w)
local rate = tonumber(ARGV[4])
e = s + math.floor((level + rate - 1) / rate) * r
redis.call('HSET', KEYS[1], ARGV[1], struct.pack('<Bi6i6i6d', 84, e, s, r, level))
return 1
`)

// GiveBack takes the costs of charges of token and leaky buckets off
// their levels, never below empty: the place of a request that was
// admitted with a Delay and left before its turn, so that the requests
// after it do not wait for it. now is the instant the request was decided
// at (the zero time means the server's clock). Charges of other
// algorithms, and counters that no longer exist, are left alone.
func (s *Store) GiveBack(ctx context.Context, now time.Time, charges []window.Charge) error {
	arg, err := nowArg(now)
	if err != nil {
		return err
	}
	ctx, cancel := s.bounded(ctx)
	defer cancel()
	var errs []error
	for i := range charges {
		c := &charges[i]
		if a := c.Limit.Algorithm; c.Cost <= 0 || a != window.TokenBucket && a != window.LeakyBucket {
			continue
		}
		if err := c.Limit.Validate(); err != nil {
			return fmt.Errorf("redisstore: charge %d: %w", i, err)
		}
		bucket, field := string(s.appendKey(nil, c.Key)), string(appendField(nil, c))
		if _, err := s.eval(ctx, giveBackScript, []string{bucket},
			[]any{field, int64(c.Cost), c.Limit.Window.Milliseconds(), int64(c.Limit.Requests), arg}); err != nil {
			errs = append(errs, fmt.Errorf("redisstore: give back: %w", err))
		}
	}
	return errors.Join(errs...)
}
