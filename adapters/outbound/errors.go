package outbound

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// The reasons a WaitError gives (its Err), besides the request context's
// own error when the caller gave up first.
var (
	// ErrTooLong: the request's turn would come after its context's
	// deadline or the transport's MaxWait.
	ErrTooLong = errors.New("outbound: the request's turn would come too late")
	// ErrTooCostly: the request costs more than a limit admits at once, so
	// no wait would help.
	ErrTooCostly = errors.New("outbound: the request costs more than the limit")
	// ErrTooManyWaiting: MaxWaiting requests wait in the transport
	// already.
	ErrTooManyWaiting = errors.New("outbound: too many requests waiting")
)

// WaitError is the error of a request that the transport did not send
// because the limiter would not admit it in time: RoundTrip returns it
// (an http.Client wraps it in a *url.Error; errors.As finds it). The
// request's body was closed, and nothing was charged for it.
type WaitError struct {
	// Rule is the rule of the limit that held the request back.
	Rule string
	// RetryAfter is how long the request would still have had to wait,
	// -1 when no wait would help (ErrTooCostly), 0 when unknown.
	RetryAfter time.Duration
	// Waited is how long the request waited before the transport gave up.
	Waited time.Duration
	// Paused reports that the upstream had asked to wait: the limit was
	// paused (a 429 with Retry-After, or a budget spent until its reset).
	Paused bool
	// Err is why: ErrTooLong, ErrTooCostly, ErrTooManyWaiting, or the
	// error of the request's context (context.Canceled,
	// context.DeadlineExceeded) when the caller gave up first.
	Err error
}

func (e *WaitError) Error() string {
	s := fmt.Sprintf("outbound: request not sent: rule %q", e.Rule)
	if e.Paused {
		s += " (paused by the upstream)"
	}
	s += ": " + e.Err.Error()
	if e.RetryAfter > 0 {
		s += fmt.Sprintf(" (retry after %s)", e.RetryAfter)
	}
	return s
}

// Unwrap returns Err.
func (e *WaitError) Unwrap() error { return e.Err }

// Timeout reports whether the request ran out of time (ErrTooLong or a
// deadline), as net.Error's Timeout does, so that url.Error's Timeout
// says so too.
func (e *WaitError) Timeout() bool {
	return errors.Is(e.Err, ErrTooLong) || errors.Is(e.Err, context.DeadlineExceeded)
}
