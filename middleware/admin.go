package middleware

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Resetter is implemented by stores that can drop counters: the in-memory
// store and the Redis store.
type Resetter interface {
	// Reset drops the counters named by the charges' Key, Name and limit
	// (Cost is ignored), as if their clients had never been seen.
	Reset(ctx context.Context, charges []Charge) error
}

// LimitState is where one limit of a rule stands for one key, as Peek
// reports it.
type LimitState struct {
	// Rule is the rule's name, and Policy the limit's name in the
	// RateLimit fields ("api", or "api-1m" for a rule with several
	// limits).
	Rule, Policy string
	// Limit is the limit as configured (without overage).
	Limit Limit
	// Remaining, ResetAfter and NextAfter are as in a Result: how many
	// more requests of cost 1 the limit admits now, when it is whole
	// again, and when more quota comes.
	Remaining  int
	ResetAfter time.Duration
	NextAfter  time.Duration
}

// ErrUnknownRule is returned by Peek and Reset for a rule name the
// limiter does not have.
var ErrUnknownRule = errors.New("sluice: unknown rule")

// Peek reports where each limit of the named rule stands for key (as the
// rule's key function would produce it: "ip:192.0.2.1", "user:alice"),
// without charging anything: a read of cost 0 on every store and
// algorithm. A rule with plans reports its default plan's limits; a client
// with an override (SetOverride), the override's. Peek
// asks the store even when the deny cache knows the answer.
func (l *Limiter) Peek(ctx context.Context, rule, key string) ([]LimitState, error) {
	c, err := l.ruleNamed(rule)
	if err != nil {
		return nil, err
	}
	limits, nominal := c.limits, c.nominal
	if l.clients.overrides.Len() > 0 {
		if cl := l.overrideFor(c, key); cl != nil {
			limits, nominal = cl.limits, cl.nominal // the client's override
		}
	}
	charges := make([]Charge, len(limits), len(limits)+len(c.usageLimits()))
	for i, lim := range limits {
		charges[i] = Charge{Key: key, Name: c.Name, Limit: lim}
	}
	var usageLimits []Limit
	if u := c.usage; u != nil {
		usageLimits = u.Limits
		if t := u.learned.Load(); t != nil {
			if ls := t.learnedUsage(u, key); ls != nil {
				usageLimits = ls // learned of the upstream (learned.go)
			}
		}
		for _, lim := range usageLimits {
			charges = append(charges, Charge{Key: key, Name: u.name, Limit: lim})
		}
	}
	if len(charges) == 0 {
		return nil, nil
	}
	out := make([]Decision, len(charges))
	var now time.Time
	if l.cfg.clock != nil {
		now = l.cfg.clock()
	}
	if _, err := l.cfg.store.Take(ctx, now, charges, out); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrStore, err)
	}
	states := make([]LimitState, len(charges))
	for i, d := range out {
		if i >= len(limits) { // a usage limit
			u, k := c.usage, i-len(limits)
			states[i] = LimitState{Rule: c.Name, Policy: u.names[k], Limit: usageLimits[k], Remaining: d.Remaining, ResetAfter: d.ResetAfter, NextAfter: d.NextAfter}
			continue
		}
		states[i] = LimitState{
			Rule: c.Name, Policy: policyName(c.Name, nominal[i], len(limits)), Limit: nominal[i],
			Remaining: nominalRemaining(d.Remaining, &limits[i], &nominal[i]), ResetAfter: d.ResetAfter, NextAfter: d.NextAfter,
		}
	}
	return states, nil
}

// Reset drops the counters of key under the named rule, or under every
// rule when rule is "", so that the client starts afresh (support staff
// forgiving a customer who was wrongly throttled), and forgets the denials
// the deny cache remembers for key. A rule with plans has the counters of
// its default plan's limits reset; a plan's limit of another window or
// algorithm is not. It needs a store that implements Resetter.
func (l *Limiter) Reset(ctx context.Context, rule, key string) error {
	rs, ok := l.cfg.store.(Resetter)
	if !ok {
		return fmt.Errorf("sluice: Reset: %T cannot reset counters", l.cfg.store)
	}
	var rules []*compiledRule
	if rule == "" {
		rules = l.rules.Load().rules
	} else {
		c, err := l.ruleNamed(rule)
		if err != nil {
			return err
		}
		rules = []*compiledRule{c}
	}
	var charges []Charge
	for _, c := range rules {
		for _, lim := range c.limits {
			charges = append(charges, Charge{Key: key, Name: c.Name, Limit: lim})
		}
		if u := c.usage; u != nil {
			for _, lim := range u.Limits {
				charges = append(charges, Charge{Key: key, Name: u.name, Limit: lim})
			}
		}
	}
	if dc := l.cfg.denyCache; dc != nil {
		dc.Forget(key)
	}
	if len(charges) == 0 {
		return nil
	}
	if err := rs.Reset(ctx, charges); err != nil {
		return fmt.Errorf("%w: %w", ErrStore, err)
	}
	if fb, ok := l.cfg.fallback.(Resetter); ok {
		_ = fb.Reset(ctx, charges)
	}
	return nil
}

// ruleNamed returns the rule in force named name.
func (l *Limiter) ruleNamed(name string) (*compiledRule, error) {
	for _, c := range l.rules.Load().rules {
		if c.Name == name {
			return c, nil
		}
	}
	return nil, fmt.Errorf("%w %q", ErrUnknownRule, name)
}

// Rules returns the rules in force.
func (l *Limiter) Rules() []Rule {
	set := l.rules.Load()
	out := make([]Rule, len(set.rules))
	for i, c := range set.rules {
		out[i] = c.Rule
	}
	return out
}

// DefaultAdminSignIn is how long a browser's sign-in lasts unless
// AdminConfig.SignIn says.
const DefaultAdminSignIn = 12 * time.Hour
