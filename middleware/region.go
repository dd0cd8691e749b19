package middleware

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/regions"
)

// Scope is whose budget a rule's limits are, when app servers run in
// several regions, each with its own Redis (Rule.Scope, NewRegionStore).
// docs/regions.md compares the scopes, with their bounds.
type Scope uint8

// The scopes.
const (
	// ScopeRegion counts in the region's own Redis only: each region has
	// the whole budget (today's behaviour with a Redis per region). The
	// default.
	ScopeRegion Scope = iota
	// ScopeGlobal is one budget across regions. A region decides on its
	// own Redis from its own count plus the last known counts of the
	// others, which a syncer writes to every peer every SyncInterval
	// (DefaultRegionSyncInterval when 0); no request waits for another
	// region. Windows are aligned to the Unix epoch (regions cannot agree
	// on a per-client anchor without a round trip). It takes sliding and
	// fixed windows without a Period. Bound: over the limit by at most
	// min(R × (T + d), (N − 1) × L) per window, for a total admit rate R,
	// sync interval T, one-way delay d, N regions and limit L.
	ScopeGlobal
	// ScopeGlobalStrict decides every request in the home region's Redis
	// (RegionConfig.Home): exact, at the price of a cross-region round
	// trip in the other regions. For small, high-value limits.
	ScopeGlobalStrict
)

// DefaultRegionSyncInterval is a ScopeGlobal rule's SyncInterval when it
// is 0.
const DefaultRegionSyncInterval = regions.DefaultSyncInterval

var scopeNames = [...]string{ScopeRegion: "region", ScopeGlobal: "global", ScopeGlobalStrict: "global_strict"}

// String returns the scope as the rules file spells it.
func (s Scope) String() string {
	if int(s) < len(scopeNames) {
		return scopeNames[s]
	}
	return "Scope(" + strconv.Itoa(int(s)) + ")"
}

// ParseScope returns the scope spelled s: "region", "global" or
// "global_strict".
func ParseScope(s string) (Scope, error) {
	for i, n := range scopeNames {
		if n == s {
			return Scope(i), nil
		}
	}
	return ScopeRegion, fmt.Errorf("unknown scope %q (want region, global or global_strict)", s)
}

// compileScope checks rule c's scope against its algorithms and its sync
// mode.
func (c *compiledRule) compileScope() error {
	r := &c.Rule
	switch r.Scope {
	case ScopeRegion, ScopeGlobalStrict:
		return nil
	case ScopeGlobal:
	default:
		return fmt.Errorf("scope: unknown scope %d", r.Scope)
	}
	if r.Sync != SyncExact {
		return fmt.Errorf("scope: global: sync: %s does not apply (a global rule syncs across regions at sync_interval)", r.Sync)
	}
	if r.SyncInterval < 0 || r.SyncInterval%time.Millisecond != 0 || r.SyncInterval > time.Hour {
		return fmt.Errorf("sync_interval %s must be a whole number of milliseconds up to 1h, or 0 for %s", r.SyncInterval, DefaultRegionSyncInterval)
	}
	for i, l := range r.Limits {
		if err := globalSupports(l); err != nil {
			return fmt.Errorf("scope: global: limits[%d] %v", i, err)
		}
	}
	if u := r.Usage; u != nil {
		for i, l := range u.Limits {
			if err := globalSupports(l); err != nil {
				return fmt.Errorf("scope: global: usage.limits[%d] %v", i, err)
			}
		}
	}
	if len(r.Limits) == 0 && r.LimitsFunc == nil && r.Usage == nil {
		return errors.New("scope: global: the rule has no rate limit (a concurrency limit is always the region's)")
	}
	return nil
}

// globalSupports reports why l cannot be a global limit, or nil.
func globalSupports(l Limit) error {
	switch {
	case l.Algorithm != SlidingWindow && l.Algorithm != FixedWindow:
		return fmt.Errorf("is a %s (scope: global takes sliding_window and fixed_window; use global_strict)", l.Algorithm)
	case l.Period != 0:
		return errors.New("has a calendar period (scope: global takes fixed lengths; use global_strict)")
	}
	return nil
}

