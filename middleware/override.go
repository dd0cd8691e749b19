package middleware

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/headers"
	"github.com/sluicehq/sluice/internal/clients"
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
	// exact: the limits were learned of an upstream (learnedLimits), and
	// are decided in the store whatever the rule's Sync mode.
	exact bool
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

// overrideFor returns the compiled limits that replace rule's for key, if
// any: the client's override in force, lowered to what the Limiter
// learned of the upstream (learned.go) if it learned less.
func (l *Limiter) overrideFor(rule *compiledRule, key string) *compiledLimits {
	base := l.operatorOverride(rule, key)
	if l.clients.overrides.Others() > 0 {
		if cl := l.learnedLimits(rule, key, base); cl != nil {
			return cl
		}
	}
	return base
}

// operatorOverride returns the compiled override of rule for key, if one
// is in force (SetOverride).
func (l *Limiter) operatorOverride(rule *compiledRule, key string) *compiledLimits {
	e := l.clients.overrides.Get(clients.ID{Rule: rule.Name, Key: key})
	if e == nil || !e.Until.IsZero() && !e.Live(l.localNow(l.clock())) {
		return nil
	}
	o := e.V
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
		v, err := clients.EncodeLimits(internalLimits(o.Limits))
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
	ov := &override{o: o}
	ov.compiled.Store(cl)
	if !l.clients.overrides.Put(&clients.Entry[*override]{ID: clients.ID{Rule: o.Rule, Key: o.Key}, Until: o.Until, V: ov}, now, l.cfg.maxOverrides) {
		return fmt.Errorf("%w: %d held", ErrTooManyOverrides, l.cfg.maxOverrides)
	}
	l.reportClientState()
	return nil
}

// Override returns the override of rule for key, if one is in force.
func (l *Limiter) Override(rule, key string) (Override, bool) {
	e := l.clients.overrides.Get(clients.ID{Rule: rule, Key: key})
	if e == nil || !e.Live(l.localNow(l.clock())) {
		return Override{}, false
	}
	out := e.V.o
	out.Limits = slices.Clone(out.Limits)
	return out, true
}

// Overrides returns the overrides in force, by rule and key.
func (l *Limiter) Overrides() []Override {
	list := l.clients.overrides.List(l.localNow(l.clock()))
	out := make([]Override, len(list))
	for i, e := range list {
		out[i] = e.V.o
		out[i].Limits = slices.Clone(out[i].Limits)
	}
	return out
}

// RemoveOverride removes the override of rule for key, here and, with a
// shared store, for the fleet, and reports whether there was one.
func (l *Limiter) RemoveOverride(ctx context.Context, rule, key string) (bool, error) {
	l.clients.gen.Add(1) // before the change, as in SetOverride
	was := l.clients.overrides.Remove(clients.ID{Rule: rule, Key: key})
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

func isTooMany(err error) bool { return errors.Is(err, redisstore.ErrTooManyOverrides) }
