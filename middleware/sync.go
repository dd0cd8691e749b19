package middleware

import (
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/internal/fleet"
	"github.com/sluicehq/sluice/internal/fleetstore"
	"github.com/sluicehq/sluice/internal/redisstore"
	"github.com/sluicehq/sluice/internal/window"
)

// SyncMode is how the app servers that share a Redis store coordinate the
// counters of a rule (Rule.Sync). docs/fleet.md compares the modes, with
// their bounds and measurements.
type SyncMode uint8

// The coordination modes.
const (
	// SyncExact decides every request in Redis, in one atomic script call:
	// the fleet admits exactly what one server would. The default.
	SyncExact SyncMode = iota
	// SyncLease has each app server reserve a slice of the remaining
	// budget of a busy counter in Redis, in one atomic call, and spend it
	// in memory; what it did not use goes back when the slice ends (one
	// SyncInterval when it was granted near the limit, ten far from it,
	// and never past the end of the window it was counted in) or the
	// counter goes idle. A slice is at most Lease units and at most
	// remaining / (2 × app servers holding slices), falling to 1 near the
	// limit. A counter not used for two intervals is decided exactly, in
	// one call, as in SyncExact.
	//
	// Bound: the fleet never admits more than exact mode would for the
	// same admissions (per window: at most the limit for sliding and fixed
	// windows; for a token bucket, at most Requests × SyncInterval / Window
	// more than the bucket, since a slice may be spent up to one interval
	// after the tokens were taken). The price is false denials, requests
	// denied while other servers still held unused slices: at most
	// (app servers − 1) × Lease per window.
	//
	// A Redis restarted empty (no persistence) loses the count c of each
	// counter, slices counted in; the servers spend what their slices had
	// left, then lease from zero: per window open at the restart, at most c
	// (≤ the limit) over the limit (docs/redis.md, "A Redis restarted
	// empty"; TestEmptyRestart).
	SyncLease
	// SyncWriteBack has each app server count in memory and push its
	// deltas (per counter and window) to Redis every SyncInterval, or at
	// once, waiting for the answer, when a counter's unsynced count
	// reaches MaxUnsynced; it decides from the fleet's count as last
	// synced plus its own unsynced count. A counter this server has not
	// synced for two intervals (or ever) is decided from that view as it
	// is, without a call, while it is far from the limit and within this
	// server's share of the bound (each server's units admitted so, plus
	// the most it held unsynced, stay within MaxUnsynced per window); its
	// counts are then pushed once they reach MaxUnsynced / 2 or their
	// window ends, so that a counter used now and then costs a push per
	// window rather than a call per request.
	//
	// Bound: per window, at most app servers × MaxUnsynced over the limit,
	// plus what the fleet admits in one SyncInterval. An app server that
	// dies loses at most its unsynced counts: MaxUnsynced per counter.
	//
	// A Redis restarted empty (no persistence) loses the fleet's count c
	// of each counter (≤ the limit plus the bound above); the unsynced
	// counts are pushed into the new counter, and each server's view drops
	// to it at its next push: per window open at the restart, at most c
	// over the limit, plus the bound above in the new counter
	// (docs/redis.md, "A Redis restarted empty"; TestEmptyRestart).
	SyncWriteBack
)

// String returns the mode as the rules file spells it: "exact", "lease"
// or "write_back".
func (m SyncMode) String() string { return fleet.Mode(m).String() }

// ParseSyncMode returns the mode spelled s ("exact", "lease" or
// "write_back").
func ParseSyncMode(s string) (SyncMode, error) {
	m, ok := fleet.ParseMode(s)
	if !ok {
		return SyncExact, fmt.Errorf("unknown sync mode %q (want exact, lease or write_back)", s)
	}
	return SyncMode(m), nil
}

// Defaults of the coordination settings.
const (
	// DefaultLease is the largest slice of a lease when Rule.Lease is 0:
	// at 1,000 requests a second per server on one counter, about one
	// Redis call per 100 decisions (BENCHMARKS.md).
	DefaultLease = fleetstore.DefaultLease
	// DefaultSyncInterval is Rule.SyncInterval when it is 0.
	DefaultSyncInterval = fleetstore.DefaultSyncInterval
	// MaxMaxUnsynced is the default MaxUnsynced's largest value: 0 means
	// Requests / 10, at least 1 and at most this.
	MaxMaxUnsynced = fleetstore.DefaultMaxUnsynced
)