// RegionConfig configures NewRegionStore.
type RegionConfig struct {
	// Region names this region, as its peers know it.
	Region string
	// Redis is the region's own Redis: a *redis.Client, a Sentinel
	// failover client or a *redis.ClusterClient.
	Redis redis.UniversalClient
	// Peers are the other regions' Redis, by region name.
	Peers map[string]redis.UniversalClient
	// Home is the region whose Redis decides the ScopeGlobalStrict rules:
	// this region or one of Peers. Empty: global_strict rules are decided
	// in this region (only right with a single region).
	Home string
	// Hold is how long a peer's last known count is used once syncs to it
	// fail; after it, the peer counts as its share, Requests / regions
	// (rounded up), in every window until it is reachable again. 0 means
	// 5s.
	Hold time.Duration
	// Prefix namespaces the global counters; "" means "sluice:rg:".
	Prefix string
	// Redis is the configuration of the stores of the ScopeRegion and
	// ScopeGlobalStrict rules (NewRedisStore).
	RedisConfig RedisConfig
	// Now, if set, is the clock of global decisions made at the zero time
	// and of the syncer. nil: global decisions made at the zero time read
	// the clock of the region's Redis (TIME), the one clock of the
	// region's app servers, and the syncer runs on time.Now.
	Now func() time.Time
	// Manual, if set, starts no syncer: the caller calls Sync.
	Manual bool
}

// scopeSet is a rule's scope and interval.
type scopeSet struct {
	scope    Scope
	interval time.Duration
}

// RegionStore is a Store for app servers in several regions: the charges
// of ScopeRegion rules go to the region's Redis, those of ScopeGlobal
// rules to the region's Redis through the global counters (synced to the
// peers in the background), those of ScopeGlobalStrict rules to the home
// region's Redis. Make one with NewRegionStore. It is a Resetter (for
// global rules, see Reset) and an ObservableStore. A Take is all or nothing
// across global and regional charges; a request denied by a
// ScopeGlobalStrict limit stays counted by its ScopeRegion limits.
//
// A region's Redis restarted empty (no persistence) loses, for each
// global counter, the window's count of every region, C (at most the
// limit plus the bound of ScopeGlobal): the region decides again from
// zero, so each window open at the restart admits at most C over its
// limit. A peer's count comes back to the region with the peer's next
// push, a sync interval after the peer admits again (pushes carry counts
// that grew); the region's own count before the restart stays with the
// peers only, which keep the larger of it and the new one. Windows that
// start after the restart are as before (docs/redis.md, "A Redis
// restarted empty"; TestRestartedEmpty in internal/regions).
type RegionStore struct {
	cfg    RegionConfig
	fake   bool // cfg.Now was set: the zero time is cfg.Now, not TIME
	local  *RedisStore
	home   *RedisStore
	g      *regions.Store
	scopes atomic.Pointer[map[string]scopeSet]
	obs    observerSet
}

// NewRegionStore returns a RegionStore and, unless cfg.Manual, starts its
// syncer (ticking every 50 ms; each counter syncs at its rule's
// SyncInterval). Close stops it. Through NewRedisStore, it probes the
// region's Redis (docs/compatibility.md).
func NewRegionStore(cfg RegionConfig) (*RegionStore, error) {
	if cfg.Region == "" || cfg.Redis == nil {
		return nil, errors.New("sluice: RegionConfig: Region and Redis are required")
	}
	if cfg.Home != "" && cfg.Home != cfg.Region && cfg.Peers[cfg.Home] == nil {
		return nil, fmt.Errorf("sluice: RegionConfig: Home %q is neither the region nor a peer", cfg.Home)
	}
	if cfg.Prefix == "" {
		cfg.Prefix = "sluice:rg:"
	}
	s := &RegionStore{cfg: cfg, fake: cfg.Now != nil}
	if cfg.Now == nil {
		s.cfg.Now = time.Now
	}
	var err error
	if s.local, err = NewRedisStore(cfg.Redis, cfg.RedisConfig); err != nil {
		return nil, err
	}
	s.home = s.local
	if cfg.Home != "" && cfg.Home != cfg.Region {
		if s.home, err = NewRedisStore(cfg.Peers[cfg.Home], cfg.RedisConfig); err != nil {
			return nil, err
		}
	}
	s.g, err = regions.New(regions.Config{
		Region: cfg.Region, Local: cfg.Redis, Peers: cfg.Peers, Hold: cfg.Hold,
		Clock: func() int64 { return s.cfg.Now().UnixMilli() },
		Events: regions.Events{
			Synced: func(p string, lag time.Duration, n int) {
				s.send(RegionEvent{Kind: RegionSynced, Peer: p, Lag: lag, Counters: n})
			},
			Failed: func(p string, err error) { s.send(RegionEvent{Kind: RegionSyncFailed, Peer: p, Err: err}) },
			Unreachable: func(p string, down bool) {
				k := RegionPeerReachable
				if down {
					k = RegionPeerUnreachable
				}
				s.send(RegionEvent{Kind: k, Peer: p})
			},
			Dropped: func() { s.send(RegionEvent{Kind: RegionDropped}) },
		},
	}, s.cfg.Now().UnixMilli())
	if err != nil {
		return nil, fmt.Errorf("sluice: %w", err)
	}
	if !cfg.Manual {
		s.g.Run(50*time.Millisecond, func() int64 { return s.cfg.Now().UnixMilli() })
	}
	return s, nil
}

