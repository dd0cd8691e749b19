package redisstore

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/keyguard"
	"github.com/sluicehq/sluice/internal/redispipe"
)

// evalQuiet runs script for background and admin work: through the
// pipeline, which fails fast on a server that is down, but not counted
// among the batches of decisions (redispipe.Pipeliner.RunQuiet).
func (s *Store) evalQuiet(ctx context.Context, script *redis.Script, keys []string, args ...any) (any, error) {
	if s.pipe != nil {
		return s.pipe.RunQuiet(ctx, script, keys, args...)
	}
	return redispipe.RunDirect(ctx, s.client, script, keys, args...)
}

// Bans and per-client overrides, shared by every app server of the fleet.
//
// A ban is one string key per rule and client, in the bucket's hash slot
// of the client's Key, "<prefix>{<tag>}ban:<24 hex digits>" (the first 12
// bytes of SHA-256 over the rule and the Key, as a counter's field), whose
// value is the instant the ban ends in Unix ms and whose TTL (PX) is the
// ban's length in the server's real time. An index of the bans in force,
// for listing and lifting them, is a sorted set "<prefix>{sluice-admin}bans"
// of "rule\x00key" scored by the instant each ends; it is pruned of bans
// that ended each time a ban is set, so it holds the bans in force and
// those of the last prune at most, and expires when its last ban ends.
//
// Overrides are a hash "<prefix>{sluice-admin}overrides" of "rule\x00key"
// to an opaque value (the middleware's encoding of the limits), with a
// sorted set "...overrides:ends" of those that end, scored by their end.
// Every change to the overrides, and every ban lifted, increments the
// counter "<prefix>{sluice-admin}version", so that app servers that cache
// them locally can poll one small key and reload only on a change.
//
// Ban keys and the index hold the client Keys in plain text (they are
// listed), unlike counters, which keep only hashes.

// adminTag is the hash tag of the keys of the index of bans, the overrides
// and the version: all in one Redis Cluster slot, so that one script
// changes them together.
const adminTag = "{sluice-admin}"

// Ban is a ban in force, as Bans lists it.
type Ban struct {
	Rule, Key string
	// Until is when the ban ends.
	Until time.Time
}

// setBanScript sets the ban KEYS[1] to end at ARGV[1] (Unix ms), "" for
// the server's clock plus ARGV[2] ms, unless it already ends later, with a
// TTL of ARGV[2] ms. Reply: the instant the ban ends.
var setBanScript = keyguard.Script(`
local now
if ARGV[1] == '' then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
else
  now = tonumber(ARGV[1])
end
local d = tonumber(ARGV[2])
local untilMs = now + d
local cur = tonumber(redis.call('GET', KEYS[1]) or '0')
if cur >= untilMs then
  return {cur, now}
end
redis.call('SET', KEYS[1], untilMs, 'PX', d)
return {untilMs, now}
`)

// indexBanScript adds ARGV[2] to the index KEYS[1] with score ARGV[1] (the
// ban's end) unless it ends later already, drops from it the bans that
// ended before ARGV[3] (the instant the ban was set at), and has it expire
// when the last ban in it ends, as every key but the overrides' does.
var indexBanScript = keyguard.Script(`
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', '(' .. ARGV[3])
redis.call('ZADD', KEYS[1], 'GT', ARGV[1], ARGV[2])
local last = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
redis.call('PEXPIRE', KEYS[1], math.max(1, tonumber(last[2]) - tonumber(ARGV[3])))
return 1
`)

// bannedScript returns the end of the ban KEYS[1] if it ends after ARGV[1]
// (Unix ms, "" for the server's clock), else 0.
var bannedScript = keyguard.Script(`
local v = redis.call('GET', KEYS[1])
if not v then return 0 end
local now
if ARGV[1] == '' then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
else
  now = tonumber(ARGV[1])
end
v = tonumber(v)
if v and v > now then return v end
return 0
`)

