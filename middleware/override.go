package middleware

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/headers"
	"github.com/sluicehq/sluice/internal/headerwrite"
	"github.com/sluicehq/sluice/internal/redisstore"
)

// Override replaces the limits of one rule for one client, at run time:
// a customer whose plan changed, a partner allowed more for a day, a
// client throttled harder while an incident lasts. See
// Limiter.SetOverride.
type Override struct {
	// Rule is the rule's name and Key the client's key as the rule's key
	// function produces it ("ip:192.0.2.1", "user:alice").
	Rule, Key string
	// Limits replace the rule's limits (or its LimitsFunc's) for this
	// client. They are checked as a rule's limits are, against the rule.
	Limits []Limit
	// Until is when the override ends; the zero time means never (until
	// it is removed).
	Until time.Time
}

// DefaultMaxOverrides bounds the overrides a Limiter holds
// (WithMaxOverrides); with Redis, the bound is the fleet's.
const DefaultMaxOverrides = 100_000

// DefaultClientSync is how often a Limiter on a shared store (Redis)
// checks whether the overrides or bans of the fleet changed: an override
// set, or a ban lifted, on one app server applies on every other within
// this time (plus a round trip).
const DefaultClientSync = time.Second

// ErrTooManyOverrides is returned by SetOverride when the limiter (or, on
// Redis, the fleet) holds WithMaxOverrides overrides already.
var ErrTooManyOverrides = errors.New("sluice: too many overrides")

// WithMaxOverrides bounds the overrides the limiter holds (on Redis, the
// fleet); SetOverride refuses more. The default is DefaultMaxOverrides.
func WithMaxOverrides(n int) Option {
	return func(c *config) {
		if n < 1 {
			c.errorf("WithMaxOverrides: %d must be at least 1", n)
			return
		}
		c.maxOverrides = n
	}
}

// WithClientSync sets how often a Limiter on a shared store checks whether
// the fleet's overrides or bans changed (see DefaultClientSync); each
// check is one small read of one key. It must be at least 10ms.
func WithClientSync(d time.Duration) Option {
	return func(c *config) {
		if d < 10*time.Millisecond {
			c.errorf("WithClientSync: %s must be at least 10ms", d)
			return
		}
		c.clientSync = d
	}
}

// clientState holds the bans and overrides of a Limiter.
type clientState struct {
	bans      banTable
	overrides overrideTable
	// shared is the store's, when it keeps them for the fleet.
	shared sharedState
	// version is the shared version last loaded, and loaded whether one
	// was.
	version atomic.Int64
	loaded  atomic.Bool
	// gen counts the changes this Limiter made to its overrides, so that
	// a reload read before one does not undo it.
	gen atomic.Int64
	// reportMu makes reports to observers one at a time, each counting
	// what is in force when it is made, so that a report that started
	// before a change cannot be told after the change's own.
	reportMu sync.Mutex
	stopOnce sync.Once
	stop     chan struct{}
	done     chan struct{}
}

// overrideTable holds the overrides in force, by rule and key.
type overrideTable struct {
	mu sync.RWMutex
	n  atomic.Int64 // len(m), read without the lock
	m  map[clientID]*override
}

// override is an Override with its limits compiled for the rule in force
// (recompiled when the rules are replaced).
type override struct {
	o        Override
	compiled atomic.Pointer[compiledLimits]
}

// compiledLimits are limits compiled for a rule, as compileRule compiles
// its own.
type compiledLimits struct {
	rule     *compiledRule
	limits   []Limit
	nominal  []Limit
	names    []string
	policy   string
	prepared []*headerwrite.Prepared
	err      error
}

// compileLimits checks limits against rule c and compiles them.
func compileLimits(c *compiledRule, limits []Limit) *compiledLimits {
	cl := &compiledLimits{rule: c}
	fail := func(format string, args ...any) *compiledLimits {
		cl.err = fmt.Errorf("sluice: override of rule %q: "+format, append([]any{c.Name}, args...)...)
		return cl
	}
	switch {
	case c.Deny:
		return fail("a Deny rule has no limits to override")
	case len(limits) == 0:
		return fail("no limits")
	}
	windows := map[string]bool{}
	ps := make([]headers.Policy, 0, len(limits))
	for _, l := range limits {
		if err := l.Validate(); err != nil {
			return fail("%v", err)
		}
		if w := windowName(l); windows[w] {
			return fail("two limits with window %s; one limit per window", w)
		} else {
			windows[w] = true
		}
		if c.Cost > l.Capacity() {
			return fail("cost %d exceeds limit %s: no request could ever pass", c.Cost, l)
		}
		if l.Ceiling > 0 {
			return fail("limit %s: an override has no ceiling", l)
		}
		if !c.Count.IsZero() {
			if err := refundable(l); err != nil {
				return fail("%v", err)
			}
		}
		eff, err := withOverage(l, c.Overage)
		if err != nil {
			return fail("%v", err)
		}
		cl.limits = append(cl.limits, eff)
		cl.nominal = append(cl.nominal, l)
	}
	for _, l := range cl.nominal {
		name := policyName(c.Name, l, len(cl.nominal))
		cl.names = append(cl.names, name)
		ps = append(ps, policyOf(name, l))
		cl.prepared = append(cl.prepared, headerwrite.Prepare(name, l.Capacity()))
	}
	cl.policy = headers.FormatPolicies(ps...)
	return cl
}