// compileSync checks the coordination settings of rule c.
func (c *compiledRule) compileSync() error {
	r := &c.Rule
	switch r.Sync {
	case SyncExact:
		switch {
		case r.Lease != 0:
			return fmt.Errorf("lease applies only to sync: lease")
		case r.SyncInterval != 0 && r.Scope != ScopeGlobal:
			return fmt.Errorf("sync_interval applies only to sync: lease, sync: write_back and scope: global")
		case r.MaxUnsynced != 0:
			return fmt.Errorf("max_unsynced applies only to sync: write_back")
		}
		return nil
	case SyncLease, SyncWriteBack:
	default:
		return fmt.Errorf("sync: unknown mode %d", r.Sync)
	}
	switch {
	case r.Lease < 0 || r.Lease > 1<<30:
		return fmt.Errorf("lease %d must be between 1 and 2^30, or 0 for %d", r.Lease, DefaultLease)
	case r.Lease != 0 && r.Sync != SyncLease:
		return fmt.Errorf("lease applies only to sync: lease")
	case r.MaxUnsynced < 0 || r.MaxUnsynced > 1<<30:
		return fmt.Errorf("max_unsynced %d must be between 1 and 2^30, or 0 for the default", r.MaxUnsynced)
	case r.MaxUnsynced != 0 && r.Sync != SyncWriteBack:
		return fmt.Errorf("max_unsynced applies only to sync: write_back")
	case !r.Count.IsZero():
		return fmt.Errorf("sync: %s: a rule with count is decided exactly (its charges may be given back after the response)", r.Sync)
	case r.SyncInterval < 0 || r.SyncInterval%time.Millisecond != 0 || r.SyncInterval > time.Hour:
		return fmt.Errorf("sync_interval %s must be a whole number of milliseconds up to 1h, or 0 for %s", r.SyncInterval, DefaultSyncInterval)
	}
	for i, l := range r.Limits {
		if !fleet.Supports(window.Algorithm(l.Algorithm)) {
			return fmt.Errorf("sync: %s: limits[%d] is a %s, which is always decided exactly (sync: lease and write_back take sliding_window, fixed_window and token_bucket)", r.Sync, i, l.Algorithm)
		}
	}
	if u := r.Usage; u != nil {
		for i, l := range u.Limits {
			if !fleet.Supports(window.Algorithm(l.Algorithm)) {
				return fmt.Errorf("sync: %s: usage.limits[%d] is a %s, which is always decided exactly (sync: lease and write_back take sliding_window, fixed_window and token_bucket)", r.Sync, i, l.Algorithm)
			}
		}
	}
	if r.Concurrency > 0 && len(r.Limits) == 0 && r.LimitsFunc == nil {
		return fmt.Errorf("sync: %s: the rule has only a concurrency limit, which is always decided exactly", r.Sync)
	}
	return nil
}

// syncLayer is the coordination layer of a Limiter whose rules use lease
// or write-back mode, made on first need.
type syncLayer struct {
	mu     sync.Mutex
	store  atomic.Pointer[fleetstore.Store]
	closed bool // by Limiter.Close: no layer is made again
	// last is the syncer's last run that made calls, for Health.
	last atomic.Pointer[SyncHealth]
}

// fleetBacked is implemented by stores that can carry the coordination
// layer: RedisStore, and stores that embed it.
type fleetBacked interface {
	fleetBackend() *redisstore.Store
}

