package middleware

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/sluicehq/sluice/internal/clients"
	"github.com/sluicehq/sluice/keyfunc"
)

// WithPauses makes the Limiter honour pauses (Limiter.Pause): before a
// request is charged, each of its rate limits' keys is checked for a pause
// in force, in memory and, with a shared store (Redis), in the store,
// where the pauses of the whole fleet are kept. That check is one more
// small read of the shared store per request and key while no pause is in
// force, so it is off unless asked for. The outbound transport
// (adapters/outbound) needs it.
func WithPauses() Option {
	return func(c *config) { c.pauses = true }
}

// pauseStore is implemented by stores that keep pauses for a whole fleet:
// the Redis store (and stores that embed it).
type pauseStore interface {
	setPause(ctx context.Context, now time.Time, rule, key string, d time.Duration) (time.Time, error)
	pausedUntil(ctx context.Context, now time.Time, rule, key string) (time.Time, error)
}

var _ pauseStore = (*RedisStore)(nil)

func (r *RedisStore) setPause(ctx context.Context, now time.Time, rule, key string, d time.Duration) (time.Time, error) {
	return r.s.SetPause(ctx, now, rule, key, d)
}

func (r *RedisStore) pausedUntil(ctx context.Context, now time.Time, rule, key string) (time.Time, error) {
	return r.s.PausedUntil(ctx, now, rule, key)
}

// pauseState holds the pauses of a Limiter made WithPauses: those this
// process set or saw, in memory (all of them with the memory store), and
// the store that keeps the fleet's.
type pauseState struct {
	table  clients.Bans
	shared pauseStore
}

// bindPauses readies the pause table of a Limiter made WithPauses.
func (l *Limiter) bindPauses() {
	if !l.cfg.pauses {
		return
	}
	l.pauses.table.Max = DefaultMaxBans
	l.pauses.shared, _ = l.cfg.store.(pauseStore)
}

// ErrNoPauses is returned by Pause on a Limiter made without WithPauses.
var ErrNoPauses = errors.New("sluice: the limiter does not honour pauses (make it WithPauses)")

// PausesEnabled reports whether the Limiter was made WithPauses.
func (l *Limiter) PausesEnabled() bool { return l.cfg.pauses }

// Pause stops for d every request that the limiter would charge under the
// same rules and keys as r: until the pause ends, such requests are
// denied, charged nothing, with Result.Paused set and RetryAfter the time
// left of the pause. With a shared store (Redis) the pause is one write
// per rule and key, and every Limiter of the fleet made WithPauses honours
// it from the moment the write is done; with the memory store it is this
// Limiter's alone. A pause already in force that ends later is kept. Pause
// does not charge r, and applies to its rate limits, not to its
// concurrency limits or shadow rules.
//
// Pause returns when the pause ends (the latest end, if r's rules have
// several keys), or the zero time if no rate limit applies to r. It
// returns an error for a limiter made without WithPauses (ErrNoPauses), d
// below a millisecond, a request whose keys cannot be computed (as Decide
// would), or a store failure (wrapping ErrStore, and reported to the
// Observers as StoreFailed), after which the pause holds in this Limiter
// only.
func (l *Limiter) Pause(ctx context.Context, r keyfunc.Request, d time.Duration) (time.Time, error) {
	if !l.cfg.pauses {
		return time.Time{}, ErrNoPauses
	}
	if d < time.Millisecond {
		return time.Time{}, fmt.Errorf("sluice: Pause: %s is less than 1ms", d)
	}
	keys, err := l.Keys(r)
	if err != nil {
		return time.Time{}, err
	}
	now := l.clock()
	local := l.localNow(now).UnixMilli()
	var latest int64
	var errs []error
	for _, k := range keys {
		until := local + d.Milliseconds()
		if sh := l.pauses.shared; sh != nil {
			u, err := sh.setPause(ctx, now, k.Rule, k.Key, d)
			if err != nil {
				err = fmt.Errorf("%w: pause rule %q: %w", ErrStore, k.Rule, err)
				l.cfg.report(r, err)
				errs = append(errs, err)
			} else {
				until = u.UnixMilli()
			}
		}
		latest = max(latest, l.pauses.table.Set(clients.ID(k), until, local))
	}
	if latest == 0 {
		return time.Time{}, errors.Join(errs...)
	}
	return time.UnixMilli(latest), errors.Join(errs...)
}