// overrideFor returns the compiled override of rule for key, if one is in
// force.
func (l *Limiter) overrideFor(rule *compiledRule, key string) *compiledLimits {
	t := &l.clients.overrides
	t.mu.RLock()
	o := t.m[clientID{rule.Name, key}]
	t.mu.RUnlock()
	if o == nil {
		return nil
	}
	if !o.o.Until.IsZero() {
		now := time.Now()
		if l.cfg.clock != nil {
			now = l.cfg.clock()
		}
		if !now.Before(o.o.Until) {
			return nil
		}
	}
	cl := o.compiled.Load()
	if cl == nil || cl.rule != rule {
		// The rules were replaced since: compile against the new rule.
		cl = compileLimits(rule, o.o.Limits)
		o.compiled.Store(cl)
		if cl.err != nil {
			l.cfg.report(nil, cl.err)
		}
	}
	if cl.err != nil {
		return nil
	}
	return cl
}

// SetOverride replaces the limits of o.Rule for the client o.Key until
// o.Until (the zero time for good), at once for this Limiter and, with a
// shared store (Redis), for every Limiter of the fleet within the sync
// interval (WithClientSync). Overrides survive SetRules: an override
// applies as long as a rule of its name exists, compiled against the rule
// in force (its overage, cost and name).
//
// SetOverride returns an error, and changes nothing, for an unknown rule
// (ErrUnknownRule), an empty key, limits that are invalid or do not suit
// the rule (none, two with one window, a cost above one, one that cannot be
// given back for a rule that counts by outcome), an end in the past, or
// when the limiter holds WithMaxOverrides overrides already
// (ErrTooManyOverrides).
func (l *Limiter) SetOverride(ctx context.Context, o Override) error {
	rule, err := l.ruleNamed(o.Rule)
	if err != nil {
		return err
	}
	if o.Key == "" {
		return fmt.Errorf("sluice: override of rule %q: empty key", o.Rule)
	}
	o.Limits = slices.Clone(o.Limits)
	cl := compileLimits(rule, o.Limits)
	if cl.err != nil {
		return cl.err
	}
	now := l.localNow(l.clock())
	if !o.Until.IsZero() && !o.Until.After(now) {
		return fmt.Errorf("sluice: override of rule %q: it ends at %s, already past", o.Rule, o.Until.Format(time.RFC3339))
	}
	if sh := l.clients.shared; sh != nil {
		v, err := encodeLimits(o.Limits)
		if err != nil {
			return err
		}
		if err := sh.setOverride(ctx, now, o.Rule, o.Key, v, o.Until, l.cfg.maxOverrides); err != nil {
			if isTooMany(err) {
				return fmt.Errorf("%w: %d held", ErrTooManyOverrides, l.cfg.maxOverrides)
			}
			return fmt.Errorf("%w: %w", ErrStore, err)
		}
	}
	l.clients.gen.Add(1) // before the change: a reload that read before it is dropped
	if err := l.clients.overrides.put(&override{o: o}, cl, now, l.cfg.maxOverrides); err != nil {
		return err
	}
	l.reportClientState()
	return nil
}

// put adds or replaces o, compiled as cl, unless the table holds max
// overrides in force already and o is new.
func (t *overrideTable) put(o *override, cl *compiledLimits, now time.Time, max int) error {
	o.compiled.Store(cl)
	t.mu.Lock()
	defer t.mu.Unlock()
	id := clientID{o.o.Rule, o.o.Key}
	if _, ok := t.m[id]; !ok && len(t.m) >= max {
		t.dropEnded(now)
		if len(t.m) >= max {
			return fmt.Errorf("%w: %d held", ErrTooManyOverrides, max)
		}
	}
	if t.m == nil {
		t.m = map[clientID]*override{}
	}
	t.m[id] = o
	t.n.Store(int64(len(t.m)))
	return nil
}

