package middleware

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/sluicehq/sluice/internal/clients"
	"github.com/sluicehq/sluice/internal/redisstore"
	"github.com/sluicehq/sluice/keyfunc"
)

// Ban is a ban in force: a client that a limit with Limit.Ban refused, and
// that every request under the limit's rule is refused until Until.
type Ban struct {
	// Rule is the rule's name, and Key the client's key as the rule's key
	// function produced it ("ip:192.0.2.1", "user:alice|ip:192.0.2.1").
	Rule, Key string
	// Until is when the ban ends.
	Until time.Time
}

// DefaultMaxBans bounds the bans a Limiter keeps in memory: all of them
// with the memory store, those it has seen with a shared store (Redis,
// which keeps them all). Beyond it, new bans push out others, expired
// ones first.
const DefaultMaxBans = 100_000

// sharedState is implemented by stores that keep bans and overrides for a
// whole fleet: the Redis store.
type sharedState interface {
	setBan(ctx context.Context, now time.Time, rule, key string, d time.Duration) (time.Time, error)
	bannedUntil(ctx context.Context, now time.Time, rule, key string) (time.Time, error)
	liftBan(ctx context.Context, rule, key string) (bool, error)
	bans(ctx context.Context, now time.Time, limit int) ([]redisstore.Ban, int, error)
	adminVersion(ctx context.Context) (int64, error)
	setOverride(ctx context.Context, now time.Time, rule, key string, value []byte, until time.Time, max int) error
	removeOverride(ctx context.Context, rule, key string) (bool, error)
	loadOverrides(ctx context.Context) (int64, []redisstore.StoredOverride, error)
}

var (
	_ sharedState = (*RedisStore)(nil)
	_ Refunder    = (*RedisStore)(nil)
	_ Refunder    = (*MemoryStore)(nil)
)

// localNow is now as the limiter's clock says, or the process's clock.
func (l *Limiter) localNow(now time.Time) time.Time {
	if now.IsZero() {
		return time.Now()
	}
	return now
}

// banned checks the charges of limits with a ban for a ban in force, in
// memory and then, for a shared store, in the store. It reports whether one
// is, and then fills s.decisions with the ban's denial.
func (l *Limiter) banned(ctx context.Context, now time.Time, r keyfunc.Request, s *scratch) bool {
	var read readUntil
	if sh := l.clients.shared; sh != nil {
		read = sh.bannedUntil
	}
	return l.held(ctx, now, r, s, &l.clients.bans, read, hasBan, "ban")
}

// hasBan reports whether c's limit bans.
func hasBan(c *Charge) bool { return c.Limit.Ban > 0 }

// startBans bans the clients that limits with a ban just refused (their
// decisions in s.decisions), makes their decisions say how long the ban
// lasts, and reports whether it banned any.
func (l *Limiter) startBans(ctx context.Context, now time.Time, r keyfunc.Request, s *scratch) bool {
	started := false
	local := l.localNow(now).UnixMilli()
	for i := range s.charges {
		c, d := &s.charges[i], &s.decisions[i]
		if d.Allowed || c.Limit.Ban <= 0 || d.RetryAfter < 0 {
			continue
		}
		id := clients.ID{Rule: c.Name, Key: c.Key}
		until := local + c.Limit.Ban.Milliseconds()
		if sh := l.clients.shared; sh != nil {
			u, err := sh.setBan(ctx, now, c.Name, c.Key, c.Limit.Ban)
			if err != nil {
				l.cfg.report(r, fmt.Errorf("%w: ban a client of rule %q: %w", ErrStore, c.Name, err))
			} else {
				until = u.UnixMilli()
			}
		}
		until = l.clients.bans.Set(id, until, local)
		left := time.Duration(until-local) * time.Millisecond
		d.RetryAfter, d.NextAfter, d.ResetAfter = max(d.RetryAfter, left), max(d.NextAfter, left), max(d.ResetAfter, left)
		d.Remaining = 0
		started = true
		if o := l.cfg.obs; o != nil {
			o.BanStarted(c.Name, time.Duration(until-local)*time.Millisecond)
		}
	}
	return started
}