// RuleKey names the counters of one client under one rule: the rule's
// name and the key its key function produced.
type RuleKey struct{ Rule, Key string }

// Keys returns the rules and keys that r would be charged under by its
// rate limits (not its shadow rules, nor rules with only a concurrency
// limit), each once, in the order of the rules, without deciding or
// charging anything: the rules that apply to r are matched and their key
// functions run, as Decide does. It returns the error Decide would for a
// key that cannot be computed.
func (l *Limiter) Keys(r keyfunc.Request) ([]RuleKey, error) {
	s := scratchPool.Get().(*scratch)
	defer s.release()
	var res Result
	if _, err := l.matchRules(l.rules.Load(), r, s, &res); err != nil {
		return nil, err
	}
	var out []RuleKey
	for i := range s.charges {
		if k := (RuleKey{s.ruleOf(i), s.charges[i].Key}); len(out) == 0 || out[len(out)-1] != k {
			out = append(out, k) // a rule's limits (and usage limits) are in a row
		}
	}
	return out, nil
}

// paused checks the request's charges for a pause in force, in memory and
// then, with a shared store, in the store. It reports whether one is, and
// then fills s.decisions so that the paused charge binds, with the pause's
// end as its wait.
func (l *Limiter) paused(ctx context.Context, now time.Time, r keyfunc.Request, s *scratch) bool {
	var read readUntil
	if sh := l.pauses.shared; sh != nil {
		read = sh.pausedUntil
	}
	return l.held(ctx, now, r, s, &l.pauses.table, read, nil, "pause")
}

// readUntil reads, in a shared store, when the hold (a ban, a pause) of
// key under rule ends: the zero time for none.
type readUntil func(ctx context.Context, now time.Time, rule, key string) (time.Time, error)

// held checks the request's charges that applies selects (all of them
// when nil) for a hold in force (a ban or a pause, named by what), in
// table and then, with read, in the shared store, which holds the
// fleet's. It reports whether one is, and then fills s.decisions: the
// held charges of that rule and key deny until the hold ends, the others
// do not bind.
func (l *Limiter) held(ctx context.Context, now time.Time, r keyfunc.Request, s *scratch, table *clients.Bans, read readUntil, applies func(*Charge) bool, what string) bool {
	local := l.localNow(now).UnixMilli()
	found := -1
	var until int64
	var checked clients.ID
	for i := range s.charges {
		c := &s.charges[i]
		id := clients.ID{Rule: s.ruleOf(i), Key: c.Key}
		if applies != nil && !applies(c) || id == checked {
			continue // a rule's limits are in a row: its hold is read once
		}
		checked = id
		if u, ok := table.Until(id, local); ok {
			found, until = i, u
			break
		}
		if read == nil {
			continue
		}
		u, err := read(ctx, now, id.Rule, c.Key)
		if err != nil {
			// The hold cannot be read: the store's decision stands.
			l.cfg.report(r, fmt.Errorf("%w: read the %s of rule %q: %w", ErrStore, what, id.Rule, err))
			continue
		}
		if !u.IsZero() {
			found, until = i, table.Set(id, u.UnixMilli(), local)
			break
		}
	}
	if found < 0 {
		return false
	}
	s.decisions = grow(s.decisions, len(s.charges))
	left := time.Duration(until-local) * time.Millisecond
	h, hr := &s.charges[found], s.ruleOf(found)
	for j := range s.decisions {
		s.decisions[j] = Decision{Allowed: true}
		if c := &s.charges[j]; s.ruleOf(j) == hr && c.Key == h.Key && (applies == nil || applies(c)) {
			s.decisions[j] = Decision{ResetAfter: left, RetryAfter: left, NextAfter: left}
		}
	}
	return true
}

// ruleOf returns the name of the rule of charge i: the charge's Name, or
// for a usage limit the name of its rule.
func (s *scratch) ruleOf(i int) string {
	if u := s.metas[i].usage; u != nil {
		return u.rule
	}
	return s.charges[i].Name
}

// Key returns the key of the binding limit (see Policy) as the rule's key
// function produced it, such as "ip:192.0.2.1"; "" when no limit applied.
// Keys are derived from requests and may be hostile: hash one
// (keyfunc.Hash) before logging it.
func (res *Result) Key() string { return res.key }