// dropEnded drops the overrides that ended before now; t.mu is held.
func (t *overrideTable) dropEnded(now time.Time) {
	for id, o := range t.m {
		if !o.o.Until.IsZero() && !now.Before(o.o.Until) {
			delete(t.m, id)
		}
	}
	t.n.Store(int64(len(t.m)))
}

// Override returns the override of rule for key, if one is in force.
func (l *Limiter) Override(rule, key string) (Override, bool) {
	t := &l.clients.overrides
	t.mu.RLock()
	o := t.m[clientID{rule, key}]
	t.mu.RUnlock()
	if o == nil || !o.o.Until.IsZero() && !l.localNow(l.clock()).Before(o.o.Until) {
		return Override{}, false
	}
	out := o.o
	out.Limits = slices.Clone(out.Limits)
	return out, true
}

// Overrides returns the overrides in force, by rule and key.
func (l *Limiter) Overrides() []Override {
	now := l.localNow(l.clock())
	t := &l.clients.overrides
	t.mu.RLock()
	out := make([]Override, 0, len(t.m))
	for _, o := range t.m {
		if o.o.Until.IsZero() || now.Before(o.o.Until) {
			c := o.o
			c.Limits = slices.Clone(c.Limits)
			out = append(out, c)
		}
	}
	t.mu.RUnlock()
	slices.SortFunc(out, func(a, b Override) int {
		if a.Rule != b.Rule {
			return compareStrings(a.Rule, b.Rule)
		}
		return compareStrings(a.Key, b.Key)
	})
	return out
}

