package redisstore

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/sluicehq/sluice/internal/keyguard"
)

// StoredOverride is one override as the store holds it: the rule and
// client Key it applies to, an opaque value, and when it ends (the zero
// time for never).
type StoredOverride struct {
	Rule, Key string
	Value     []byte
	Until     time.Time
}

// ErrTooManyOverrides is returned by SetOverride when the store holds its
// maximum of overrides already.
var ErrTooManyOverrides = errors.New("redisstore: too many overrides")

// setOverrideScript sets ARGV[1] to ARGV[2] in the overrides KEYS[1], ending
// at ARGV[3] (Unix ms, 0 for never; KEYS[2] holds the ends), after
// dropping those that ended before ARGV[4]; it refuses a new one (reply -1)
// when ARGV[5] are held already. It increments the version KEYS[3].
var setOverrideScript = keyguard.Script(`
local ended = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', '(' .. ARGV[4])
for _, f in ipairs(ended) do
  redis.call('HDEL', KEYS[1], f)
end
if #ended > 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', '(' .. ARGV[4])
end
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 0 and redis.call('HLEN', KEYS[1]) >= tonumber(ARGV[5]) then
  return -1
end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
if ARGV[3] == '0' then
  redis.call('ZREM', KEYS[2], ARGV[1])
else
  redis.call('ZADD', KEYS[2], ARGV[3], ARGV[1])
end
return redis.call('INCR', KEYS[3])
`)

// removeOverrideScript drops ARGV[1] from the overrides KEYS[1] and their
// ends KEYS[2] and increments the version KEYS[3]; reply: whether it was
// there.
var removeOverrideScript = keyguard.Script(`
local n = redis.call('HDEL', KEYS[1], ARGV[1])
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('INCR', KEYS[3])
return n
`)

// loadOverridesScript returns the version KEYS[3], the overrides KEYS[1]
// (field, value, ...) and their ends KEYS[2] (field, end, ...), read
// together.
var loadOverridesScript = keyguard.Script(`
return {tonumber(redis.call('GET', KEYS[3]) or '0'), redis.call('HGETALL', KEYS[1]), redis.call('ZRANGE', KEYS[2], 0, -1, 'WITHSCORES')}
`)

func (s *Store) overrideKeys() []string {
	return []string{s.adminKey("overrides"), s.adminKey("overrides:ends"), s.adminKey("version")}
}

// SetOverride stores an override of rule for key with an opaque value,
// ending at until (the zero time for never), first dropping the overrides
// that ended before now (the app server's clock if zero: ends are the
// middleware's instants). It fails with ErrTooManyOverrides, and changes
// nothing, if max overrides are held and this one is new.
func (s *Store) SetOverride(ctx context.Context, now time.Time, rule, key string, value []byte, until time.Time, max int) error {
	if strings.Contains(rule, "\x00") {
		return fmt.Errorf("redisstore: rule %q contains a NUL", rule)
	}
	if now.IsZero() {
		now = time.Now()
	}
	var end int64
	if !until.IsZero() {
		end = until.UnixMilli()
	}
	ctx, cancel := s.bounded(ctx)
	defer cancel()
	v, err := s.eval(ctx, setOverrideScript, s.overrideKeys(),
		[]any{rule + "\x00" + key, string(value), end, now.UnixMilli(), max})
	if err != nil {
		return fmt.Errorf("redisstore: set override: %w", err)
	}
	if n, _ := v.(int64); n < 0 {
		return fmt.Errorf("%w: %d held", ErrTooManyOverrides, max)
	}
	return nil
}

// RemoveOverride drops the override of rule for key and reports whether
// there was one.
func (s *Store) RemoveOverride(ctx context.Context, rule, key string) (bool, error) {
	ctx, cancel := s.bounded(ctx)
	defer cancel()
	v, err := s.eval(ctx, removeOverrideScript, s.overrideKeys(), []any{rule + "\x00" + key})
	if err != nil {
		return false, fmt.Errorf("redisstore: remove override: %w", err)
	}
	n, _ := v.(int64)
	return n > 0, nil
}

// LoadOverrides returns every override held (ended ones included, with
// their end) and the version they are at. It is not counted among the
// batches of decisions.
func (s *Store) LoadOverrides(ctx context.Context) (int64, []StoredOverride, error) {
	ctx, cancel := s.bounded(ctx)
	defer cancel()
	v, err := s.evalQuiet(ctx, loadOverridesScript, s.overrideKeys())
	if err != nil {
		return 0, nil, fmt.Errorf("redisstore: load overrides: %w", err)
	}
	r, ok := v.([]any)
	if !ok || len(r) != 3 {
		return 0, nil, fmt.Errorf("redisstore: load overrides: reply %T", v)
	}
	version, err := intAt(r, 0)
	if err != nil {
		return 0, nil, err
	}
	ends := map[string]int64{}
	if e, ok := r[2].([]any); ok {
		for i := 0; i+1 < len(e); i += 2 {
			f, _ := e[i].(string)
			var ms float64
			if sc, ok := e[i+1].(string); ok {
				_, _ = fmt.Sscan(sc, &ms)
			}
			ends[f] = int64(ms)
		}
	}
	all, _ := r[1].([]any)
	out := make([]StoredOverride, 0, len(all)/2)
	for i := 0; i+1 < len(all); i += 2 {
		f, _ := all[i].(string)
		val, _ := all[i+1].(string)
		rule, key, ok := strings.Cut(f, "\x00")
		if !ok {
			continue
		}
		o := StoredOverride{Rule: rule, Key: key, Value: []byte(val)}
		if ms, ok := ends[f]; ok && ms > 0 {
			o.Until = time.UnixMilli(ms)
		}
		out = append(out, o)
	}
	return version, out, nil
}