// liftScript drops ARGV[1] from the index KEYS[1] and increments the
// version KEYS[2]; reply: whether it was in the index.
var liftScript = keyguard.Script(`
local n = redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('INCR', KEYS[2])
return n
`)

func (s *Store) adminKey(name string) string { return s.prefix + adminTag + name }

// banKey returns the key of the ban of rule on key.
func (s *Store) banKey(rule, key string) string { return s.clientKey("ban:", rule, key) }

// clientKey returns the key of a record of kind ("ban:", "pause:") of rule
// on key, in the hash slot of key's bucket.
func (s *Store) clientKey(kind, rule, key string) string {
	var arr [160]byte
	in := binary.AppendUvarint(arr[:0], uint64(len(rule)))
	in = append(in, rule...)
	in = binary.AppendUvarint(in, uint64(len(key)))
	in = append(in, key...)
	sum := sha256.Sum256(in)
	b := s.appendKey(nil, key)
	b = append(b, kind...)
	return string(hex.AppendEncode(b, sum[:fieldLen]))
}

// SetBan bans key under rule for d from now (the zero time means the
// server's clock), unless a ban that ends later is in force, and returns
// when the ban ends.
func (s *Store) SetBan(ctx context.Context, now time.Time, rule, key string, d time.Duration) (time.Time, error) {
	ctx, cancel := s.bounded(ctx)
	defer cancel()
	until, at, err := s.setUntil(ctx, now, s.banKey(rule, key), d, "ban")
	if err != nil {
		return time.Time{}, err
	}
	if _, err := s.eval(ctx, indexBanScript, []string{s.adminKey("bans")},
		[]any{until, rule + "\x00" + key, at}); err != nil {
		return time.UnixMilli(until), fmt.Errorf("redisstore: index ban: %w", err)
	}
	return time.UnixMilli(until), nil
}

// BannedUntil returns when the ban of key under rule ends, or the zero
// time if none is in force at now (the zero time means the server's
// clock).
func (s *Store) BannedUntil(ctx context.Context, now time.Time, rule, key string) (time.Time, error) {
	return s.readUntil(ctx, now, s.banKey(rule, key), "ban")
}

// setUntil makes the record k (a ban or a pause) end d from now (the zero
// time means the server's clock), unless it ends later already, in one
// script call; it returns when the record ends and the instant it was
// set at, in Unix ms. what names the record in errors.
func (s *Store) setUntil(ctx context.Context, now time.Time, k string, d time.Duration, what string) (until, at int64, err error) {
	arg, err := nowArg(now)
	if err != nil {
		return 0, 0, err
	}
	if d < time.Millisecond {
		return 0, 0, fmt.Errorf("redisstore: %s of %s: want at least 1ms", what, d)
	}
	v, err := s.eval(ctx, setBanScript, []string{k}, []any{arg, d.Milliseconds()})
	if err != nil {
		return 0, 0, fmt.Errorf("redisstore: set %s: %w", what, err)
	}
	r, ok := v.([]any)
	if !ok || len(r) != 2 {
		return 0, 0, fmt.Errorf("redisstore: set %s: reply %T", what, v)
	}
	until, err1 := intAt(r, 0)
	at, err2 := intAt(r, 1)
	if err1 != nil || err2 != nil {
		return 0, 0, fmt.Errorf("redisstore: set %s: reply %v", what, r)
	}
	return until, at, nil
}

// readUntil returns when the record k (a ban or a pause) ends, or the zero
// time if it is not in force at now (the zero time means the server's
// clock).
func (s *Store) readUntil(ctx context.Context, now time.Time, k, what string) (time.Time, error) {
	arg, err := nowArg(now)
	if err != nil {
		return time.Time{}, err
	}
	ctx, cancel := s.bounded(ctx)
	defer cancel()
	v, err := s.eval(ctx, bannedScript, []string{k}, []any{arg})
	if err != nil {
		return time.Time{}, fmt.Errorf("redisstore: %s: %w", what, err)
	}
	n, ok := v.(int64)
	if !ok {
		return time.Time{}, fmt.Errorf("redisstore: %s: reply %T", what, v)
	}
	if n == 0 {
		return time.Time{}, nil
	}
	return time.UnixMilli(n), nil
}