func compareStrings(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// RemoveOverride removes the override of rule for key, here and, with a
// shared store, for the fleet, and reports whether there was one.
func (l *Limiter) RemoveOverride(ctx context.Context, rule, key string) (bool, error) {
	t := &l.clients.overrides
	l.clients.gen.Add(1) // before the change, as in SetOverride
	t.mu.Lock()
	_, was := t.m[clientID{rule, key}]
	delete(t.m, clientID{rule, key})
	t.n.Store(int64(len(t.m)))
	t.mu.Unlock()
	if sh := l.clients.shared; sh != nil {
		ok, err := sh.removeOverride(ctx, rule, key)
		if err != nil {
			return was, fmt.Errorf("%w: %w", ErrStore, err)
		}
		was = was || ok
	}
	l.reportClientState()
	return was, nil
}

// clock returns the limiter's clock's now, or the zero time.
func (l *Limiter) clock() time.Time {
	if l.cfg.clock != nil {
		return l.cfg.clock()
	}
	return time.Time{}
}

// startClientSync starts following the fleet's overrides and bans when the
// store keeps them, or reporting the counts to observers that want them.
func (l *Limiter) startClientSync() {
	cs := &l.clients
	cs.bans.max = DefaultMaxBans
	if sh, ok := l.cfg.store.(sharedState); ok {
		cs.shared = sh
	} else if !l.wantsClientState() {
		return
	} else {
		l.reportClientState() // the gauges exist from the start
	}
	cs.stop, cs.done = make(chan struct{}), make(chan struct{})
	go l.syncLoop(cs.stop, cs.done)
}

// stopClientSync stops the sync loop, if it runs.
func (l *Limiter) stopClientSync() {
	cs := &l.clients
	cs.stopOnce.Do(func() {
		if cs.stop != nil {
			close(cs.stop)
			<-cs.done
		}
	})
}

func (l *Limiter) syncLoop(stop, done chan struct{}) {
	defer close(done)
	every := l.cfg.clientSync
	if every == 0 {
		every = DefaultClientSync
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		l.syncOnce(every)
		select {
		case <-stop:
			return
		case <-t.C:
		}
	}
}

// syncOnce reloads the fleet's overrides if they changed, forgetting the
// bans seen so far (one may have been lifted), and reports the counts.
func (l *Limiter) syncOnce(timeout time.Duration) {
	cs := &l.clients
	if sh := cs.shared; sh != nil {
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		v, err := sh.adminVersion(ctx)
		if err != nil {
			// Retried at the next interval; the store's health events
			// tell of the outage.
			return
		}
		if !cs.loaded.Load() || v != cs.version.Load() {
			if err := l.loadOverrides(ctx); err != nil {
				return // retried at the next interval
			}
			for _, k := range cs.bans.clear() {
				if dc := l.cfg.denyCache; dc != nil {
					dc.Forget(k)
				}
			}
		}
	}
	l.reportClientState()
}

// loadOverrides replaces the overrides with the fleet's.
func (l *Limiter) loadOverrides(ctx context.Context) error {
	cs := &l.clients
	gen := cs.gen.Load()
	v, list, err := cs.shared.loadOverrides(ctx)
	if err != nil {
		return fmt.Errorf("%w: load the overrides: %w", ErrStore, err)
	}
	now := l.localNow(l.clock())
	m := make(map[clientID]*override, len(list))
	for _, so := range list {
		if !so.Until.IsZero() && !now.Before(so.Until) {
			continue
		}
		limits, err := decodeLimits(so.Value)
		if err != nil {
			l.cfg.report(nil, fmt.Errorf("sluice: override of rule %q: %w", so.Rule, err))
			continue
		}
		m[clientID{so.Rule, so.Key}] = &override{o: Override{Rule: so.Rule, Key: so.Key, Limits: limits, Until: so.Until}}
	}
	t := &cs.overrides
	t.mu.Lock()
	if cs.gen.Load() != gen {
		// This Limiter changed an override while the fleet's were read:
		// they may not include the change. The next sync reads them again
		// (the change moved the version on).
		t.mu.Unlock()
		return nil
	}
	t.m = m
	t.n.Store(int64(len(m)))
	t.mu.Unlock()
	cs.version.Store(v)
	cs.loaded.Store(true)
	return nil
}

func (l *Limiter) wantsClientState() bool { return l.cfg.obs != nil }

// reportClientState tells the observers how many overrides and bans are in
// force.
func (l *Limiter) reportClientState() {
	if !l.wantsClientState() {
		return
	}
	l.clients.reportMu.Lock()
	defer l.clients.reportMu.Unlock()
	var bans int
	if sh := l.clients.shared; sh != nil {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_, n, err := sh.bans(ctx, l.clock(), 0)
		cancel()
		if err != nil {
			return
		}
		bans = n
	} else {
		bans = len(l.clients.bans.list(l.localNow(l.clock()).UnixMilli()))
	}
	l.cfg.obs.ClientState(len(l.Overrides()), bans)
}

// limitJSON is a Limit as overrides are kept in a shared store.
type limitJSON struct {
	Requests   int    `json:"requests"`
	WindowMs   int64  `json:"window_ms,omitempty"`
	Algorithm  uint8  `json:"algorithm,omitempty"`
	Burst      int    `json:"burst,omitempty"`
	Period     uint8  `json:"period,omitempty"`
	TimeZone   string `json:"time_zone,omitempty"`
	MaxLog     int    `json:"max_log,omitempty"`
	MaxDelayMs int64  `json:"max_delay_ms,omitempty"`
	BanMs      int64  `json:"ban_ms,omitempty"`
}

func encodeLimits(limits []Limit) ([]byte, error) {
	out := make([]limitJSON, len(limits))
	for i, l := range limits {
		out[i] = limitJSON{Requests: l.Requests, WindowMs: l.Window.Milliseconds(), Algorithm: uint8(l.Algorithm), Burst: l.Burst,
			Period: uint8(l.Period), MaxLog: l.MaxLog, MaxDelayMs: l.MaxDelay.Milliseconds(), BanMs: l.Ban.Milliseconds()}
		if l.Location != nil {
			out[i].TimeZone = l.Location.String()
		}
	}
	return json.Marshal(out)
}

func decodeLimits(b []byte) ([]Limit, error) {
	var in []limitJSON
	if err := json.Unmarshal(b, &in); err != nil {
		return nil, err
	}
	out := make([]Limit, len(in))
	for i, j := range in {
		l := Limit{Requests: j.Requests, Window: time.Duration(j.WindowMs) * time.Millisecond, Algorithm: Algorithm(j.Algorithm),
			Burst: j.Burst, Period: Period(j.Period), MaxLog: j.MaxLog, MaxDelay: time.Duration(j.MaxDelayMs) * time.Millisecond,
			Ban: time.Duration(j.BanMs) * time.Millisecond}
		if j.TimeZone != "" {
			loc, err := time.LoadLocation(j.TimeZone)
			if err != nil {
				return nil, err
			}
			l.Location = loc
		}
		if err := l.Validate(); err != nil {
			return nil, err
		}
		out[i] = l
	}
	return out, nil
}

func isTooMany(err error) bool { return errors.Is(err, redisstore.ErrTooManyOverrides) }