// Sync runs one tick of the syncer at now (the zero time: the store's
// clock): it writes the region's counts that are due to every peer. For
// tests and for stores made with Manual.
func (s *RegionStore) Sync(ctx context.Context, now time.Time) error {
	if now.IsZero() {
		now = s.cfg.Now()
	}
	return s.g.Sync(ctx, now.UnixMilli())
}

// Close stops the syncer and the stores' pipelines.
func (s *RegionStore) Close() error {
	s.g.Close()
	err := s.local.Close()
	if s.home != s.local {
		err = errors.Join(err, s.home.Close())
	}
	return err
}

// AddObserver has the store report its events (Region, and the
// StoreHealth and StoreBatch events of its Redis stores) to o until remove
// is called; see ObservableStore.
func (s *RegionStore) AddObserver(o Observer) (remove func()) {
	if o == nil {
		return func() {}
	}
	rm := []func(){s.obs.add(o), s.local.AddObserver(o)}
	if s.home != s.local {
		rm = append(rm, s.home.AddObserver(o))
	}
	return func() {
		for _, f := range rm {
			f()
		}
	}
}

// bindScopes gives the store the scopes of the rules of set.
func (s *RegionStore) bindScopes(set *ruleSet) {
	m := map[string]scopeSet{}
	for _, r := range set.rules {
		if r.Scope != ScopeRegion {
			m[r.Name] = scopeSet{scope: r.Scope, interval: r.SyncInterval}
			if r.usage != nil {
				m[r.usage.name] = m[r.Name] // its usage limits' counters
			}
		}
	}
	s.scopes.Store(&m)
}

func (s *RegionStore) send(e RegionEvent) {
	for _, o := range s.obs.load() {
		o.Region(e)
	}
}

// counter names a global counter, the same in every region.
func (s *RegionStore) counter(c *Charge) string {
	h := sha256.New()
	h.Write([]byte(c.Name))
	h.Write([]byte{0})
	h.Write([]byte(c.Key))
	h.Write([]byte{0, byte(c.Limit.Algorithm)})
	h.Write(strconv.AppendInt(nil, c.Limit.Window.Milliseconds(), 10))
	var b [32]byte
	return s.cfg.Prefix + hex.EncodeToString(h.Sum(b[:0])[:12])
}

var _ Resetter = (*RegionStore)(nil)

// scopesNow returns the scopes of the rules in force, by rule name.
func (s *RegionStore) scopesNow() map[string]scopeSet {
	if p := s.scopes.Load(); p != nil {
		return *p
	}
	return nil
}

// at is the instant of a global decision made at now (Unix ms): the zero
// time is the clock of the region's Redis (-1), unless the store was given
// a clock.
func (s *RegionStore) at(now time.Time) int64 {
	switch {
	case !now.IsZero():
		return now.UnixMilli()
	case s.fake:
		return s.cfg.Now().UnixMilli()
	}
	return -1
}

// global returns the global counter's charge of c, or an error if c's
// limit cannot be global.
func (s *RegionStore) global(c *Charge, sc scopeSet) (regions.Charge, error) {
	rc := regions.Charge{
		Counter: s.counter(c), Limit: int64(c.Limit.Requests), Window: c.Limit.Window.Milliseconds(),
		Sliding: c.Limit.Algorithm == SlidingWindow, Cost: int64(c.Cost), Interval: sc.interval,
	}
	if rc.Window <= 0 || globalSupports(c.Limit) != nil {
		return rc, fmt.Errorf("sluice: rule %q: limit %v cannot be global", c.Name, c.Limit)
	}
	return rc, nil
}

// Reset drops the counters the charges name: those of ScopeRegion rules
// in the region's Redis, those of ScopeGlobalStrict rules in the home
// region's, and those of ScopeGlobal rules in every region: the count
// known here of the current and previous windows is taken off, in this
// region at once and in the peers when the syncer carries it (within a
// tick plus the one-way delay); counts of other regions that had not
// reached this region yet stay counted. It implements Resetter.
func (s *RegionStore) Reset(ctx context.Context, charges []Charge) error {
	return s.split(charges, func(_ int, c *Charge, sc scopeSet) error {
		rc, err := s.global(c, sc)
		if err == nil {
			err = s.g.Reset(ctx, s.at(time.Time{}), rc)
		}
		return err
	}, func(st *RedisStore, cs []Charge, _ []int) error { return st.Reset(ctx, cs) })
}

// Take decides charges at one instant; see RegionStore and Store.
func (s *RegionStore) Take(ctx context.Context, now time.Time, charges []Charge, out []Decision) (bool, error) {
	ok, _, err := s.take(ctx, now, charges, out)
	return ok, err
}

