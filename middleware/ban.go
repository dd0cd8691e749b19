package middleware

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

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

// The Redis store keeps bans and overrides for the fleet.

func (r *RedisStore) setBan(ctx context.Context, now time.Time, rule, key string, d time.Duration) (time.Time, error) {
	return r.s.SetBan(ctx, now, rule, key, d)
}

func (r *RedisStore) bannedUntil(ctx context.Context, now time.Time, rule, key string) (time.Time, error) {
	return r.s.BannedUntil(ctx, now, rule, key)
}

func (r *RedisStore) liftBan(ctx context.Context, rule, key string) (bool, error) {
	return r.s.LiftBan(ctx, rule, key)
}

func (r *RedisStore) bans(ctx context.Context, now time.Time, limit int) ([]redisstore.Ban, int, error) {
	return r.s.Bans(ctx, now, limit)
}

func (r *RedisStore) adminVersion(ctx context.Context) (int64, error) { return r.s.AdminVersion(ctx) }

func (r *RedisStore) setOverride(ctx context.Context, now time.Time, rule, key string, value []byte, until time.Time, max int) error {
	return r.s.SetOverride(ctx, now, rule, key, value, until, max)
}

func (r *RedisStore) removeOverride(ctx context.Context, rule, key string) (bool, error) {
	return r.s.RemoveOverride(ctx, rule, key)
}

func (r *RedisStore) loadOverrides(ctx context.Context) (int64, []redisstore.StoredOverride, error) {
	return r.s.LoadOverrides(ctx)
}

// TakeAt is Take that also returns the instant Redis decided at; see
// Refunder.
func (r *RedisStore) TakeAt(ctx context.Context, now time.Time, charges []Charge, out []Decision) (bool, time.Time, error) {
	return r.s.TakeAt(ctx, now, internalCharges(charges), internalDecisions(out))
}

// Refund gives back admitted charges; see Refunder.
func (r *RedisStore) Refund(ctx context.Context, at time.Time, charges []Charge) error {
	return r.s.Refund(ctx, at, internalCharges(charges))
}

// TakeAt is Take that also returns the instant the store decided at; see
// Refunder.
func (m *MemoryStore) TakeAt(ctx context.Context, now time.Time, charges []Charge, out []Decision) (bool, time.Time, error) {
	return m.s.TakeAt(ctx, now, internalCharges(charges), internalDecisions(out))
}

// Refund gives back admitted charges; see Refunder.
func (m *MemoryStore) Refund(ctx context.Context, at time.Time, charges []Charge) error {
	return m.s.Refund(ctx, at, internalCharges(charges))
}

// clientID names a client under a rule.
type clientID struct{ rule, key string }

// banTable holds bans in memory, at most max: the bans themselves with
// the memory store, and the bans this process has seen with a shared
// store, so that a banned client's requests do not reach Redis again.
type banTable struct {
	mu  sync.RWMutex
	n   atomic.Int64 // len(m), read without the lock
	m   map[clientID]int64
	max int
}

// until returns when the ban of id ends, in Unix ms, if it is in force at
// now.
func (t *banTable) until(id clientID, now int64) (int64, bool) {
	if t.n.Load() == 0 {
		return 0, false
	}
	t.mu.RLock()
	u, ok := t.m[id]
	t.mu.RUnlock()
	return u, ok && u > now
}

// set records a ban of id ending at until, unless one that ends later is
// there, and returns when the ban ends.
func (t *banTable) set(id clientID, until, now int64) int64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.m == nil {
		t.m = map[clientID]int64{}
	}
	if u, ok := t.m[id]; ok && u >= until {
		return u
	}
	if _, ok := t.m[id]; !ok && len(t.m) >= t.max {
		// Full: drop an expired ban if one of a few is, else any.
		var victim clientID
		seen := 0
		for k, u := range t.m {
			victim = k
			if u <= now || seen == 8 {
				break
			}
			seen++
		}
		delete(t.m, victim)
	}
	t.m[id] = until
	t.n.Store(int64(len(t.m)))
	return until
}

// lift drops the ban of id and reports whether one was in force.
func (t *banTable) lift(id clientID, now int64) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	u, ok := t.m[id]
	delete(t.m, id)
	t.n.Store(int64(len(t.m)))
	return ok && u > now
}

// list returns the bans in force at now, soonest to end first, dropping
// those that ended.
func (t *banTable) list(now int64) []Ban {
	t.mu.Lock()
	defer t.mu.Unlock()
	var out []Ban
	for id, u := range t.m {
		if u <= now {
			delete(t.m, id)
			continue
		}
		out = append(out, Ban{Rule: id.rule, Key: id.key, Until: time.UnixMilli(u)})
	}
	t.n.Store(int64(len(t.m)))
	slices.SortFunc(out, func(a, b Ban) int { return a.Until.Compare(b.Until) })
	return out
}

// clear drops every ban and returns the keys they were on.
func (t *banTable) clear() []string {
	t.mu.Lock()
	defer t.mu.Unlock()
	keys := make([]string, 0, len(t.m))
	for id := range t.m {
		keys = append(keys, id.key)
	}
	clear(t.m)
	t.n.Store(0)
	return keys
}

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
		id := clientID{c.Name, c.Key}
		until := local + c.Limit.Ban.Milliseconds()
		if sh := l.clients.shared; sh != nil {
			u, err := sh.setBan(ctx, now, c.Name, c.Key, c.Limit.Ban)
			if err != nil {
				l.cfg.report(r, fmt.Errorf("%w: ban a client of rule %q: %w", ErrStore, c.Name, err))
			} else {
				until = u.UnixMilli()
			}
		}
		until = l.clients.bans.set(id, until, local)
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
	out := l.clients.bans.list(l.localNow(now).UnixMilli())
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
	was := l.clients.bans.lift(clientID{rule, key}, l.localNow(now).UnixMilli())
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