// Bans lists the bans in force, soonest to end first: with a shared store
// (Redis), those of the whole fleet, at most limit of them (0 for
// DefaultMaxBans), and how many there are in all.
func (l *Limiter) Bans(ctx context.Context, limit int) ([]Ban, int, error) {
	if limit <= 0 {
		limit = DefaultMaxBans
	}
	var now time.Time
	if l.cfg.clock != nil {
		now = l.cfg.clock()
	}
	if sh := l.clients.shared; sh != nil {
		list, total, err := sh.bans(ctx, now, limit)
		if err != nil {
			return nil, 0, fmt.Errorf("%w: %w", ErrStore, err)
		}
		out := make([]Ban, len(list))
		for i, b := range list {
			out[i] = Ban{Rule: b.Rule, Key: b.Key, Until: b.Until}
		}
		return out, total, nil
	}
	list := l.clients.bans.List(l.localNow(now).UnixMilli())
	out := make([]Ban, len(list))
	for i, b := range list {
		out[i] = Ban{Rule: b.Rule, Key: b.Key, Until: time.UnixMilli(b.Until)}
	}
	total := len(out)
	if len(out) > limit {
		out = out[:limit]
	}
	return out, total, nil
}

// LiftBan ends the ban of key under rule and reports whether one was in
// force. It also drops the client's counters under the rule (as Reset
// does, on a store that can), so that the client starts afresh: otherwise
// the limit, still full, would refuse its next request and ban it again.
// The deny cache forgets key's denials. With a shared store, the other app
// servers stop applying the ban within the sync interval
// (WithClientSync).
func (l *Limiter) LiftBan(ctx context.Context, rule, key string) (bool, error) {
	if _, err := l.ruleNamed(rule); err != nil {
		return false, err
	}
	var now time.Time
	if l.cfg.clock != nil {
		now = l.cfg.clock()
	}
	was := l.clients.bans.Lift(clients.ID{Rule: rule, Key: key}, l.localNow(now).UnixMilli())
	if dc := l.cfg.denyCache; dc != nil {
		dc.Forget(key)
	}
	if sh := l.clients.shared; sh != nil {
		ok, err := sh.liftBan(ctx, rule, key)
		if err != nil {
			return was, fmt.Errorf("%w: %w", ErrStore, err)
		}
		was = was || ok
	}
	if _, ok := l.cfg.store.(Resetter); ok {
		if err := l.Reset(ctx, rule, key); err != nil {
			return was, err
		}
	}
	return was, nil
}

// banning reports whether a rule may ban: one of its limits has a Ban, or
// its LimitsFunc may return one.
func banning(rules []*compiledRule) bool {
	for _, r := range rules {
		if r.LimitsFunc != nil {
			return true
		}
		for _, l := range r.Limits {
			if l.Ban > 0 {
				return true
			}
		}
	}
	return false
}

// ErrCannotBan is returned by Ban for a rule none of whose limits bans
// (Limit.Ban): its requests never check for a ban.
var ErrCannotBan = errors.New("sluice: the rule has no limit with a ban")

// Ban bans key under rule for d from now, as the rule's limit would when
// it refuses the client (an operator acting on the top clients, say),
// unless a ban that ends later is in force, and returns when the ban
// ends. d of 0 means the longest Ban of the rule's limits. With a shared
// store, the ban is the fleet's. The rule must have a limit with a Ban
// (ErrCannotBan otherwise): only such limits check for bans. LiftBan ends
// it.
func (l *Limiter) Ban(ctx context.Context, rule, key string, d time.Duration) (time.Time, error) {
	c, err := l.ruleNamed(rule)
	if err != nil {
		return time.Time{}, err
	}
	var longest time.Duration
	for _, lim := range c.limits {
		longest = max(longest, lim.Ban)
	}
	switch {
	case longest == 0:
		return time.Time{}, fmt.Errorf("%w: rule %q", ErrCannotBan, rule)
	case key == "":
		return time.Time{}, errors.New("sluice: Ban: empty key")
	case d < 0 || d > 0 && d < time.Millisecond:
		return time.Time{}, fmt.Errorf("sluice: Ban: duration %s: want 0 (the rule's) or at least 1ms", d)
	case d == 0:
		d = longest
	}
	now := l.clock()
	local := l.localNow(now).UnixMilli()
	until := local + d.Milliseconds()
	if sh := l.clients.shared; sh != nil {
		u, err := sh.setBan(ctx, now, rule, key, d)
		if err != nil {
			return time.Time{}, fmt.Errorf("%w: %w", ErrStore, err)
		}
		until = u.UnixMilli()
	}
	until = l.clients.bans.Set(clients.ID{Rule: rule, Key: key}, until, local)
	l.reportClientState()
	return time.UnixMilli(until), nil
}
