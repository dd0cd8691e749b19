package middleware

import (
	"fmt"
	"net/http"
)

// UnmatchedPolicy says what a Limiter does with a request that no rule
// applies to: one whose path, method, headers, query and Match select no
// rule. A request a rule's Skip exempts, or whose key a rule allowlists,
// was matched.
type UnmatchedPolicy uint8

const (
	// UnmatchedAllow lets the request through unlimited and without
	// rate-limit headers (Outcome OutcomeUnlimited). The default.
	UnmatchedAllow UnmatchedPolicy = iota
	// UnmatchedDeny answers the request with 503 Service Unavailable
	// through the deny handler (Outcome OutcomeUnmatched): for services
	// where every route must be covered by some rule.
	UnmatchedDeny
)

// String returns "allow" or "deny", as rules files spell the policy.
func (p UnmatchedPolicy) String() string {
	switch p {
	case UnmatchedAllow:
		return "allow"
	case UnmatchedDeny:
		return "deny"
	}
	return fmt.Sprintf("UnmatchedPolicy(%d)", p)
}

// WithUnmatched sets what the Limiter does with requests that no rule
// applies to: UnmatchedAllow (the default) or UnmatchedDeny.
// Limiter.SetUnmatched changes it later.
func WithUnmatched(p UnmatchedPolicy) Option {
	return func(c *config) {
		if p > UnmatchedDeny {
			c.errorf("WithUnmatched: unknown policy %d", p)
			return
		}
		c.unmatched = p
	}
}

// SetUnmatched changes what the Limiter does with requests that no rule
// applies to, as WithUnmatched set it; requests in flight are unaffected.
// It ignores a policy it does not know.
func (l *Limiter) SetUnmatched(p UnmatchedPolicy) {
	if p <= UnmatchedDeny {
		l.unmatched.Store(uint32(p))
	}
}

// Unmatched returns the Limiter's policy for requests no rule applies to.
func (l *Limiter) Unmatched() UnmatchedPolicy { return UnmatchedPolicy(l.unmatched.Load()) }

// unmatchedBody is DenyBody's answer to a request no rule applies to.
const unmatchedBody = `{"error":"no rate-limit rule applies to the request"}` + "\n"

// unmatchedResult is the decision on a request no rule applies to under
// UnmatchedDeny.
func (l *Limiter) unmatchedResult() Result {
	if l.cfg.shadow {
		return Result{Allowed: true, Shadowed: true, Outcome: OutcomeShadowDenied}
	}
	return Result{Outcome: OutcomeUnmatched, status: http.StatusServiceUnavailable}
}
