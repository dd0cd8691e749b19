package middleware

import (
	"fmt"

	"github.com/sluicehq/sluice/internal/adaptive"
	"github.com/sluicehq/sluice/keyfunc"
)

// Priority orders requests for shedding under an adaptive concurrency
// limit (Rule.AdaptiveConcurrency): as load rises, sheddable requests are
// refused first, then normal ones, then high ones; critical ones only at
// the hard limit (AdaptiveConcurrency.Max). The zero value means not set:
// such a request is normal.
type Priority uint8

// The priorities.
const (
	// PriorityUnset is the zero value: the priority is not set here.
	PriorityUnset Priority = iota
	// PrioritySheddable requests are refused first: once half the
	// adaptive limit is in flight.
	PrioritySheddable
	// PriorityNormal requests are refused at the adaptive limit.
	PriorityNormal
	// PriorityHigh requests are refused half-way between the adaptive
	// limit and the hard limit.
	PriorityHigh
	// PriorityCritical requests are refused only at the hard limit.
	PriorityCritical
)

var priorityNames = [...]string{"unset", "sheddable", "normal", "high", "critical"}

// String returns "sheddable", "normal", "high", "critical" or "unset".
func (p Priority) String() string {
	if int(p) < len(priorityNames) {
		return priorityNames[p]
	}
	return fmt.Sprintf("Priority(%d)", p)
}

// ParsePriority parses a priority's name, as String returns it ("unset"
// excepted).
func ParsePriority(s string) (Priority, error) {
	for i, n := range priorityNames[1:] {
		if n == s {
			return Priority(i + 1), nil
		}
	}
	return 0, fmt.Errorf("sluice: priority %q: want sheddable, normal, high or critical", s)
}

// valid reports whether p is one of the constants.
func (p Priority) valid() bool { return p <= PriorityCritical }

// shedClass is p as the shedder orders it.
func (p Priority) shedClass() adaptive.Priority {
	switch p {
	case PrioritySheddable:
		return adaptive.Sheddable
	case PriorityHigh:
		return adaptive.High
	case PriorityCritical:
		return adaptive.Critical
	}
	return adaptive.Normal
}

// WithPriority sets the priority of each request for shedding under
// adaptive concurrency limits (see Priority). fn runs on every request that
// an adaptive concurrency rule applies to and must be fast; when it returns
// PriorityUnset, the request takes the highest Priority of the rules that
// apply to it, and is normal if none sets one.
func WithPriority(fn func(keyfunc.Request) Priority) Option {
	return func(c *config) {
		if fn == nil {
			c.errorf("WithPriority: nil function")
			return
		}
		c.overload.priority = fn
	}
}