// bindSync gives the coordination layer the settings of the rules of set,
// making the layer on first need. Only the Redis store made by
// NewRedisStore has one: with another store, every rule is decided
// exactly, whatever its mode.
func (l *Limiter) bindSync(set *ruleSet) error {
	rules := map[string]fleetstore.Settings{}
	for _, r := range set.rules {
		if r.Sync != SyncExact {
			set := fleetstore.Settings{Mode: fleet.Mode(r.Sync), Lease: r.Lease, SyncInterval: r.SyncInterval, MaxUnsynced: r.MaxUnsynced}
			rules[r.Name] = set
			if r.usage != nil {
				rules[r.usage.name] = set // its usage limits' counters
			}
		}
	}
	sl := &l.syncs
	sl.mu.Lock()
	defer sl.mu.Unlock()
	fs := sl.store.Load()
	if fs == nil {
		if len(rules) == 0 || sl.closed {
			// After Close no syncer starts: every mode decides exactly.
			return nil
		}
		fb, ok := l.cfg.store.(fleetBacked)
		if !ok {
			// One process counts alone (the in-memory store) or the store
			// coordinates itself: every mode decides exactly.
			return nil
		}
		var err error
		fs, err = fleetstore.New(fleetstore.Config{
			Backend: fb.fleetBackend(), Exact: fb.fleetBackend(), ID: redisstore.FleetID, Wait: fb.fleetBackend().Timeout(),
			MaxKeys: l.cfg.syncMaxKeys, Now: l.cfg.clock, Events: l.syncEvents(), Manual: l.cfg.syncManual,
		})
		if err != nil {
			return fmt.Errorf("sluice: %w", err)
		}
		sl.store.Store(fs)
	}
	fs.SetRules(rules)
	return nil
}

// stopSync pushes what is unsynced, gives back what is leased and stops
// the syncer.
func (l *Limiter) stopSync() {
	sl := &l.syncs
	sl.mu.Lock()
	sl.closed = true
	fs := sl.store.Load()
	sl.mu.Unlock()
	if fs != nil {
		fs.Close()
	}
}

// SyncEventKind is what a SyncEvent reports.
type SyncEventKind uint8

// The kinds of SyncEvent.
const (
	// SyncUnsynced: Units admitted in write-back mode and not pushed yet.
	SyncUnsynced SyncEventKind = iota + 1
	// SyncFlushed: one run of the syncer made Calls calls to Redis, which
	// took Duration, with Err the first error (nil if none).
	SyncFlushed
	// SyncLeaseGranted: a lease granted Units.
	SyncLeaseGranted
	// SyncGaveBack: Units of a slice were not used and went back.
	SyncGaveBack
	// SyncDropped: Units of deltas or slices of counters evicted from the
	// local table were dropped, because too many waited for the syncer or
	// Redis failed.
	SyncDropped
)

var syncKindNames = [...]string{SyncUnsynced: "unsynced", SyncFlushed: "flushed", SyncLeaseGranted: "lease_granted", SyncGaveBack: "gave_back", SyncDropped: "dropped"}

// String returns the kind's name, such as "lease_granted".
func (k SyncEventKind) String() string {
	if int(k) < len(syncKindNames) && syncKindNames[k] != "" {
		return syncKindNames[k]
	}
	return fmt.Sprintf("SyncEventKind(%d)", k)
}

// SyncEvent reports what the coordination layer of rules in lease or
// write-back mode did (Observer.Synced).
type SyncEvent struct {
	Kind SyncEventKind
	// Rule is the rule, for every kind but SyncFlushed.
	Rule string
	// Units is how many cost units the event is about.
	Units int64
	// Calls, Duration and Err describe a SyncFlushed run.
	Calls    int
	Duration time.Duration
	Err      error
}

// syncEvents passes the layer's events on to the observers, and the
// syncer's runs to Health.
func (l *Limiter) syncEvents() fleetstore.Events {
	o := l.cfg.obs
	if o == nil {
		return fleetstore.Events{Flushed: l.syncs.flushed}
	}
	send := o.Synced
	units := func(k SyncEventKind) func(string, int64) {
		return func(rule string, n int64) { send(SyncEvent{Kind: k, Rule: rule, Units: n}) }
	}
	return fleetstore.Events{
		Unsynced: units(SyncUnsynced),
		Granted:  units(SyncLeaseGranted),
		GaveBack: units(SyncGaveBack),
		Dropped:  units(SyncDropped),
		Flushed: func(calls int, d time.Duration, err error) {
			l.syncs.flushed(calls, d, err)
			send(SyncEvent{Kind: SyncFlushed, Calls: calls, Duration: d, Err: err})
		},
	}
}

// WithSyncMaxKeys bounds how many counters of rules in lease or
// write-back mode each app server keeps in memory (0 means 1,048,576);
// beyond it, the least recently used of a few drawn at random is dropped,
// after its unsynced counts are pushed and its slice given back.
func WithSyncMaxKeys(n int) Option {
	return func(c *config) {
		if n < 0 {
			c.errorf("WithSyncMaxKeys: %d is negative", n)
			return
		}
		c.syncMaxKeys = n
	}
}