// LiftBan ends the ban of key under rule, if there is one, and reports
// whether there was; the version is incremented either way, so that app
// servers that cache bans forget it.
func (s *Store) LiftBan(ctx context.Context, rule, key string) (bool, error) {
	ctx, cancel := s.bounded(ctx)
	defer cancel()
	v, err := s.eval(ctx, resetDelScript, []string{s.banKey(rule, key)}, nil)
	if err != nil {
		return false, fmt.Errorf("redisstore: lift ban: %w", err)
	}
	deleted, _ := v.(int64)
	w, err := s.eval(ctx, liftScript, []string{s.adminKey("bans"), s.adminKey("version")}, []any{rule + "\x00" + key})
	if err != nil {
		return deleted > 0, fmt.Errorf("redisstore: lift ban: %w", err)
	}
	indexed, _ := w.(int64)
	return deleted > 0 || indexed > 0, nil
}

var resetDelScript = keyguard.Script(`return redis.call('DEL', KEYS[1])`)

// listBansScript returns at most ARGV[2] members of the index KEYS[1] that
// end after ARGV[1] ("" for the server's clock), with their scores, and
// how many there are in all.
var listBansScript = keyguard.Script(`
local now
if ARGV[1] == '' then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
else
  now = tonumber(ARGV[1])
end
local min = '(' .. now
local list = redis.call('ZRANGEBYSCORE', KEYS[1], min, '+inf', 'WITHSCORES', 'LIMIT', 0, tonumber(ARGV[2]))
return {redis.call('ZCOUNT', KEYS[1], min, '+inf'), list}
`)

// Bans lists at most limit bans in force at now (the zero time means the
// server's clock), soonest to end first, and how many are in force in
// all. It is not counted among the batches of decisions.
func (s *Store) Bans(ctx context.Context, now time.Time, limit int) ([]Ban, int, error) {
	arg, err := nowArg(now)
	if err != nil {
		return nil, 0, err
	}
	ctx, cancel := s.bounded(ctx)
	defer cancel()
	v, err := s.evalQuiet(ctx, listBansScript, []string{s.adminKey("bans")}, arg, limit)
	if err != nil {
		return nil, 0, fmt.Errorf("redisstore: list bans: %w", err)
	}
	r, ok := v.([]any)
	if !ok || len(r) != 2 {
		return nil, 0, fmt.Errorf("redisstore: list bans: reply %T", v)
	}
	total, err := intAt(r, 0)
	if err != nil {
		return nil, 0, err
	}
	list, _ := r[1].([]any)
	var out []Ban
	for i := 0; i+1 < len(list); i += 2 {
		m, _ := list[i].(string)
		sc, _ := list[i+1].(string)
		rule, key, ok := strings.Cut(m, "\x00")
		ms, err := strconv.ParseFloat(sc, 64)
		if !ok || err != nil {
			continue
		}
		out = append(out, Ban{Rule: rule, Key: key, Until: time.UnixMilli(int64(ms))})
	}
	return out, int(total), nil
}

// AdminVersion returns the version of the overrides and lifted bans (0
// before the first change); it changes whenever they do. App servers poll
// it in the background: it is not counted among the batches of
// decisions.
func (s *Store) AdminVersion(ctx context.Context) (int64, error) {
	ctx, cancel := s.bounded(ctx)
	defer cancel()
	v, err := s.evalQuiet(ctx, versionScript, []string{s.adminKey("version")})
	if err != nil {
		return 0, fmt.Errorf("redisstore: version: %w", err)
	}
	n, _ := v.(int64)
	return n, nil
}

var versionScript = keyguard.Script(`return tonumber(redis.call('GET', KEYS[1]) or '0')`)