// take is Take that also returns the instant it decided at, on the clock
// of the Redis that decided (Unix ms; 0 if none did): the region's own,
// or the home region's for a request of ScopeGlobalStrict charges only.
func (s *RegionStore) take(ctx context.Context, now time.Time, charges []Charge, out []Decision) (bool, int64, error) {
	scopes := s.scopesNow()
	var global, strict, local []int
	for i := range charges {
		switch scopes[charges[i].Name].scope {
		case ScopeGlobal:
			global = append(global, i)
		case ScopeGlobalStrict:
			strict = append(strict, i)
		default:
			local = append(local, i)
		}
	}
	if len(global) == 0 && len(strict) == 0 {
		ok, at, err := s.local.TakeAt(ctx, now, charges, out)
		return ok, at.UnixMilli(), err
	}
	ms := s.at(now)
	type taken struct {
		c regions.Charge
		d regions.Decision
	}
	var admitted []taken
	refund := func() {
		for _, t := range admitted {
			_ = s.g.Refund(context.WithoutCancel(ctx), t.c, t.d)
		}
	}
	ok := true
	var at int64
	for _, i := range global {
		c := &charges[i]
		rc, err := s.global(c, scopes[c.Name])
		if err != nil {
			refund()
			return false, 0, err
		}
		d, err := s.g.Decide(ctx, ms, rc)
		if err != nil {
			refund()
			return false, 0, err
		}
		if at == 0 {
			at = d.Now
		}
		out[i] = globalDecision(rc, d, d.Now)
		if d.Allowed && rc.Cost > 0 {
			admitted = append(admitted, taken{rc, d})
		}
		ok = ok && d.Allowed
	}
	if !ok {
		refund()
		return false, at, nil
	}
	for _, g := range [2]struct {
		idx []int
		st  *RedisStore
	}{{local, s.local}, {strict, s.home}} {
		if len(g.idx) == 0 {
			continue
		}
		sub := make([]Charge, len(g.idx))
		subOut := make([]Decision, len(g.idx))
		for j, i := range g.idx {
			sub[j] = charges[i]
		}
		ok, when, err := g.st.TakeAt(ctx, now, sub, subOut)
		if at == 0 && err == nil {
			at = when.UnixMilli()
		}
		for j, i := range g.idx {
			out[i] = subOut[j]
		}
		if err != nil || !ok {
			refund()
			return false, at, err
		}
	}
	return true, at, nil
}

// globalDecision describes a global decision at now (Unix ms).
func globalDecision(c regions.Charge, d regions.Decision, now int64) Decision {
	end := d.Start + c.Window
	reset := end - now
	if c.Sliding {
		reset += c.Window
	}
	out := Decision{Allowed: d.Allowed, Remaining: int(max(0, c.Limit-d.Total)), ResetAfter: time.Duration(reset) * time.Millisecond, Debt: int(max(0, d.Total-c.Limit))}
	switch {
	case d.Allowed && d.Total > 0:
		out.NextAfter = time.Duration(end-now) * time.Millisecond
	case !d.Allowed && c.Cost > c.Limit:
		out.RetryAfter = -1
		out.NextAfter = time.Duration(end-now) * time.Millisecond
	case !d.Allowed:
		out.RetryAfter = time.Duration(end-now) * time.Millisecond
		out.NextAfter = out.RetryAfter
	}
	return out
}

// RegionEventKind is what a RegionEvent reports.
type RegionEventKind uint8

// The kinds of RegionEvent.
const (
	// RegionSynced: a sync to Peer succeeded; Lag is how long it took
	// and Counters how many counts it carried.
	RegionSynced RegionEventKind = iota + 1
	// RegionSyncFailed: a sync to Peer failed with Err.
	RegionSyncFailed
	// RegionPeerUnreachable: syncs to Peer have failed for longer than
	// RegionConfig.Hold; it now counts as its share.
	RegionPeerUnreachable
	// RegionPeerReachable: a sync to an unreachable Peer succeeded.
	RegionPeerReachable
	// RegionDropped: a global counter was not synced, because too many
	// were.
	RegionDropped
)

var regionKindNames = [...]string{RegionSynced: "synced", RegionSyncFailed: "sync_failed", RegionPeerUnreachable: "peer_unreachable", RegionPeerReachable: "peer_reachable", RegionDropped: "dropped"}

// String returns the kind's name, such as "peer_unreachable".
func (k RegionEventKind) String() string {
	if int(k) < len(regionKindNames) && regionKindNames[k] != "" {
		return regionKindNames[k]
	}
	return "RegionEventKind(" + strconv.Itoa(int(k)) + ")"
}

// RegionEvent reports what the syncer of a RegionStore did
// (Observer.Region), on the syncer's goroutine.
type RegionEvent struct {
	Kind RegionEventKind
	// Peer is the peer region, for every kind but RegionDropped.
	Peer     string
	Lag      time.Duration
	Counters int
	Err      error
}
