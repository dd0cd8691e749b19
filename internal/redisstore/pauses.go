package redisstore

import (
	"context"
	"time"
)

// Pauses, kept for the whole fleet: a pause stops every request of a
// client under a rule until an instant, as a ban does, but no limit
// starts it: the Limiter's Pause does, when something outside (an
// upstream API's 429 with Retry-After) says to wait. A pause is one string
// key per rule and client, "<prefix>{<tag>}pause:<24 hex digits>" in the
// hash slot of the client's bucket (as a ban's, with "pause:" for
// "ban:"), whose value is the instant it ends in Unix ms and whose TTL is
// its length in the server's real time. Setting one is one script call
// that keeps the later end; there is no index: pauses are short, and end
// by themselves.

// SetPause pauses key under rule for d from now (the zero time means the
// server's clock), unless a pause that ends later is in force, and returns
// when the pause ends.
func (s *Store) SetPause(ctx context.Context, now time.Time, rule, key string, d time.Duration) (time.Time, error) {
	ctx, cancel := s.bounded(ctx)
	defer cancel()
	until, _, err := s.setUntil(ctx, now, s.pauseKey(rule, key), d, "pause")
	if err != nil {
		return time.Time{}, err
	}
	return time.UnixMilli(until), nil
}

// PausedUntil returns when the pause of key under rule ends, or the zero
// time if none is in force at now (the zero time means the server's
// clock).
func (s *Store) PausedUntil(ctx context.Context, now time.Time, rule, key string) (time.Time, error) {
	return s.readUntil(ctx, now, s.pauseKey(rule, key), "pause")
}

// pauseKey returns the key of the pause of rule on key.
func (s *Store) pauseKey(rule, key string) string { return s.clientKey("pause:", rule, key) }
